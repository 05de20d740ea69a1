"""A server that hangs -- it accepts connections and never answers (SIGSTOP) -- holds a client no
longer than the limits its user set; and a call cut off (its answer late, though the server did
what it asked) never has its memory taken for refused.

``close()`` waits for requests in flight up to *slot_timeout*, then asks the
server to unregister everything for up to ``min(slot_timeout, 5 s)``: each of
those calls is bounded by that settling (gRPC's ``client_timeout``, an aio
client's await, the wait for an HTTP I/O thread), so a server that hangs does
not hold ``close()`` for ever.  What it did not answer is treated as what it
refused: host memory closed and its registration asked about after the close,
device memory held and asked about -- and once the server answers again, it is
let go of.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from typing import Any, Iterator

import numpy as np
import pytest

import tritonshm
import tritonshm.aio
from tritonshm.server import LocalServer

from triton_fixtures import client_url, registered_regions, start_or_skip, wait_until

pytestmark = pytest.mark.server

X = {"INPUT0": np.arange(16, dtype=np.float32)}
SLOT_TIMEOUT = 1.0
# close() may take slot_timeout (no request in flight here: nothing of it) plus its settling,
# min(slot_timeout, 5 s), plus its last call's grace: 1.5 s.  Not a timing to meet -- a bound
# that tells "returned" from "hangs until the server answers" with room for a loaded machine.
RETURNS_WITHIN = 15.0


@pytest.fixture(scope="module")
def hanging_server() -> Iterator[LocalServer]:
    """A LocalServer of this module's own, which :func:`hung` stops and starts again."""
    with start_or_skip(LocalServer()) as srv:
        yield srv


