"""GPU tensors through the high-level client on a real GPU: torch, cupy, a real Triton.

Run on a CUDA machine with ``pytest -m gpu`` (tests/gpu/run.sh on the
offline GPU machine).  Everything skips where no GPU is usable; the same
logic runs on every machine against the fake runtime in test_client_cuda.py.
"""

from __future__ import annotations

import concurrent.futures
import gc
import time
import warnings

import ml_dtypes
import numpy as np
import pytest

import tritonshm
from tritonshm import cuda
from tritonshm._memory import _runtime
from tritonshm.client._devices import as_device_tensor

from triton_fixtures import NUMERIC_IDENTITY_MODELS, client_url, sample, start_or_skip

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu")]

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def _on_gpu(torch, data: np.ndarray):
    if data.dtype == BFLOAT16:  # torch takes no ml_dtypes array: the same bits, as torch.bfloat16
        return torch.from_numpy(np.ascontiguousarray(data).view(np.int16)).view(torch.bfloat16).to("cuda:0")
    return torch.from_numpy(np.ascontiguousarray(data)).to("cuda:0")


def _on_host(tensor) -> np.ndarray:
    """A torch tensor's values as numpy (bfloat16 as ml_dtypes', which torch's numpy() refuses)."""
    import torch

    if tensor.dtype == torch.bfloat16:
        return tensor.cpu().view(torch.int16).numpy().view(BFLOAT16)
    return tensor.cpu().numpy()


@pytest.mark.parametrize("model, dtype", sorted(NUMERIC_IDENTITY_MODELS.items()))
def test_torch_round_trip_for_every_dtype(server, protocol, torch, model, dtype):
    data = sample(dtype, 4099)
    with tritonshm.Client(client_url(server, protocol)) as c:
        out = c.infer(model, {"INPUT0": _on_gpu(torch, data)})["OUTPUT0"]
        assert isinstance(out, torch.Tensor) and out.is_cuda
        assert _on_host(out).dtype == np.dtype(dtype)
        np.testing.assert_array_equal(_on_host(out), data)
        assert [(p.model, p.memory) for p in c.pools()] == [(model, "cuda:0")]


def test_cupy_round_trip_and_copy_false_views(server, cupy):
    data = sample(np.float32, 1 << 16)
    with tritonshm.Client(server.grpc_url) as c:
        out = c.infer("identity_fp32", {"INPUT0": cupy.asarray(data)})["OUTPUT0"]
        assert isinstance(out, cupy.ndarray)
        np.testing.assert_array_equal(cupy.asnumpy(out), data)
        view = c.infer("identity_fp32", {"INPUT0": cupy.asarray(data)}, copy=False)["OUTPUT0"]
        assert isinstance(view, cuda.CudaArray)
        np.testing.assert_array_equal(cupy.asnumpy(cupy.asarray(view)), data)


def test_results_held_by_torch_stay_intact_across_later_requests(server, torch):
    with tritonshm.Client(server.grpc_url, slots=2) as c:
        kept = []
        for i in range(10):
            data = sample(np.float32, 1 << 14, seed=i)
            view = c.infer("identity_fp32", {"INPUT0": _on_gpu(torch, data)}, copy=False)["OUTPUT0"]
            kept.append((data, torch.from_dlpack(view)))  # only the DLPack tensor holds the slot
            del view
        gc.collect()
        for data, tensor in kept:
            np.testing.assert_array_equal(tensor.cpu().numpy(), data)
        assert c.pools()[0].held == 10
        del kept, tensor
        gc.collect()
        assert c.pools()[0].held == 0


