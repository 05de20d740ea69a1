"""Fixtures that put a real Triton server in the loop (loaded from conftest.py).

One LocalServer serves the whole test session; tests that restart or stop
a server start their own with ``fresh_server``.

Where no server can be installed or started (no package index, no usable
existing install: :class:`~tritonshm.server.ServerInstallError`), the tests
that need one are skipped with the reason -- unless
``TRITONSHM_REQUIRE_SERVER=1`` is set, as CI does, and then they fail:
a broken install must not hide behind skips. Any other error of a server
(a model that does not load, a timeout) fails the tests everywhere.
"""

from __future__ import annotations

import os
import time

import ml_dtypes
import numpy as np
import pytest

from tritonshm.server import LocalServer, ServerInstallError

#: The bundled identity models of fixed-size dtypes, and their numpy dtypes.
NUMERIC_IDENTITY_MODELS = {
    "identity_fp32": np.float32,
    "identity_fp16": np.float16,
    "identity_int8": np.int8,
    "identity_uint8": np.uint8,
    "identity_int32": np.int32,
    "identity_int64": np.int64,
    "identity_bool": np.bool_,
    "identity_bf16": ml_dtypes.bfloat16,  # through the backend's DLPack: it has no numpy BF16
}


def sample(dtype, n, seed=0):
    """*n* reproducible values of *dtype* spanning its range."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.integers(0, 2, n).astype(bool)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    return rng.standard_normal(n).astype(dtype)


def start_or_skip(srv: LocalServer) -> LocalServer:
    """``srv.start()``; if no server can be installed or started here, skip the test with the reason.

    With ``TRITONSHM_REQUIRE_SERVER=1`` in the environment the error is raised instead.
    """
    try:
        return srv.start()
    except ServerInstallError as exc:
        if os.environ.get("TRITONSHM_REQUIRE_SERVER") == "1":
            raise
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        pytest.skip(f"no local Triton server ({reason}); "
                    f"set TRITONSHM_REQUIRE_SERVER=1 to fail instead")


def restarted_unable_to_open_our_memory(server: LocalServer, **options) -> LocalServer:
    """*server* stopped, and one with a /dev/shm of its own started on its ports (*options*: more
    of LocalServer's, e.g. the fake CUDA runtime's ``env``): a container restarted without
    ``--ipc=host``, or with client shared memory turned off, as its clients see it."""
    server.stop()

    def port(url: str) -> int:
        return int(url.rsplit(":", 1)[1])

    return start_or_skip(LocalServer(grpc_port=port(server.grpc_url), http_port=port(server.http_url),
                                     private_shm=True, **options))


#: The session's shared server once the ``server`` fixture started it (for ``session_server_survives``).
_session_server: LocalServer | None = None


@pytest.fixture(scope="session")
def server():
    """A running LocalServer with the bundled models, shared by the session."""
    global _session_server
    try:
        srv = start_or_skip(LocalServer())
    except pytest.skip.Exception:
        # The tests that need no server still use tritonclient (against a
        # closed port): give them the same warm clients before they run.
        _warm_up_tritonclient("127.0.0.1:1", "127.0.0.1:1")
        raise
    with srv:
        _warm_up_tritonclient(srv.http_url, srv.grpc_url)
        _session_server = srv
        try:
            yield srv
        finally:
            _session_server = None


@pytest.fixture(autouse=True)
def session_server_survives():
    """Fail the test during which the session's server died, with the end of its log, and start it
    again on the same ports for the next test: one crash of Triton fails one test, not every later
    one with "connection refused" (CI once lost 183 tests to an abort inside Triton 2.51)."""
    srv = _session_server
    if srv is not None and not srv.running:
        srv.start()  # it died outside any test, or its restart failed: try again
    yield
    srv = _session_server
    if srv is None or srv.running:
        return
    exit_code = srv._proc.popen.returncode if srv._proc.popen is not None else None
    tail = srv._log_tail()  # before start(): this run's log, not the next one's
    srv.start()
    pytest.fail(f"the session's Triton server died during this test (exit code {exit_code}); it was started "
                f"again for the next test. The end of its log:\n{tail}", pytrace=False)


def _warm_up_tritonclient(http_url: str, grpc_url: str) -> None:
    """Use each tritonclient protocol once, against *http_url* and *grpc_url*.

    tritonclient.http's gevent hub keeps an epoll and an eventfd per thread
    once used, gRPC its own process-wide pollers: create them before the
    leak checks take their first snapshot.
    """
    import tritonclient.grpc
    import tritonclient.http

    tritonclient.http.InferenceServerClient(http_url).close()
    warm = tritonclient.grpc.InferenceServerClient(grpc_url)
    try:
        warm.is_server_live()
    except tritonclient.grpc.InferenceServerException:
        pass  # no server there: the pollers exist all the same
    finally:
        warm.close()


@pytest.fixture
def fresh_server():
    """A LocalServer of this test's own, for restarts and shutdowns."""
    with start_or_skip(LocalServer()) as srv:
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


def wait_until(predicate, seconds: float = 5.0) -> None:
    """Return once *predicate()* is true; fail the test if it is not within *seconds*."""
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


def registered_regions(srv, kind: str = "system") -> set[str]:
    """The names of the shared-memory regions of *kind* ("system" or "cuda") *srv* has now."""
    import tritonshm

    _, tc = make_client(srv, "grpc")
    try:
        return set(tritonshm.status(tc, kind=kind))
    finally:
        tc.close()


def client_url(srv, protocol):
    """The url tritonshm.Client takes for *srv* over *protocol*."""
    return srv.grpc_url if protocol == "grpc" else "http://" + srv.http_url


def refuse_unregister(monkeypatch, name: str, times: int | None = None, error=None,
                      before=None) -> list[str]:
    """Make ``tritonshm.triton.unregister`` refuse *name*: *times* times (None: always), raising
    *error* (default: Triton 2.51's "currently in use", a ``ServerError``); *before* is called
    at each refusal.  Returns the list of refusals made so far (it grows as they happen)."""
    from tritonshm import triton
    from tritonshm.errors import ServerError, copy_for_another_caller

    real_unregister, refusals = triton.unregister, []
    if error is None:
        error = ServerError(f"Cannot unregister shared memory region '{name}', it is currently in use.")

    def unregister(client, what, **kwargs):
        if what == name and (times is None or len(refusals) < times):
            refusals.append(what)
            if before is not None:
                before()
            raise copy_for_another_caller(error)  # a fresh one: a raised instance keeps its frames alive
        return real_unregister(client, what, **kwargs)

    monkeypatch.setattr(triton, "unregister", unregister)
    return refusals
