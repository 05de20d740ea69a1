"""One ordering point per call (issue 40), on the FAKE runtime: captures on the producer's stream.

``capture(pending=...)`` takes a device array without recording anything or queueing anything on a
stream of ours, and adds it to the call's captures of its stream; the client's :func:`~tritonshm.client._devices.one_ordering_point` then records one
event per producer stream for all the arrays of a call, and the request waits for it once.  The fake
lands work only where something synchronizes it, so a missing order reads the old bytes.
"""

from __future__ import annotations

import contextlib
import gc

import numpy as np
import pytest

import tritonshm
from tritonshm import cuda
from tritonshm._memory import _runtime
from tritonshm.client import _devices


def test_an_unrecorded_capture_names_the_producers_stream_and_waits_for_its_event(fake_cuda, torch_like):
    with torch_like.stream(0) as side:
        x = torch_like.from_numpy(np.arange(64, dtype=np.float32))  # queued on the side stream
        queued = fake_cuda.stats()
        pending: dict = {}
        cap = cuda.capture(x, pending=pending)
    assert (fake_cuda.stats() - queued).event_records == 0  # nothing recorded, nothing of ours queued
    assert cap.stream == side and cap.event is None and torch_like.handshakes == 0
    assert pending == {(0, side): [cap]}  # gathered, for one event on that stream
    with pytest.raises(TypeError, match="ordered_by"):  # nothing may use it before it has its event
        cuda.copy(np.empty(64, np.float32), cap)
    event = cuda.Event.create(0).record(side)
    cap.ordered_by(event)
    with pytest.raises(ValueError, match="has its event already"):
        cap.ordered_by(event)
    out = np.empty(64, np.float32)
    cuda.copy(out, cap)  # waits for the event: the side stream's write has landed first
    np.testing.assert_array_equal(out, np.arange(64, dtype=np.float32))
    cap.release()


@pytest.mark.parametrize("on_a_stream", [False, True], ids=["legacy default stream", "a stream of its own"])
def test_a_tensor_on_its_librarys_current_stream_is_taken_without_a_handshake(fake_cuda, torch_like, on_a_stream):
    """torch's current stream is read (producer_stream_of): when it is the stream the capture
    orders on, torch is asked for ``stream=-1`` -- it would compare the two, with four Python
    stream look-ups, and do nothing."""
    with torch_like.stream(0) if on_a_stream else contextlib.nullcontext(0) as current:
        x = torch_like.from_numpy(np.arange(64, dtype=np.float32))
        cap = cuda.capture(x, pending={})
    assert cap.stream == current and torch_like.stream_compares == 0 and torch_like.handshakes == 0
    cap.ordered_by(cuda.Event.create(0).record(current))
    out = np.empty(64, np.float32)
    cuda.copy(out, cap)
    np.testing.assert_array_equal(out, np.arange(64, dtype=np.float32))
    cap.release()


def test_a_tensor_whose_library_is_on_another_stream_keeps_its_handshake(fake_cuda, torch_like, cupy_like):
    """The capture orders on cupy's current stream while torch's is the legacy one: torch's
    handshake orders its write before cupy's stream (without it the copy reads old bytes)."""
    x = torch_like.from_numpy(np.arange(64, dtype=np.float32))  # queued on the legacy stream
    with cupy_like.stream(0) as side:
        cap = cuda.capture(x, pending={})
        assert cap.stream == side and torch_like.handshakes == 1
        cap.ordered_by(cuda.Event.create(0).record(side))
    out = np.empty(64, np.float32)
    cuda.copy(out, cap)
    np.testing.assert_array_equal(out, np.arange(64, dtype=np.float32))
    cap.release()
    torch_like.synchronize(0)


