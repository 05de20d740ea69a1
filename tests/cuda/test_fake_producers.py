"""Tests of the torch-like and cupy-like producer DOUBLES (tests/fake_producers.py) on the FAKE runtime.

Like test_fake_cudart.py, these use no tritonshm code (but the last test,
which checks that the fixtures register the doubles with tritonshm).
"""

from __future__ import annotations

import ctypes
import gc
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

import fake_cuda
import fake_producers
from cuda_fixtures import cupy_like, torch_like  # noqa: F401  (fixtures)
from fake_cuda import FakeCudart
from fake_producers import DEVICE_INDEX_ERROR, CupyLike, TorchLike


@pytest.fixture(scope="module")
def fake(fake_cudart_path) -> FakeCudart:
    return FakeCudart(fake_cudart_path)


@pytest.fixture(autouse=True)
def clean(fake, monkeypatch):
    """Default environment, device 0, no last error; everything given back, nothing queued, no capsule left."""
    for var in (fake_cuda.ENV_DEVICES, fake_cuda.ENV_SYNC, fake_cuda.ENV_FAIL):
        monkeypatch.delenv(var, raising=False)
    fake.set_device(0)
    fake.get_last_error()  # an earlier test's failure would fail the torch-like double's launch check
    before = fake.stats()
    exports = fake_producers.live_exports()
    yield
    gc.collect()
    fake.set_device(0)
    assert fake.pending() == 0, "the test left queued work"
    assert fake.stats().live == before.live, "the test left fake allocations, opens or registrations"
    assert fake_producers.live_exports() == exports, "a capsule's deleter never ran"


@pytest.fixture
def two_devices(monkeypatch):
    monkeypatch.setenv(fake_cuda.ENV_DEVICES, "2")


@pytest.fixture(params=[TorchLike, CupyLike], ids=["torch", "cupy"])
def producer(request, fake):
    p = request.param(fake)
    yield p
    p.close()


@pytest.fixture
def torch(fake):
    p = TorchLike(fake)
    yield p
    p.close()


@pytest.fixture
def cupy(fake):
    p = CupyLike(fake)
    yield p
    p.close()


@pytest.fixture
def consumer_stream(fake):
    """A non-blocking stream of a consumer (what tritonshm's copy stream is)."""
    s = fake.stream_create()
    yield s
    fake.stream_synchronize(s)
    fake.stream_destroy(s)


def read_on(fake, stream, t) -> bytes:
    """What a consumer copying *t* on *stream* (then syncing it) gets."""
    out = ctypes.create_string_buffer(t.nbytes)
    fake.memcpy_async(ctypes.addressof(out), t.ptr, t.nbytes, stream, 2)
    fake.stream_synchronize(stream)
    return out.raw


# --- streams and asynchronous writes -------------------------------------------


def test_current_stream_is_per_thread_and_per_device(producer, fake, two_devices):
    assert producer.current_stream(0) == producer.current_stream(1) == 0  # the legacy default stream
    assert producer.current_stream_provider(0) is None  # "not mine": tritonshm asks the next one
    seen = {}
    with producer.stream(0) as s:
        assert s not in (0, None, 1, 2)
        assert producer.current_stream(0) == producer.current_stream() == s
        assert producer.current_stream(1) == 0
        assert producer.current_stream_provider(0) == s
        t = threading.Thread(target=lambda: seen.update(other=producer.current_stream(0)))
        t.start()
        t.join()
        with producer.stream(0) as inner:
            assert producer.current_stream(0) == inner != s
        assert producer.current_stream(0) == s
    assert seen == {"other": 0}
    assert producer.current_stream(0) == 0
    with producer.stream(1) as s1:  # made on device 1, this thread stays on device 0
        assert producer.current_stream(1) == s1 and fake.get_device() == 0


def test_writes_are_queued_on_the_current_stream(producer, fake):
    t = producer.empty(4, "int32")
    with producer.stream():
        t.copy_(np.arange(4, dtype=np.int32))
        assert fake.read(t.ptr, 16) == bytes(16)  # not landed
        assert fake.pending() == 1
        assert t.numpy().tolist() == [0, 1, 2, 3]  # .cpu(): on the same stream, then a sync
    t.fill_(9)  # on the legacy stream now: not ordered with the non-blocking stream's work
    assert fake.pending() == 1
    assert t.numpy().tolist() == [9, 9, 9, 9]
    assert fake.pending() == 0


