"""The client under real CUDA semantics, on the adversarial FAKE runtime (issue 17).

Each test here is a defect a kind fake could not show: work that lands
only when its stream is synchronized, producers on their own streams and
threads, several devices, memory the server still has open, readers that
are still reading.  tritonshm runs on the fake (``fake_cuda``) and so does
a real Triton server (``fake_cuda_server``, the fake ``LD_PRELOAD``-ed).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import threading

import numpy as np
import pytest

import tritonshm
import tritonshm.aio
from tritonshm import triton

from triton_fixtures import client_url, refuse_unregister, sample
from support.insides import live_pools, parked


@pytest.fixture
def url(fake_cuda_server, protocol, fake_cuda):
    before = fake_cuda.stats()
    yield client_url(fake_cuda_server, protocol)
    # The server (another process) had our memory open: never freed under it, in any test here.
    assert (fake_cuda.stats() - before).freed_while_open == 0


@pytest.fixture(scope="module")
def two_gpu_server(fake_cudart_path):
    """A real Triton whose (fake) CUDA runtime has two devices, so it opens handles of cuda:1."""
    from fake_cuda import server_env
    from tritonshm.server import LocalServer

    from triton_fixtures import start_or_skip

    with start_or_skip(LocalServer(env=server_env(fake_cudart_path, TSHM_FAKE_CUDA_DEVICES="2"))) as srv:
        yield srv


def device_array(data: np.ndarray):
    """*data* copied into fresh (fake) device memory: a CudaArray holding its region."""
    with tritonshm.CudaRegion.create(max(1, data.nbytes)) as region:
        region.write(np.ascontiguousarray(data))
        return region.view(data.dtype, data.shape)


def registered_cuda_names(server) -> set[str]:
    with tritonshm.Client(server.grpc_url) as probe:
        return set(tritonshm.status(probe.tritonclient, kind="cuda"))


# -- 8. CUDA slots are 256-byte aligned ---------------------------------------------------------

def test_every_tensor_of_a_cuda_slot_is_256_byte_aligned(url):
    """cudaMalloc gives 256-byte alignment and Triton's device kernels assume it of every buffer."""
    with tritonshm.Client(url) as c:
        with c.request("add_sub", device="cuda:0") as req:  # two inputs of 64 bytes each
            pointers = [view.ptr for view in req.inputs.values()]
            assert all(ptr % 256 == 0 for ptr in pointers), [hex(p) for p in pointers]
            assert sorted(pointers)[1] - sorted(pointers)[0] == 256


# -- 4. memory the server has open is never freed under it ---------------------------------------

def test_close_waits_for_a_request_in_flight_on_another_thread(url, fake_cuda_server, fake_cuda):
    """close() while a device request runs (the server reading our CUDA slot for 500 ms): the
    request finishes with the right answer, then the memory is unregistered and freed."""
    data = sample(np.float32, 256)
    c = tritonshm.Client(url)
    c.infer("slow_fp32", {"INPUT0": device_array(data)})  # pool made and registered
    order = []
    started = threading.Event()

    def run():
        started.set()
        out = c.infer("slow_fp32", {"INPUT0": device_array(data)})["OUTPUT0"].get()
        order.append("request done")
        return out

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(run)
        started.wait()
        while not c.pools()[0].running:  # the request holds its slot: it is in flight
            threading.Event().wait(0.001)
        c.close()
        order.append("close returned")
        np.testing.assert_array_equal(future.result(), data)
    assert order == ["request done", "close returned"]
    assert not registered_cuda_names(fake_cuda_server) & {n for n in parked(c)}
    gc.collect()


def test_a_refused_unregistration_keeps_device_memory_for_the_server(url, fake_cuda, monkeypatch):
    """close() while the server refuses to unregister a CUDA extent (it may still be reading it):
    the memory is held for the life of the process, never freed under the server."""
    from fake_cuda import KIND_ALLOC
    from tritonshm.client._disposal import held_for_the_server

    data = sample(np.float32, 64)
    c = tritonshm.Client(url, slot_timeout=0.2)  # close() asks again for up to 0.2 s
    c.infer("identity_fp32", {"INPUT0": device_array(data)})
    (name,) = c.pools()[0].regions
    real_unregister = triton.unregister
    refuse_unregister(monkeypatch, name)
    c.close()
    gc.collect()
    (extent,) = [e for e in held_for_the_server if e.name == name]
    assert fake_cuda.pointer_kind(extent.memory.region.ptr) == KIND_ALLOC  # still allocated
    # Clean up for the leak check, as the server letting go would allow.
    held_for_the_server.remove(extent)
    with tritonshm.Client(url) as helper:
        real_unregister(helper.tritonclient, name)
    extent.memory.close()