def test_capture_at_takes_where_the_caller_read_and_asks_the_tensor_nothing_more(fake_cuda, torch_like):
    """The client reads a tensor's ``__dlpack_device__()`` once (device or pinned host memory?) and
    hands it to ``capture_at``: neither the capture nor the import asks it again (torch's is
    Python, a few microseconds a call).  Host memory is refused there, as capture() refuses it."""
    from tritonshm._memory._capture import capture_at

    x = torch_like.from_numpy(np.arange(64, dtype=np.float32))
    where = x.__dlpack_device__()
    asked = torch_like.device_queries
    cap = capture_at(x, where)
    assert torch_like.device_queries == asked and cap.device == 0 and cap.shape == (64,)
    out = np.empty(64, np.float32)
    cuda.copy(out, cap)
    np.testing.assert_array_equal(out, np.arange(64, dtype=np.float32))
    cap.release()
    with pytest.raises(tritonshm.UnsupportedBuffer, match="device memory"):
        capture_at(x, (3, 0))  # kDLCUDAHost: pinned host memory


def test_a_recorded_capture_still_orders_our_copy_stream(fake_cuda, torch_like):
    """capture() as before (the default): the producer's handshake orders our copy stream."""
    with torch_like.stream(0):
        x = torch_like.from_numpy(np.arange(64, dtype=np.float32))
        cap = cuda.capture(x)
    assert cap.stream == cuda.copy_stream(0).handle and torch_like.handshakes == 1
    cap.release()
    torch_like.synchronize(0)


def test_one_ordering_point_for_the_arrays_of_a_call(fake_cuda, torch_like):
    with torch_like.stream(0) as side:
        x = torch_like.from_numpy(np.full(64, 3, np.float32))
        y = torch_like.from_numpy(np.full(32, 4, np.float32))
        before = fake_cuda.calls()
        with _devices.one_ordering_point():
            a = _devices.as_device_tensor(x)
            b = _devices.as_device_tensor(y)
            assert a.source.event is None  # recorded when the block ends, after both
        used = fake_cuda.calls() - before
    assert a.source.event is b.source.event and a.source.stream == side
    assert used["cudaEventRecord"] == 1 and used["cudaStreamWaitEvent"] == 0
    assert _devices.distinct([a.source.event, b.source.event]) == [a.source.event]
    a.source.event.synchronize()  # the one wait: both writes have landed
    assert fake_cuda.read(x.ptr, 4) == np.float32(3).tobytes()
    assert fake_cuda.read(y.ptr, 4) == np.float32(4).tobytes()
    a.source.release(), b.source.release()


def test_ordering_events_are_used_again_once_nothing_holds_them(fake_cuda):
    first = _devices.ordering_event(0)
    held = _devices.ordering_event(0)
    assert held is not first  # the first is held: never recorded again under its holder
    del first, held
    gc.collect()
    before = fake_cuda.calls()
    again = _devices.ordering_event(0)
    assert fake_cuda.calls() - before == {}  # no event made: one of the thread's comes back
    assert isinstance(again, cuda.Event) and not again.closed


def test_the_device_count_is_read_once(fake_cuda, monkeypatch):
    rt = _runtime.current()
    cuda.Event.create(0).close()
    before = fake_cuda.calls()
    for _ in range(3):
        cuda.Event.create(0).close()
        cuda.copy_stream(0)
    assert "cudaGetDeviceCount" not in fake_cuda.calls() - before
    with pytest.raises(tritonshm.OutOfBounds, match="device=1 does not exist"):  # beyond it: asked again
        cuda.Event.create(1)
    monkeypatch.setenv("TSHM_FAKE_CUDA_DEVICES", "2")  # (a fake's change; a process's GPUs never change)
    cuda.Event.create(1).close()
    assert rt is _runtime.current()


def test_ordering_events_belong_to_the_runtime_they_were_made_with(fake_cuda, fake_cudart_path):
    """A process may switch runtimes (a test suite: the fake, then the real one): an event made with
    one is never recorded through another."""
    made = _devices.ordering_event(0)
    made_id = id(made)
    del made
    assert id(_devices.ordering_event(0)) == made_id  # the same runtime: the thread's event again
    previous = _runtime.use(str(fake_cudart_path))  # another Runtime (the same library here)
    try:
        other = _devices.ordering_event(0)
        assert id(other) != made_id
        del other
    finally:
        _runtime.use(previous)
