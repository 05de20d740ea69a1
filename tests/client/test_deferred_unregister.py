"""A server that defers an unregister (Triton 2.53 and later) never gets memory freed under it.

Triton 2.50-2.52 refuse to unregister a region a running request uses, so there
an unregister that succeeds proves the server done with the memory.  From 2.53
the same call succeeds at once and the server keeps the region -- and its
mapping of our memory -- until the requests using it end (server PR #7743).
``tritonshm.unregister`` asks the server whether it still has the region after
it said yes, so "unregistered" means "let go of" on every release: a region
still listed is "in use", and the memory stays ours to hold, as 2.51 has it.

The server here is 2.51; :class:`~support.deferring_triton.DeferringUnregisters`
makes it answer as 2.53 does.  The FAKE CUDA runtime catches memory freed while
the server has it open (``freed_while_open``).
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time

import numpy as np
import pytest

import tritonshm
from tritonshm import triton
from tritonshm.errors import ServerError

from support.deferring_triton import DeferringUnregisters
from triton_fixtures import client_url, make_client

pytestmark = pytest.mark.server

N = 16384  # floats: 64 KiB, a block of a 2 MiB segment of the caching double
SLOW = 0.5  # slow_fp32's delay


@pytest.fixture
def deferring(request, monkeypatch):
    """The session's server (or the fake-CUDA one, where the test asks for it) answering an
    unregister of a region in use as Triton 2.53 does; at the end, every such region removed."""
    server = request.getfixturevalue("fake_cuda_server" if "fake_cuda_server" in request.fixturenames else "server")
    shim = DeferringUnregisters(server).install(monkeypatch)
    yield shim
    shim.stop()


def _slow_request_on(server, protocol: str, region, started: threading.Event, done: threading.Event) -> None:
    """slow_fp32 reading INPUT0 from *region* and writing OUTPUT0 there (500 ms), on a client of
    this thread's own (tritonclient.http's work only in the thread that made them)."""
    module, tc = make_client(server, protocol)
    try:
        inp = module.InferInput("INPUT0", [4], "FP32")
        tritonshm.bind_input(inp, region, 0, 16)
        out = module.InferRequestedOutput("OUTPUT0", **({"binary_data": True} if protocol == "http" else {}))
        tritonshm.bind_output(out, region, 4096, 16)
        started.set()
        tc.infer("slow_fp32", [inp], outputs=[out])
    finally:
        done.set()
        tc.close()
        if protocol == "http":
            import gevent

            gevent.get_hub().destroy(destroy_loop=True)  # (the client's, made in this thread)


def test_an_unregister_the_server_defers_is_refused_until_the_server_let_go(server, protocol, deferring):
    _, tc = make_client(server, protocol)
    region = tritonshm.SystemRegion.create(8192)
    region.write(np.ones(4, np.float32))
    name = tritonshm.register(tc, region)
    started, done = threading.Event(), threading.Event()
    request = threading.Thread(target=_slow_request_on, args=(server, protocol, region, started, done))
    request.start()
    try:
        started.wait(5)
        time.sleep(0.2)  # (running on the server now)
        with pytest.raises(ServerError, match="currently in use"):
            tritonshm.unregister(tc, name, patience=0.0)
        assert deferring.deferred == 1  # (the server did defer it)
        assert name in triton.status(tc)  # it still has the region ...
        tritonshm.unregister(tc, name, patience=5.0)  # ... until the request ends
        assert done.is_set()
        assert name not in triton.status(tc)
    finally:
        request.join()
        region.close()
        tc.close()


def test_an_aio_unregister_the_server_defers_is_refused_until_the_server_let_go(server, deferring):
    import tritonclient.grpc.aio

    region = tritonshm.SystemRegion.create(8192)
    region.write(np.ones(4, np.float32))
    started, done = threading.Event(), threading.Event()

    async def main() -> None:
        tc = tritonclient.grpc.aio.InferenceServerClient(server.grpc_url)
        try:
            name = await tritonshm.register(tc, region)
            request = threading.Thread(target=_slow_request_on, args=(server, "grpc", region, started, done))
            request.start()
            try:
                started.wait(5)
                await asyncio.sleep(0.2)
                with pytest.raises(ServerError, match="currently in use"):
                    await tritonshm.unregister(tc, name, patience=0.0)
                assert deferring.deferred == 1
                await tritonshm.unregister(tc, name, patience=5.0)
                assert done.is_set() and name not in await triton.status(tc)
            finally:
                request.join()
        finally:
            await tc.close()

    try:
        asyncio.run(main())
    finally:
        region.close()


def test_close_never_frees_a_slot_whose_unregister_the_server_deferred(fake_cuda_server, deferring, torch_like):
    """A request given up on (client_timeout) still runs when the client closes: the unregister
    of its CUDA slot succeeds at once on 2.53, and the slot's memory must stay until the server
    removed the region -- within close()'s wait here (the request ends 500 ms after it began)."""
    x = torch_like.from_numpy(np.full(N, 7, np.float32))
    c = tritonshm.Client(client_url(fake_cuda_server, "grpc"), by_reference=False)  # x goes in a CUDA slot
    try:
        c.model_info("slow_fp32")
        with pytest.raises(tritonshm.ServerTimeout):
            c.infer("slow_fp32", {"INPUT0": x}, client_timeout=0.1)
    finally:
        c.close()
    assert deferring.deferred >= 1
    del x


def test_a_lent_allocation_whose_unregister_the_server_deferred_keeps_its_blocks(fake_cuda_server, fake_cuda,
                                                                                deferring, torch_caching):
    """A request given up on still writes its out= tensor; the next request lets go of the lent
    allocation (unregistered: deferred by the server) -- its blocks must not go to new tensors
    before the server is done with the request."""
    x = torch_caching.from_numpy(np.full(N, 7, np.float32))
    y = torch_caching.zeros(N)
    with tritonshm.Client(client_url(fake_cuda_server, "grpc")) as c:
        c.model_info("slow_fp32")
        with pytest.raises(tritonshm.ServerTimeout):
            c.infer("slow_fp32", {"INPUT0": x}, out={"OUTPUT0": y}, client_timeout=0.1)
        c.infer("identity_fp32", {"INPUT0": np.ones(4, np.float32)})  # its end lets go of what is due
        assert deferring.deferred >= 1
        y_ptr, x_ptr = y.ptr, x.ptr
        del y, x
        gc.collect()
        z, w = torch_caching.zeros(N), torch_caching.zeros(N)
        torch_caching.synchronize()  # (the zeros land now: a late write into z or w is seen below)
        assert {z.ptr, w.ptr}.isdisjoint({y_ptr, x_ptr})
        time.sleep(SLOW + 0.5)  # the request given up on has written its output by now
        assert not z.numpy().any() and not w.numpy().any()
        deadline = time.monotonic() + 5
        while c.stats().awaiting_server:  # let go of once the server removed the region
            assert time.monotonic() < deadline
            c.infer("identity_fp32", {"INPUT0": np.ones(4, np.float32)})
            time.sleep(0.05)
        del z, w
