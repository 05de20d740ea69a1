"""Streams, events, the device guard, capture() and copy(stream=) against the ADVERSARIAL fake runtime.

The fake (tests/fake_cudart) completes nothing on return: queued copies and
"kernel writes" land only when their stream, an event recorded after them,
or the device is synchronized; it records which devices got a context and
counts syncs of the legacy default stream and of the device.  The torch-like
and cupy-like doubles (tests/fake_producers.py) queue their writes on a
per-thread current stream, do torch's DLPack stream handshake and refuse to
export from a non-current device as torch does.

Regression tests for issue 17, per defect of the C/Cython layer:

* #3 contexts and devices: test_a_thread_that_only_uses_device_1_creates_no_context_on_device_0,
  test_pinned_region_is_registered_under_its_device,
  test_guard_puts_back_a_previous_device_that_has_a_context,
  test_torch_refusal_from_another_device_is_avoided_by_the_guard,
  test_producer_refusals_become_unsupported_buffer
* #5 slot reuse before a consumer's stream is done:
  test_window_has_readers_pending_until_the_consumers_stream_is_done,
  test_readers_pending_clears_when_the_consumer_synchronizes, test_reader_events_are_freed_with_the_window
* #6 legacy-stream cudaMemcpy + sync:
  test_copies_never_use_cudamemcpy_the_legacy_stream_or_a_device_sync,
  test_threads_copy_on_streams_of_their_own, test_copy_on_a_given_stream_is_asynchronous
* #8 device numbers and the read-only attribute:
  test_device_numbers_are_checked_against_the_device_count,
  test_read_only_pinning_needs_the_read_only_attribute
* #1/#2 groundwork (capture on the caller's thread):
  test_capture_orders_a_producers_pending_work_for_a_copy_on_another_thread and the CAI/CudaArray variants
"""

from __future__ import annotations

import gc
import pickle
import threading

import numpy as np
import pytest

import tritonshm
from tritonshm import CudaUnavailable, OutOfBounds, RegionClosed, UnsupportedBuffer, cuda
from tritonshm._memory import _stream

from fake_cuda import ENV_DEVICES, ENV_NO_READONLY_REGISTER
from fake_producers import CupyLike, TorchLike

N = 256
DATA = np.arange(N, dtype=np.uint8)


