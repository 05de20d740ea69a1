# cython: language_level=3, embedsignature=True
"""Streams, events and the device guard: how tritonshm's work is ordered with everyone else's.

Everything a GPU library does is asynchronous: a torch ``copy_`` is queued
on torch's *current stream* and done later.  tritonshm orders its copies
with CUDA events, never with a device-wide synchronization nor the legacy
default stream (which serializes every thread and library in the process):

* :class:`Stream` -- a non-blocking CUDA stream of one device;
  :func:`copy_stream` is the calling thread's own, made once, which
  :func:`tritonshm.cuda.copy` and the regions' ``write``/``read`` use.
* :class:`Event` -- a point in a stream's work (DisableTiming), recorded on
  a producer's stream and waited for by a copy stream, or queried
  (:meth:`Event.query`) by code that must not block.
* :func:`current_stream` -- the calling thread's current stream on a device,
  as the libraries in use see it (:data:`current_stream_providers`).
* :func:`device_guard` -- the C guard as a context manager: makes a device
  current and puts the caller's previous device back only if that device
  has a context, so no context is ever created on a GPU the process did
  not use.

Every runtime call runs under the guard of its stream's or event's device.
"""

from cpython.list cimport PyList_GET_ITEM
from cpython.ref cimport PyObject
from posix.unistd cimport getpid

cdef extern from "Python.h":
    Py_ssize_t references_to "Py_REFCNT" (PyObject *o)  # (the macro: a borrowed pointer, no reference taken)

from ._runtime cimport Runtime, current
from ._tshm cimport (
    TSHM_CUDA_ERROR_NOT_READY,
    tshm_cuda_device_enter,
    tshm_cuda_device_has_context,
    tshm_cuda_device_leave,
    tshm_cuda_event_free,
    tshm_cuda_event_new,
    tshm_cuda_event_query,
    tshm_cuda_event_record,
    tshm_cuda_event_sync,
    tshm_cuda_stream_free,
    tshm_cuda_stream_new,
    tshm_cuda_stream_sync,
    tshm_cuda_stream_wait,
)

import operator
import sys
import threading

from ..errors import OutOfBounds, RegionClosed, UnsupportedBuffer
from ._args cimport device_of as _device_of

__all__ = ["Stream", "Event", "Pending", "DeviceGuard", "copy_stream", "ordering_event", "current_stream",
           "current_stream_providers", "producer_streams", "producer_stream_of",
           "device_guard", "has_context"]