def test_numpy_on_another_stream_sees_stale_bytes(producer, fake):
    """The double is as unforgiving as a GPU: reading on a stream that is not ordered after the write."""
    t = producer.zeros(2, "float32")
    with producer.stream() as s:
        t.fill_(1.5)
    assert t.numpy().tolist() == [0.0, 0.0]  # legacy stream; the non-blocking stream's fill is still queued
    fake.stream_synchronize(s)
    assert t.numpy().tolist() == [1.5, 1.5]


def test_from_numpy_and_copy_between_tensors(producer, fake):
    a = producer.from_numpy(np.array([[1, 2], [3, 4]], dtype=np.int64))
    b = producer.empty((2, 2), "int64")
    b.copy_(a)
    assert b.numpy().tolist() == [[1, 2], [3, 4]]
    assert (a.shape, a.dtype, a.nbytes, a.device) == ((2, 2), np.dtype("int64"), 32, 0)
    assert a.data_ptr() == a.ptr and fake.pointer_kind(a.ptr) == fake_cuda.KIND_ALLOC
    with pytest.raises(ValueError):
        b.copy_(producer.empty(3, "int64"))


def test_tensors_free_their_memory_under_their_device(producer, fake, two_devices):
    before = fake.stats().live_allocs
    fake.reset_contexts()
    done = {}

    def on_device_1():  # a fresh thread, device 0 never touched
        t = producer.empty(100, "uint8", device="cuda:1")
        done["during"] = fake.stats().live_allocs - before
        del t
        gc.collect()
        done["after"] = fake.stats().live_allocs - before
        done["contexts"] = fake.contexts()
        done["device"] = fake.get_device()

    th = threading.Thread(target=on_device_1)
    th.start()
    th.join()
    assert done == {"during": 1, "after": 0, "contexts": {1}, "device": 1}


# --- DLPack export: the stream handshake -----------------------------------------


def test_dlpack_handshake_orders_the_consumers_stream(producer, fake, consumer_stream):
    t = producer.zeros(4, "int32")
    producer.synchronize()
    with producer.stream():
        t.fill_(7)
        before = fake.stats()
        capsule = t.__dlpack__(stream=consumer_stream, max_version=(1, 0))
        d = fake.stats() - before
        assert (d.event_records, d.stream_waits, producer.handshakes) == (1, 1, 1)
        ptr, managed, deleter = fake_cuda.consume_dlpack(capsule)
        assert managed.dl_tensor.data == t.ptr and (managed.major, managed.minor) == (1, 0)
        assert (managed.dl_tensor.device_type, managed.dl_tensor.device_id) == (2, 0)
        # the consumer's copy on its own stream lands after the producer's fill
        assert np.frombuffer(read_on(fake, consumer_stream, t), np.int32).tolist() == [7] * 4
        deleter(ptr)
        # the same stream as ours: nothing to order
        capsule = t.__dlpack__(stream=producer.current_stream())
        assert producer.handshakes == 1
        del capsule
        producer.synchronize()


def test_stream_minus_one_does_not_synchronize(producer, fake, consumer_stream):
    t = producer.zeros(4, "int32")
    producer.synchronize()
    with producer.stream():
        t.fill_(7)
        capsule = t.__dlpack__(stream=-1)  # -1: the consumer takes care of ordering itself
        del capsule
        assert producer.handshakes == 0
        assert read_on(fake, consumer_stream, t) == bytes(16)  # unordered: the consumer sees stale bytes
        producer.synchronize()


def test_stream_none_is_the_legacy_stream(producer, fake):
    a = producer.zeros(4, "int32")
    producer.synchronize()
    with producer.stream():
        a.fill_(3)
        capsule = a.__dlpack__()  # None: the consumer will use the legacy default stream
        assert producer.handshakes == 1
        out = ctypes.create_string_buffer(16)
        fake.memcpy(ctypes.addressof(out), a.ptr, 16, 2)  # cudaMemcpy: the legacy stream
        assert np.frombuffer(out.raw, np.int32).tolist() == [3] * 4
        del capsule
        producer.synchronize()