def in_thread(fn):
    """Run *fn* on a fresh thread (one that never chose a device); re-raise what it raised."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out.get("value")


@pytest.fixture
def two_gpus(fake_cuda, monkeypatch):
    monkeypatch.setenv(ENV_DEVICES, "2")
    return fake_cuda


def _producer(cls, fake):
    producer = cls(fake)
    _stream.current_stream_providers.insert(0, producer.current_stream_provider)
    try:
        yield producer
    finally:
        _stream.current_stream_providers.remove(producer.current_stream_provider)
        fake.device_synchronize()  # nothing of the double's stays queued past the test
        producer.close()
        gc.collect()


@pytest.fixture
def torch_double(fake_cuda):
    yield from _producer(TorchLike, fake_cuda)


@pytest.fixture
def cupy_double(fake_cuda):
    yield from _producer(CupyLike, fake_cuda)


# --------------------------------------------------------------------------
# The API: Stream, Event, copy_stream, current_stream, device_guard
# --------------------------------------------------------------------------


def test_stream_and_event_round_trip(fake_cuda):
    before = fake_cuda.stats()
    s = cuda.Stream.create(0)
    assert s.device == 0 and s.handle not in (0, 1, 2) and not s.closed
    e = cuda.Event.create(0)
    assert e.query() is True  # never recorded: complete
    with tritonshm.CudaRegion.create(N) as r:
        fake_cuda.kernel_write(s.handle, r.ptr, bytes(DATA))
        assert e.record(s) is e
        assert e.query() is False  # the write is queued, not landed
        e.synchronize()
        assert e.query() is True
        assert fake_cuda.read(r.ptr, N) == bytes(DATA)
        # wait(): another stream's later work is ordered after the event
        other = cuda.Stream.create(0)
        fake_cuda.kernel_write(s.handle, r.ptr, b"\x07" * N)
        e.record(s.handle)  # an int handle works too
        other.wait(e)
        assert s.record().query() in (False, True)
        other.synchronize()  # lands s's write through the dependency
        assert fake_cuda.read(r.ptr, N) == b"\x07" * N
        other.close()
    delta = fake_cuda.stats() - before
    assert delta.stream_creates == 2 and delta.stream_waits == 1 and delta.device_syncs == 0
    s.close()
    s.close()  # idempotent
    e.close()
    with pytest.raises(RegionClosed):
        s.handle
    with pytest.raises(RegionClosed):
        s.synchronize()
    with pytest.raises(RegionClosed):
        e.query()
    assert "closed" in repr(s) and "closed" in repr(e)


def test_streams_and_events_refuse_what_would_crash(fake_cuda):
    s = cuda.Stream.create(0)
    e = cuda.Event.create(0)
    for obj in (s, e):
        with pytest.raises(TypeError):
            pickle.dumps(obj)
        with pytest.raises(TypeError):
            type(obj)()
    with pytest.raises(TypeError):
        s.wait(None)
    with pytest.raises(TypeError):
        s.wait(123)
    with pytest.raises(UnsupportedBuffer):
        e.record("stream")
    with pytest.raises(OutOfBounds):
        e.record(-5)
    with pytest.raises(tritonshm.CudaError):
        e.record(0xDEAD0)  # not a stream the runtime made: an error, not a crash
    with pytest.raises(TypeError):
        cuda.copy(np.zeros(4, np.uint8), np.ones(4, np.uint8), stream=1)
    s.close()
    e.close()


def test_copy_stream_is_one_per_thread_and_device(two_gpus):
    main0 = cuda.copy_stream(0)
    assert cuda.copy_stream(0) is main0 and cuda.copy_stream(1) is not main0
    assert cuda.copy_stream(1).device == 1
    other = in_thread(lambda: cuda.copy_stream(0))
    assert other is not main0 and other.handle != main0.handle
    main0.close()  # a closed one is replaced
    assert not cuda.copy_stream(0).closed


def test_current_stream_asks_the_providers_in_order(fake_cuda):
    assert cuda.current_stream(0) == 0  # nobody answers: the legacy default stream
    assert cuda.current_stream_providers is _stream.current_stream_providers
    calls = []

    def mine(device):
        calls.append(device)
        return 4242 if device == 0 else None

    cuda.current_stream_providers.insert(0, mine)
    try:
        assert cuda.current_stream(0) == 4242 and cuda.current_stream(3) == 0
        assert calls == [0, 3]
    finally:
        cuda.current_stream_providers.remove(mine)


def test_current_stream_follows_the_doubles_per_thread_stream(torch_double):
    assert cuda.current_stream(0) == 0
    with torch_double.stream(0) as s:
        assert cuda.current_stream(0) == s
        assert in_thread(lambda: cuda.current_stream(0)) == 0  # another thread: its own (default)
    assert cuda.current_stream(0) == 0


def test_device_guard_enters_and_leaves(two_gpus):
    def body():
        two_gpus.set_device(0)  # this thread uses device 0: it has a context, so it comes back
        with cuda.device_guard(1) as g:
            assert two_gpus.get_device() == 1 and g.device == 1
            with g:  # re-entrant
                assert two_gpus.get_device() == 1
            assert two_gpus.get_device() == 1
        return two_gpus.get_device()

    assert in_thread(body) == 0

    def fresh():  # a thread that never chose a device reads 0, which has no context: it stays on 1
        with cuda.device_guard(1):
            pass
        return two_gpus.get_device(), two_gpus.contexts()

    two_gpus.reset_contexts()
    assert in_thread(fresh) == (1, {1})


# --------------------------------------------------------------------------
# #3: contexts, devices, the torch refusal
# --------------------------------------------------------------------------


def test_a_thread_that_only_uses_device_1_creates_no_context_on_device_0(two_gpus):
    two_gpus.reset_contexts()

    def body():
        with tritonshm.CudaRegion.create(N, device=1) as r:
            r.write(DATA)
            np.testing.assert_array_equal(r.read(np.uint8, N), DATA)
            w = r.window()
            cuda.copy(w, np.full(N, 3, np.uint8))
            np.testing.assert_array_equal(w.view(np.uint8, N).get(), np.full(N, 3, np.uint8))
            s = cuda.Stream.create(1)
            e = cuda.Event.create(1).record(s)
            e.synchronize()
            assert not w.readers_pending()
            del w
            s.close()
            e.close()
        return two_gpus.contexts()

    # The old guard put "device 0" back after every call: a context on GPU 0.
    assert in_thread(body) == {1}
    assert _stream.has_context(0) is False and _stream.has_context(1) is True


def test_pinned_region_is_registered_under_its_device(two_gpus):
    two_gpus.reset_contexts()

    def body():
        with tritonshm.PinnedRegion.create(4096, device=1) as p:
            assert p.device == 1
        return two_gpus.contexts()

    # cudaHostRegister attaches to the current device's context: it was device 0's.
    assert in_thread(body) == {1}


def test_guard_puts_back_a_previous_device_that_has_a_context(two_gpus):
    def body():
        two_gpus.set_device(0)
        with tritonshm.CudaRegion.create(N, device=1) as r:
            r.write(DATA)
            assert two_gpus.get_device() == 0
            r.read(np.uint8, N)
            assert two_gpus.get_device() == 0
        return two_gpus.get_device()

    assert in_thread(body) == 0


def test_torch_refusal_from_another_device_is_avoided_by_the_guard(two_gpus, torch_double):
    two_gpus.set_device(0)
    t = torch_double.from_numpy(DATA, device=1)
    with tritonshm.CudaRegion.create(N, device=0) as r:
        # torch refuses __dlpack__ unless the tensor's device is current: every DLPack call is guarded
        r.write(t)
        np.testing.assert_array_equal(r.read(np.uint8, N), DATA)
        assert cuda.describe(t) == (np.dtype(np.uint8), (N,), 1)
        out = torch_double.empty(N, np.uint8, device=1)
        assert cuda.copy(out, r) == N
        np.testing.assert_array_equal(out.numpy(), DATA)
        with cuda.capture(t) as cap:
            assert cap.device == 1 and cap.nbytes == N
    assert two_gpus.get_device() == 0
    del t, out


def test_producer_refusals_become_unsupported_buffer(fake_cuda):
    class Refuses:
        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, **kwargs):
            raise BufferError("Can't export tensors on a different CUDA device index")

    class BadCai:
        @property
        def __cuda_array_interface__(self):
            raise RuntimeError("requires grad")

    with tritonshm.CudaRegion.create(N) as r:
        for call in (lambda: r.write(Refuses()), lambda: cuda.copy(r, Refuses()),
                     lambda: cuda.capture(Refuses()), lambda: cuda.describe(Refuses()),
                     lambda: cuda.copy(r, BadCai()), lambda: cuda.capture(BadCai())):
            with pytest.raises(UnsupportedBuffer) as info:
                call()
            assert "refused" in str(info.value)
        with pytest.raises(UnsupportedBuffer, match="host memory"):
            cuda.capture(np.zeros(4))


# --------------------------------------------------------------------------
# #8: device numbers, the read-only registration attribute
# --------------------------------------------------------------------------


def test_device_numbers_are_checked_against_the_device_count(two_gpus):
    calls = [
        lambda: tritonshm.CudaRegion.create(64, device=2),
        lambda: tritonshm.CudaRegion.attach(b"\0" * 64, 64, device=2),
        lambda: cuda.empty(np.uint8, 4, device=5),
        lambda: tritonshm.PinnedRegion.create(4096, device=2),
        lambda: cuda.Stream.create(2),
        lambda: cuda.Event.create(2),
        lambda: cuda.device_guard(2),
        lambda: cuda.copy_stream(7),
    ]
    for call in calls:
        with pytest.raises(OutOfBounds, match="sees 2 CUDA GPUs") as info:
            call()
        assert isinstance(info.value, ValueError)
    with pytest.raises(OutOfBounds):
        cuda.Stream.create(-1)


def test_read_only_pinning_needs_the_read_only_attribute(fake_cuda, monkeypatch):
    with tritonshm.SystemRegion.create(4096) as owner:
        with tritonshm.PinnedRegion.attach(owner.key, readonly=True) as ro:
            assert ro.readonly and ro.pinned
        monkeypatch.setenv(ENV_NO_READONLY_REGISTER, "1")
        before = fake_cuda.stats()
        with pytest.raises(CudaUnavailable, match="read-only memory"):
            tritonshm.PinnedRegion.attach(owner.key, readonly=True)
        assert (fake_cuda.stats() - before).host_register_calls == 0  # checked first, not tried
        with tritonshm.PinnedRegion.attach(owner.key) as rw:  # a writable mapping needs no attribute
            assert rw.pinned


# --------------------------------------------------------------------------
# #6: no cudaMemcpy, no legacy default stream, no device-wide sync
# --------------------------------------------------------------------------


def test_copies_never_use_cudamemcpy_the_legacy_stream_or_a_device_sync(fake_cuda, torch_double, cupy_double):
    with tritonshm.CudaRegion.create(4 * N) as r, tritonshm.CudaRegion.create(4 * N) as r2:
        w = r.window(N, N)
        v = r.view(np.uint8, N, offset=2 * N)
        t = torch_double.from_numpy(DATA)
        c = cupy_double.from_numpy(DATA[::-1].copy())
        before = fake_cuda.stats()
        r.write(DATA)
        r.write(t, offset=N)
        r.write(c, offset=3 * N)
        cuda.copy(w, r, N)
        cuda.copy(r2, w)
        cuda.copy(r2, c, dst_offset=N)
        cuda.copy(r2, v, dst_offset=2 * N)
        host = np.zeros(N, np.uint8)
        cuda.copy(host, w)
        r.read(np.uint8, N)
        v.get()
        np.testing.assert_array_equal(r2.read(np.uint8, N, offset=N), DATA[::-1])
        delta = fake_cuda.stats() - before
        assert delta.async_copies >= 10
        assert delta.memcpy_calls == 0 and delta.legacy_syncs == 0 and delta.device_syncs == 0
        np.testing.assert_array_equal(host, DATA)
        del w, v, t, c


def test_threads_copy_on_streams_of_their_own(fake_cuda):
    with tritonshm.CudaRegion.create(4 * N) as r:
        handles = {}
        errors = []

        def work(i):
            try:
                for _ in range(20):
                    r.write(np.full(N, i, np.uint8), offset=i * N)
                    assert (r.read(np.uint8, N, offset=i * N) == i).all()
                handles[i] = cuda.copy_stream(0).handle
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and len(set(handles.values())) == 4


def test_copy_on_a_given_stream_is_asynchronous(fake_cuda):
    s = cuda.Stream.create(0)
    with tritonshm.CudaRegion.create(N) as r:
        before = fake_cuda.stats()
        assert cuda.copy(r, DATA, stream=s) == N
        assert fake_cuda.read(r.ptr, N) == bytes(N)  # queued on s: not landed
        s.synchronize()
        assert fake_cuda.read(r.ptr, N) == bytes(DATA)
        delta = fake_cuda.stats() - before
        assert delta.async_copies == 1 and delta.stream_sync_calls == 1 and delta.legacy_syncs == 0
    s.close()


def test_copy_on_a_given_stream_tells_a_dlpack_producer_that_stream(fake_cuda, torch_double):
    s = cuda.Stream.create(0)
    with torch_double.stream(0):
        t = torch_double.from_numpy(DATA)  # queued on the double's stream
        with tritonshm.CudaRegion.create(N) as r:
            handshakes = torch_double.handshakes
            cuda.copy(r, t, stream=s)
            assert torch_double.handshakes == handshakes + 1
            s.synchronize()  # lands the producer's write first, through the handshake's event
            assert fake_cuda.read(r.ptr, N) == bytes(DATA)
    s.close()
    del t


# --------------------------------------------------------------------------
# capture(): the caller's thread, the caller's stream
# --------------------------------------------------------------------------


def test_capture_orders_a_producers_pending_work_for_a_copy_on_another_thread(fake_cuda, torch_double):
    with tritonshm.CudaRegion.create(N) as r:
        with torch_double.stream(0):
            t = torch_double.from_numpy(DATA)  # queued on the caller's current stream
            cap = cuda.capture(t)              # handshake on this thread, with that stream current
        assert torch_double.handshakes >= 1
        assert cap.device == 0 and cap.nbytes == N and cap.dtype == np.uint8 and cap.shape == (N,)
        assert cuda.describe(cap) == (np.dtype(np.uint8), (N,), 0)
        # A worker thread (the old intake's mistake: its current stream is the default one)
        in_thread(lambda: cuda.copy(r, cap))
        np.testing.assert_array_equal(r.read(np.uint8, N), DATA)
        cap.release()
        cap.release()
        assert cap.closed
        with pytest.raises(RegionClosed):
            cuda.copy(r, cap)
        del t


def test_capture_of_a_cai_producer_waits_for_its_stream(fake_cuda, cupy_double):
    with tritonshm.CudaRegion.create(N) as r:
        with cupy_double.stream(0) as s:
            c = cupy_double.empty(N, np.uint8)
            fake_cuda.kernel_write(s, c.ptr, bytes(DATA))
            cap = cuda.capture(c)
        r.write(cap)
        np.testing.assert_array_equal(r.read(np.uint8, N), DATA)
        cap.release()
        del c


def test_capture_of_a_cudaarray_is_recorded_on_the_current_stream(fake_cuda, torch_double):
    with tritonshm.CudaRegion.create(2 * N) as r:
        v = r.view(np.uint8, N)
        with torch_double.stream(0) as s:
            fake_cuda.kernel_write(s, v.ptr, bytes(DATA))  # a kernel of the caller's writing the view
            cap = cuda.capture(v)
        in_thread(lambda: cuda.copy(r, cap, dst_offset=N))
        np.testing.assert_array_equal(r.read(np.uint8, N, offset=N), DATA)
        with pytest.raises(UnsupportedBuffer, match="not device=1"):
            cuda.capture(v, device=1)
        cap.release()
        del v


# --------------------------------------------------------------------------
# #5: a slot is not free while a consumer's stream may still read it
# --------------------------------------------------------------------------


def test_window_has_readers_pending_until_the_consumers_stream_is_done(fake_cuda, torch_double):
    with tritonshm.CudaRegion.create(N) as r:
        r.write(DATA)
        w = r.window()
        with torch_double.stream(0) as s:
            t = torch_double.from_dlpack(w.view(np.uint8, N))  # __dlpack__(stream=s)
            out = torch_double.empty(N, np.uint8)
            out.copy_(t)  # the consumer's kernel reading the slot, queued on s
            del t  # the deleter runs now; the kernel has not
            gc.collect()
            assert w.holders == 1
            # The old pool reused the slot here: only the count was looked at.
            assert w.readers_pending() is True
            assert fake_cuda.read(out.ptr, N) == bytes(N)  # the consumer has not read it yet
            polls = 0
            while w.readers_pending():
                polls += 1
                assert polls < 10
            # Free only once the consumer's kernel is done: the event was recorded after it, on s.
            assert fake_cuda.read(out.ptr, N) == bytes(DATA)
            assert w.readers_pending() is False  # the finished event was forgotten
        del w, out


def test_readers_pending_clears_when_the_consumer_synchronizes(fake_cuda, torch_double):
    with tritonshm.CudaRegion.create(N) as r:
        w = r.window()
        with torch_double.stream(0) as s:
            t = torch_double.from_dlpack(w.view(np.uint8, N))
            torch_double.empty(N, np.uint8).copy_(t)
            del t
            fake_cuda.stream_synchronize(s)
        assert any(not w.readers_pending() for _ in range(2))
        del w


def test_readers_of_a_stream_less_export(fake_cuda):
    with tritonshm.CudaRegion.create(N) as r:
        w = r.window()
        v = w.view(np.uint8, N)
        for stream in (-1, None, 1, 2):
            capsule = v.__dlpack__(stream=stream, max_version=(1, 0))
            del capsule  # unconsumed: released at once
            assert w.holders == 2
        # -1: no stream to record on; legacy/per-thread: an event there, with nothing before it
        assert w.readers_pending() is False
        del v, w


def test_reader_events_are_freed_with_the_window(fake_cuda, torch_double):
    with tritonshm.CudaRegion.create(N) as r:
        w = r.window()
        with torch_double.stream(0):
            t = torch_double.from_dlpack(w.view(np.uint8, N))
            torch_double.empty(N, np.uint8).copy_(t)
            del t
        del w  # pending reader events go with the hold; nothing leaks, nothing crashes
        gc.collect()
        fake_cuda.device_synchronize()


def test_stream_api_is_in_tritonshm_cuda():
    for name in ("Stream", "Event", "copy_stream", "current_stream", "current_stream_providers",
                 "device_guard", "capture", "Capture"):
        assert name in cuda.__all__
        obj = getattr(cuda, name)
        if callable(obj):
            assert obj.__doc__ and len(obj.__doc__.strip()) > 20, name
    assert callable(cuda.CudaWindow.readers_pending)


def test_objects_not_made_by_their_factories_raise_instead_of_crashing(fake_cuda):
    from tritonshm._memory._capture import Capture
    from tritonshm._memory._cuda_array import CudaArray

    array = CudaArray.__new__(CudaArray)
    cap = Capture.__new__(Capture)
    stream = _stream.Stream.__new__(_stream.Stream)
    event = _stream.Event.__new__(_stream.Event)
    guard = _stream.DeviceGuard.__new__(_stream.DeviceGuard)
    calls = [
        lambda: array.ptr, lambda: array.get(), lambda: array.__dlpack__(), lambda: cuda.capture(array),
        lambda: cuda.copy(array, np.zeros(4, np.uint8)), lambda: cuda.describe(array),
        lambda: cuda.copy(np.zeros(4, np.uint8), cap), lambda: cuda.describe(cap),
        lambda: stream.record(), lambda: stream.synchronize(), lambda: event.query(), lambda: event.record(0),
        lambda: guard.__enter__(),
    ]
    for call in calls:
        with pytest.raises((TypeError, RegionClosed, UnsupportedBuffer)):
            call()
    repr(array), repr(cap), repr(stream), repr(event), repr(guard)
    guard.__exit__(None, None, None)
    cap.release()


def test_a_runtime_not_loaded_raises_instead_of_crashing(fake_cudart_path):
    """A Runtime made without load() (its C entry points NULL) raises on every method; in a
    process of its own, since the old code crashed it (SIGSEGV)."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        from tritonshm._memory._runtime import Runtime
        r = Runtime.__new__(Runtime)
        for call in (r.versions, r.device_count, lambda: r.library, lambda: r.device_info(0),
                     lambda: r.mem_info(0), lambda: r.check_device(0), lambda: r.error_name(1)):
            try:
                call()
            except TypeError as exc:
                assert "not loaded" in str(exc), exc
            else:
                raise AssertionError("no TypeError")
        print(repr(r))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, "<Runtime not loaded>"), done.stderr[-2000:]