def test_cudaarray_results_in_place_stay_intact_and_read_through_torch(server, torch):
    """CudaArray inputs: results are the slot the server wrote (copy=True, a slot to spare), later
    requests never write them, and torch reads them through DLPack on the real card."""
    with tritonshm.Client(server.grpc_url, slots=4) as c, tritonshm.CudaRegion.create(4 << 14) as region:
        x = region.view(np.float32, 1 << 14)
        kept = []
        for i in range(6):
            data = sample(np.float32, 1 << 14, seed=i)
            cuda.copy(x, data)
            kept.append((data, c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]))
        in_slots = [c._engine.pool_table.own_slot(as_device_tensor(out)) is not None for _, out in kept]
        assert in_slots == [False, True, True, True, False, False]  # (the first made the pool)
        for data, out in kept:
            assert isinstance(out, cuda.CudaArray)
            np.testing.assert_array_equal(torch.from_dlpack(out).cpu().numpy(), data)
        del kept, out, x
        gc.collect()
        torch.cuda.synchronize()  # (torch's reads of the slots are done: they come back)
        deadline = time.monotonic() + 5
        while any(pool.held for pool in c.pools()) and time.monotonic() < deadline:
            time.sleep(0.01)  # (readers let go of a slot asynchronously: looked at again)
        assert all(pool.held == 0 for pool in c.pools())


def test_chunked_torch_batch(server, torch):
    with tritonshm.Client(server.grpc_url) as c:
        limit = c.model_info("batched_fp32").max_batch_size
        data = sample(np.float32, (limit * 3 + 1) * 4).reshape(limit * 3 + 1, 4)
        out = c.infer("batched_fp32", {"INPUT0": _on_gpu(torch, data)})["OUTPUT0"]
        assert isinstance(out, torch.Tensor) and tuple(out.shape) == data.shape
        np.testing.assert_array_equal(out.cpu().numpy(), data * 2)


def test_eight_threads_times_200_requests_verified(server, torch):
    with tritonshm.Client(server.grpc_url, slots=4) as c:
        def work(seed):
            for i in range(200):
                data = torch.full((1024,), float(seed * 1000 + i), device="cuda:0")
                out = c.infer("identity_fp32", {"INPUT0": data})["OUTPUT0"]
                assert bool((out == seed * 1000 + i).all()), (seed, i)

        with concurrent.futures.ThreadPoolExecutor(8) as threads:
            list(threads.map(work, range(8)))  # re-raises the first failure


def test_zero_copy_device_request_filled_by_torch(server, torch):
    with tritonshm.Client(server.grpc_url) as c:
        with c.request("batched_fp32", batch_size=8, device="cuda:0") as req:
            torch.from_dlpack(req.inputs["INPUT0"]).copy_(torch.arange(32.0, device="cuda:0").reshape(8, 4))
            out = torch.from_dlpack(req.run()["OUTPUT0"])
            assert bool((out == torch.arange(32.0, device="cuda:0").reshape(8, 4) * 2).all())


def test_host_inputs_with_results_on_the_gpu(server, torch):
    data = sample(np.float32, 1000)
    with tritonshm.Client(server.grpc_url, pinned=True) as c:
        out = c.infer("identity_fp32", {"INPUT0": data}, output_device="cuda")["OUTPUT0"]
        assert isinstance(out, cuda.CudaArray)
        np.testing.assert_array_equal(out.get(), data)


def test_falls_back_to_pinned_slots_when_the_server_cannot_open_our_handles(torch):
    from tritonshm.server import LocalServer

    data = sample(np.float32, 4096)
    # A server that sees no GPU: it cannot open our CUDA handles.
    with start_or_skip(LocalServer(env={"CUDA_VISIBLE_DEVICES": ""})) as srv:
        with tritonshm.Client(srv.grpc_url) as c:
            with pytest.warns(RuntimeWarning, match="pinned system shared memory"):
                out = c.infer("identity_fp32", {"INPUT0": _on_gpu(torch, data)})["OUTPUT0"]
            assert isinstance(out, torch.Tensor) and out.is_cuda
            np.testing.assert_array_equal(out.cpu().numpy(), data)
            assert [p.memory for p in c.pools()] == ["pinned:0"]
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                c.infer("identity_fp32", {"INPUT0": _on_gpu(torch, data)})
        with tritonshm.Client(srv.grpc_url, transport="cuda") as c:
            with pytest.raises(tritonshm.SharedMemoryRefused):
                c.infer("identity_fp32", {"INPUT0": _on_gpu(torch, data)})