def test_close_asks_again_while_the_server_is_still_letting_go(url, fake_cuda, monkeypatch):
    """Triton answers a request before it has released the request's regions: an unregistration
    right after is refused ("currently in use") for a moment.  close() asks again; the memory
    is freed once the server has let go, and nothing is held back."""
    from fake_cuda import KIND_UNKNOWN
    from tritonshm.client._disposal import held_for_the_server

    c = tritonshm.Client(url)
    c.infer("identity_fp32", {"INPUT0": device_array(sample(np.float32, 64))})
    (name,) = c.pools()[0].regions
    ptr = next(iter(live_pools(c).values())).extents[0].memory.region.ptr
    refusals = refuse_unregister(monkeypatch, name, times=3)
    c.close()
    gc.collect()
    assert len(refusals) == 3
    assert fake_cuda.pointer_kind(ptr) == KIND_UNKNOWN
    assert not [e for e in held_for_the_server if e.name == name]


def test_refused_device_memory_is_retried_by_later_requests(url, fake_cuda, monkeypatch):
    """A retired CUDA extent whose unregistration was refused is parked, still allocated, and
    retried after later requests: freed once the server lets go."""
    from fake_cuda import KIND_ALLOC, KIND_UNKNOWN

    c = tritonshm.Client(url, slots=1)
    try:
        small = sample(np.float32, 16)
        c.infer("identity_fp32", {"INPUT0": device_array(small)})
        (old,) = c.pools()[0].regions
        refusals = refuse_unregister(monkeypatch, old, times=1)
        big = sample(np.float32, 1 << 16)
        c.infer("identity_fp32", {"INPUT0": device_array(big)})  # a larger pool replaces the first
        assert refusals == [old]
        (extent,) = parked(c)
        ptr = extent.memory.region.ptr
        assert extent.name == old and fake_cuda.pointer_kind(ptr) == KIND_ALLOC
        c.infer("identity_fp32", {"INPUT0": device_array(small)})  # retried: goes through now
        gc.collect()
        assert parked(c) == [] and fake_cuda.pointer_kind(ptr) == KIND_UNKNOWN
    finally:
        c.close()


def test_a_copy_mode_lease_keeps_its_device_memory_while_it_runs(fake_cuda):
    """A request that copies its results out holds no view of its slot; its lease still keeps the
    device memory alive, so an extent closed under it is freed only when the request is over."""
    from fake_cuda import KIND_ALLOC, KIND_UNKNOWN
    from tritonshm.client._model import ModelInfo
    from tritonshm.client._pool import ByteBudget, Layout, SlotPool
    from tritonshm.client._slots import CudaSlotMemory

    info = ModelInfo.__new__(ModelInfo)
    pool = SlotPool(info, Layout.for_capacities({"x": 1024}), 2, ByteBudget(1 << 20), CudaSlotMemory)
    extent = pool.new_extent()
    pool.add_extent(extent)
    ptr = extent.memory.region.ptr
    lease = pool.try_acquire(hold=False)
    for dropped in pool.close():   # the client closing under the request
        dropped.memory.close()
    gc.collect()
    assert fake_cuda.pointer_kind(ptr) == KIND_ALLOC
    pool.finished_and_back(lease)
    del lease
    gc.collect()
    assert fake_cuda.pointer_kind(ptr) == KIND_UNKNOWN


# -- 1. run() sends what the caller's stream wrote ---------------------------------------------

def test_run_waits_for_the_callers_current_stream(url, torch_like):
    """The README's zero-copy example: a torch-like copy_ into the slot, queued on the caller's
    (non-default) current stream, then run(): the server must read what the copy wrote."""
    data = sample(np.float32, 4096)
    with tritonshm.Client(url) as c:
        with c.request("identity_fp32", shapes={"INPUT0": (4096,)}, device="cuda:0") as req:
            with torch_like.stream(0):
                torch_like.from_dlpack(req.inputs["INPUT0"]).copy_(data)
                out = req.run()["OUTPUT0"]
            np.testing.assert_array_equal(out.get(), data)
            del out


