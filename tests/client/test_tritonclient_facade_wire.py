"""What tritonshm.grpc / tritonshm.http put on the socket: only the request's header.

A 4 MiB FP32 request to identity_fp32 is sent through a loopback forwarder that counts the bytes
each way (tests/support/forwarder.py), once with the facade's client, once with tritonclient's own
-- the control that shows the counter sees the tensors when they do travel.  The facade's slots
are registered with the server through the same forwarder, on its first call: the counts are
taken around the measured calls only, after a warm-up call of the same size.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from support.forwarder import Forwarder
from support.insides import record_plans

pytestmark = pytest.mark.server

MODEL = "identity_fp32"
NBYTES = 4 << 20
#: What one request may move each way through the facade: its header, never its tensor.
HEADER_LIMIT = 64 << 10
#: Measured calls per client (after one warm-up call).
CALLS = 3


def one_call(module, client, x):
    """A tritonclient user's request: set_data_from_numpy, infer, as_numpy."""
    inp = module.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer(MODEL, [inp], outputs=[module.InferRequestedOutput("OUTPUT0")])
    return result.as_numpy("OUTPUT0")


def bytes_per_call(module_name, fwd, rng):
    """(client->server, server->client) bytes per call of *module_name*'s client through *fwd*,
    the largest of :data:`CALLS` calls after a warm-up one; and the client's slot client."""
    module = importlib.import_module(module_name)
    client = module.InferenceServerClient(fwd.address)
    try:
        warm = rng.standard_normal(NBYTES // 4, dtype=np.float32)
        np.testing.assert_array_equal(one_call(module, client, warm), warm)
        worst = (0, 0)
        for _ in range(CALLS):
            x = rng.standard_normal(NBYTES // 4, dtype=np.float32)
            before = fwd.counts()
            out = one_call(module, client, x)
            up, down = fwd.counts_since(before)
            np.testing.assert_array_equal(out, x)  # a fresh input each call: no stale result passes
            worst = (max(worst[0], up), max(worst[1], down))
        slots = getattr(client, "tritonshm", None)
        used_slots = slots is not None and [pool.model for pool in slots.pools()] == [MODEL]
        return worst, used_slots
    finally:
        client.close()


@pytest.fixture
def forwarder(server, protocol):
    with Forwarder(0, server.grpc_url if protocol == "grpc" else server.http_url) as fwd:
        yield fwd


def test_the_facade_moves_only_the_header_and_tritonclient_the_tensors(forwarder, protocol):
    rng = np.random.default_rng(31)
    (up, down), used_slots = bytes_per_call(f"tritonshm.{protocol}", forwarder, rng)
    assert used_slots, "the facade's call did not go through its slots"
    assert 0 < up < HEADER_LIMIT, f"facade, {protocol}: {up} bytes client->server per 4 MiB request"
    assert 0 < down < HEADER_LIMIT, f"facade, {protocol}: {down} bytes server->client per 4 MiB request"

    (plain_up, plain_down), plain_slots = bytes_per_call(f"tritonclient.{protocol}", forwarder, rng)
    assert not plain_slots
    # The control: the same call with tritonclient's own module carries the tensor each way.
    assert plain_up > NBYTES, f"tritonclient, {protocol}: {plain_up} bytes client->server"
    assert plain_down > NBYTES, f"tritonclient, {protocol}: {plain_down} bytes server->client"
    assert forwarder.connections >= 2  # both clients did go through the forwarder


def test_the_facades_small_calls_take_the_clients_quick_path(server, protocol, monkeypatch):
    """A small call seen before is not checked and planned again by the slots' client (the
    facade passes an empty RequestOptions on every call: that must count as none)."""
    module = importlib.import_module(f"tritonshm.{protocol}")
    client = module.InferenceServerClient(server.grpc_url if protocol == "grpc" else server.http_url)
    client.tritonshm_inline_bytes = 0  # a small call through the slots, gRPC too
    try:
        x = np.arange(1024, dtype=np.float32)
        np.testing.assert_array_equal(one_call(module, client, x), x)  # the slots made, the call planned
        planned = record_plans(monkeypatch, client.tritonshm)
        for seed in range(3):
            y = x + seed
            np.testing.assert_array_equal(one_call(module, client, y), y)
        assert planned == []
    finally:
        client.close()


def stream_bytes_up(module_name, fwd, rng):
    """Client->server bytes of one stream (start_stream, CALLS requests of NBYTES each to the
    decoupled stream_fp32 with COUNT=0, so only the empty final responses come back, not asked
    for: nothing is heard), after a warm-up stream; and whether the slots were used."""
    module = importlib.import_module(module_name)
    client = module.InferenceServerClient(fwd.address)
    heard = []
    try:
        def stream(calls):
            client.start_stream(lambda result, error: heard.append(error))
            for _ in range(calls):
                data = module.InferInput("INPUT0", [NBYTES // 4], "FP32")
                data.set_data_from_numpy(rng.standard_normal(NBYTES // 4, dtype=np.float32))
                count = module.InferInput("COUNT", [1], "INT32")
                count.set_data_from_numpy(np.array([0], np.int32))
                client.async_stream_infer("stream_fp32", [data, count])
            client.stop_stream()

        stream(1)  # warm-up: the slots made and registered
        before = fwd.counts()
        stream(CALLS)
        up, _ = fwd.counts_since(before)
        slots = getattr(client, "tritonshm", None)
        return up, slots is not None and [pool.model for pool in slots.pools()] == ["stream_fp32"], heard
    finally:
        client.close()


def test_the_facades_stream_moves_only_the_headers_of_its_requests(server):
    rng = np.random.default_rng(32)
    with Forwarder(0, server.grpc_url) as fwd:
        up, used_slots, heard = stream_bytes_up("tritonshm.grpc", fwd, rng)
        plain_up, _, plain_heard = stream_bytes_up("tritonclient.grpc", fwd, rng)
    assert used_slots, "the facade's stream did not put its inputs in its slots"
    assert 0 < up < CALLS * HEADER_LIMIT, f"facade: {up} bytes client->server for {CALLS} 4 MiB stream requests"
    assert plain_up > CALLS * NBYTES, f"tritonclient: {plain_up} bytes client->server"  # the control
    assert heard == plain_heard == []  # no response asked for, none heard: no error either