def test_thousand_requests_leak_nothing(server, torch):
    data = _on_gpu(torch, sample(np.float32, 1 << 16))
    with tritonshm.Client(server.grpc_url) as c:
        for _ in range(20):  # the pool and torch's caches settle
            c.infer("identity_fp32", {"INPUT0": data})
        torch.cuda.synchronize()
        free_before = _runtime.current().mem_info(0)[0]
        for _ in range(1000):
            out = c.infer("identity_fp32", {"INPUT0": data})["OUTPUT0"]
        assert bool((out == data).all())
        del out
        gc.collect()
        torch.cuda.synchronize()
        # torch caches what it frees; our own allocations are one pool and no more
        assert _runtime.current().mem_info(0)[0] >= free_before - (8 << 20)
        names = {name for pool in c.pools() for name in pool.regions}
        assert len(names) == 1
        assert names <= set(tritonshm.status(c.tritonclient, kind="cuda"))
    with tritonshm.Client(server.grpc_url) as probe:
        assert not names & set(tritonshm.status(probe.tritonclient, kind="cuda"))


# -- ordering under real CUDA semantics (issue 17): producers on their own streams and threads --------

def _big_then_small(torch, data: np.ndarray, stream):
    """*data* written on *stream* behind enough queued work that a reader not ordered after the
    stream would see the old bytes: a large matmul first, then the copy of *data*."""
    with torch.cuda.stream(stream):
        ballast = torch.randn(4096, 4096, device="cuda:0")
        for _ in range(4):
            ballast = ballast @ ballast
        out = torch.empty(len(data), dtype=torch.float32, device="cuda:0")
        out.copy_(torch.from_numpy(data).pin_memory(), non_blocking=True)
    return out, ballast


def test_an_input_written_on_a_side_stream_is_sent_as_written(server, torch):
    data = sample(np.float32, 1 << 20)
    side = torch.cuda.Stream()
    with tritonshm.Client(server.grpc_url) as c, torch.cuda.stream(side):
        for _ in range(5):
            x, _ = _big_then_small(torch, data, side)
            out = c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]
            np.testing.assert_array_equal(out.cpu().numpy(), data)  # results complete on return


def test_infer_async_orders_after_the_callers_stream_not_the_workers(server, torch):
    data = sample(np.float32, 1 << 20)
    side = torch.cuda.Stream()
    with tritonshm.Client(server.grpc_url) as c:
        with torch.cuda.stream(side):
            futures = [c.infer_async("identity_fp32", {"INPUT0": _big_then_small(torch, data, side)[0]})
                       for _ in range(4)]
        for future in futures:
            np.testing.assert_array_equal(future.result()["OUTPUT0"].cpu().numpy(), data)


def test_run_sends_what_a_side_stream_copy_wrote(server, torch):
    data = sample(np.float32, 1 << 20)
    side = torch.cuda.Stream()
    with tritonshm.Client(server.grpc_url) as c:
        for _ in range(5):
            with c.request("identity_fp32", shapes={"INPUT0": (len(data),)}, device="cuda:0") as req:
                with torch.cuda.stream(side):
                    x, _ = _big_then_small(torch, data, side)
                    torch.from_dlpack(req.inputs["INPUT0"]).copy_(x)
                    out = req.run()["OUTPUT0"]  # ordered after side: torch's current stream here
                np.testing.assert_array_equal(out.get(), data)


def test_two_threads_each_on_its_own_stream(server, torch):
    def worker(seed):
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream), tritonshm.Client(server.grpc_url) as c:
            for i in range(20):
                data = sample(np.float32, 1 << 16, seed=seed * 100 + i)
                x, _ = _big_then_small(torch, data, stream) if i % 5 == 0 else (None, None)
                if x is None:
                    x = torch.from_numpy(data).to("cuda:0", non_blocking=False)
                out = c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]
                np.testing.assert_array_equal(out.cpu().numpy(), data)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for future in [pool.submit(worker, seed) for seed in range(2)]:
            future.result()


def test_a_tensor_on_the_second_gpu_while_the_first_is_current(server, torch):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    data = sample(np.float32, 4096)
    with tritonshm.Client(server.grpc_url) as c:
        torch.cuda.set_device(0)
        x = torch.from_numpy(data).to("cuda:1")
        out = c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]
        assert out.device.index == 1
        np.testing.assert_array_equal(out.cpu().numpy(), data)
        assert torch.cuda.current_device() == 0