cdef class Stream:
    """A non-blocking CUDA stream of one device (``cudaStreamCreateWithFlags(..., NonBlocking)``).

    Work queued on it has no implicit ordering with the legacy default
    stream or any other stream: order it with :class:`Event`\\ s.  Destroyed
    by :meth:`close` or when the object dies (queued work still completes).
    """

    def __cinit__(self):
        self._handle = NULL
        self._pid = -1
        self._borrowed = False

    def __init__(self, *args, **kwargs):
        raise TypeError("use Stream.create(device), or copy_stream(device) for this thread's own")

    def __dealloc__(self):
        self._free()

    cdef _free(self):
        cdef void *h = self._handle
        self._handle = NULL
        if h != NULL and self._pid == getpid() and not self._borrowed:
            tshm_cuda_stream_free(self._runtime.rt, self._device, h)

    @staticmethod
    def create(device=0):
        """A new non-blocking stream of *device* (validated against the device count)."""
        cdef Runtime rt = current()
        return _new_stream(rt, rt.valid_device(device))

    @staticmethod
    def borrow(handle, device=0):
        """Another library's stream of *device* (a ``cudaStream_t`` as an int: torch's
        ``cuda_stream``, cupy's ``ptr``; 0 or 1 for the legacy default stream) as a Stream:
        work can be queued on it and events recorded there; it is never destroyed by us
        (:meth:`close` only lets go of it), and the library must keep it alive meanwhile."""
        cdef Runtime rt = current()
        cdef size_t h = stream_handle(handle)
        cdef Stream self = Stream.__new__(Stream)
        self._handle = <void *>(h if h != 0 else 1)  # (1: cudaStreamLegacy, a handle that is not NULL)
        self._device = rt.valid_device(device)
        self._runtime = rt
        self._pid = getpid()
        self._borrowed = True
        return self

    cdef void *_live(self) except NULL:
        if self._handle == NULL:
            raise RegionClosed(f"{self!r} is closed")
        return self._handle

    @property
    def handle(self):
        """The ``cudaStream_t`` as an int (what ``__dlpack__(stream=)`` and other libraries take)."""
        return <size_t>self._live()

    @property
    def device(self):
        """The CUDA device the stream belongs to."""
        return self._device

    @property
    def closed(self):
        """True after :meth:`close`."""
        return self._handle == NULL

    def synchronize(self):
        """Wait (GIL released) until everything queued on the stream so far is done."""
        cdef void *h = self._live()
        cdef int rc
        with nogil:
            rc = tshm_cuda_stream_sync(self._runtime.rt, self._device, h)
        if rc != 0:  # (the message is made only for a failure: this runs every request)
            self._runtime.check(rc, f"synchronizing {self!r}")

    def wait(self, Event event not None):
        """Make work queued on this stream from now on wait for *event* (no host blocking)."""
        cdef void *h = self._live()
        cdef int rc = tshm_cuda_stream_wait(self._runtime.rt, self._device, h, event._live())
        if rc != 0:  # (the message is made only for a failure: copies wait on every request)
            self._runtime.check(rc, f"making {self!r} wait for {event!r}")

    def record(self):
        """A new :class:`Event` recorded on this stream now: the point of its work queued so far."""
        cdef void *h = self._live()
        cdef Event event = new_event(self._runtime, self._device)
        event._record(<size_t>h)
        return event

    def close(self):
        """Destroy the stream; idempotent.  Work already queued still completes."""
        self._free()

    def __enter__(self):
        self._live()
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __repr__(self):
        if self._handle == NULL:
            return f"<Stream cuda:{self._device} closed>"
        return f"<Stream cuda:{self._device} 0x{<size_t>self._handle:x}{' borrowed' if self._borrowed else ''}>"

    def __reduce__(self):
        raise TypeError("a CUDA stream belongs to this process and cannot be pickled")


cdef Stream _new_stream(Runtime rt, int device):
    cdef Stream self = Stream.__new__(Stream)
    cdef void *h = NULL
    cdef int rc
    with nogil:
        rc = tshm_cuda_stream_new(rt.rt, device, &h)
    rt.check(rc, f"creating a CUDA stream on device {device}")
    self._handle = h
    self._device = device
    self._runtime = rt
    self._pid = getpid()
    return self


cdef size_t stream_handle(object stream) except? 0:
    """A stream argument as a ``cudaStream_t``: a :class:`Stream`, or an int handle (0: legacy default)."""
    if isinstance(stream, Stream):
        return <size_t>(<Stream>stream)._live()
    try:
        h = operator.index(stream)
    except TypeError:
        raise UnsupportedBuffer(f"a stream is a Stream or an int handle, not {type(stream).__name__}") from None
    if h < 0 or h > <size_t>-1:
        raise OutOfBounds(f"stream handle {h} is not a pointer")
    return h


