"""CudaWindow (counted byte ranges of a CUDA region), copy() and describe(), on the FAKE runtime.

Windows are what the client's CUDA slot pools are made of: a slot is free
again when its probe window is the only holder left, so the count must
include every view and every DLPack tensor a consumer still holds, and
must drop from any thread.  The fake runtime's counters tell whether the
memory was freed and how many bytes cudaMemcpyAsync moved, and on which
kind of stream (never the legacy default stream, never a device sync).
"""

from __future__ import annotations

import gc
import pickle
import threading
import weakref

import numpy as np
import pytest

import tritonshm
from tritonshm import CudaError, DTypeMismatch, OutOfBounds, RegionClosed, UnsupportedBuffer, cuda
from tritonshm._memory import _capture, _copy, _cuda_window

from fake_cuda import ENV_DEVICES, ENV_FAIL, ClosingIndex, consume_dlpack

# --------------------------------------------------------------------------
# DLPack without torch: producers here, the consumer is fake_cuda.consume_dlpack
# --------------------------------------------------------------------------


class DLPackOnly:
    """A producer that speaks only DLPack (no CUDA Array Interface), over another's memory."""

    def __init__(self, inner, device=None):
        self.inner = inner
        self.device = device
        self.streams = []

    def __dlpack_device__(self):
        return self.device if self.device is not None else self.inner.__dlpack_device__()

    def __dlpack__(self, **kwargs):
        self.streams.append(kwargs.get("stream"))
        return self.inner.__dlpack__(**kwargs)


class CaiOnly:
    """A producer that speaks only the CUDA Array Interface, with optional stream / read-only / strides."""

    def __init__(self, view, stream=None, readonly=False, strides=None, dlpack_device=None):
        cai = dict(view.__cuda_array_interface__, stream=stream, strides=strides)
        cai["data"] = (cai["data"][0], readonly)
        self.__cuda_array_interface__ = cai
        if dlpack_device is not None:
            self.__dlpack_device__ = lambda: dlpack_device


# --------------------------------------------------------------------------
# Windows: ranges, views, errors
# --------------------------------------------------------------------------


def test_window_ranges_and_properties(fake_cuda):
    with tritonshm.CudaRegion.create(4096) as c:
        whole = c.window()
        assert (whole.offset, whole.nbytes, whole.ptr) == (0, 4096, c.ptr)
        w = c.window(1024, 512)
        assert (w.offset, w.nbytes, w.device, w.key) == (1024, 512, 0, c.key)
        assert w.ptr == c.ptr + 1024 and w.holders == 1
        rest = c.window(4000)
        assert rest.nbytes == 96 and rest.ptr == c.ptr + 4000
        empty = c.window(4096, 0)
        assert empty.nbytes == 0
        assert "CudaWindow" in repr(w) and "holders=1" in repr(w)
        del whole, w, rest, empty


@pytest.mark.parametrize("offset, nbytes", [(-1, 4), (4097, None), (0, 4097), (4000, 97), (2**64, 1),
                                            (1, 2**64 - 1), ("1", 4), (1.0, 4), (0, -1)])
def test_window_out_of_range_is_refused(fake_cuda, offset, nbytes):
    with tritonshm.CudaRegion.create(4096) as c:
        with pytest.raises(OutOfBounds):
            c.window(offset, nbytes)
        assert c.exports == 0


def test_window_of_a_closed_region_is_refused(fake_cuda):
    c = tritonshm.CudaRegion.create(64)
    c.close()
    with pytest.raises(RegionClosed):
        c.window()