def test_a_torch_tensor_streams_through_a_cuda_slot(server, torch):
    """A decoupled model on a real GPU: the input goes through a CUDA slot (the server reads it
    through CUDA IPC), every response's output lands back on the GPU as a torch tensor."""
    data = sample(np.float32, 1 << 12)
    x = _on_gpu(torch, data)
    with tritonshm.Client(server.grpc_url) as c:
        responses = list(c.stream("stream_fp32", {"INPUT0": x, "COUNT": np.array([4], np.int32)}))
        assert len(responses) == 4
        for i, response in enumerate(responses):
            assert isinstance(response["OUTPUT0"], torch.Tensor) and response["OUTPUT0"].is_cuda
            np.testing.assert_array_equal(response["OUTPUT0"].cpu().numpy(), data + i)
        assert [(p.memory, p.running) for p in c.pools()] == [("cuda:0", 0)]


# -- GPU tensors by reference (the caller's allocations lent to the server) --------------------------


@pytest.mark.parametrize("nbytes", [64 << 10, 16 << 20])
def test_torch_inputs_are_sent_by_reference(server, protocol, torch, nbytes):
    data = sample(np.float32, nbytes // 4)
    x = _on_gpu(torch, data)
    with tritonshm.Client(client_url(server, protocol)) as c:
        for _ in range(3):
            out = c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]
            np.testing.assert_array_equal(out.cpu().numpy(), data)
        stats = c.stats()
        assert (stats.inputs_lent, stats.registrations, stats.copied) == (3, 1, {})
        (lent,) = c.lent()
        assert lent.base <= x.data_ptr() < lent.base + lent.nbytes  # torch's segment, not the tensor
        y = torch.empty_like(x)
        assert c.infer("identity_fp32", {"INPUT0": x}, out={"OUTPUT0": y})["OUTPUT0"] is y
        torch.testing.assert_close(y, x, rtol=0, atol=0)
        assert c.stats().outputs_lent == 1
        c.forget()
        assert not c.lent()


def test_a_torch_block_freed_and_reused_between_requests_is_read_right(server, torch):
    with tritonshm.Client(server.grpc_url) as c:
        for i in range(20):
            x = torch.full((4096,), float(i), device="cuda")  # the allocator hands blocks out again
            out = c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]
            assert bool((out == i).all())
            del x, out
        stats = c.stats()
        assert stats.inputs_lent == 20 and stats.registrations <= 2 and not stats.copied
        c.forget()
        torch.cuda.empty_cache()  # nothing registered any more: the segments may go


def test_cupy_inputs_are_sent_by_reference(server, cupy):
    data = sample(np.float32, 1 << 16)
    x = cupy.asarray(data)
    with tritonshm.Client(server.grpc_url) as c:
        out = c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]
        np.testing.assert_array_equal(cupy.asnumpy(out), data)
        assert c.stats().inputs_lent == 1 and not c.stats().copied


def test_torch_cuda_malloc_async_is_copied_and_said(server, torch):
    """Memory CUDA IPC cannot export (here: cudaMallocAsync through cupy's async pool, which any
    machine with cupy has; torch's own backend:cudaMallocAsync needs its setting at start-up)."""
    cupy = pytest.importorskip("cupy")
    pool = cupy.cuda.MemoryAsyncPool()
    data = sample(np.float32, 1 << 12)
    with cupy.cuda.using_allocator(pool.malloc):
        x = cupy.asarray(data)
    with tritonshm.Client(server.grpc_url) as c:
        out = c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]
        np.testing.assert_array_equal(cupy.asnumpy(out), data)
        stats = c.stats()
        assert stats.inputs_lent == 0 and sum(stats.copied.values()) == 1