cdef class Event:
    """A point in a stream's work (``cudaEventCreateWithFlags(..., DisableTiming)``).

    :meth:`record` it on a stream (ours, or a producer's: any library's
    handle), then have another stream :meth:`Stream.wait` for it, poll it
    with :meth:`query`, or block on it with :meth:`synchronize`.  A new
    event that was never recorded is complete.
    """

    def __cinit__(self):
        self._handle = NULL
        self._pid = -1

    def __init__(self, *args, **kwargs):
        raise TypeError("use Event.create(device)")

    def __dealloc__(self):
        self._free()

    cdef _free(self):
        cdef void *h = self._handle
        self._handle = NULL
        if h != NULL and self._pid == getpid():
            tshm_cuda_event_free(self._runtime.rt, self._device, h)

    @staticmethod
    def create(device=0):
        """A new event of *device* (validated against the device count)."""
        cdef Runtime rt = current()
        return new_event(rt, rt.valid_device(device))

    cdef void *_live(self) except NULL:
        if self._handle == NULL:
            raise RegionClosed(f"{self!r} is closed")
        return self._handle

    cdef int _record(self, size_t stream) except -1:
        cdef void *h = self._live()
        cdef int rc
        rc = tshm_cuda_event_record(self._runtime.rt, self._device, h, <void *>stream)
        if rc != 0:  # (the message is made only for a failure: this runs every request)
            self._runtime.check(rc, f"recording {self!r} on stream 0x{stream:x}")
        return 0

    @property
    def handle(self):
        """The ``cudaEvent_t`` as an int."""
        return <size_t>self._live()

    @property
    def device(self):
        """The CUDA device the event belongs to (it can be recorded on that device's streams only)."""
        return self._device

    @property
    def closed(self):
        """True after :meth:`close`."""
        return self._handle == NULL

    def record(self, stream=0):
        """Record the event on *stream* (a :class:`Stream` or an int handle; 0: the legacy default stream).

        Returns the event, so ``Event.create(d).record(s)`` reads as one step.
        """
        self._record(stream_handle(stream))
        return self

    def query(self):
        """True when the work before the last :meth:`record` is done; never blocks."""
        cdef void *h = self._live()
        cdef int rc = tshm_cuda_event_query(self._runtime.rt, self._device, h)
        if rc == TSHM_CUDA_ERROR_NOT_READY:
            return False
        if rc != 0:
            self._runtime.check(rc, f"querying {self!r}")
        return True

    def synchronize(self):
        """Wait (GIL released) until the work before the last :meth:`record` is done."""
        cdef void *h = self._live()
        cdef int rc
        with nogil:
            rc = tshm_cuda_event_sync(self._runtime.rt, self._device, h)
        if rc != 0:  # (the message is made only for a failure: this runs every request)
            self._runtime.check(rc, f"synchronizing {self!r}")

    def close(self):
        """Destroy the event; idempotent (a pending one is released when it completes)."""
        self._free()

    def __repr__(self):
        if self._handle == NULL:
            return f"<Event cuda:{self._device} closed>"
        return f"<Event cuda:{self._device} 0x{<size_t>self._handle:x}>"

    def __reduce__(self):
        raise TypeError("a CUDA event belongs to this process and cannot be pickled")


cdef Event new_event(Runtime rt, int device):
    """A new event of *device*; *device* is already known to be valid."""
    cdef Event self = Event.__new__(Event)
    cdef void *h = NULL
    cdef int rc = tshm_cuda_event_new(rt.rt, device, &h)
    if rc != 0:  # (the message is made only for a failure, as for the other calls of every request)
        rt.check(rc, f"creating a CUDA event on device {device}")
    self._handle = h
    self._device = device
    self._runtime = rt
    self._pid = getpid()
    return self


cdef class Pending:
    """Work of ours queued on a stream and not yet known to be complete: an asynchronous copy
    into a result, or out of a slot, marked by the :class:`Event` recorded after it.

    Whoever reads what the work wrote (or reuses what it reads) orders after it: a stream
    waits for :attr:`event`, or :meth:`query` / :meth:`synchronize` on the CPU.  Once seen
    complete -- by a query, a synchronize, or :meth:`completed` (an event recorded after it,
    on a stream that waited for it, was waited for) -- the event is let go of (:attr:`event`
    None), so that a pool may record it again.
    """

    def __init__(self, Event event not None):
        self.event = event

    @property
    def done(self):
        """True once the work is known complete (no CUDA call)."""
        return self.event is None

    def query(self):
        """True when the work is complete; never blocks (one event query until it is seen done)."""
        cdef Event e = self.event
        if e is None:
            return True
        if e.query():
            self.event = None
            return True
        return False

    def synchronize(self):
        """Wait (GIL released) until the work is complete."""
        cdef Event e = self.event
        if e is not None:
            e.synchronize()
            self.event = None

    def completed(self):
        """The work is known complete by other means (a later point that depends on it was
        waited for): the event is let go of, without a CUDA call."""
        self.event = None

    def __repr__(self):
        return "<Pending done>" if self.event is None else f"<Pending after {self.event!r}>"

    def __reduce__(self):
        raise TypeError("pending GPU work belongs to this process and cannot be pickled")