def test_run_with_an_explicit_stream(url, torch_like):
    data = sample(np.float32, 4096)
    with tritonshm.Client(url) as c:
        with c.request("identity_fp32", shapes={"INPUT0": (4096,)}, device="cuda:0") as req:
            with torch_like.stream(0) as side:
                torch_like.from_dlpack(req.inputs["INPUT0"]).copy_(data)
            out = req.run(stream=side)["OUTPUT0"]  # not the current stream any more: named
            np.testing.assert_array_equal(out.get(), data)
            del out


def test_aio_run_orders_at_call_time_without_blocking_the_loop(url, torch_like, fake_cuda):
    data = sample(np.float32, 4096)

    async def main():
        async with tritonshm.aio.Client(url) as c:
            req = await c.request("identity_fp32", shapes={"INPUT0": (4096,)}, device="cuda:0")
            with torch_like.stream(0):
                torch_like.from_dlpack(req.inputs["INPUT0"]).copy_(data)
                pending = req.run()  # the order point is taken here, on the side stream
            before = fake_cuda.stats()
            out = (await pending)["OUTPUT0"]
            used = fake_cuda.stats() - before
            assert used.event_syncs == 0 and used.event_queries >= 1  # polled, never a blocking sync
            result = out.get()
            del out
            req.close()
            return result

    np.testing.assert_array_equal(asyncio.run(main()), data)


# -- 2. the ordering point is taken on the caller's thread, at call time ---------------------------

def test_infer_async_orders_after_the_callers_stream(url, torch_like):
    data = sample(np.float32, 4096)
    with tritonshm.Client(url) as c:
        with torch_like.stream(0):
            asked = torch_like.provider_calls
            x = torch_like.from_numpy(data)  # queued on the caller's side stream, not landed
            future = c.infer_async("identity_fp32", {"INPUT0": x})
            assert torch_like.provider_calls > asked  # its current stream asked for, on this thread, now
        np.testing.assert_array_equal(future.result()["OUTPUT0"].get(), data)
        # The event is recorded on the caller's own stream (issue 40): its DLPack handshake, asked
        # to order before that very stream, has nothing to do.
        assert torch_like.handshakes == 0


def test_a_producer_whose_stream_is_unknown_orders_itself_by_its_handshake(url, torch_like):
    """Where no current-stream provider knows the producer (a library tritonshm does not know),
    the ordering point is on the legacy default stream, and the producer's DLPack handshake
    orders its own stream's work before it."""
    from tritonshm.cuda import current_stream_providers

    data = sample(np.float32, 4096)
    current_stream_providers.remove(torch_like.current_stream_provider)
    try:
        with tritonshm.Client(url) as c:
            with torch_like.stream(0):
                x = torch_like.from_numpy(data)  # on a side stream nobody told tritonshm of
                future = c.infer_async("identity_fp32", {"INPUT0": x})
            np.testing.assert_array_equal(future.result()["OUTPUT0"].get(), data)
            assert torch_like.handshakes >= 1
    finally:
        current_stream_providers.insert(0, torch_like.current_stream_provider)


def test_a_chunked_batch_orders_every_chunk_after_the_callers_stream(url, torch_like):
    data = sample(np.float32, 21 * 4).reshape(21, 4)  # 3 chunks of max_batch_size 8, on worker threads
    with tritonshm.Client(url) as c:
        with torch_like.stream(0):
            x = torch_like.from_numpy(data)
            out = c.infer("batched_fp32", {"INPUT0": x})["OUTPUT0"]
        np.testing.assert_array_equal(out.get(), data * 2)


def test_aio_infer_captures_when_called_not_when_awaited(url, torch_like):
    data = sample(np.float32, 4096)

    async def main():
        async with tritonshm.aio.Client(url) as c:
            with torch_like.stream(0):
                x = torch_like.from_numpy(data)
                pending = c.infer("identity_fp32", {"INPUT0": x})
            return (await pending)["OUTPUT0"].get()  # awaited on the legacy stream

    np.testing.assert_array_equal(asyncio.run(main()), data)