def test_a_refused_export_leaves_torch_usable_and_is_asked_once(server, torch):
    """On an H200 the refused export of a cupy MemoryAsyncPool array (cudaIpcGetMemHandle: invalid
    value) stayed on the CUDA runtime's last error -- torch's instance, which tritonshm's dlopen
    returns -- and the caller's next torch kernel raised "CUDA error: invalid argument".  Nothing
    is left now, and the second request of the same allocation asks CUDA nothing."""
    import ctypes

    from tritonshm._memory import _cuda_region

    cupy = pytest.importorskip("cupy")
    pool = cupy.cuda.MemoryAsyncPool()
    data = sample(np.float32, 1 << 12)
    with cupy.cuda.using_allocator(pool.malloc):
        x = cupy.asarray(data)
    cudart = ctypes.CDLL(_runtime.current().library)  # the loaded instance: its last error is ours
    with tritonshm.Client(server.grpc_url) as c:
        refusals = _cuda_region.export_refusals()
        for _ in range(2):
            out = c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]
            np.testing.assert_array_equal(cupy.asnumpy(out), data)
            assert cudart.cudaPeekAtLastError() == 0
            y = torch.rand(8, 4, device="cuda")  # raised torch.AcceleratorError on the H200
            assert y.shape == (8, 4) and bool(((y >= 0) & (y < 1)).all())
        torch.cuda.synchronize()
        assert torch.ones(3, device="cuda").mul(2).sum().item() == 6.0  # torch.cuda stays usable
        assert _cuda_region.export_refusals() == refusals + 1  # asked once: the refusal is remembered
        stats = c.stats()
        assert stats.inputs_lent == 0 and sum(stats.copied.values()) == 2
        del out


# -- lending without hazards (issue 30) ------------------------------------------------------------

def test_a_timed_out_request_keeps_its_tensors_until_the_server_is_done(server, torch):
    """slow_fp32 answers after 500 ms; the client gives up at 0.1 s and the caller drops its out=
    tensor: torch must not hand that block to the next tensor while the request may still write
    it, and the retry into a kept out= waits for the old request instead of racing its write."""
    n = 1 << 14
    x = torch.full((n,), 7.0, device="cuda")
    y = torch.zeros(n, device="cuda")
    with tritonshm.Client(server.grpc_url) as c:
        c.model_info("slow_fp32")
        with pytest.raises(tritonshm.ServerTimeout):
            c.infer("slow_fp32", {"INPUT0": x}, out={"OUTPUT0": y}, client_timeout=0.1)
        y_ptr = y.data_ptr()
        del y
        z = torch.zeros(n, device="cuda")
        assert z.data_ptr() != y_ptr  # still held for the server
        torch.cuda.synchronize()
        time.sleep(0.7)
        assert not bool(z.any())  # the late write went where it was meant to, not into z
        y2 = torch.zeros(n, device="cuda")
        with pytest.raises(tritonshm.ServerTimeout):
            c.infer("slow_fp32", {"INPUT0": x}, out={"OUTPUT0": y2}, client_timeout=0.1)
        x2 = torch.full((n,), 9.0, device="cuda")
        c.infer("identity_fp32", {"INPUT0": x2}, out={"OUTPUT0": y2})  # waits for the old request
        time.sleep(0.6)
        assert bool((y2 == 9).all())
        assert c.stats().abandoned == 2


def test_fresh_large_tensors_per_request_are_copied_not_pinned(server, torch):
    """The everyday loop with 64 MiB batches made afresh for each request: torch's reserved memory
    grows by a few tensors at most, and at most two allocations stay registered."""
    nbytes = 64 << 20
    with tritonshm.Client(server.grpc_url) as c:
        torch.cuda.synchronize()
        before = torch.cuda.memory_reserved()
        for i in range(12):
            x = torch.full((nbytes // 4,), float(i), device="cuda")
            out = c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]
            assert float(out[-1]) == i
            del x, out
        grown = torch.cuda.memory_reserved() - before
        assert grown <= 4 * nbytes, grown
        assert len(c.lent()) <= 2
        assert c.stats().copied.get("used once", 0) >= 10
        c.forget()


def test_reused_buffers_are_lent_every_time_and_registered_once(server, torch):
    nbytes = 64 << 20
    x = torch.empty(nbytes // 4, device="cuda")
    y = torch.empty_like(x)
    with tritonshm.Client(server.grpc_url) as c:
        for i in range(30):
            x.fill_(float(i))
            c.infer("identity_fp32", {"INPUT0": x}, out={"OUTPUT0": y})
            assert float(y[-1]) == i
        stats = c.stats()
        assert stats.registrations <= 2 and (stats.inputs_lent, stats.outputs_lent) == (30, 30)
        assert stats.copied == {}
        c.forget()