# -- this thread's copy streams ---------------------------------------------------

_local = threading.local()


cdef Stream thread_copy_stream(Runtime rt, int device):
    """This thread's copy stream of *device* under *rt*, made on first use."""
    cdef Stream s
    streams = getattr(_local, "streams", None)
    if streams is None or getattr(_local, "runtime", None) is not rt:
        # Another runtime (tests switch): its streams die with the old dict.
        streams = _local.streams = {}
        _local.runtime = rt
    s = streams.get(device)
    if s is None or s._handle == NULL or s._pid != getpid():
        s = _new_stream(rt, device)
        streams[device] = s
    return s


def copy_stream(device=0):
    """This thread's non-blocking copy stream of *device*, made once per thread and device.

    tritonshm's own copies run on it; a copy that must wait for other work
    waits for an event of that work, so threads never serialize on each other.
    """
    cdef Runtime rt = current()
    return thread_copy_stream(rt, rt.valid_device(device))


# -- this thread's ordering events -------------------------------------------------

#: Events kept per thread, runtime and device: more at once (results kept with their events) are
#: made and dropped.
_POOLED_EVENTS = 8


cpdef Event ordering_event(int device):
    """An event of *device* to record now, from this thread's few: one that nothing else holds
    any more (no capture, step or caller can wait for its old point), else a new one.  A warm
    request creates and destroys no event (two runtime calls, each under a device guard).

    An event belongs to the runtime it was made with (a test suite switches between a fake
    runtime and the real one in one process)."""
    cdef Runtime rt = current()
    cdef dict pools = getattr(_local, "events", None)
    cdef list pool
    cdef Py_ssize_t index, count
    cdef PyObject *kept
    cdef Event event
    if pools is None:
        pools = _local.events = {}
    key = (rt, device)
    pool = pools.get(key)
    if pool is None:
        pool = pools[key] = []
    count = len(pool)
    for index in range(count):
        kept = PyList_GET_ITEM(pool, index)  # (borrowed: the pool's reference is the only one counted)
        if references_to(kept) == 1 and (<Event>kept)._handle != NULL:
            event = <Event>kept
            # To the back: the pool is kept least recently handed out first -- the events still
            # held (by results, by marks) are the recent ones, looked at last.
            del pool[index]
            pool.append(event)
            return event
    event = new_event(rt, rt.valid_device(device))
    if count < _POOLED_EVENTS:
        pool.append(event)
    return event


# -- the caller's current stream ---------------------------------------------------

def _torch_raw_stream(torch):
    """``device -> handle`` of torch's current stream for this thread (0: the legacy default): its
    C accessor, one call, where torch has it -- ``torch.cuda.current_stream()`` is five Python
    layers (device index, availability, a Stream object) and a warm GPU request asks up to four
    times."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda device: torch.cuda.current_stream(device).cuda_stream


def _torch_current_stream(device):
    """torch's current stream on *device* for this thread, if torch is in use and it is not the default."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_initialized():
            return None
        handle = producer_stream_of(torch.Tensor)(device)
    except Exception:  # a CPU-only build, or a device torch cannot see
        return None
    return handle or None  # the default stream: let another library answer (else 0 anyway)


def _cupy_current_stream(device):
    """cupy's current stream on *device* for this thread, if cupy is loaded and it is not the default."""
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return None
    try:
        handle = cupy.cuda.get_current_stream(device).ptr
    except Exception:  # an old cupy without the device argument, no GPU, ...
        return None
    return handle or None


#: Callables ``device -> stream handle or None`` asked in order by
#: :func:`current_stream`; the first that answers (not None) wins.  Built
#: in: torch (when loaded and initialized) and cupy (when loaded), each
#: answering only for a non-default current stream.  Test doubles and other
#: libraries insert their own.
current_stream_providers = [_torch_current_stream, _cupy_current_stream]


#: DLPack producer types whose own current stream can be read: ``type -> (device -> handle)`` (0:
#: the legacy default stream), or None where it cannot.  torch's tensor is found the first time one
#: is asked about; test doubles and other libraries put their own here.
producer_streams = {}


