"""The CUDA layer's logic against the FAKE CUDA runtime (tests/fake_cudart), on any machine.

The fake models what these tests rely on -- allocation, IPC handles that
only another process can open, host registration, the fork rule, error
codes -- with POSIX shared memory standing in for device memory.  What only
a GPU shows (real handles, torch/cupy handshakes, speed) is in
test_cuda_gpu.py under the ``gpu`` marker.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import subprocess
import sys
import threading
import weakref

import ml_dtypes
import numpy as np
import pytest

import tritonshm
from tritonshm import CudaError, CudaUnavailable, DLPackError, DTypeMismatch, OutOfBounds, RegionClosed
from tritonshm import UnsupportedBuffer, cuda
from tritonshm._memory import _runtime

from fake_cuda import (ENV_DEVICES, ENV_DRIVER, ENV_FAIL, KIND_ALLOC, KIND_HOST_REGISTERED, ClosingIndex,
                       consume_dlpack)
from triton_fixtures import sample

DTYPES = [np.float32, np.float16, np.float64, np.int8, np.uint8, np.int16, np.int32, np.int64,
          np.uint64, np.bool_, np.complex64]


# --------------------------------------------------------------------------
# Without CUDA
# --------------------------------------------------------------------------


def test_import_loads_no_cuda_library():
    code = (
        "import tritonshm, tritonshm.cuda, tritonshm.triton\n"
        "tritonshm.CudaRegion, tritonshm.PinnedRegion\n"  # the lazy names resolve ...
        "maps = open('/proc/self/maps').read()\n"         # ... and still load no library
        "print([l for l in maps.splitlines() if 'libcuda' in l or 'cudart' in l])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_unloadable_runtime_is_one_line_of_cuda_unavailable(tmp_path):
    code = (
        "import tritonshm\n"
        "from tritonshm import cuda\n"
        "assert cuda.available() is False and cuda.device_count() == 0\n"
        "info = cuda.runtime_info()\n"
        "assert info['available'] is False and info['devices'] == [], info\n"
        "try:\n"
        "    tritonshm.CudaRegion.create(64)\n"
        "except tritonshm.CudaUnavailable as exc:\n"
        "    print(exc)\n"
    )
    env = dict(os.environ, TRITONSHM_CUDART=str(tmp_path / "libcudart.so.99"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    message = out.stdout.strip()
    assert "\n" not in message and "cannot load the CUDA runtime" in message and "libcudart.so.99" in message


def test_real_lookup_without_a_gpu_never_crashes():
    """The real library search on this machine: a GPU, or a clear CudaUnavailable."""
    code = (
        "import tritonshm\n"
        "from tritonshm import cuda\n"
        "info = cuda.runtime_info()\n"
        "if info['available']:\n"
        "    print('GPU', info['devices'][0].get('name'))\n"
        "else:\n"
        "    try:\n"
        "        tritonshm.CudaRegion.create(64)\n"
        "    except tritonshm.CudaUnavailable as exc:\n"
        "        assert str(exc) == info['error'], (str(exc), info)\n"
        "        print('NO', exc)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITONSHM_CUDART"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.startswith(("GPU ", "NO ")) and len(out.stdout.strip().splitlines()) == 1


@pytest.mark.parametrize("env, expected", [
    ({ENV_DRIVER: "none"}, "driver"),
    ({ENV_DEVICES: "0"}, "no CUDA GPU is visible"),
])
def test_no_driver_or_no_device_is_cuda_unavailable(fake_cuda, monkeypatch, env, expected):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(CudaUnavailable, match=expected):
        tritonshm.CudaRegion.create(64)
    with pytest.raises(CudaUnavailable, match=expected):
        tritonshm.PinnedRegion.create(64)
    assert cuda.available() is False and cuda.device_count() == 0
    assert cuda.runtime_info()["error"]


def test_runtime_info_describes_the_fake(fake_cuda, fake_cudart_path):
    info = cuda.runtime_info()
    assert info["available"] and info["error"] is None
    assert info["library"] == str(fake_cudart_path)
    assert info["runtime_version"] == "13.0" and info["driver_version"] == "13.0"
    (dev,) = info["devices"]
    assert dev["index"] == 0 and "Fake" in dev["name"] and dev["compute_capability"] == "9.0"
    assert dev["host_register_supported"] is True


# --------------------------------------------------------------------------
# CudaRegion: state, copies, bounds
# --------------------------------------------------------------------------


def test_create_and_state(fake_cuda):
    with tritonshm.CudaRegion.create(4096) as c:
        assert c.kind == "cuda" and c.owner and not c.closed and c.exports == 0
        assert c.nbytes == 4096 and c.device == 0
        assert fake_cuda.pointer_kind(c.ptr) == KIND_ALLOC
        assert isinstance(c.ipc_handle, bytes) and len(c.ipc_handle) == 64
        assert c.key.startswith(f"tritonshm-cuda-{os.getpid()}-") and len(c.key.rsplit("-", 1)[1]) == 16
        other = tritonshm.CudaRegion.create(64)
        assert other.key != c.key and other.ipc_handle != c.ipc_handle
        other.close()
    assert c.closed
    c.close()  # idempotent


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_read_round_trip_every_dtype(fake_cuda, dtype):
    data = sample(dtype, 24).reshape(2, 3, 4)
    with tritonshm.CudaRegion.create(8192) as c:
        assert c.write(data, offset=512) == data.nbytes
        np.testing.assert_array_equal(c.read(dtype, (2, 3, 4), offset=512), data)
        view = c.view(dtype, (2, 3, 4), offset=512)
        np.testing.assert_array_equal(view.get(), data)
        assert view.ptr == c.ptr + 512 and view.shape == (2, 3, 4) and view.dtype == np.dtype(dtype)
        del view


def test_read_copies_only_that_range(fake_cuda):
    with tritonshm.CudaRegion.create(1 << 20) as c:
        before = fake_cuda.stats()
        c.read(np.uint8, 100, offset=1000)
        assert (fake_cuda.stats() - before).async_copy_bytes == 100


def test_write_from_a_device_array_is_device_to_device(fake_cuda):
    data = sample(np.int32, 256)
    with tritonshm.CudaRegion.create(4096) as src, tritonshm.CudaRegion.create(4096) as dst:
        src.write(data)
        dst.write(src.view(np.int32, 256))          # through DLPack
        np.testing.assert_array_equal(dst.read(np.int32, 256), data)

        class CaiOnly:  # a producer that speaks only the CUDA Array Interface, with a stream
            def __init__(self, view, stream):
                self.__cuda_array_interface__ = dict(view.__cuda_array_interface__, stream=stream)

        stream = fake_cuda.stream_create()
        try:
            before = fake_cuda.stats()
            dst.write(CaiOnly(src.view(np.int32, 128, offset=512), stream), offset=1024)
            # An event on the producer's stream is waited for by the copy stream (no host wait on it).
            delta = fake_cuda.stats() - before
            assert delta.event_records == 1 and delta.stream_waits == 1 and delta.legacy_syncs == 0
            np.testing.assert_array_equal(dst.read(np.int32, 128, offset=1024), data[128:])
        finally:
            fake_cuda.stream_destroy(stream)


def test_write_refuses_non_contiguous_and_misfits_and_writes_nothing(fake_cuda):
    with tritonshm.CudaRegion.create(64) as c:
        c.write(np.zeros(64, np.uint8))
        with pytest.raises(UnsupportedBuffer, match="C-contiguous"):
            c.write(np.arange(32, dtype=np.int32)[::2])
        with pytest.raises(OutOfBounds):
            c.write(np.ones(65, np.uint8))
        with pytest.raises(OutOfBounds):
            c.write(np.ones(8, np.uint8), offset=60)
        with pytest.raises(DTypeMismatch):
            c.write(np.array([object()]))
        with pytest.raises(UnsupportedBuffer):
            c.write(12)

        class Strided:
            __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (c.ptr, False),
                                        "strides": (8,), "version": 3}

        with pytest.raises(UnsupportedBuffer, match="C-contiguous"):
            c.write(Strided())
        assert not c.read(np.uint8, 64).any()


@pytest.mark.parametrize("field, value, match", [
    ("shape", (-1,), "negative dimension"), ("shape", (2**62, 8), "larger than any allocation"),
    ("data", (-8, False), "no address"), ("data", (2**64, False), "no address"),
    ("stream", -1, "no stream handle"), ("stream", 2**64, "no stream handle"), ("stream", "s", "not an int"),
])
@pytest.mark.parametrize("op", ["write", "copy", "capture", "describe"])
def test_a_malformed_cuda_array_interface_is_refused_by_name(fake_cuda, op, field, value, match):
    """Numbers the C side holds as size_t are checked as Python ints: never an OverflowError from
    deep down, never a shape whose int64 product wraps to a 0-byte copy."""
    with tritonshm.CudaRegion.create(64) as c, tritonshm.CudaRegion.create(64) as src:
        src.write(np.ones(16, np.float32))

        class Malformed:
            __cuda_array_interface__ = dict({"shape": (4,), "typestr": "<f4", "data": (src.ptr, False),
                                             "version": 3}, **{field: value})

        with pytest.raises(UnsupportedBuffer, match=match):
            {"write": c.write, "copy": lambda obj: cuda.copy(c, obj), "capture": cuda.capture,
             "describe": cuda.describe}[op](Malformed())
        assert not c.read(np.uint8, 64).any()


@pytest.mark.parametrize("offset, nbytes", [(-1, 4), (65, 0), (0, 65), (60, 8), (2**64, 1), (1, 2**64 - 1)])
def test_bounds_and_overflow_are_checked(fake_cuda, offset, nbytes):
    with tritonshm.CudaRegion.create(64) as c:
        with pytest.raises(OutOfBounds):
            c.span(offset, nbytes)
        if nbytes > 0:
            with pytest.raises((OutOfBounds, tritonshm.ShapeMismatch)):
                c.read(np.uint8, nbytes, offset=offset)
            with pytest.raises((OutOfBounds, tritonshm.ShapeMismatch)):
                c.view(np.uint8, nbytes, offset=offset)


def test_bad_arguments(fake_cuda):
    with pytest.raises(OutOfBounds):
        tritonshm.CudaRegion.create(0)
    with pytest.raises(OutOfBounds):
        tritonshm.CudaRegion.create(-5)
    with pytest.raises(OutOfBounds):
        tritonshm.CudaRegion.create("big")
    with pytest.raises(OutOfBounds, match="sees 1 CUDA GPU"):
        tritonshm.CudaRegion.create(64, device=7)
    with tritonshm.CudaRegion.create(64) as c:
        with pytest.raises(DTypeMismatch, match="no DLPack equivalent"):
            c.view("datetime64[s]", 2)
        with pytest.raises(DTypeMismatch):
            c.view(object, 2)


def test_cuda_failures_become_cuda_errors(fake_cuda, monkeypatch):
    monkeypatch.setenv(ENV_FAIL, "cudaMalloc=2")
    with pytest.raises(CudaError, match="out of memory") as info:
        tritonshm.CudaRegion.create(64)
    assert info.value.code == 2 and info.value.name == "cudaErrorMemoryAllocation"
    monkeypatch.delenv(ENV_FAIL)
    with tritonshm.CudaRegion.create(64) as c:
        monkeypatch.setenv(ENV_FAIL, "cudaMemcpyAsync=700")
        with pytest.raises(CudaError, match="700"):
            c.write(b"x" * 8)
        with pytest.raises(CudaError):
            c.read(np.uint8, 8)
        monkeypatch.delenv(ENV_FAIL)
        assert c.exports == 0  # the failed copies gave their references back


def test_operations_on_a_closed_region(fake_cuda):
    c = tritonshm.CudaRegion.create(64)
    c.close()
    for op in (lambda: c.ptr, lambda: c.ipc_handle, lambda: c.view(np.uint8, 4), lambda: c.write(b"x"),
               lambda: c.read(np.uint8, 4), lambda: c.span(), lambda: pickle.dumps(c), lambda: c.__enter__()):
        with pytest.raises(RegionClosed):
            op()


def test_close_while_write_converts_its_offset(fake_cuda):
    base = fake_cuda.stats().live_allocs
    c = tritonshm.CudaRegion.create(64)

    with pytest.raises(RegionClosed):
        c.write(b"abcd", offset=ClosingIndex(c))
    assert c.closed and c.exports == 0 and fake_cuda.stats().live_allocs == base


class _ClosingStream:
    """An offset whose conversion closes *stream*; with *tensor*, a DLPack producer whose export
    closes it (a call's own arguments running code that closes the copy's stream)."""

    def __init__(self, stream, tensor=None):
        self.stream, self.tensor = stream, tensor

    def __index__(self):
        self.stream.close()
        return 0

    def __dlpack_device__(self):
        return self.tensor.__dlpack_device__()

    def __dlpack__(self, **kwargs):
        capsule = self.tensor.__dlpack__(**kwargs)  # (its handshake with the stream, then the close)
        self.stream.close()
        return capsule


@pytest.mark.parametrize("call", ["write", "copy", "copy stream="])
def test_a_stream_closed_by_the_calls_own_arguments_is_never_used(fake_cuda, torch_like, call):
    """The copy's stream is read after the arguments' own code ran (an offset's ``__index__``, a
    producer's export): one that code closed is a clear RegionClosed, never a destroyed handle
    handed to CUDA (which the fake fails with cudaErrorInvalidResourceHandle, and a real driver
    need not catch)."""
    with tritonshm.CudaRegion.create(64) as c:
        stream = cuda.Stream.create(0) if call == "copy stream=" else cuda.copy_stream(0)
        with pytest.raises(RegionClosed, match="closed"):
            if call == "write":
                c.write(np.ones(4, np.uint8), offset=_ClosingStream(stream))
            else:
                source = _ClosingStream(stream, torch_like.from_numpy(np.ones(4, np.uint8)))
                cuda.copy(c, source, stream=stream if call == "copy stream=" else None)
        assert not c.read(np.uint8, 64).any()
        assert not cuda.copy_stream(0).closed  # (the thread's next copy makes a new one)


# --------------------------------------------------------------------------
# Lifetimes: views, DLPack capsules, close, GC, fork
# --------------------------------------------------------------------------


def test_view_outlives_close_and_memory_goes_with_the_last_view(fake_cuda):
    base = fake_cuda.stats().live_allocs
    c = tritonshm.CudaRegion.create(4096)
    c.write(np.arange(16, dtype=np.float32))
    v = c.view(np.float32, 16)
    w = c.view(np.float32, 8, offset=32)
    assert c.exports == 2
    c.close()
    assert c.closed and c.exports == 2
    np.testing.assert_array_equal(v.get(), np.arange(16, dtype=np.float32))
    assert fake_cuda.stats().live_allocs == base + 1
    del v
    assert c.exports == 1 and fake_cuda.stats().live_allocs == base + 1
    del w
    assert c.exports == 0 and fake_cuda.stats().live_allocs == base


# A region closed in the middle of read() or view() -- by a finalizer the cyclic GC runs at an
# allocation of the call's own, or by another thread while the call runs Python code (a thread's
# first copy makes its copy stream): the call must hold the memory before any of that, or it reads
# freed memory and frees it a second time (read) or hands out a view of freed memory (view).  In a
# child process: that is a crash.  The GC is made to collect at each allocation of the call in
# turn; each read() runs on a new thread, whose copy stream it makes.
_CLOSED_MID_CALL = r"""
import gc, sys, threading
import numpy as np
from fake_cuda import FakeCudart
import tritonshm
from tritonshm._memory import _runtime
fake = FakeCudart(sys.argv[1])
_runtime.use(sys.argv[1])
op = sys.argv[2]
data = np.arange(4096, dtype=np.float32)

class ClosesOnCollection:  # garbage in a cycle: its finalizer runs at the next collection
    def __init__(self, region):
        self.region, self.me = region, self
    def __del__(self):
        self.region.close()

closed_mid_call = 0
for shift in range(16):  # the collection lined up with each allocation of the call in turn
    r = tritonshm.CudaRegion.create(data.nbytes)
    r.write(data)
    frees = fake.stats().free_calls
    result = [None]

    def call():
        gc.collect()
        ClosesOnCollection(r)
        gc.set_threshold(10)
        padding = [[] for _ in range(shift)]
        try:
            result[0] = r.read(np.float32, (4096,)) if op == "read" else r.view(np.float32, (4096,))
        except tritonshm.RegionClosed:
            pass
        finally:
            gc.set_threshold(700)

    if op == "read":
        worker = threading.Thread(target=call)
        worker.start()
        worker.join()
    else:
        call()
    got = result.pop()
    if got is not None and r.closed:
        closed_mid_call += 1
        if op == "view":
            assert fake.stats().free_calls == frees, "the region's memory was freed under a live view"
            got = got.get()
        assert (got == data).all(), "the copy read freed memory"
    del got
    gc.collect()
    assert fake.stats().free_calls == frees + 1, f"{fake.stats().free_calls - frees} frees, not 1"
assert closed_mid_call, "no collection fell inside the call: the test lines nothing up"
print("ok", closed_mid_call)
"""


@pytest.mark.parametrize("op", ["read", "view"])
def test_a_region_closed_in_the_middle_of_read_or_view_is_never_freed_under_it(fake_cudart_path, op):
    out = subprocess.run([sys.executable, "-c", _CLOSED_MID_CALL, str(fake_cudart_path), op],
                         capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0 and out.stdout.startswith("ok"), \
        f"rc={out.returncode} stdout={out.stdout[-300:]!r} stderr={out.stderr[-600:]!r}"


def test_device_free_memory_comes_back(fake_cuda):
    free_before, _ = _runtime.current().mem_info(0)
    c = tritonshm.CudaRegion.create(8 << 20)
    assert _runtime.current().mem_info(0)[0] == free_before - (8 << 20)
    c.close()
    assert _runtime.current().mem_info(0)[0] == free_before


def test_dlpack_capsule_describes_the_view(fake_cuda):
    with tritonshm.CudaRegion.create(4096) as c:
        v = c.view(np.float16, (3, 5), offset=64)
        assert v.__dlpack_device__() == (2, 0)
        capsule = v.__dlpack__(max_version=(1, 2), stream=1)
        ptr, t, deleter = consume_dlpack(capsule)
        assert (t.major, t.minor) == (1, 1) and t.flags == 0
        d = t.dl_tensor
        assert d.data == c.ptr + 64 and d.byte_offset == 0 and (d.device_type, d.device_id) == (2, 0)
        assert (d.code, d.bits, d.lanes) == (2, 16, 1) and d.ndim == 2
        assert [d.shape[i] for i in range(2)] == [3, 5] and [d.strides[i] for i in range(2)] == [5, 1]
        deleter(ptr)
        legacy = v.__dlpack__()  # no max_version: a legacy capsule
        ptr, t, deleter = consume_dlpack(legacy, versioned=False)
        assert t.dl_tensor.data == c.ptr + 64
        deleter(ptr)
        del v


def test_a_bfloat16_view_exports_kdlbfloat_16(fake_cuda):
    """ml_dtypes' bfloat16 (Triton's BF16) is DLPack's (kDLBfloat = 4, 16 bits), as torch's is."""
    bf16 = np.dtype(ml_dtypes.bfloat16)
    with tritonshm.CudaRegion.create(4096) as c:
        v = c.view(bf16, (4,))
        ptr, t, deleter = consume_dlpack(v.__dlpack__(max_version=(1, 0)))
        assert (t.dl_tensor.code, t.dl_tensor.bits, t.dl_tensor.lanes) == (4, 16, 1)
        deleter(ptr)
        assert cuda.describe(v) == (bf16, (4,), 0)
        del v


def test_describe_asks_dlpack_what_a_void_cuda_array_interface_type_is(fake_cuda, torch_like):
    """torch 2.11 exports bfloat16 through __cuda_array_interface__ as typestr '<V2' (seen on an
    H200): a void type is the interface saying it cannot name the type, and describe() must not
    answer dtype('V2') -- the client then refused a bf16 tensor for a BF16 model.  DLPack names it
    (kDLBfloat, 16).  capture() takes DLPack as before (its stream handshake)."""
    bf16 = np.dtype(ml_dtypes.bfloat16)
    t = torch_like.from_numpy(sample(bf16, 12).reshape(3, 4))
    assert t.__cuda_array_interface__["typestr"] == "<V2"
    assert cuda.describe(t) == (bf16, (3, 4), 0)
    f = torch_like.from_numpy(sample(np.float32, 5))
    assert cuda.describe(f) == (np.dtype(np.float32), (5,), 0)  # a type the interface names: as it says
    handshakes = torch_like.handshakes
    with cuda.capture(t) as cap:
        assert cap.dtype == bf16 and cap.shape == (3, 4)
    assert torch_like.handshakes == handshakes + 1  # DLPack's handshake, not the interface's
    torch_like.synchronize()
    del t, f


@pytest.mark.parametrize("major, dims", [(2, None), (0, None), (1, -3)])
def test_a_dlpack_tensor_of_another_major_version_or_negative_dims_is_refused(fake_cuda, torch_like, major, dims):
    """DLPack's rule: a versioned tensor whose major version the consumer does not read is not
    taken (past the version its layout is unknown): the capsule, unconsumed, hands it back.  A
    negative dimension is refused too (a negative byte count otherwise)."""
    import ctypes

    import fake_producers

    class Odd:  # a producer whose export says another major version, or a negative dimension
        def __init__(self, tensor):
            self.tensor = tensor

        def __dlpack_device__(self):
            return self.tensor.__dlpack_device__()

        def __dlpack__(self, **kwargs):
            capsule = self.tensor.__dlpack__(**kwargs)
            get = ctypes.pythonapi.PyCapsule_GetPointer
            get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
            managed = fake_producers.DLManagedTensorVersioned.from_address(get(capsule, b"dltensor_versioned"))
            managed.major = major
            if dims is not None:
                managed.dl_tensor.shape[0] = dims
            return capsule

    exports = fake_producers.live_exports()
    t = Odd(torch_like.from_numpy(np.ones(4, np.float32)))
    with tritonshm.CudaRegion.create(64) as c:
        for op in (cuda.capture, lambda obj: cuda.copy(c, obj), c.write):
            with pytest.raises(UnsupportedBuffer, match="DLPack 2.x|DLPack 0.x" if dims is None else "malformed"):
                op(t)
            gc.collect()
            assert fake_producers.live_exports() == exports, "the producer never got its tensor back"


def test_unconsumed_capsule_releases_its_reference(fake_cuda):
    with tritonshm.CudaRegion.create(64) as c:
        v = c.view(np.uint8, 64)
        capsule = v.__dlpack__(max_version=(1, 0))
        assert c.exports == 2
        del capsule
        assert c.exports == 1
        del v


def test_dlpack_deleter_on_another_thread_without_the_gil_frees_last(fake_cuda):
    base = fake_cuda.stats().live_allocs
    c = tritonshm.CudaRegion.create(4096)
    v = c.view(np.int64, 8)
    capsule = v.__dlpack__(max_version=(1, 0))
    ptr, _, deleter = consume_dlpack(capsule)  # calling the deleter releases the GIL
    del capsule, v
    c.close()
    assert fake_cuda.stats().live_allocs == base + 1  # the consumer still holds the memory
    thread = threading.Thread(target=deleter, args=(ptr,))
    thread.start()
    thread.join()
    assert fake_cuda.stats().live_allocs == base and c.exports == 0


def test_dlpack_request_rules(fake_cuda):
    with tritonshm.CudaRegion.create(64) as c:
        v = c.view(np.float32, 16)
        for kwargs, match in [({"copy": True}, "copy"), ({"dl_device": (1, 0)}, "device"),
                              ({"dl_device": (2, 1)}, "device"), ({"stream": 0}, "stream"),
                              ({"stream": -2}, "stream"), ({"stream": "s"}, "stream"),
                              ({"max_version": "x"}, "max_version")]:
            with pytest.raises(DLPackError, match=match):
                v.__dlpack__(**kwargs)
            with pytest.raises(BufferError):
                v.__dlpack__(**kwargs)
        for stream in (None, -1, 1, 2, 123456):
            v.__dlpack__(stream=stream, dl_device=(2, 0), copy=False, max_version=(1, 1))
        assert c.exports == 1
        w = c.window()
        for view in (v, w.view(np.float32, 16)):  # (a window's view converts the stream to a handle)
            for stream in (2**64, -2**70):
                with pytest.raises(DLPackError, match="stream"):
                    view.__dlpack__(stream=stream)
        del v, view, w


def test_cuda_array_interface(fake_cuda):
    with tritonshm.CudaRegion.create(4096) as c:
        v = c.view(np.int16, (4, 8), offset=128)
        cai = v.__cuda_array_interface__
        assert cai["version"] == 3 and cai["shape"] == (4, 8) and cai["typestr"] == "<i2"
        assert cai["data"] == (c.ptr + 128, False) and cai["strides"] is None and cai["stream"] is None
        assert v.ndim == 2 and v.size == 32 and v.nbytes == 64 and len(v) == 4
        with pytest.raises(TypeError, match="get()"):
            np.asarray(v)
        with pytest.raises(TypeError):
            pickle.dumps(v)
        del v


def test_forgotten_region_is_released_with_a_resource_warning(fake_cuda):
    base = fake_cuda.stats().live_allocs
    c = tritonshm.CudaRegion.create(64)
    ref = weakref.ref(c)
    with pytest.warns(ResourceWarning, match="unclosed"):
        del c
        gc.collect()
    assert ref() is None and fake_cuda.stats().live_allocs == base


def _fork_and_close(region):
    pid = os.fork()
    if pid == 0:  # the child: close and drop everything, then leave
        try:
            region.close()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return status


def test_forked_child_never_frees_the_parents_memory(fake_cuda):
    with tritonshm.CudaRegion.create(64) as c:
        c.write(b"parent!!")
        before = fake_cuda.stats()
        assert _fork_and_close(c) == 0
        assert fake_cuda.stats().live_allocs == before.live_allocs
        assert c.read(np.uint8, 8).tobytes() == b"parent!!"


# --------------------------------------------------------------------------
# IPC: attach and pickle in another process, refused in this one
# --------------------------------------------------------------------------


def _child_attach(payload, how):
    import numpy as np  # noqa: F811 (spawned child)

    import tritonshm as t

    region = pickle.loads(payload) if how == "pickle" else t.CudaRegion.attach(*payload)
    try:
        seen = region.read(np.uint8, 8).tobytes()
        region.write(b"child!!!", offset=8)
        return seen, region.owner, region.nbytes
    finally:
        region.close()


@pytest.mark.parametrize("how", ["pickle", "handle"])
def test_another_process_attaches_and_writes_are_seen_both_ways(fake_cuda, how):
    with tritonshm.CudaRegion.create(4096) as c:
        c.write(b"parent!!")
        payload = pickle.dumps(c) if how == "pickle" else (c.ipc_handle, c.nbytes)
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            seen, owner, nbytes = pool.apply(_child_attach, (payload, how))
        assert (seen, owner, nbytes) == (b"parent!!", False, 4096)
        assert c.read(np.uint8, 8, offset=8).tobytes() == b"child!!!"
        assert fake_cuda.stats().live_ipc_opens == 0


def test_attach_in_the_creating_process_is_a_clear_error(fake_cuda):
    with tritonshm.CudaRegion.create(64) as c:
        with pytest.raises(CudaError, match="created by this process") as info:
            pickle.loads(pickle.dumps(c))
        assert info.value.code == 201
        with pytest.raises(CudaError, match="created by this process"):
            tritonshm.CudaRegion.attach(c.ipc_handle, 64)
        handle = c.ipc_handle
    # Closed (and freed): the runtime's own error, explained.
    with pytest.raises(CudaError):
        tritonshm.CudaRegion.attach(handle, 64)


def test_attach_checks_its_arguments(fake_cuda):
    with pytest.raises(OutOfBounds, match="64 bytes"):
        tritonshm.CudaRegion.attach(b"short", 64)
    with pytest.raises(UnsupportedBuffer):
        tritonshm.CudaRegion.attach("a string", 64)
    with pytest.raises(OutOfBounds):
        tritonshm.CudaRegion.attach(bytes(64), 0)
    with pytest.raises(CudaError, match="400"):
        tritonshm.CudaRegion.attach(bytes(64), 64)  # not a handle at all


# --------------------------------------------------------------------------
# PinnedRegion
# --------------------------------------------------------------------------


def test_pinned_region_is_a_page_locked_system_region(fake_cuda):
    before = fake_cuda.stats()
    with tritonshm.PinnedRegion.create(1 << 16) as p:
        assert isinstance(p, tritonshm.SystemRegion) and p.kind == "system" and p.pinned and p.device == 0
        a = p.ndarray(np.float32, 16)
        assert fake_cuda.pointer_kind(a.ctypes.data) == KIND_HOST_REGISTERED
        a[:] = np.arange(16)
        assert np.from_dlpack(a).__dlpack_device__() == (1, 0)  # host views speak DLPack as kDLCPU
        with tritonshm.CudaRegion.create(64) as c:
            c.write(a)  # a host-to-device copy from pinned memory
            np.testing.assert_array_equal(c.read(np.float32, 16), np.arange(16))
        assert (fake_cuda.stats() - before).host_register_calls == 1
    # Unregistered once, when the mapping went (the view `a` is still alive).
    assert (fake_cuda.stats() - before).host_unregister_calls == 0
    del a
    after = fake_cuda.stats() - before
    assert after.host_unregister_calls == 1 and after.live_host_registrations == 0


def test_pinned_attach_and_pickle_pin_in_the_receiver(fake_cuda):
    with tritonshm.PinnedRegion.create(4096) as p:
        before = fake_cuda.stats()
        ro = tritonshm.PinnedRegion.attach(p.key, readonly=True)
        assert ro.readonly and ro.pinned
        ro.close()
        assert (fake_cuda.stats() - before).host_unregister_calls == 1
        clone = pickle.loads(pickle.dumps(p))  # another mapping of the same segment: pinned on its own
        assert type(clone) is tritonshm.PinnedRegion and not clone.owner
        clone.close()


def test_pinning_failure_leaves_no_segment(fake_cuda, monkeypatch):
    monkeypatch.setenv(ENV_FAIL, "cudaHostRegister=2")
    with pytest.raises(CudaError, match="page-locking"):
        tritonshm.PinnedRegion.create(4096)
    # conftest's leak check proves the segment was unlinked and unmapped.