def test_cai_producer_stream_is_waited_for(url, cupy_like):
    data = sample(np.float32, 4096)
    with tritonshm.Client(url) as c:
        with cupy_like.stream(0):
            x = CaiOnly(cupy_like.asarray(data))  # its CAI names the side stream it was made on
        future = c.infer_async("identity_fp32", {"INPUT0": x})
        np.testing.assert_array_equal(future.result()["OUTPUT0"].get(), data)


class CaiOnly:
    """A device array that speaks only the CUDA Array Interface (its stream included)."""

    def __init__(self, array):
        self._array = array
        self.__cuda_array_interface__ = array.__cuda_array_interface__


# -- 3. several GPUs ---------------------------------------------------------------------------

def test_a_tensor_on_gpu_1_while_gpu_0_is_current(two_gpu_server, fake_cuda, torch_like, monkeypatch):
    """torch refuses DLPack export off the current device: the client exports under the tensor's
    device, gives the thread its device back, and the pool lives on cuda:1."""
    monkeypatch.setenv("TSHM_FAKE_CUDA_DEVICES", "2")
    data = sample(np.float32, 1024)
    fake_cuda.set_device(0)
    x = torch_like.from_numpy(data, device=1)
    with pytest.raises(BufferError, match="different CUDA device"):
        x.__dlpack__(stream=1)  # the double is as strict as torch
    with tritonshm.Client(two_gpu_server.grpc_url, transport="cuda") as c:
        out = c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]
        assert out.device == 1
        np.testing.assert_array_equal(out.get(), data)
        assert [p.memory for p in c.pools()] == ["cuda:1"]
        assert fake_cuda.get_device() == 0
        del out


def test_an_out_tensor_on_another_gpu_than_the_slot_is_copied_into_in_its_streams_order(
        two_gpu_server, fake_cuda, torch_like, monkeypatch):
    """The input on cuda:0 (its slot there), out= on cuda:1, copied into (by_reference=False): the
    copy out of the slot is queued on our copy stream of cuda:0 and the out= tensor's stream on
    cuda:1 waits for it -- not queued on that stream, whose device is not the copy's (its event
    could not be recorded there)."""
    monkeypatch.setenv("TSHM_FAKE_CUDA_DEVICES", "2")
    data = sample(np.float32, 1024)
    x = torch_like.from_numpy(data, device=0)
    with torch_like.stream(1):  # y's work goes on a stream of cuda:1, side
        y = torch_like.empty(1024, np.float32, device=1)
        with tritonshm.Client(two_gpu_server.grpc_url, transport="cuda", by_reference=False) as c:
            got = c.infer("identity_fp32", {"INPUT0": x}, out={"OUTPUT0": y}, output_device="cuda:1")["OUTPUT0"]
            assert got is y and [p.memory for p in c.pools()] == ["cuda:0"]
            np.testing.assert_array_equal(y.numpy(), data)  # .numpy(): on y's current stream, side


def test_a_process_that_only_uses_gpu_1_makes_no_context_on_gpu_0(two_gpu_server, fake_cuda, monkeypatch):
    monkeypatch.setenv("TSHM_FAKE_CUDA_DEVICES", "2")
    data = sample(np.float32, 1024)

    def only_gpu_1():
        fake_cuda.reset_contexts()  # as in a fresh process (a fresh thread starts on device 0)
        with tritonshm.Client(two_gpu_server.grpc_url) as c:
            out = c.infer("identity_fp32", {"INPUT0": data}, output_device="cuda:1")["OUTPUT0"]
            result = out.get()
            del out
        return result, fake_cuda.contexts()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        result, contexts = pool.submit(only_gpu_1).result()
    np.testing.assert_array_equal(result, data)
    assert contexts == {1}, contexts


# -- 5. a slot is reused only when its readers' streams are done ----------------------------------