def test_torch_refuses_streams_0_and_2_and_non_ints(torch):
    t = torch.empty(4, "uint8")
    with pytest.raises(BufferError, match="per-thread default stream is not supported"):
        t.__dlpack__(stream=2)
    with pytest.raises(AssertionError, match="unsupported stream on CUDA: 0"):
        t.__dlpack__(stream=0)
    with pytest.raises(TypeError):
        t.__dlpack__(stream=object())
    assert torch.handshakes == 0


def test_torch_refuses_export_from_a_non_current_device(torch, fake, two_devices, consumer_stream):
    t = torch.empty(8, "uint8", device=1)
    assert fake.get_device() == 0
    before = fake.stats()
    with pytest.raises(BufferError, match=DEVICE_INDEX_ERROR) as info:
        t.__dlpack__(stream=consumer_stream)
    assert "Expected: 1. Current device: 0." in str(info.value)
    assert (fake.stats() - before).event_records == 0
    fake.set_device(1)  # the caller's guard: then it works
    capsule = t.__dlpack__(stream=1)
    assert t.__dlpack_device__() == (2, 1)
    del capsule


def test_cupy_exports_from_any_device(cupy, fake, two_devices, consumer_stream):
    a = cupy.empty(8, "uint8", device=1)
    with cupy.stream(1) as s:
        cai = a.__cuda_array_interface__
        assert cai["stream"] == s
        capsule = a.__dlpack__(stream=consumer_stream)  # cupy works under its own device guard
        assert fake.get_device() == 0 and cupy.handshakes == 1
        del capsule
    assert a.__cuda_array_interface__["stream"] == 1  # the legacy default stream is 1, never 0
    cupy.synchronize(1)


def test_cuda_array_interface(cupy):
    a = cupy.asarray(np.zeros((2, 3), np.float16))
    cai = a.__cuda_array_interface__
    assert cai == {"shape": (2, 3), "typestr": "<f2", "descr": [("", "<f2")], "data": (a.ptr, False),
                   "strides": None, "version": 3, "stream": 1}
    cupy.synchronize()


def test_torch_cuda_array_interface_is_torch_2_11s(torch):
    """Version 2, no stream, strides None; bfloat16 as a void type of its size ('<V2'), which is
    what torch 2.11 exported on an H200."""
    t = torch.empty((2, 3), "float32")
    assert t.__cuda_array_interface__ == {"typestr": "<f4", "shape": (2, 3), "strides": None,
                                          "data": (t.ptr, False), "version": 2}
    bf16 = torch.empty(2, fake_producers.BFLOAT16)
    assert bf16.__cuda_array_interface__["typestr"] == "<V2"
    assert torch.empty(0, "int8").__cuda_array_interface__["data"] == (0, False)


def test_torch_kernels_check_the_last_error_as_torch_does(torch, cupy, fake):
    """C10_CUDA_KERNEL_LAUNCH_CHECK: a kernel launch reads (and clears) the thread's last error and
    raises if one is set -- whoever left it there.  cupy launches through the driver: no check."""
    fake.get_last_error()
    t = torch.zeros(4, "float32")
    assert fake.lib.cudaSetDevice(99) == fake_cuda.ERROR_INVALID_DEVICE  # another library's failure
    cupy.asarray(np.ones(4, np.float32))
    with pytest.raises(fake_producers.FakeAcceleratorError, match="CUDA error: invalid device ordinal"):
        t.fill_(1.0)
    assert fake.peek_last_error() == 0  # read and cleared, as cudaGetLastError does
    t.fill_(2.0)
    np.testing.assert_array_equal(t.numpy(), np.full(4, 2.0, np.float32))
    torch.synchronize()
    cupy.synchronize()


def test_unconsumed_and_legacy_capsules(producer, fake):
    t = producer.empty((2, 3), "float32")
    capsule = t.__dlpack__(stream=1)
    assert fake_producers.live_exports() >= 1
    del t
    gc.collect()
    assert fake.stats().live_allocs >= 1  # the export keeps the tensor's memory
    del capsule  # never consumed: the capsule's destructor lets go
    t = producer.empty(5, "int16")
    capsule = t.__dlpack__(stream=1)  # no max_version: a legacy "dltensor" capsule
    ptr, managed, deleter = fake_cuda.consume_dlpack(capsule, versioned=False)
    dl = managed.dl_tensor
    assert (dl.ndim, dl.shape[0], dl.code, dl.bits, dl.lanes) == (1, 5, 0, 16, 1)
    deleter(ptr)


