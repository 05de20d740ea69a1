"""A server whose shared-memory API is restricted (``--grpc-restricted-protocol=shared-memory:...``,
``--http-restricted-api=shared-memory:...``), issue 39: without the header, the client falls back
to the wire with one warning naming the header the server wants (every call failed, the refusal
read as "cannot reach the server"); with it in the client's ``headers=``, every call it makes --
registrations, unregisters and model reads too -- carries it, and tensors go through the slots.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import tritonshm
from tritonshm.server import LocalServer
from triton_fixtures import client_url, start_or_skip

KEY, VALUE = "admin-key", "s3cret"


@pytest.fixture(scope="module")
def restricted_server():
    with start_or_skip(LocalServer(extra_args=[f"--grpc-restricted-protocol=shared-memory:{KEY}={VALUE}",
                                               f"--http-restricted-api=shared-memory:{KEY}={VALUE}"])) as srv:
        yield srv


def header_for(protocol: str) -> str:
    """The header as each protocol's client sends it (gRPC's carries Triton's prefix)."""
    return f"triton-grpc-protocol-{KEY}" if protocol == "grpc" else KEY


@pytest.mark.server
def test_without_the_header_requests_go_on_the_wire_with_one_warning_naming_it(restricted_server, protocol):
    x = np.arange(4, dtype=np.float32)
    with tritonshm.Client(client_url(restricted_server, protocol)) as c:
        with pytest.warns(RuntimeWarning) as warned:
            for _ in range(3):
                np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"], x)
        (warning,) = [str(w.message) for w in warned]
        assert header_for(protocol) in warning and "headers=" in warning
        assert c.pools() == []


@pytest.mark.server
def test_with_the_header_every_call_carries_it_and_tensors_go_through_the_slots(restricted_server, protocol):
    x = np.arange(4, dtype=np.float32)
    headers = {header_for(protocol): VALUE}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with tritonshm.Client(client_url(restricted_server, protocol), headers=headers) as c:
            np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"], x)
            (pool,) = c.pools()
            ours = set(pool.regions)
            assert ours <= registered(c.tritonclient, protocol, headers)
        # closed: its regions were unregistered, with the header (else the server refused, and kept them)
        with tritonshm.Client(client_url(restricted_server, protocol)) as probe:
            assert not ours & registered(probe.tritonclient, protocol, headers)


def registered(tritonclient, protocol: str, headers: dict) -> set[str]:
    status = tritonclient.get_system_shared_memory_status(headers=headers)
    return {r["name"] for r in status} if protocol == "http" else set(status.regions)


@pytest.mark.server
def test_a_facade_plugins_headers_go_with_the_registrations_too(restricted_server, protocol):
    """tritonshm.grpc / .http with a tritonclient plugin that adds the header: the facade's slots
    register (and unregister) with it, as tritonclient's own calls carry a plugin's headers --
    before, the held client's registrations went without, were refused, and the calls fell back to
    the wire."""
    import importlib

    class AdminKey:  # (a plugin is any callable of the call's request)
        def __call__(self, request):
            request.headers[header_for(protocol)] = VALUE

    module = importlib.import_module(f"tritonshm.{protocol}")
    url = restricted_server.grpc_url if protocol == "grpc" else restricted_server.http_url
    x = np.arange(4, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to the wire
        client = module.InferenceServerClient(url)
        client.tritonshm_inline_bytes = 0  # (every call through the slots, however small)
        client.register_plugin(AdminKey())
        given = module.InferInput("INPUT0", [4], "FP32")
        given.set_data_from_numpy(x)
        np.testing.assert_array_equal(client.infer("identity_fp32", [given]).as_numpy("OUTPUT0"), x)
        (pool,) = client.tritonshm.pools()
        ours = set(pool.regions)
        client.close()
    with tritonshm.Client(client_url(restricted_server, protocol)) as probe:
        assert not ours & registered(probe.tritonclient, protocol, {header_for(protocol): VALUE})
