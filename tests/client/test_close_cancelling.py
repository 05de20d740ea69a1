"""``close(cancel_requests=True)``: a client that closes without waiting for its requests, as
tritonclient's gRPC ``close()`` does (its channel closes under them: CANCELLED).

Requests queued by ``infer_async`` end cancelled, those waiting for a slot end with
ClientClosed, and those the server runs are cut off -- but the memory each names is held until
the server is done with it, and let go of (unregistered, freed) once it provably is, after the
close.  Against a real Triton: slow_fp32 answers 0.5 s after a request reaches it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import numpy as np
import pytest

import tritonshm
import tritonshm.aio
from tritonshm.client import _disposal
from tritonshm.errors import ClientClosed, ServerError

from triton_fixtures import client_url, registered_regions, wait_until

pytestmark = pytest.mark.server

N = 16384  # floats: 64 KiB


def slot_names(client) -> set[str]:
    return {name for pool in client.pools() for name in pool.regions}


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_cancelling_close_ends_every_request_and_the_server_keeps_its_slot_until_done(server, protocol):
    c = tritonshm.Client(client_url(server, protocol), slots=3, slot_timeout=30)  # (three workers)
    c.model_info("slow_fp32")
    x = np.ones(N, np.float32)
    running, second = (c.infer_async("slow_fp32", {"INPUT0": x}) for _ in range(2))
    time.sleep(0.2)  # (on the server now: it answers them at 0.5 and 1 s)
    lease = c.request("slow_fp32", shapes={"INPUT0": (N,)})  # the third slot, held by the caller
    waiting_worker = c.infer_async("slow_fp32", {"INPUT0": x})  # waits for a slot on the third worker
    queued = [c.infer_async("slow_fp32", {"INPUT0": x}) for _ in range(2)]  # behind them
    waiting: list[BaseException] = []

    def wait_for_a_slot() -> None:
        try:
            c.infer("slow_fp32", {"INPUT0": x}, slot_timeout=30)
        except BaseException as exc:
            waiting.append(exc)

    waiter = threading.Thread(target=wait_for_a_slot)
    waiter.start()
    time.sleep(0.05)
    names = slot_names(c)
    assert names
    c.close(cancel_requests=True)
    assert names & registered_regions(server), "close() waited for the server"
    cut = running.exception(timeout=10)  # cut off, not answered: close() did not wait for the server
    if protocol == "grpc":
        assert isinstance(cut, ServerError) and cut.status() == "StatusCode.CANCELLED", cut
    else:  # (its connection shut under it)
        assert isinstance(cut, ClientClosed), cut
    assert isinstance(second.exception(timeout=10), type(cut))
    assert all(future.cancelled() for future in queued)
    assert isinstance(waiting_worker.exception(timeout=10), ClientClosed)
    waiter.join(10)
    assert len(waiting) == 1 and isinstance(waiting[0], ClientClosed)
    del lease
    # The server still ran the request on the slot: its region was let go of only after that.
    wait_until(lambda: not names & registered_regions(server), 10)
    with tritonshm.Client(client_url(server, protocol)) as again:  # the server is fine
        np.testing.assert_array_equal(again.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"], x)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_an_aio_cancelling_close_ends_every_request_and_the_server_keeps_its_slot_until_done(server, protocol):
    x = np.ones(N, np.float32)

    async def main() -> set[str]:
        c = tritonshm.aio.Client(client_url(server, protocol), slots=1, slot_timeout=30)
        await c.model_info("slow_fp32")
        running = asyncio.ensure_future(c.infer("slow_fp32", {"INPUT0": x}))
        await asyncio.sleep(0.2)
        waiting = [asyncio.ensure_future(c.infer("slow_fp32", {"INPUT0": x})) for _ in range(2)]
        await asyncio.sleep(0.05)
        names = slot_names(c)
        assert names
        await c.close(cancel_requests=True)
        ends = await asyncio.gather(running, *waiting, return_exceptions=True)
        assert all(isinstance(end, ClientClosed) for end in ends), ends  # none answered: cut off
        return names

    names = asyncio.run(main())
    wait_until(lambda: not names & registered_regions(server), 10)


@pytest.mark.parametrize("aio", [False, True], ids=["sync", "aio"])
@pytest.mark.parametrize("by_reference", [True, False], ids=["lent", "slot"])
def test_gpu_memory_of_a_request_cut_off_by_close_is_held_until_the_server_let_go(fake_cuda_server, torch_caching,
                                                                                  by_reference, aio):
    """The caller's lent tensors (or the CUDA slot) of a request cut off: never freed (nor handed
    to another tensor) under the server; freed once it let go."""
    x = torch_caching.from_numpy(np.full(N, 7, np.float32))
    y = torch_caching.zeros(N)
    before = set(map(id, _disposal.held_for_the_server))
    url = client_url(fake_cuda_server, "grpc")

    def sync() -> BaseException | None:
        c = tritonshm.Client(url, slot_timeout=30, by_reference=by_reference)
        c.model_info("slow_fp32")
        running = c.infer_async("slow_fp32", {"INPUT0": x}, out={"OUTPUT0": y})
        time.sleep(0.2)  # (on the server now: it reads x, or the slot, and writes y, or the slot, at 0.5 s)
        c.close(cancel_requests=True)
        return running.exception(timeout=10)

    async def asynchronous() -> BaseException | None:
        c = tritonshm.aio.Client(url, slot_timeout=30, by_reference=by_reference)
        await c.model_info("slow_fp32")
        running = asyncio.ensure_future(c.infer("slow_fp32", {"INPUT0": x}, out={"OUTPUT0": y}))
        await asyncio.sleep(0.2)
        await c.close(cancel_requests=True)
        [end] = await asyncio.gather(running, return_exceptions=True)
        return end

    end = asyncio.run(asynchronous()) if aio else sync()
    assert isinstance(end, (ServerError, ClientClosed)), end  # cut off, not answered
    held = [e for e in _disposal.held_for_the_server if id(e) not in before]
    assert held and not any(e.memory.closed for e in held)  # the server still uses it: held
    wait_until(lambda: not any(e in _disposal.held_for_the_server for e in held), 10)
    assert all(e.memory.closed for e in held)
