"""A script written for tritonclient runs against tritonshm.Client and does what it did there.

The script below is what a tritonclient user has: it catches ``InferenceServerException``,
passes ``timeout=`` in microseconds (the server's queue timeout), names the server
``http://host`` without a port, and sends a BF16 model ``ml_dtypes.bfloat16`` arrays.  The test
runs its steps with tritonclient.http and with tritonshm.Client against the same server and
compares what came back.  The server's HTTP port is reached as ``http://127.0.0.1`` -- port
8000, tritonclient's and PyTriton's default -- through a forwarder on that port when it is
free here (else the script gets the port, and the default is checked as parsed).
"""

from __future__ import annotations

import json
from typing import Any, Callable

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import tritonshm
from tritonshm import _transport

from support.forwarder import Forwarder

pytestmark = pytest.mark.server

X = np.array([1.5, -2.25, 3.0, 0.125, 1e3, -7], dtype=ml_dtypes.bfloat16)
ROW = np.ones((1, 4), np.float32)


def script(infer: Callable[..., dict[str, np.ndarray]]) -> dict[str, Any]:
    """The tritonclient user's script, over *infer(model, inputs, **options)*: what it saw."""
    seen: dict[str, Any] = {}
    out = infer("identity_bf16", {"INPUT0": X}, timeout=30_000_000)["OUTPUT0"]
    seen["bf16"] = (out.dtype, out.tolist())
    echoed = infer("echo_request", {"INPUT0": ROW}, timeout=2_500_000)["OUTPUT0"]
    seen["server_timeout_us"] = json.loads(echoed.reshape(-1)[0])["timeout"]
    try:
        infer("no_such_model", {"INPUT0": ROW}, timeout=1_000_000)
    except InferenceServerException as exc:
        seen["unknown_model"] = ("unknown model" in str(exc.message()).lower(), exc.status())
    return seen


def tritonclient_infer(client: Any) -> Callable[..., dict[str, np.ndarray]]:
    """*infer* as the script did it with tritonclient.http."""
    dtypes = {"identity_bf16": "BF16", "echo_request": "FP32", "no_such_model": "FP32"}
    outputs = {"identity_bf16": ["OUTPUT0"], "echo_request": ["OUTPUT0"], "no_such_model": ["OUTPUT0"]}

    def infer(model: str, inputs: dict[str, np.ndarray], timeout: int) -> dict[str, np.ndarray]:
        wire_inputs = []
        for name, array in inputs.items():
            wire = httpclient.InferInput(name, list(array.shape), dtypes[model])
            wire.set_data_from_numpy(array, binary_data=True)
            wire_inputs.append(wire)
        result = client.infer(model, wire_inputs, timeout=timeout,
                              outputs=[httpclient.InferRequestedOutput(n, binary_data=True) for n in outputs[model]])
        return {name: result.as_numpy(name) for name in outputs[model]}

    return infer


@pytest.fixture
def default_port_url(server):
    """``"http://127.0.0.1"`` (no port: 8000) reaching the server, where 8000 is free here;
    else the server's own address (the default port is then checked as parsed)."""
    try:
        forwarder = Forwarder(8000, server.http_url)
    except OSError:  # port 8000 is taken on this machine (another server, another session)
        yield "http://" + server.http_url
        return
    try:
        yield "http://127.0.0.1"
    finally:
        forwarder.close()


def test_a_tritonclient_script_does_the_same_on_tritonshm(server, default_port_url):
    assert _transport.parse_url("http://127.0.0.1")[1] == "127.0.0.1:8000"  # tritonclient's default port
    plain = httpclient.InferenceServerClient(server.http_url)
    try:
        expected = script(tritonclient_infer(plain))
    finally:
        plain.close()
    with tritonshm.Client(default_port_url) as client:
        def infer(model: str, inputs: dict[str, np.ndarray], **options: Any) -> dict[str, np.ndarray]:
            return client.infer(model, inputs, **options)

        seen = script(infer)
        assert [pool.model for pool in client.pools()] == ["identity_bf16", "echo_request"]  # shared memory
    assert seen["bf16"] == expected["bf16"] == (np.dtype(ml_dtypes.bfloat16), X.tolist())
    assert seen["server_timeout_us"] == expected["server_timeout_us"] == 2_500_000
    assert expected["unknown_model"][0] and seen["unknown_model"][0]
    assert seen["unknown_model"][1] == expected["unknown_model"][1]  # the server's status, carried over


def test_a_timeout_in_seconds_is_refused_before_anything_is_sent(server):
    """What a tritonshm user of old (timeout= was the slot wait in seconds) now gets."""
    with tritonshm.Client("http://" + server.http_url) as client:
        with pytest.raises(InferenceServerException, match="slot_timeout=") as caught:
            client.infer("identity_bf16", {"INPUT0": X}, timeout=0.5)
        assert isinstance(caught.value, tritonshm.InvalidOptionType) and caught.value.status() is None
        assert client.pools() == []