@contextlib.contextmanager
def hung(srv: LocalServer) -> Iterator[None]:
    """*srv* hangs in the block: its processes stopped, its sockets open, nothing answered."""
    os.killpg(srv.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(srv.pid, signal.SIGCONT)


def while_hung(srv: LocalServer, fn: Any) -> list:
    """``[fn()]`` called on a thread of its own while *srv* hangs, if it returned within
    RETURNS_WITHIN (else ``[]``: the thread is left to end once the server answers again)."""
    box: list = []
    ended = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    with hung(srv):
        ended.start()
        ended.join(RETURNS_WITHIN)
        in_time = not ended.is_alive()
    ended.join()
    return box if in_time else []


def _http_io_threads() -> int:
    return sum(thread.name.startswith("tritonshm-http") for thread in threading.enumerate())


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_close_returns_while_the_server_hangs_and_its_regions_go_once_it_answers(hanging_server, protocol):
    c = tritonshm.Client(client_url(hanging_server, protocol), slot_timeout=SLOT_TIMEOUT)
    np.testing.assert_array_equal(c.infer("identity_fp32", X)["OUTPUT0"], X["INPUT0"])
    names = {name for pool in c.pools() for name in pool.regions}
    closing = threading.Thread(target=c.close, daemon=True)
    with hung(hanging_server):
        closing.start()
        closing.join(RETURNS_WITHIN)
        returned = not closing.is_alive()
    closing.join()
    assert returned, f"close() (slot_timeout={SLOT_TIMEOUT}) was still waiting for a server that hangs " \
                     f"after {RETURNS_WITHIN} s"
    # What it did not answer was asked about again after the close: gone once it answers.
    wait_until(lambda: not names & registered_regions(hanging_server), 15)
    wait_until(lambda: _http_io_threads() == 0, 70)  # (an I/O thread's hung call ends when answered)


def test_an_aio_close_returns_while_the_server_hangs(hanging_server):
    async def main() -> tuple[bool, set[str]]:
        c = tritonshm.aio.Client(client_url(hanging_server, "grpc"), slot_timeout=SLOT_TIMEOUT)
        np.testing.assert_array_equal((await c.infer("identity_fp32", X))["OUTPUT0"], X["INPUT0"])
        names = {name for pool in c.pools() for name in pool.regions}
        closing = asyncio.ensure_future(c.close())
        with hung(hanging_server):
            done, _ = await asyncio.wait([closing], timeout=RETURNS_WITHIN)
        await closing
        return bool(done), names

    returned, names = asyncio.run(main())
    assert returned, f"aio close() (slot_timeout={SLOT_TIMEOUT}) was still waiting for a server that hangs " \
                     f"after {RETURNS_WITHIN} s"
    wait_until(lambda: not names & registered_regions(hanging_server), 15)


@pytest.mark.parametrize("client", ["sync", "aio"])
def test_client_timeout_bounds_the_clients_own_calls_while_the_server_hangs(hanging_server, client):
    """``client_timeout`` bounds everything a request waits for, the calls the client makes on its
    own for it too: a cold client's model reads, and the registration of a new extent when the
    pool must grow (its one slot held for the server after the first request timed out) --
    ServerTimeout, never a wait for ever.  A registration cut off may have been carried out: its
    name is unregistered before its memory goes, and nothing of the client's is left on the
    server once it answers again and the client closed."""
    before = registered_regions(hanging_server)
    url = client_url(hanging_server, "grpc")

    def calls(infer) -> list[str]:  # what each of three calls ended with while the server hangs
        return [type(outcome).__name__ for outcome in (infer() for _ in range(3))]

    if client == "sync":
        c = tritonshm.Client(url, slots=1, slot_timeout=SLOT_TIMEOUT)

        def infer():
            try:
                return c.infer("identity_fp32", X, client_timeout=0.5)
            except tritonshm.Error as exc:
                return exc

        cold = (while_hung(hanging_server, infer) or ["still waiting after %s s" % RETURNS_WITHIN])[0]  # (cold)
        c.infer("identity_fp32", X)  # warm: model read, its pool's one extent registered
        box = while_hung(hanging_server, lambda: calls(infer))
        c.close()
    else:
        async def main() -> tuple[Any, list]:
            c = tritonshm.aio.Client(url, slots=1, slot_timeout=SLOT_TIMEOUT)

            async def infer():
                try:
                    return await c.infer("identity_fp32", X, client_timeout=0.5)
                except tritonshm.Error as exc:
                    return exc

            with hung(hanging_server):
                cold = await asyncio.wait_for(infer(), RETURNS_WITHIN)
            await c.infer("identity_fp32", X)
            with hung(hanging_server):
                warm = [type(await asyncio.wait_for(infer(), RETURNS_WITHIN)).__name__ for _ in range(3)]
            await c.close()
            return cold, warm

        cold, warm = asyncio.run(main())
        box = [warm]
    assert isinstance(cold, tritonshm.ServerTimeout), cold
    assert box and set(box[0]) <= {"ServerTimeout", "PoolExhausted"}, \
        f"warm calls while the server hangs: {box or 'still waiting after %s s' % RETURNS_WITHIN}"
    wait_until(lambda: registered_regions(hanging_server) == before, 15)


@pytest.mark.parametrize("client", ["sync", "aio"])
def test_client_timeout_bounds_a_cold_streams_own_calls_while_the_server_hangs(hanging_server, client):
    """``stream()``'s ``client_timeout`` bounds the calls the client makes on its own for the
    request too (a cold client's model reads): ServerTimeout, never a wait for ever."""
    url = client_url(hanging_server, "grpc")

    if client == "sync":
        c = tritonshm.Client(url, slots=1, slot_timeout=SLOT_TIMEOUT)

        def first_response() -> Any:
            try:
                return next(iter(c.stream("identity_fp32", X, client_timeout=0.5)))
            except tritonshm.Error as exc:
                return exc

        cold = (while_hung(hanging_server, first_response) or [f"still waiting after {RETURNS_WITHIN} s"])[0]
        c.close()
    else:
        async def main() -> Any:
            c = tritonshm.aio.Client(url, slots=1, slot_timeout=SLOT_TIMEOUT)

            async def first_response() -> Any:
                try:
                    async for outputs in c.stream("identity_fp32", X, client_timeout=0.5):
                        return outputs
                except tritonshm.Error as exc:
                    return exc

            try:
                with hung(hanging_server):
                    return await asyncio.wait_for(first_response(), RETURNS_WITHIN)
            except asyncio.TimeoutError:
                return f"still waiting after {RETURNS_WITHIN} s"
            finally:
                await c.close()

        cold = asyncio.run(main())
    assert isinstance(cold, tritonshm.ServerTimeout), cold


@pytest.mark.parametrize("flavour", ["grpc", "grpc.aio", "http.aio"])
def test_unregister_with_a_timeout_gives_up_on_a_server_that_hangs(hanging_server, flavour):
    """The registration layer's own bound: ``unregister(timeout=)`` is ServerTimeout once it
    passed (whether the server let go is then unknown), never a wait for ever.  (A blocking HTTP
    client has no per-call bound: its network_timeout is it.)"""
    import importlib

    module = importlib.import_module(f"tritonclient.{flavour}")
    url = hanging_server.grpc_url if flavour.startswith("grpc") else hanging_server.http_url
    region = tritonshm.SystemRegion.create(4096)

    async def run() -> None:
        tc = module.InferenceServerClient(url)  # (made in the loop it runs on)
        try:
            name = await tritonshm.register(tc, region)
            with hung(hanging_server):
                with pytest.raises(tritonshm.ServerTimeout):
                    await tritonshm.unregister(tc, name, timeout=1.0)
            await tritonshm.unregister(tc, name)
        finally:
            await tc.close()

    with region:
        if flavour.endswith(".aio"):
            asyncio.run(run())
            return
        tc = module.InferenceServerClient(url)
        try:
            name = tritonshm.register(tc, region)
            with hung(hanging_server):
                with pytest.raises(tritonshm.ServerTimeout):
                    tritonshm.unregister(tc, name, timeout=1.0)
            tritonshm.unregister(tc, name)
        finally:
            tc.close()


def test_a_lent_registration_cut_off_though_carried_out_is_unregistered_before_its_memory_goes(
        fake_cuda_server, torch_caching, monkeypatch):
    """A GPU tensor lent for the first time: the server registers its allocation, and the answer
    does not come in time (a client_timeout, a lost connection: tritonclient's call raises
    DEADLINE_EXCEEDED after the server did it).  The client does not take the cut-off call for a
    refusal: the allocation is held until its name is unregistered, and nothing of it is left on
    the server."""
    import tritonclient.grpc
    from tritonclient.utils import InferenceServerException

    register = tritonclient.grpc.InferenceServerClient.register_cuda_shared_memory

    def carried_out_then_cut_off(self, *args, **kwargs):
        register(self, *args, **kwargs)
        monkeypatch.undo()  # (once)
        raise InferenceServerException("Deadline Exceeded", status="StatusCode.DEADLINE_EXCEEDED")

    before = registered_regions(fake_cuda_server, "cuda")
    c = tritonshm.Client(client_url(fake_cuda_server, "grpc"), slot_timeout=SLOT_TIMEOUT)
    x = torch_caching.from_numpy(np.full(16, 3, np.float32))
    monkeypatch.setattr(tritonclient.grpc.InferenceServerClient, "register_cuda_shared_memory",
                        carried_out_then_cut_off)
    with pytest.raises(tritonshm.ServerTimeout):
        c.infer("identity_fp32", {"INPUT0": x}, client_timeout=5.0)
    assert registered_regions(fake_cuda_server, "cuda") != before  # (the server has it)
    del x
    torch_caching.empty_cache()  # (the allocation stays: held until its name is unregistered)
    c.close()
    wait_until(lambda: registered_regions(fake_cuda_server, "cuda") == before, 15)
    torch_caching.empty_cache()