def test_a_slot_is_not_reused_before_the_consumers_stream_has_read_it(url, torch_like, fake_cuda):
    """A copy=False result taken by a torch-like consumer on its own stream, a kernel still
    queued there when the tensor dies: the slot stays held until that stream gets there."""
    data = sample(np.float32, 64)
    with tritonshm.Client(url, slots=1) as c:
        view = c.infer("identity_fp32", {"INPUT0": device_array(data)}, copy=False)["OUTPUT0"]
        with torch_like.stream(0) as side:
            consumer = torch_like.from_dlpack(view)
            busy = torch_like.empty(1 << 16, device=0)
            busy.fill_(1.0)  # the consumer's stream has work queued after it took the slot
            del view, consumer  # deleters run now; the stream has not got there
            gc.collect()
        assert c.pools()[0].held == 1
        fake_cuda.stream_synchronize(side)
        assert c.pools()[0].held == 0
        del busy


def test_a_failing_collect_leaves_no_copy_queued_out_of_the_slot(url, fake_cuda, monkeypatch):
    """A request whose second result cannot be made (out of device memory) after the first one's
    copy was queued: the slot goes back and the first result is dropped -- a caching allocator
    hands its block out again at once -- so that copy must have landed first."""
    from tritonshm.client import _devices

    x = device_array(np.zeros(16, np.float32))
    with tritonshm.Client(url, slots=1) as c:  # (no slot to spare for results in place: copied out)
        c.infer("add_sub", {"INPUT0": x, "INPUT1": x})  # the pool is made
        real, calls, kept = _devices.empty, [], []

        def empty(*args, **kwargs):
            calls.append(1)
            if len(calls) == 2:
                raise MemoryError("out of device memory for OUTPUT1")
            kept.append(real(*args, **kwargs))  # a caching allocator keeps the block: no cudaFree, no sync
            return kept[-1]

        monkeypatch.setattr(_devices, "empty", empty)
        with pytest.raises(MemoryError):
            c.infer("add_sub", {"INPUT0": x, "INPUT1": x})
        try:
            assert fake_cuda.pending() == 0, "the slot came back with a copy out of it still queued"
        finally:
            fake_cuda.device_synchronize()
            kept.clear()


@pytest.mark.parametrize("status, message, freed", [
    ("StatusCode.UNAVAILABLE", "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: "
                               "Failed to connect to remote host: Connection refused", True),
    ("StatusCode.UNAVAILABLE", "Socket closed", False),  # cut off after it went out: alive, maybe slow
    ("StatusCode.UNAVAILABLE", "Received http2 header with status: 502", False),  # a proxy's
], ids=["refused", "socket-closed", "gateway"])
def test_device_memory_of_an_unreachable_server_is_parked_then_freed(url, fake_cuda, monkeypatch, status,
                                                                     message, freed):
    """An unregistration that cannot reach the server (a network failure: the server may still have
    our memory open) parks device memory; close() asks again, and frees it only once the server
    has stayed unreachable -- no connection made, nothing listening -- for the whole settle time
    (gone: it holds nothing).  A call cut off after it went out says nothing of the server, which
    may be alive and slow: that memory is held for the life of the process (it was freed)."""
    from fake_cuda import KIND_ALLOC, KIND_UNKNOWN
    from tritonshm.client import _disposal
    from tritonshm.errors import ServerUnavailable

    c = tritonshm.Client(url, slot_timeout=0.3)
    c.infer("identity_fp32", {"INPUT0": device_array(sample(np.float32, 64))})
    (name,) = c.pools()[0].regions
    ptr = next(iter(live_pools(c).values())).extents[0].memory.region.ptr
    seen = []
    with tritonshm.Client(url) as helper:  # as a server that went away would: it holds nothing
        triton.unregister(helper.tritonclient, name)
    refuse_unregister(monkeypatch, name, error=ServerUnavailable(f"unregistering {name!r}: {message}", status=status),
                      before=lambda: seen.append(fake_cuda.pointer_kind(ptr)))  # still allocated at every try
    c.close()
    gc.collect()
    assert len(seen) > 1 and set(seen) == {KIND_ALLOC}  # asked again while parked
    held = [e for e in _disposal.held_for_the_server if e.name == name]
    try:
        assert fake_cuda.pointer_kind(ptr) == (KIND_UNKNOWN if freed else KIND_ALLOC)
        assert len(held) == (0 if freed else 1)
    finally:
        for extent in held:  # (this test's own clean-up: the server holds nothing of it)
            _disposal.held_for_the_server.remove(extent)
            extent.release_memory()
