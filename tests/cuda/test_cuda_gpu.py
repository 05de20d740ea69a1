"""The CUDA layer on a real GPU, with torch, cupy and a real Triton server.

Run on a CUDA machine with ``pytest -m gpu`` (tests/gpu/run.sh does it on
the offline GPU machine).  Everything here skips where no GPU is usable;
the same logic is covered without a GPU by test_cuda_fake.py.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle

import ml_dtypes
import numpy as np
import pytest

import tritonshm
from tritonshm import cuda
from tritonshm._memory import _runtime

from triton_fixtures import NUMERIC_IDENTITY_MODELS, make_client, sample, start_or_skip

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu")]

_TRITON_TYPES = {np.float32: "FP32", np.float16: "FP16", np.int8: "INT8", np.uint8: "UINT8",
                 np.int32: "INT32", np.int64: "INT64", np.bool_: "BOOL", ml_dtypes.bfloat16: "BF16"}


def _free_bytes():
    return _runtime.current().mem_info(0)[0]


# --------------------------------------------------------------------------
# Memory: real handles, torch and cupy, lifetimes
# --------------------------------------------------------------------------


def test_runtime_info_sees_the_gpu():
    info = cuda.runtime_info()
    assert info["available"] and info["devices"] and cuda.device_count() == len(info["devices"])
    assert info["devices"][0]["name"] and info["driver_version"] and info["runtime_version"]


def test_torch_consumes_views_without_a_copy_and_sees_writes_both_ways(torch):
    with tritonshm.CudaRegion.create(1 << 20) as c:
        c.write(np.arange(1024, dtype=np.float32), offset=4096)
        v = c.view(np.float32, (32, 32), offset=4096)
        t = torch.from_dlpack(v)
        assert t.is_cuda and t.data_ptr() == c.ptr + 4096 and t.shape == (32, 32)
        assert torch.equal(t.flatten().cpu(), torch.arange(1024, dtype=torch.float32))
        t.mul_(2)
        torch.cuda.synchronize()
        np.testing.assert_array_equal(c.read(np.float32, 1024, offset=4096), np.arange(1024) * 2)
        c.write(np.full(1024, 7, np.float32), offset=4096)
        assert bool((t == 7).all())
        legacy = torch.utils.dlpack.from_dlpack(v.__dlpack__())  # the legacy capsule too
        assert legacy.data_ptr() == t.data_ptr()
        cai = torch.as_tensor(v, device="cuda")
        assert cai.data_ptr() == t.data_ptr()
        del t, legacy, cai, v


def test_cupy_consumes_views_without_a_copy_and_sees_writes_both_ways(cupy):
    with tritonshm.CudaRegion.create(1 << 20) as c:
        c.write(np.arange(256, dtype=np.int32), offset=512)
        v = c.view(np.int32, 256, offset=512)
        for a in (cupy.from_dlpack(v), cupy.asarray(v)):
            assert a.data.ptr == c.ptr + 512
            assert int(a.sum()) == sum(range(256))
        a = cupy.asarray(v)
        a += 1
        cupy.cuda.runtime.deviceSynchronize()
        np.testing.assert_array_equal(c.read(np.int32, 256, offset=512), np.arange(256) + 1)
        del a, v


def test_write_from_torch_is_ordered_after_the_producer_stream(torch):
    n = 1 << 22
    with tritonshm.CudaRegion.create(n * 4) as c:
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            x = torch.zeros(n, device="cuda")
            torch.cuda._sleep(50_000_000)  # keep the stream busy: a racing copy would see zeros
            x.fill_(3.0)
            c.write(x)  # the DLPack handshake orders our copy after `side`'s work
        assert (c.read(np.float32, n) == 3.0).all()


def test_write_from_cupy_and_device_to_device(cupy, torch):
    with tritonshm.CudaRegion.create(4096) as a, tritonshm.CudaRegion.create(4096) as b:
        a.write(cupy.arange(100, dtype=cupy.float64))
        b.write(a.view(np.float64, 100))
        b.write(torch.ones(10, dtype=torch.float64, device="cuda"), offset=800)
        got = b.read(np.float64, 110)
        np.testing.assert_array_equal(got[:100], np.arange(100))
        np.testing.assert_array_equal(got[100:], np.ones(10))


def test_view_outlives_close_and_device_memory_returns_after_the_last_view(torch):
    nbytes = 256 << 20
    free_before = _free_bytes()
    c = tritonshm.CudaRegion.create(nbytes)
    c.write(np.ones(16, np.float32))
    t = torch.from_dlpack(c.view(np.float32, 16))
    c.close()
    assert _free_bytes() <= free_before - nbytes  # still allocated: torch holds it
    assert float(t.sum()) == 16.0
    del t
    gc.collect()
    torch.cuda.synchronize()
    assert _free_bytes() >= free_before - (4 << 20)  # back, give or take the allocator's granularity


def test_copy_between_torch_cupy_regions_windows_and_numpy(torch, cupy):
    data = np.arange(1024, dtype=np.float32)
    with tritonshm.CudaRegion.create(1 << 16) as c:
        w = c.window(8192, 4096)
        assert cuda.copy(w, data) == 4096                                   # host -> window
        t = torch.zeros(1024, dtype=torch.float32, device="cuda")
        assert cuda.copy(t, w) == 4096                                      # window -> torch
        assert torch.equal(t.cpu(), torch.from_numpy(data))
        a = cupy.zeros(512, dtype=cupy.float32)
        assert cuda.copy(a, t, src_offset=2048) == 2048                     # torch -> cupy, offset
        np.testing.assert_array_equal(cupy.asnumpy(a), data[512:])
        assert cuda.copy(c, a, 1024, dst_offset=100) == 1024                # cupy -> region
        np.testing.assert_array_equal(c.read(np.float32, 256, offset=100), data[512:768])
        v = w.view(np.float32, 8, offset=64)
        out = np.zeros(8, np.float32)
        assert cuda.copy(out, v) == 32                                      # CudaArray -> host
        np.testing.assert_array_equal(out, data[16:24])
        t2 = torch.full((4,), 9.0, device="cuda")
        assert cuda.copy(v, t2, dst_offset=0) == 16                         # torch -> CudaArray
        np.testing.assert_array_equal(v.get()[:4], np.full(4, 9, np.float32))
        with pytest.raises(tritonshm.OutOfBounds):
            cuda.copy(t2, w)                                                # 4096 bytes do not fit in 16
        # Ordered after torch's work on a side stream (the DLPack handshake, stream=1).
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            x = torch.zeros(1 << 20, device="cuda")
            torch.cuda._sleep(50_000_000)
            x.fill_(5.0)
            big = tritonshm.CudaRegion.create(4 << 20)
            cuda.copy(big, x)
        assert (big.read(np.float32, 1 << 20) == 5.0).all()
        big.close()
        del w, v, t, a, t2


def test_window_view_in_torch_keeps_holders_up_until_the_tensor_dies(torch):
    c = tritonshm.CudaRegion.create(1 << 20)
    probe = c.window(4096, 4096)
    v = probe.share().view(np.float32, (8, 8), offset=256)
    t = torch.from_dlpack(v)
    assert t.data_ptr() == c.ptr + 4096 + 256
    del v
    gc.collect()
    assert probe.holders == 2  # the probe and torch's tensor
    c.close()
    t.fill_(1.0)
    torch.cuda.synchronize()
    del t
    gc.collect()
    assert probe.holders == 1
    del probe
    assert c.exports == 0


def test_describe_torch(torch):
    t = torch.zeros((3, 4), dtype=torch.float16, device="cuda")
    assert cuda.describe(t) == (np.dtype(np.float16), (3, 4), t.device.index)
    assert cuda.describe(torch.zeros(3)) is None  # host tensor
    assert cuda.describe(torch.zeros(3).pin_memory()) is None  # pinned host memory is host memory
    with pytest.raises(tritonshm.UnsupportedBuffer, match="C-contiguous"):
        cuda.describe(t.t())
    assert cuda.describe(torch.zeros(2, dtype=torch.bool, device="cuda"))[0] == np.dtype(np.bool_)
    # torch's CAI refused bfloat16 before 2.11 and says '<V2' (a void type) since; DLPack names it
    # (kDLBfloat, 16): ml_dtypes' bfloat16
    assert cuda.describe(torch.zeros(2, dtype=torch.bfloat16, device="cuda"))[:2] == (np.dtype(ml_dtypes.bfloat16), (2,))


def test_describe_cupy(cupy):
    a = cupy.zeros((2, 5), dtype=cupy.int64)
    assert cuda.describe(a) == (np.dtype(np.int64), (2, 5), a.device.id)
    with pytest.raises(tritonshm.UnsupportedBuffer, match="C-contiguous"):
        cuda.describe(a[:, ::2])


def _child(payload, how):
    import numpy as np  # noqa: F811 (spawned child)

    import tritonshm as t

    region = pickle.loads(payload) if how == "pickle" else t.CudaRegion.attach(*payload)
    try:
        seen = region.read(np.uint8, 8).tobytes()
        region.write(b"child!!!", offset=8)
        return seen
    finally:
        region.close()


# --------------------------------------------------------------------------
# Streams, events, capture, readers (issue 17) with torch and cupy on non-default streams
# --------------------------------------------------------------------------

_BUSY = 200_000_000  # torch.cuda._sleep cycles: long enough that a racing copy would see old bytes


def test_stream_and_event_api_with_a_torch_side_stream(torch):
    n = 1 << 20
    with tritonshm.CudaRegion.create(n * 4) as c:
        side = torch.cuda.Stream()
        ours = cuda.Stream.create(0)
        with torch.cuda.stream(side):
            assert cuda.current_stream(0) == side.cuda_stream
            x = torch.zeros(n, device="cuda")
            torch.cuda._sleep(_BUSY)
            x.fill_(5.0)
        done = cuda.Event.create(0).record(side.cuda_stream)
        ours.wait(done)
        cuda.copy(c, x, stream=ours)  # DLPack handshake with `ours` as well
        ours.synchronize()
        assert done.query() is True
        assert (c.read(np.float32, n) == 5.0).all()
        ours.close()
        done.close()


def test_capture_on_a_side_stream_orders_a_copy_on_another_thread(torch):
    import threading

    n = 1 << 22
    with tritonshm.CudaRegion.create(n * 4) as c:
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            x = torch.zeros(n, device="cuda")
            torch.cuda._sleep(_BUSY)
            x.fill_(3.0)
            cap = cuda.capture(x)  # on the caller's thread, with `side` current
        worker = threading.Thread(target=lambda: cuda.copy(c, cap))
        worker.start()
        worker.join()
        assert (c.read(np.float32, n) == 3.0).all()
        cap.release()


def test_capture_of_cupy_on_its_stream(cupy):
    n = 1 << 20
    with tritonshm.CudaRegion.create(n * 8) as c:
        s = cupy.cuda.Stream(non_blocking=True)
        with s:
            a = cupy.arange(n, dtype=cupy.float64)
            cap = cuda.capture(a)
        c.write(cap)
        np.testing.assert_array_equal(c.read(np.float64, n), np.arange(n))
        cap.release()


def test_window_readers_pending_until_torchs_stream_is_done(torch):
    with tritonshm.CudaRegion.create(1 << 20) as c:
        c.write(np.ones(1 << 18, np.float32))
        probe = c.window()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            t = torch.from_dlpack(probe.share().view(np.float32, 1 << 18))  # stream=side
            torch.cuda._sleep(_BUSY * 5)
            total = t.sum()
            del t
        gc.collect()
        assert probe.holders == 1
        assert probe.readers_pending() is True  # torch's kernel has not run yet
        side.synchronize()
        assert probe.readers_pending() is False
        assert float(total) == float(1 << 18)
        del probe


def test_copies_do_not_wait_for_the_legacy_default_stream(torch):
    import time

    with tritonshm.CudaRegion.create(1 << 20) as c:
        c.write(np.zeros(1 << 18, np.float32))  # the thread's copy stream exists now
        torch.cuda._sleep(_BUSY * 20)  # the legacy default stream (torch's default) is busy for ~2 s
        start = time.perf_counter()
        c.write(np.ones(1 << 18, np.float32))
        c.read(np.float32, 16)
        elapsed = time.perf_counter() - start
        torch.cuda.synchronize()
        assert elapsed < 0.5, f"a copy waited {elapsed:.2f} s for the legacy default stream"


def _two_gpus():
    if cuda.device_count() < 2:
        pytest.skip("needs two GPUs")


def test_torch_tensor_on_another_device_is_exported_under_its_guard(torch):
    _two_gpus()
    torch.cuda.set_device(0)
    x = torch.arange(1024, dtype=torch.float32, device="cuda:1")
    with tritonshm.CudaRegion.create(4096, device=0) as c:
        c.write(x)  # torch would refuse __dlpack__ with device 0 current
        np.testing.assert_array_equal(c.read(np.float32, 1024), np.arange(1024))
    assert torch.cuda.current_device() == 0


def test_a_process_that_uses_only_gpu_1_creates_no_context_on_gpu_0():
    _two_gpus()
    import subprocess
    import sys

    code = (
        "import numpy as np, tritonshm\n"
        "from tritonshm._memory import _stream\n"
        "with tritonshm.CudaRegion.create(1 << 20, device=1) as c:\n"
        "    c.write(np.ones(1024, np.float32)); c.read(np.float32, 1024)\n"
        "    tritonshm.PinnedRegion.create(1 << 16, device=1).close()\n"
        "print(_stream.has_context(0), _stream.has_context(1))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"], out.stdout + out.stderr


@pytest.mark.parametrize("how", ["pickle", "handle"])
def test_another_process_attaches_by_handle_and_by_pickle(how):
    with tritonshm.CudaRegion.create(1 << 20) as c:
        c.write(b"parent!!")
        payload = pickle.dumps(c) if how == "pickle" else (c.ipc_handle, c.nbytes)
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            assert pool.apply(_child, (payload, how)) == b"parent!!"
        assert c.read(np.uint8, 8, offset=8).tobytes() == b"child!!!"
        with pytest.raises(tritonshm.CudaError, match="created by this process"):
            pickle.loads(pickle.dumps(c))


def test_pinned_region_is_page_locked_and_torch_copies_into_it(torch):
    with tritonshm.PinnedRegion.create(64 << 20) as p:
        host = torch.from_dlpack(p.ndarray(np.float32, 16 << 20))
        assert host.device.type == "cpu"
        gpu = torch.arange(16 << 20, dtype=torch.float32, device="cuda")
        host.copy_(gpu)
        assert float(host[-1]) == float((16 << 20) - 1)
        del host


# --------------------------------------------------------------------------
# With a real Triton: registration, inference, refusals, leaks
# --------------------------------------------------------------------------


@pytest.mark.parametrize("model, dtype", sorted(NUMERIC_IDENTITY_MODELS.items()))
def test_every_dtype_round_trips_through_cuda_shm_at_offsets(server, protocol, model, dtype):
    module, client = make_client(server, protocol)
    data = sample(dtype, 64)
    with tritonshm.CudaRegion.create(1 << 16) as c:
        name = tritonshm.register(client, c)
        try:
            assert tritonshm.status(client, name, kind="cuda")[name] == {"device_id": 0, "byte_size": c.nbytes}
            c.write(data, offset=4096)
            inp = module.InferInput("INPUT0", [64], _TRITON_TYPES[dtype])
            tritonshm.bind_input(inp, c, offset=4096)
            out = module.InferRequestedOutput("OUTPUT0")
            tritonshm.bind_output(out, c, offset=8192, nbytes=data.nbytes)
            client.infer(model, [inp], outputs=[out])
            np.testing.assert_array_equal(c.read(dtype, 64, offset=8192), data)
        finally:
            tritonshm.unregister(client, name)
        assert name not in tritonshm.status(client, kind="cuda")
    client.close()


def test_undersized_output_and_out_of_range_binds_are_refused_before_sending(server, protocol):
    module, client = make_client(server, protocol)
    with tritonshm.CudaRegion.create(4096) as c:
        name = tritonshm.register(client, c)
        try:
            inp = module.InferInput("INPUT0", [1024], "FP32")
            with pytest.raises(tritonshm.OutOfBounds):
                tritonshm.bind_input(inp, c, offset=8)  # 4096 bytes do not fit at 8
            tritonshm.bind_input(inp, c, offset=0)
            out = module.InferRequestedOutput("OUTPUT0")
            with pytest.raises(tritonshm.OutOfBounds):
                tritonshm.bind_output(out, c, offset=4096, nbytes=1)
            tritonshm.bind_output(out, c, offset=0, nbytes=16)
            with pytest.raises(Exception) as raw:
                client.infer("identity_fp32", [inp], outputs=[out])
            assert isinstance(tritonshm.errors.translate_error(raw.value, "inferring"), tritonshm.OutputTooSmall)
        finally:
            tritonshm.unregister(client, name)
    client.close()


def test_server_that_cannot_open_our_handles_is_shared_memory_refused(protocol):
    from tritonshm.server import LocalServer

    # A server that sees no GPU: a CPU-only server, as far as our handles go.
    with start_or_skip(LocalServer(env={"CUDA_VISIBLE_DEVICES": ""})) as srv:
        _, client = make_client(srv, protocol)
        with tritonshm.CudaRegion.create(4096) as c:
            with pytest.raises(tritonshm.SharedMemoryRefused, match="ipc=host"):
                tritonshm.register(client, c)
        client.close()


def test_thousand_create_register_infer_close_cycles_leak_nothing(server):
    module, client = make_client(server, "grpc")
    data = np.arange(256, dtype=np.float32)

    def cycle():
        with tritonshm.CudaRegion.create(2 << 20) as c:
            name = tritonshm.register(client, c)
            c.write(data)
            inp = module.InferInput("INPUT0", [256], "FP32")
            tritonshm.bind_input(inp, c)
            out = module.InferRequestedOutput("OUTPUT0")
            tritonshm.bind_output(out, c, offset=1 << 20, nbytes=data.nbytes)
            client.infer("identity_fp32", [inp], outputs=[out])
            got = c.read(np.float32, 256, offset=1 << 20)
            tritonshm.unregister(client, name)
        np.testing.assert_array_equal(got, data)

    for _ in range(50):  # warm up: contexts, gRPC channel, the server's handle cache
        cycle()
    gc.collect()
    free_before, fds_before = _free_bytes(), len(os.listdir("/proc/self/fd"))
    for _ in range(1000):
        cycle()
    gc.collect()
    assert abs(_free_bytes() - free_before) <= (8 << 20)
    assert len(os.listdir("/proc/self/fd")) <= fds_before + 2
    assert not tritonshm.status(client, kind="cuda")
    client.close()