def producer_stream_of(kind):
    """``device -> handle`` of the current stream of the library that made arrays of type *kind*,
    or None when not known (:data:`producer_streams`, torch's tensor found on first use).

    ``capture()`` asks a DLPack producer for no handshake at all (``stream=-1``) when that stream is
    the one it orders on: the handshake would compare the two, find them equal and do nothing --
    after four Python stream look-ups per tensor in torch's case."""
    try:
        return producer_streams[kind]
    except KeyError:
        pass
    reader = None
    torch = sys.modules.get("torch")
    if torch is not None and kind is getattr(torch, "Tensor", None):
        reader = _torch_raw_stream(torch)
    producer_streams[kind] = reader
    return reader


cdef object handshake_stream(object obj, int device, size_t consumer, bint on_device=False):
    """``__dlpack__``'s *stream* for a consumer ordering on *consumer*, a stream of *device*: -1
    ("no synchronization") where *obj* lives on *device* (the caller may know it: *on_device*) and
    its library's own current stream there is *consumer* (:func:`producer_stream_of`) -- the
    producer's handshake would find the two equal and do nothing, after four Python stream look-ups
    in torch's case -- else *consumer* (0, the legacy default stream, spelled 1)."""
    own = producer_stream_of(type(obj))
    if own is not None:
        try:
            if (on_device or obj.__dlpack_device__()[1] == device) and own(device) == consumer:
                return -1
        except Exception:  # (a device the library cannot see: its own handshake says so)
            pass
    return 1 if consumer == 0 else consumer


def current_stream(device=0):
    """The calling thread's current CUDA stream on *device*, as an int handle.

    The first of :data:`current_stream_providers` that answers; 0 (the
    legacy default stream) when none does.  Asked on the caller's thread at
    the time of the call: that is where and when torch's and cupy's notion
    of "current" is the user's.
    """
    dev = _device_of(device)
    for provider in tuple(current_stream_providers):
        handle = provider(dev)
        if handle is not None:
            h = operator.index(handle)
            if h < 0:
                raise OutOfBounds(f"{provider!r} gave stream handle {h} for device {dev}")
            return h
    return 0


# -- the device guard ----------------------------------------------------------------

cdef class DeviceGuard:
    """``with device_guard(d):`` -- *d* is the current device inside; the caller's comes back after.

    The caller's previous device is put back only if it has an active
    primary context (torch does the same): a thread that never used a GPU
    reads device 0 as current, and putting 0 back would create a context
    there.  Then the thread stays on *d*.  Re-entrant; each exit undoes
    its own enter.
    """

    def __init__(self, *args, **kwargs):
        raise TypeError("use device_guard(device)")

    def __enter__(self):
        cdef int previous = 0, rc
        if self._runtime is None:  # only DeviceGuard.__new__ without device_guard() makes one
            raise TypeError("this DeviceGuard was not made by device_guard()")
        rc = tshm_cuda_device_enter(self._runtime.rt, self._device, &previous)
        if rc != 0:
            self._runtime.check(rc, f"selecting CUDA device {self._device}")
        self._previous.append(previous)
        return self

    def __exit__(self, *exc_info):
        if self._runtime is not None and self._previous:
            tshm_cuda_device_leave(self._runtime.rt, self._device, self._previous.pop())

    @property
    def device(self):
        """The device made current inside the block."""
        return self._device

    def __repr__(self):
        return f"<device_guard cuda:{self._device}>"


def device_guard(device):
    """A :class:`DeviceGuard` for *device* (validated against the device count)."""
    cdef Runtime rt = current()
    cdef DeviceGuard guard = DeviceGuard.__new__(DeviceGuard)
    guard._runtime = rt
    guard._device = rt.valid_device(device)
    guard._previous = []
    return guard


def has_context(device):
    """True when *device*'s primary context is active, False when not, None when the runtime cannot tell.

    Creates nothing; what the device guard decides by.
    """
    cdef Runtime rt = current()
    cdef int state = tshm_cuda_device_has_context(rt.rt, rt.valid_device(device))
    return None if state < 0 else bool(state)
