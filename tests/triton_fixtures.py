"""Fixtures that put a real Triton server in the loop (loaded from conftest.py).

One LocalServer serves the whole test session; tests that restart or stop
a server start their own with ``fresh_server``.
"""

from __future__ import annotations

import pytest

from tritonshm.server import LocalServer


@pytest.fixture(scope="session")
def server():
    """A running LocalServer with the bundled models, shared by the session."""
    with LocalServer() as srv:
        # tritonclient.http's gevent hub keeps an epoll and an eventfd per
        # thread once used, gRPC its own process-wide pollers: create them
        # before the leak checks take their first snapshot.
        import tritonclient.grpc
        import tritonclient.http

        tritonclient.http.InferenceServerClient(srv.http_url).close()
        warm = tritonclient.grpc.InferenceServerClient(srv.grpc_url)
        warm.is_server_live()
        warm.close()
        yield srv


@pytest.fixture
def fresh_server():
    """A LocalServer of this test's own, for restarts and shutdowns."""
    with LocalServer() as srv:
        yield srv


@pytest.fixture(params=["grpc", "http"])
def protocol(request):
    """Each tritonclient protocol in turn."""
    return request.param


def make_client(srv, protocol):
    """A tritonclient client of *protocol* for *srv*."""
    if protocol == "grpc":
        import tritonclient.grpc as module

        return module, module.InferenceServerClient(srv.grpc_url)
    import tritonclient.http as module

    return module, module.InferenceServerClient(srv.http_url)


@pytest.fixture
def triton_client(server, protocol):
    """``(tritonclient module, client)`` for the session server, both protocols."""
    module, client = make_client(server, protocol)
    yield module, client
    client.close()


def client_url(srv, protocol):
    """The url tritonshm.Client takes for *srv* over *protocol*."""
    return srv.grpc_url if protocol == "grpc" else "http://" + srv.http_url