# --- consuming: from_dlpack --------------------------------------------------------


def test_from_dlpack_passes_its_stream_and_holds_the_capsule(fake):
    cupy, torch = CupyLike(fake), TorchLike(fake)
    try:
        a = cupy.zeros(4, "int32")
        cupy.synchronize()
        exports = fake_producers.live_exports()
        with cupy.stream(), torch.stream():
            a.fill_(5)  # queued on cupy's current stream
            t = torch.from_dlpack(a)  # passes torch's: cupy orders its fill before it
            assert cupy.handshakes == 1
            assert t.ptr == a.ptr and t.shape == (4,) and t.dtype == np.int32
            assert t.numpy().tolist() == [5] * 4  # on torch's stream, no other sync
        assert fake_producers.live_exports() == exports + 1  # the capsule is held ...
        del a
        gc.collect()
        assert fake.pointer_kind(t.ptr) == fake_cuda.KIND_ALLOC  # ... and with it cupy's memory
        del t
        gc.collect()
        assert fake_producers.live_exports() == exports  # the consumer's death ran the deleter
        cupy.synchronize()
    finally:
        cupy.close()
        torch.close()


def test_from_dlpack_with_the_legacy_stream_passes_1(fake):
    seen = []

    class Spy:
        def __init__(self, inner):
            self.inner = inner

        def __dlpack_device__(self):
            return self.inner.__dlpack_device__()

        def __dlpack__(self, **kwargs):
            seen.append(kwargs)
            if "max_version" in kwargs:
                raise TypeError("an old producer")
            return self.inner.__dlpack__(**kwargs)

    torch = TorchLike(fake)
    try:
        t = torch.from_dlpack(Spy(torch.zeros(2, "uint8")))
        assert seen == [{"max_version": (1, 0), "stream": 1}, {"stream": 1}]  # then without max_version
        assert t.numpy().tolist() == [0, 0]
        del t
    finally:
        torch.close()


def test_an_export_let_go_of_at_exit_after_the_doubles_module_is_cleared_does_not_crash(fake_cudart_path):
    """A consumer may call an export's deleter last of all, as the interpreter exits -- a capture
    held by a module-level name -- after the doubles' module globals were cleared.  torch's and
    cupy's deleters are C code that lives as long as the process; the doubles' are ctypes objects,
    and must be as durable (they were not: a capture held by a module-level name crashed the
    interpreter at exit, jumping to a freed callback)."""
    code = textwrap.dedent(f"""
        import ctypes, gc, sys
        sys.path.insert(0, {str(Path(__file__).parents[1])!r})
        import numpy as np
        import fake_cuda, fake_producers
        torch = fake_producers.TorchLike(fake_cuda.FakeCudart({str(fake_cudart_path)!r}))
        capsule = torch.from_numpy(np.arange(4, dtype=np.float32)).__dlpack__()
        get = ctypes.pythonapi.PyCapsule_GetPointer
        get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        managed = get(capsule, b"dltensor")
        ctypes.pythonapi.PyCapsule_SetName(ctypes.py_object(capsule), b"used_dltensor")  # consumed
        deleter_at = managed + fake_cuda.DLManagedTensor.deleter.offset
        del capsule
        vars(fake_producers).clear()  # what finalisation does to the module, before the consumer lets go
        del fake_producers, torch
        gc.collect()
        deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(ctypes.c_void_p.from_address(deleter_at).value)
        deleter(managed)
        print("let go")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "let go", (proc.returncode, proc.stderr[-2000:])


# --- registration with tritonshm -----------------------------------------------------


def test_fixtures_register_the_current_stream_provider(torch_like, cupy_like):  # noqa: F811
    _stream = pytest.importorskip("tritonshm._memory._stream")
    providers = getattr(_stream, "current_stream_providers", None)
    if providers is None:
        pytest.skip("this tritonshm has no current_stream_providers")
    assert providers[0] == cupy_like.current_stream_provider  # the later fixture is first
    assert providers[1] == torch_like.current_stream_provider
    assert _stream.current_stream(0) == 0  # neither has a stream set: the legacy stream
    with torch_like.stream(0) as s:
        assert _stream.current_stream(0) == s
        assert torch_like.provider_calls >= 1
    assert os.environ.get(fake_cuda.ENV_SYNC) is None