def _pending_result(nbytes: int = 4096) -> tuple[cuda.CudaArray, cuda.Stream]:
    """A CudaArray marked as a client marks a result whose copy is queued (its Pending)."""
    from tritonshm._memory._stream import Pending

    region = cuda.CudaRegion.create(nbytes)
    region.write(np.arange(nbytes // 4, dtype=np.float32))
    view = region.view(np.float32, (nbytes // 4,))
    region.close()
    stream = cuda.Stream.create(0)
    view._after(Pending(stream.record()))
    return view, stream


def test_a_pending_result_read_by_another_reader_during_get(fake_cuda, monkeypatch):
    """get() releases the GIL for its copy: another reader (a thread's get(), synchronize() or
    __cuda_array_interface__) waits for the same copy meanwhile and lets go of it.  get() then
    raised AttributeError ('NoneType' object has no attribute 'completed').  The other reader
    runs here where get() makes its host array."""
    from tritonshm._memory import _cuda_array

    view, stream = _pending_result()
    real_np = _cuda_array.np

    class AnotherReaderMeanwhile:
        def __getattr__(self, name):
            return getattr(real_np, name)

        def empty(self, *args, **kwargs):
            view.__cuda_array_interface__  # waits for the copy, and lets go of it
            return real_np.empty(*args, **kwargs)

    monkeypatch.setattr(_cuda_array, "np", AnotherReaderMeanwhile())
    got = view.get()
    monkeypatch.setattr(_cuda_array, "np", real_np)
    np.testing.assert_array_equal(got, np.arange(1024, dtype=np.float32))
    assert not view.pending
    del view
    stream.close()


def test_a_pending_result_read_from_two_threads_at_once(fake_cuda):
    """The same, undriven: two threads get() each of many pending results."""
    errors: list[BaseException] = []
    for _ in range(100):
        view, stream = _pending_result(1 << 20)
        barrier = threading.Barrier(2)

        def read():
            barrier.wait()
            try:
                np.testing.assert_array_equal(view.get()[:4], [0, 1, 2, 3])
            except BaseException as exc:  # noqa: BLE001 (reported below)
                errors.append(exc)

        threads = [threading.Thread(target=read) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        del view
        stream.close()
        if errors:
            break
    assert not errors, f"a reader of a pending result failed: {errors[0]!r}"


def test_a_reader_whose_stream_is_gone_is_waited_for_by_a_device_sync(fake_cuda):
    from fake_cuda import consume_dlpack

    with tritonshm.CudaRegion.create(N) as r:
        w = r.window()
        s = fake_cuda.stream_create()
        ptr, _, deleter = consume_dlpack(w.view(np.uint8, N).__dlpack__(stream=s, max_version=(1, 0)))
        fake_cuda.kernel_write(s, r.ptr, bytes(DATA))  # the consumer's work on its stream
        fake_cuda.stream_destroy(s)  # a consumer that destroys its stream before letting go
        before = fake_cuda.stats()
        deleter(ptr)  # recording on the dead stream fails: the device is synchronized instead
        delta = fake_cuda.stats() - before
        assert delta.device_syncs == 1
        assert w.holders == 1 and w.readers_pending() is False
        del w


def test_per_thread_stream_reader_released_on_another_thread(fake_cuda):
    """#5: a consumer that names the per-thread default stream (2: cupy with PTDS) reads the slot on
    ITS thread's stream; its tensor dies on another thread (GC, a worker): the reader is recorded
    on the legacy stream (ordered after every thread's per-thread stream), not on the dying
    thread's own, so the window is not free while the read is pending."""
    from fake_cuda import consume_dlpack

    with tritonshm.CudaRegion.create(N) as r, tritonshm.CudaRegion.create(N) as out:
        r.write(DATA)
        w = r.window()
        handed, done = threading.Event(), threading.Event()
        box = {}

        def consumer():
            box["cap"] = consume_dlpack(w.view(np.uint8, N).__dlpack__(stream=2, max_version=(1, 0)))
            fake_cuda.memcpy_async(out.ptr, r.ptr, N, 2, 3)  # the consumer's kernel reads the slot on stream 2
            handed.set()
            done.wait()  # the thread (and its per-thread stream) stays alive

        t = threading.Thread(target=consumer)
        t.start()
        handed.wait()
        ptr, _, deleter = box.pop("cap")
        deleter(ptr)  # the tensor dies here, on the main thread
        try:
            assert w.holders == 1
            pending_reads = fake_cuda.pending()
            assert pending_reads >= 1          # the consumer has not read the slot yet ...
            assert w.readers_pending() is True, "slot reported free while its reader is still pending"
        finally:
            done.set()
            t.join()
            fake_cuda.device_synchronize()
            del w
            gc.collect()


def test_torchs_current_stream_is_read_through_its_c_accessor(monkeypatch):
    """torch's current stream (the caller's, for the ordering point; torch's own, for a tensor's
    handshake) comes from ``torch._C._cuda_getCurrentRawStream``: one C call, not
    ``torch.cuda.current_stream()``'s five Python layers. A stand-in torch module, no GPU."""
    import sys
    import types

    from tritonshm._memory import _stream

    asked = []

    class Tensor:
        pass

    torch = types.ModuleType("torch")
    torch.Tensor = Tensor
    torch._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda device: asked.append(device) or 0xABC)
    torch.cuda = types.SimpleNamespace(is_initialized=lambda: True,
                                       current_stream=lambda device: pytest.fail("the Python way was taken"))
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(_stream, "producer_streams", {})
    assert _stream._torch_current_stream(1) == 0xABC
    reader = _stream.producer_stream_of(Tensor)
    assert reader is not None and reader(0) == 0xABC
    assert _stream.producer_stream_of(object) is None  # not torch's tensor: its handshake stays
    assert asked == [1, 0]
    del torch._C._cuda_getCurrentRawStream  # an older torch: the public way, same answer
    torch.cuda.current_stream = lambda device: types.SimpleNamespace(cuda_stream=0xDEF)
    monkeypatch.setattr(_stream, "producer_streams", {})
    assert _stream._torch_current_stream(0) == 0xDEF


@pytest.mark.parametrize("own_stream", [False, True], ids=["legacy default stream", "a stream of its own"])
def test_a_copy_on_the_callers_borrowed_stream_needs_no_handshake_and_lands_in_its_order(
        fake_cuda, torch_like, own_stream):
    """Stream.borrow(): the caller's stream (torch's current one; 0, the legacy default, is 1 as
    a handle) as a Stream a copy is queued on. A result its library allocated there needs no
    handshake (asked for stream=-1), the copy lands when that stream is synchronized, and closing
    the borrowed Stream destroys nothing of the library's."""
    import contextlib

    data = np.arange(64, dtype=np.float32)
    region = cuda.CudaRegion.create(data.nbytes)
    region.write(data)
    with torch_like.stream(0) if own_stream else contextlib.nullcontext(0) as current:
        dst = torch_like.empty(64, np.float32)  # allocated on the current stream
        borrowed = cuda.Stream.borrow(current, 0)
        assert borrowed.handle == (current or 1) and borrowed.device == 0
        cuda.copy(dst, region, stream=borrowed)
        assert torch_like.stream_compares == 0 and torch_like.handshakes == 0
        np.testing.assert_array_equal(dst.numpy(), data)  # .numpy() synchronizes the current stream
        borrowed.close()
        assert borrowed.closed
        dst.fill_(7.0)  # the library's stream still works: nothing of it was destroyed
        assert dst.numpy()[0] == 7.0
    # on our copy stream instead, the library is asked to order its stream before ours
    cuda.copy(dst, region, stream=cuda.copy_stream(0))
    assert torch_like.stream_compares == 1
    cuda.copy_stream(0).synchronize()
    region.close()