def test_window_views_are_relative_and_stay_inside(fake_cuda):
    data = np.arange(1024, dtype=np.int32)
    with tritonshm.CudaRegion.create(4096) as c:
        c.write(data)
        w = c.window(1024, 512)
        v = w.view(np.int32, (4, 8), offset=64)
        assert v.ptr == c.ptr + 1024 + 64 and v.shape == (4, 8) and v.dtype == np.int32
        np.testing.assert_array_equal(v.get(), data[(1024 + 64) // 4:(1024 + 64) // 4 + 32].reshape(4, 8))
        full = w.view(np.uint8, 512)
        assert full.nbytes == 512
        # Inside the region but outside the window: refused.
        for shape, offset in [(513, 0), (1, 512), (16, 500), (4, -4), (4, 2**64)]:
            with pytest.raises(OutOfBounds):
                w.view(np.uint8, shape, offset=offset)
        with pytest.raises(DTypeMismatch):
            w.view(object, 2)
        with pytest.raises(DTypeMismatch, match="no DLPack equivalent"):
            w.view("datetime64[s]", 2)
        assert w.holders == 3  # w, v, full: the failures took nothing
        with pytest.raises(TypeError):
            _cuda_window.CudaWindow()
        bare = _cuda_window.CudaWindow.__new__(_cuda_window.CudaWindow)  # never crashes: refuses
        for op in (lambda: bare.ptr, lambda: bare.holders, lambda: bare.share(), lambda: bare.view(np.uint8, 0),
                   lambda: cuda.copy(bare, b"")):
            with pytest.raises(TypeError):
                op()
        assert "not made" in repr(bare)
        del v, full, w


def test_windows_and_their_views_cannot_be_pickled(fake_cuda):
    with tritonshm.CudaRegion.create(64) as c:
        w = c.window(0, 32)
        with pytest.raises(TypeError, match="cannot be pickled"):
            pickle.dumps(w)
        with pytest.raises(TypeError, match="cannot be pickled"):
            pickle.dumps(w.view(np.uint8, 4))
        del w


# --------------------------------------------------------------------------
# Holders
# --------------------------------------------------------------------------


def test_holders_count_windows_shares_and_views(fake_cuda):
    with tritonshm.CudaRegion.create(4096) as c:
        w = c.window(0, 1024)
        other = c.window(1024, 1024)  # another range: another count
        probe = w.share()
        assert probe.holders == w.holders == 2 and other.holders == 1
        assert (probe.offset, probe.nbytes, probe.ptr, probe.key) == (w.offset, w.nbytes, w.ptr, w.key)
        views = [w.view(np.float32, 16, offset=64 * i) for i in range(5)]
        assert probe.holders == 7 and other.holders == 1
        region_view = c.view(np.float32, 16)  # a region view is no window's holder
        assert probe.holders == 7
        del views[0]
        assert probe.holders == 6
        views.clear()
        assert probe.holders == 2
        del w
        assert probe.holders == 1  # the pool's "slot is free" condition
        # Windows and views take weak references (a pool's weakref.finalize on what it hands out).
        lent = probe.share()
        fired = []
        weakref.finalize(lent, fired.append, "window")
        weakref.finalize(lent.view(np.uint8, 4), fired.append, "view")
        assert fired == ["view"] and probe.holders == 2
        del lent
        assert fired == ["view", "window"] and probe.holders == 1
        del region_view, other, probe


def test_exports_count_each_window_once_and_survive_close(fake_cuda):
    base = fake_cuda.stats().live_allocs
    c = tritonshm.CudaRegion.create(4096)
    w = c.window(0, 2048)
    probe = w.share()
    v = w.view(np.uint8, 16)
    plain = c.view(np.uint8, 16)
    assert c.exports == 2  # the window's hold (w, probe, v together) + the plain view
    other = c.window(2048)
    assert c.exports == 3
    del other
    assert c.exports == 2
    c.close()
    assert c.closed and c.exports == 2 and fake_cuda.stats().live_allocs == base + 1
    # The window still works: views, copies, DLPack.
    assert cuda.copy(v, np.full(16, 7, np.uint8)) == 16
    np.testing.assert_array_equal(v.get(), np.full(16, 7, np.uint8))
    w2 = w.view(np.uint8, 16, offset=16)
    assert probe.holders == 4
    del plain
    assert c.exports == 1 and fake_cuda.stats().live_allocs == base + 1
    del w, v, w2
    assert probe.holders == 1 and fake_cuda.stats().live_allocs == base + 1
    del probe  # the last holder of the last reference frees the memory
    assert c.exports == 0 and fake_cuda.stats().live_allocs == base


def test_unconsumed_capsules_hold_and_release(fake_cuda):
    with tritonshm.CudaRegion.create(4096) as c:
        probe = c.window(512, 512)
        v = probe.view(np.float32, (2, 4), offset=32)
        versioned = v.__dlpack__(max_version=(1, 0))
        legacy = v.__dlpack__()
        assert probe.holders == 4 and c.exports == 1
        del versioned
        assert probe.holders == 3
        del legacy
        assert probe.holders == 2
        del v
        assert probe.holders == 1
        del probe


@pytest.mark.parametrize("versioned", [True, False])
def test_consumed_capsule_keeps_holders_up_until_its_deleter_runs(fake_cuda, versioned):
    base = fake_cuda.stats().live_allocs
    c = tritonshm.CudaRegion.create(4096)
    c.write(np.arange(1024, dtype=np.float32))
    w = c.window(2048, 1024)
    probe = w.share()
    v = w.view(np.float32, (3, 5), offset=128)
    capsule = v.__dlpack__(max_version=(1, 1) if versioned else None, stream=1)
    ptr, t, deleter = consume_dlpack(capsule, versioned)
    d = t.dl_tensor
    assert d.data == c.ptr + 2048 + 128 and d.byte_offset == 0 and (d.device_type, d.device_id) == (2, 0)
    assert (d.code, d.bits, d.lanes, d.ndim) == (2, 32, 1, 2) and [d.shape[i] for i in range(2)] == [3, 5]
    assert probe.holders == 4
    del capsule, v, w  # the consumer (think torch) still has the tensor
    c.close()
    gc.collect()
    assert probe.holders == 2 and fake_cuda.stats().live_allocs == base + 1
    # The memory is still there: read it through the consumer's pointer.
    assert fake_cuda.read(d.data, 4) == np.float32(512 + 32).tobytes()
    deleter(ptr)
    assert probe.holders == 1 and fake_cuda.stats().live_allocs == base + 1
    del probe
    assert fake_cuda.stats().live_allocs == base and c.exports == 0


def test_last_holder_dropped_on_another_thread_without_the_gil_frees(fake_cuda):
    base = fake_cuda.stats().live_allocs
    c = tritonshm.CudaRegion.create(4096)
    w = c.window(0, 4096)
    v = w.view(np.int64, 8)
    ptr, _, deleter = consume_dlpack(v.__dlpack__(max_version=(1, 0)))
    del v, w
    c.close()
    assert fake_cuda.stats().live_allocs == base + 1
    thread = threading.Thread(target=deleter, args=(ptr,))
    thread.start()
    thread.join()
    assert fake_cuda.stats().live_allocs == base and c.exports == 0


def test_holders_drop_from_many_threads(fake_cuda):
    with tritonshm.CudaRegion.create(1 << 16) as c:
        probe = c.window(0, 1 << 16)
        rounds, nthreads = 200, 8
        barrier = threading.Barrier(nthreads)
        errors = []

        def work(i):
            try:
                barrier.wait()
                for _ in range(rounds):
                    shares = [probe.share() for _ in range(3)]
                    views = [s.view(np.uint8, 64, offset=64 * i) for s in shares]
                    consumed = [consume_dlpack(v.__dlpack__(max_version=(1, 0))) for v in views]
                    del shares, views
                    for ptr, _, deleter in consumed:
                        deleter(ptr)  # releases the GIL: decrefs race with the other threads
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(nthreads)]
        for t in threads:
            t.start()
        # The probe's count is never below 1 while it lives.
        while any(t.is_alive() for t in threads):
            assert probe.holders >= 1
        for t in threads:
            t.join()
        assert not errors, errors
        assert probe.holders == 1 and c.exports == 1
        del probe
        assert c.exports == 0


# --------------------------------------------------------------------------
# copy(): every kind of end, offsets, refusals
# --------------------------------------------------------------------------

SIZE = 256


class Ends:
    """Makes copy() ends of SIZE bytes (plus a margin around device ones) and reads them back."""

    def __init__(self, fake):
        self.regions = []
        self.fake = fake
        self.streams = []

    def close(self):
        for r in self.regions:
            r.close()
        for s in self.streams:
            self.fake.stream_destroy(s)

    def make(self, kind, data):
        """An end of *kind* holding *data* (SIZE uint8), and a function returning its current bytes."""
        if kind == "host":
            a = data.copy()
            return a, lambda: a.copy()
        if kind == "host_f64":  # a host array of another dtype: bytes are what count
            a = data.view(np.float64).copy()
            return a, lambda: a.view(np.uint8).copy()
        r = tritonshm.CudaRegion.create(SIZE + 2 * 128)
        self.regions.append(r)
        r.write(data, offset=128)
        read = lambda: r.read(np.uint8, SIZE, offset=128)  # noqa: E731
        if kind == "region":
            r.close()
            r = tritonshm.CudaRegion.create(SIZE)
            self.regions.append(r)
            r.write(data)
            return r, (lambda r=r: r.read(np.uint8, SIZE))
        if kind == "window":
            return r.window(128, SIZE), read
        if kind == "array":
            return r.view(np.uint8, SIZE, offset=128), read
        if kind == "cai":  # a producer on a stream of its own (the fake's, so a real handle)
            self.streams.append(self.fake.stream_create())
            return CaiOnly(r.view(np.uint8, SIZE, offset=128), stream=self.streams[-1]), read
        if kind == "dlpack":
            return DLPackOnly(r.view(np.uint8, SIZE, offset=128)), read
        raise AssertionError(kind)


KINDS = ["region", "window", "array", "cai", "dlpack", "host", "host_f64"]


@pytest.fixture
def ends(fake_cuda):
    e = Ends(fake_cuda)
    yield e
    e.close()


@pytest.mark.parametrize("src_kind", KINDS)
@pytest.mark.parametrize("dst_kind", KINDS)
def test_copy_between_every_kind_of_end(fake_cuda, ends, dst_kind, src_kind):
    src_bytes = np.arange(SIZE, dtype=np.uint8)
    dst_bytes = np.full(SIZE, 0xEE, np.uint8)
    src, read_src = ends.make(src_kind, src_bytes)
    dst, read_dst = ends.make(dst_kind, dst_bytes)
    before = fake_cuda.stats()
    assert cuda.copy(dst, src, 40, dst_offset=16, src_offset=100) == 40
    delta = fake_cuda.stats() - before
    assert delta.async_copies == 1 and delta.async_copy_bytes == 40
    # Issue 17 #6: never cudaMemcpy, the legacy default stream or a device-wide sync.
    assert delta.memcpy_calls == 0 and delta.legacy_syncs == 0 and delta.device_syncs == 0
    expected = dst_bytes.copy()
    expected[16:56] = src_bytes[100:140]
    np.testing.assert_array_equal(read_dst(), expected)
    np.testing.assert_array_equal(read_src(), src_bytes)
    if "cai" in (dst_kind, src_kind):
        # An event on the producer's stream, waited for by the copy stream (no host wait on it).
        assert delta.event_records >= 1 and delta.stream_waits >= 1
    # Default nbytes: the rest of src after src_offset.
    assert cuda.copy(dst, src, src_offset=SIZE - 8) == 8
    expected[:8] = src_bytes[SIZE - 8:]
    np.testing.assert_array_equal(read_dst(), expected)
    del src, dst


def test_dlpack_ends_get_the_copy_streams_handshake(fake_cuda):
    with tritonshm.CudaRegion.create(64) as a, tritonshm.CudaRegion.create(64) as b:
        a.write(np.arange(64, dtype=np.uint8))
        src, dst = DLPackOnly(a.view(np.uint8, 64)), DLPackOnly(b.view(np.uint8, 64))
        assert cuda.copy(dst, src) == 64
        # The producer is told the stream the copy runs on: this thread's copy stream, not legacy.
        handle = cuda.copy_stream(0).handle
        assert handle not in (0, 1, 2)
        assert src.streams == [handle] and dst.streams == [handle]
        np.testing.assert_array_equal(b.read(np.uint8, 64), np.arange(64, dtype=np.uint8))
        assert a.exports == 1 and b.exports == 1  # the imported tensors were released
        del src, dst


def test_copy_takes_any_c_contiguous_host_dtype(fake_cuda):
    with tritonshm.CudaRegion.create(64) as c:
        when = np.array(["2024-01-01", "2025-06-30"], dtype="datetime64[s]")  # no buffer protocol
        assert cuda.copy(c, when) == 16
        out = np.zeros(2, dtype="datetime64[s]")
        assert cuda.copy(out, c, 16) == 16
        np.testing.assert_array_equal(out, when)
        assert cuda.copy(c, b"hello", dst_offset=32) == 5
        buf = bytearray(5)
        assert cuda.copy(buf, c, src_offset=32, nbytes=5) == 5 and buf == b"hello"
        m = np.zeros((2, 3), np.float32)
        cuda.copy(c, np.arange(6, dtype=np.float32).reshape(2, 3))
        cuda.copy(m, c, 24)
        np.testing.assert_array_equal(m, np.arange(6, dtype=np.float32).reshape(2, 3))


@pytest.mark.parametrize("kwargs", [
    {"nbytes": 65},                                   # larger than both
    {"nbytes": 33, "dst_offset": 32},                 # past dst's end
    {"nbytes": 8, "src_offset": 60},                  # past src's end
    {"src_offset": 65},                               # offset past the end
    {"dst_offset": 65, "nbytes": 0},
    {"dst_offset": -1, "nbytes": 4},
    {"src_offset": -1, "nbytes": 4},
    {"nbytes": -1},
    {"nbytes": 2**64},
    {"dst_offset": 2**64, "nbytes": 1},
    {"src_offset": 1, "nbytes": 2**64 - 1},
    {"dst_offset": "0", "nbytes": 4},
    {"src_offset": 1.5, "nbytes": 4},
    {"nbytes": 4.0},
])
def test_copy_out_of_range_is_refused_and_copies_nothing(fake_cuda, kwargs):
    with tritonshm.CudaRegion.create(64) as dst:
        src = np.arange(64, dtype=np.uint8)
        host_dst = np.zeros(64, np.uint8)
        before = fake_cuda.stats()
        with pytest.raises(OutOfBounds):
            cuda.copy(dst, src, **kwargs)
        with pytest.raises(OutOfBounds):
            cuda.copy(host_dst, dst.window(), **kwargs)
        assert fake_cuda.stats().async_copies == before.async_copies
        assert not dst.read(np.uint8, 64).any() and not host_dst.any()
        assert dst.exports == 0


def test_copy_checks_the_destination_against_a_default_nbytes(fake_cuda):
    with tritonshm.CudaRegion.create(64) as dst:
        with pytest.raises(OutOfBounds, match="dst"):
            cuda.copy(dst.window(0, 32), np.ones(48, np.uint8))
        with pytest.raises(OutOfBounds, match="dst"):
            cuda.copy(dst.view(np.uint8, 16), dst.window(16, 32))
        assert not dst.read(np.uint8, 64).any()


def test_copy_zero_bytes_makes_no_cuda_call(fake_cuda):
    with tritonshm.CudaRegion.create(64) as c:
        before = fake_cuda.stats()
        assert cuda.copy(c, np.ones(8, np.uint8), 0) == 0
        assert cuda.copy(c, np.ones(8, np.uint8), src_offset=8) == 0  # nothing left after the offset
        assert cuda.copy(np.zeros(0, np.uint8), c, 0, src_offset=64) == 0
        assert cuda.copy(c.window(64), c.window(0, 0)) == 0
        assert fake_cuda.stats().async_copies == before.async_copies
        assert fake_cuda.stats().stream_sync_calls == before.stream_sync_calls
        assert not c.read(np.uint8, 64).any()


def test_copy_refuses_what_it_cannot_use(fake_cuda):
    with tritonshm.CudaRegion.create(64) as c:
        c.write(np.arange(64, dtype=np.uint8))
        closed = tritonshm.CudaRegion.create(64)
        closed.close()
        before = fake_cuda.stats()
        with pytest.raises(RegionClosed):
            cuda.copy(closed, c)
        with pytest.raises(RegionClosed):
            cuda.copy(c, closed)
        with pytest.raises(UnsupportedBuffer, match="read-only"):
            cuda.copy(b"12345678", c, 8)
        ro = np.zeros(8, np.uint8)
        ro.flags.writeable = False
        with pytest.raises(UnsupportedBuffer, match="read-only"):
            cuda.copy(ro, c, 8)
        with pytest.raises(UnsupportedBuffer, match="read-only"):
            cuda.copy(CaiOnly(c.view(np.uint8, 8), readonly=True), np.ones(8, np.uint8))
        with pytest.raises(DTypeMismatch):
            cuda.copy(c, np.array([object()] * 2))
        with pytest.raises(DTypeMismatch):
            cuda.copy(np.empty(2, object), c, 16)
        with pytest.raises(UnsupportedBuffer, match="C-contiguous"):
            cuda.copy(c, np.arange(16, dtype=np.int32)[::2])
        with pytest.raises(UnsupportedBuffer, match="C-contiguous"):
            cuda.copy(c, CaiOnly(c.view(np.float32, 4), strides=(8,)))
        with pytest.raises(UnsupportedBuffer):
            cuda.copy(c, 12)
        with pytest.raises(UnsupportedBuffer):
            cuda.copy("text", c)
        with pytest.raises(OutOfBounds, match="overlap"):
            cuda.copy(c, c, 16, dst_offset=8)
        assert fake_cuda.stats().async_copies == before.async_copies
        np.testing.assert_array_equal(c.read(np.uint8, 64), np.arange(64, dtype=np.uint8))
        # The same range onto itself is allowed and moves nothing.
        before = fake_cuda.stats()
        assert cuda.copy(c, c.window(0, 16)) == 16
        assert fake_cuda.stats().async_copies == before.async_copies
        assert c.exports == 0


def test_copy_failure_is_a_cuda_error_and_gives_references_back(fake_cuda, monkeypatch):
    with tritonshm.CudaRegion.create(64) as a, tritonshm.CudaRegion.create(64) as b:
        w = b.window()
        monkeypatch.setenv(ENV_FAIL, "cudaMemcpyAsync=700")
        with pytest.raises(CudaError, match="700"):
            cuda.copy(a, w)
        with pytest.raises(CudaError):
            cuda.copy(np.zeros(8, np.uint8), a, 8)
        monkeypatch.delenv(ENV_FAIL)
        assert a.exports == 0 and b.exports == 1 and w.holders == 1
        del w


def test_region_closed_while_the_offsets_convert_is_refused(fake_cuda):
    base = fake_cuda.stats().live_allocs
    c = tritonshm.CudaRegion.create(64)

    with pytest.raises(RegionClosed):
        cuda.copy(c, b"abcd", dst_offset=ClosingIndex(c))
    assert c.exports == 0 and fake_cuda.stats().live_allocs == base


def test_region_closed_during_the_copy_setup_keeps_its_memory_until_done(fake_cuda):
    base = fake_cuda.stats().live_allocs
    c = tritonshm.CudaRegion.create(64)
    other = tritonshm.CudaRegion.create(64)
    other.write(np.full(64, 5, np.uint8))
    view = other.view(np.uint8, 64)

    class ClosesTheDestination:  # resolved after dst: dst is already held by copy()
        @property
        def __cuda_array_interface__(self):
            c.close()
            return view.__cuda_array_interface__

    before = fake_cuda.stats()
    assert cuda.copy(c, ClosesTheDestination()) == 64
    assert (fake_cuda.stats() - before).async_copy_bytes == 64
    assert c.closed and c.exports == 0
    del view
    other.close()
    assert fake_cuda.stats().live_allocs == base


def test_copy_and_describe_are_in_tritonshm_cuda():
    assert cuda.copy is _copy.copy and cuda.describe is _capture.describe
    assert cuda.CudaWindow is _cuda_window.CudaWindow
    assert {"copy", "describe", "CudaWindow"} <= set(cuda.__all__)
    window = _cuda_window.CudaWindow
    for obj in (cuda.copy, cuda.describe, window, window.holders, window.share, window.view, window.ptr,
                tritonshm.CudaRegion.window):
        assert obj.__doc__ and len(obj.__doc__.strip()) > 20, obj


# --------------------------------------------------------------------------
# describe()
# --------------------------------------------------------------------------


def test_describe_device_arrays(fake_cuda, monkeypatch):
    monkeypatch.setenv(ENV_DEVICES, "4")  # a CAI producer on device 3 is read under device 3's guard
    with tritonshm.CudaRegion.create(4096) as c:
        v = c.view(np.float16, (3, 5), offset=64)
        dt, shape, device = cuda.describe(v)
        assert dt == np.float16 and shape == (3, 5) and device == 0
        w = c.window(1024, 1024)
        wv = w.view(np.int64, (2, 2, 2))
        assert cuda.describe(wv) == (np.dtype(np.int64), (2, 2, 2), 0)
        assert cuda.describe(CaiOnly(c.view(np.int16, (4, 8)))) == (np.dtype(np.int16), (4, 8), 0)
        # CAI has no device: taken from __dlpack_device__ when the object has one.
        assert cuda.describe(CaiOnly(c.view(np.int8, 3), dlpack_device=(2, 3)))[2] == 3
        # DLPack only: imported (no stream sync), read, released at once.
        producer = DLPackOnly(w.view(np.bool_, (7,)))
        assert w.holders == 3
        assert cuda.describe(producer) == (np.dtype(np.bool_), (7,), 0)
        assert producer.streams == [-1] and w.holders == 3
        assert cuda.describe(DLPackOnly(c.view(np.complex64, (2, 1)))) == (np.dtype(np.complex64), (2, 1), 0)
        # A CAI that raises (torch does, for bfloat16) is not fatal: DLPack is asked instead.
        class RaisingCai(DLPackOnly):
            @property
            def __cuda_array_interface__(self):
                raise TypeError("dtype not supported by the interface")

        assert cuda.describe(RaisingCai(c.view(np.uint16, 6))) == (np.dtype(np.uint16), (6,), 0)
        # A size-1 dim with any stride is still contiguous.
        assert cuda.describe(CaiOnly(c.view(np.float32, (4, 1)), strides=(4, 400)))[1] == (4, 1)
        del v, w, wv, producer


def test_describe_is_none_for_host_memory(fake_cuda):
    with tritonshm.CudaRegion.create(64) as c:
        for obj in (np.zeros(3), b"xyz", [1, 2], 3, None, c.window(), c):
            assert cuda.describe(obj) is None
        # DLPack producers on the host or in pinned host memory (kDLCUDAHost) are not device arrays.
        for device_type in (1, 3):
            producer = DLPackOnly(c.view(np.uint8, 4), device=(device_type, 0))
            assert cuda.describe(producer) is None and producer.streams == []
        del producer
        assert c.exports == 0


def test_describe_refuses_non_contiguous_and_malformed(fake_cuda):
    with tritonshm.CudaRegion.create(64) as c:
        with pytest.raises(UnsupportedBuffer, match="C-contiguous"):
            cuda.describe(CaiOnly(c.view(np.float32, (2, 4)), strides=(4, 8)))

        class Malformed:
            __cuda_array_interface__ = {"shape": (2,), "version": 3}

        with pytest.raises(UnsupportedBuffer, match="malformed"):
            cuda.describe(Malformed())


# --------------------------------------------------------------------------
# empty(): a device array in an allocation of its own
# --------------------------------------------------------------------------


def test_empty_is_a_plain_allocation_freed_with_its_last_holder(fake_cuda):
    before = fake_cuda.stats()
    out = cuda.empty(np.int16, (3, 5), device=0)
    assert isinstance(out, cuda.CudaArray) and out.shape == (3, 5) and out.dtype == np.int16
    used = fake_cuda.stats() - before
    assert (used.malloc_calls, used.ipc_get_calls, used.live_allocs) == (1, 0, 1)
    cuda.copy(out, np.arange(15, dtype=np.int16).reshape(3, 5))
    capsule = out.__dlpack__(max_version=(1, 0))
    del out
    gc.collect()
    assert (fake_cuda.stats() - before).live_allocs == 1  # the DLPack tensor holds it
    managed, tensor, deleter = consume_dlpack(capsule)
    del capsule
    assert fake_cuda.read(tensor.dl_tensor.data, 4) == np.arange(2, dtype=np.int16).tobytes()
    deleter(managed)
    assert (fake_cuda.stats() - before).live_allocs == 0


def test_empty_of_nothing_and_its_refusals(fake_cuda):
    zero = cuda.empty(np.float32, (0, 4))
    assert zero.nbytes == 0 and zero.shape == (0, 4)
    with pytest.raises(DTypeMismatch):
        cuda.empty(object, 4)
    with pytest.raises(tritonshm.ShapeMismatch):
        cuda.empty(np.float32, (-1,))
    with pytest.raises(OutOfBounds):
        cuda.empty(np.float32, 4, device=-1)
