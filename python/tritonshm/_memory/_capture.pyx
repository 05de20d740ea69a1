# cython: language_level=3, embedsignature=True
"""A producer's device array taken in: :func:`describe` says what it is, :func:`capture` takes it.

:func:`describe` gives ``(dtype, shape, device)`` of any device array
(None for host memory) and holds nothing: the client sorts its inputs with
it (host or device, which GPU) before it takes any.

:func:`capture` takes one as it is *now*, on the caller's thread (torch's
and cupy's current streams are per thread).  A :class:`Capture` holds the
producer's memory (its DLPack tensor, or the object itself for the CUDA
Array Interface and :class:`CudaArray`) and an :class:`~._stream.Event`
recorded after the work the producer had queued on it: a copy made later,
on any thread (:func:`~._copy.copy`, :meth:`CudaRegion.write`), waits for
the event and sees the bytes the caller meant.
"""

from ._cuda_array cimport CudaArray
from ._dlpack cimport Imported, import_device_at
from ._runtime cimport Runtime, current
from ._stream cimport Event, Stream, handshake_stream, new_event, thread_copy_stream

import numpy as np

from ..errors import DTypeMismatch, Error, RegionClosed, UnsupportedBuffer
from . import _dlpack
from ._args cimport device_of as _device_of
from ._cai import cai_device, parse_cai, read_cai
from ._stream import current_stream as _current_stream

_DEVICE_MEMORY_TYPES = _dlpack.DEVICE_MEMORY_TYPES

__all__ = ["Capture", "capture", "capture_at", "describe"]


cdef class Capture:
    """A device array as it was when :func:`capture` was called: its memory, and its work so far.

    Holds the array's memory (a DLPack producer's tensor, or the object
    itself for the CUDA Array Interface and :class:`CudaArray`) until
    :meth:`release`, and :attr:`event`, recorded after the work the
    producer had queued on it at capture time.  :func:`copy` (and
    :meth:`CudaRegion.write`) accept a capture as either end: the copy's
    stream waits for the event, so the copy may run later, on any thread,
    and still see the bytes the caller meant.

    Release it after the copies that read it are done (a copy without
    ``stream=`` is done on return): the producer may reuse the memory
    once it is released.
    """

    def __init__(self, *args, **kwargs):
        raise TypeError("use tritonshm.cuda.capture(device_array)")

    cdef int _live(self) except -1:
        if self.event is None:  # Capture.__new__ without capture(), or capture(pending=) before ordered_by()
            raise TypeError("this Capture was not made by capture(), or its event was never given "
                            "(capture(pending=...) waits for ordered_by())")
        if self._released:
            raise RegionClosed(f"{self!r} was released")
        return 0

    def ordered_by(self, Event event not None):
        """Give a capture made with *pending* its event: one the caller records on
        :attr:`stream` (of :attr:`device`) after this capture was taken -- and before anything
        waits for it -- and may share with other captures of the same stream (one ordering point
        for all the device arrays of one call).  Once only."""
        if self.event is not None:
            raise ValueError(f"{self!r} has its event already")
        if event.device != self.device:
            raise ValueError(f"an event of cuda:{event.device} cannot order {self!r}")
        self.event = event

    @property
    def closed(self):
        """True after :meth:`release`."""
        return self._released

    def release(self):
        """Hand the memory back to its producer; idempotent.  The :attr:`event` stays readable."""
        if self._released:
            return
        self._released = True
        if self._imported is not None:
            self._imported.release()
            self._imported = None
        self._obj = None

    def __enter__(self):
        self._live()
        return self

    def __exit__(self, *exc_info):
        self.release()

    def __repr__(self):
        state = " released" if self._released else ""
        return f"<Capture {self.nbytes} bytes on cuda:{self.device} at 0x{self.ptr:x}{state}>"

    def __reduce__(self):
        raise TypeError("a Capture belongs to this process and cannot be pickled")


cdef int _device_wanted(object want, int actual, object obj) except -1:
    if want is not None and want != actual:
        raise UnsupportedBuffer(f"{type(obj).__name__} lives on cuda:{actual}, not device={want}")
    return 0


cdef int _order(Capture cap, Runtime rt, int dev, size_t stream, dict pending) except -1:
    """The capture's ordering point: an event on *stream*, recorded now -- or, *pending* given,
    left to the caller (:meth:`Capture.ordered_by`)."""
    cap.stream = stream
    if pending is None:
        cap.event = new_event(rt, dev)
        cap.event._record(stream)
    return 0


cdef Capture _gathered(Capture cap, dict pending):
    """*cap*, added where given to *pending*'s captures of its device and stream -- those one event
    is to order -- (none given: it recorded its own)."""
    if pending is not None:
        pending.setdefault((cap.device, cap.stream), []).append(cap)
    return cap


def capture(obj, device=None, *, dict pending=None):
    """Take a device array as it is now, on the caller's thread: a :class:`Capture`.

    *obj* is a :class:`CudaArray`, a DLPack producer of CUDA memory (torch,
    cupy, jax) or a CUDA Array Interface producer.  What "its work so far"
    means, per kind (the event's stream is :attr:`Capture.stream`):

    * DLPack: ``__dlpack__(stream=copy_stream(device))`` under the tensor's
      device guard (the producer orders its pending work on *its* current
      stream before our copy stream: torch's handshake), then the event is
      recorded on the copy stream;
    * CUDA Array Interface: recorded on its ``stream``, or on
      :func:`current_stream` of the device when it gives none;
    * :class:`CudaArray`: recorded on :func:`current_stream` of its device,
      which first waits for a copy into the array still landing (a client's
      result handed out before its copy completed).

    Call it where the work was queued: torch's and cupy's current streams are
    per thread.  *device* is the device of a CUDA Array Interface producer
    that does not say (default 0), or a check for the others.  A producer's
    refusal is :class:`UnsupportedBuffer`; host memory too.

    Given *pending* (a dict), it records nothing and queues nothing on a
    stream of ours: the capture is added to ``pending[(device, stream)]`` (a
    list), and the caller gives the event (:meth:`Capture.ordered_by`),
    recorded on :attr:`Capture.stream` after its captures -- one event for
    all the device arrays of a call on one stream, the client's one ordering
    point per request.  A DLPack producer is then asked for ``__dlpack__(stream=s)``,
    *s* being :func:`current_stream` of its device (1, the legacy default
    stream, for 0): the producer orders its pending work before *s* -- no
    work at all where *s* is its own current stream, as torch's and cupy's
    are (their handshake makes no event then; where the producer's own
    current stream can be read -- :func:`~._stream.producer_stream_of`, torch's
    -- and is *s*, it is asked for ``stream=-1``, no handshake at all), and the
    right order for any other producer, whose handshake makes *s* wait -- and
    :attr:`stream` is *s*.  Nothing of ours is then ordered after the producer but what waits
    for that event.  The driver is also asked, under the same device guard,
    which allocation holds a DLPack tensor (:attr:`Capture.buffer_id`, 0 where
    it does not say): the client's lent table knows an allocation it
    registered by it without borrowing it again.
    """
    cdef Capture cap
    cdef CudaArray array
    cdef Runtime rt
    cdef int dev
    cdef size_t producer
    want = None if device is None else _device_of(device)
    if isinstance(obj, Capture):
        (<Capture>obj)._live()
        return obj
    if isinstance(obj, CudaArray):
        cap = Capture.__new__(Capture)
        array = <CudaArray>obj
        if array._alloc == NULL:
            raise UnsupportedBuffer("this CudaArray was not made by view()")
        dev = array._alloc.device
        _device_wanted(want, dev, obj)
        producer = _current_stream(dev)
        array._order_before(producer or 1)  # a copy into it still landing (a client's result) first
        _order(cap, array._runtime, dev, producer, pending)
        cap._obj = obj
        return _gathered(_describe(cap, array.ptr, array.nbytes, array.dtype, array.shape, False, dev), pending)
    where = _dlpack.dlpack_device(obj)
    if where is not None and where[0] in _DEVICE_MEMORY_TYPES:
        return _capture_dlpack(obj, where, want, pending)
    parsed = parse_cai(obj)
    if parsed is None:
        raise UnsupportedBuffer(
            f"capture() takes a device array (a CudaArray, DLPack CUDA memory or __cuda_array_interface__); "
            f"{type(obj).__name__} is none of these: copy host memory directly")
    ptr, dt, shape, stream, readonly = parsed
    cap = Capture.__new__(Capture)
    rt = current()
    dev = rt.valid_device(cai_device(obj, want if want is not None else 0))
    _device_wanted(want, dev, obj)
    _order(cap, rt, dev, stream if stream != 0 else _current_stream(dev), pending)
    cap._obj = obj
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    return _gathered(_describe(cap, ptr, count * dt.itemsize, dt, shape, readonly, dev), pending)


def capture_at(obj, tuple where not None, *, dict pending=None):
    """:func:`capture` of a DLPack producer of device memory whose ``__dlpack_device__()`` the
    caller has read already: *where*, ``(device type, device id)`` as ints.  The client reads it
    once per tensor, to tell device memory from pinned host memory; :func:`capture` would read it
    again, and the import a third time (torch's is Python: a few microseconds a call)."""
    if len(where) != 2 or where[0] not in _DEVICE_MEMORY_TYPES:
        raise UnsupportedBuffer(f"capture_at() takes DLPack device memory, not device {where!r}")
    return _capture_dlpack(obj, where, None, pending)


cdef Capture _capture_dlpack(object obj, tuple where, object want, dict pending):
    """:func:`capture` of a DLPack producer of device memory at *where* (its ``__dlpack_device__()``)."""
    cdef Capture cap = Capture.__new__(Capture)
    cdef Runtime rt = current()
    cdef Imported imp
    cdef Stream cs
    cdef int dev = rt.valid_device(where[1])
    cdef size_t producer
    cdef bint record = pending is None
    _device_wanted(want, dev, obj)
    producer = 2 if record else _current_stream(dev)
    if producer == 2:  # (per-thread default streams torch refuses to order before): our copy stream
        cs = thread_copy_stream(rt, dev)
        producer = <size_t>cs._live()
    imp = import_device_at(obj, where, handshake_stream(obj, dev, producer, True), _DEVICE_MEMORY_TYPES,
                           not record)
    cap.buffer_id = imp.buffer_id
    try:
        _order(cap, rt, dev, producer, pending)
        try:
            dtype = imp.dtype
        except DTypeMismatch:  # bfloat16 and co: the bytes can still be copied
            dtype = None
    except BaseException:
        imp.release()
        raise
    cap._imported = imp
    return _gathered(_describe(cap, imp.ptr, imp.nbytes, dtype, imp.shape, imp.readonly, dev), pending)


cdef inline Capture _describe(Capture cap, size_t ptr, object nbytes, object dtype, tuple shape, bint readonly,
                              int device):
    """*cap*, told what it took: *nbytes* at *ptr* on *device*, of *dtype* and *shape*."""
    cap.ptr = ptr
    cap.nbytes = nbytes
    cap.dtype = dtype
    cap.shape = shape
    cap.readonly = readonly
    cap.device = device
    return cap


# -- describe() ----------------------------------------------------------------

def describe(obj):
    """``(dtype, shape, device)`` of a C-contiguous CUDA device array, or None for anything else.

    Device arrays are :class:`CudaArray` (also a :class:`CudaWindow`'s
    views), :class:`Capture`\ s, objects with ``__cuda_array_interface__``
    (looked at first: it is cheap) and DLPack producers whose
    ``__dlpack_device__`` is CUDA or CUDA-managed memory.  Pinned host
    memory (kDLCUDAHost) is not a device array here: None, as for numpy and
    everything else.

    The CUDA Array Interface carries no device: it is taken from the
    object's ``__dlpack_device__`` when it has one, else assumed to be 0
    (finding it from the pointer would need ``cudaPointerGetAttributes``).
    An interface whose typestr is a void type (``'<V2'``: torch 2.11's
    bfloat16) names no type: DLPack is asked instead where the object
    speaks it (kDLBfloat is ``ml_dtypes.bfloat16``).
    DLPack producers are imported without stream synchronisation, under
    their device's guard, and released at once.

    Raises :class:`UnsupportedBuffer` for a non-contiguous (or malformed)
    device array and :class:`DTypeMismatch` for a dtype numpy lacks.
    """
    cdef CudaArray array
    cdef Capture cap
    cdef Imported imp
    if isinstance(obj, CudaArray) and (<CudaArray>obj)._alloc != NULL:
        array = <CudaArray>obj
        return array.dtype, array.shape, array._alloc.device
    if isinstance(obj, Capture):
        cap = <Capture>obj
        cap._live()
        if cap.dtype is None:
            raise DTypeMismatch(f"{cap!r} has a dtype numpy lacks")
        return cap.dtype, cap.shape, cap.device
    if isinstance(obj, np.ndarray):
        return None
    try:
        cai = read_cai(obj)
    except Error:
        raise
    except Exception:  # torch raises for dtypes the interface cannot name (bfloat16): ask DLPack
        cai = None
    parsed = parse_cai(obj, cai) if cai is not None else None
    if parsed is not None:
        _, dt, shape, _, _ = parsed
        # A void typestr is the interface unable to name the type (torch 2.11 says '<V2' for
        # bfloat16): DLPack can, where the object speaks it.
        if dt.kind != "V" or not hasattr(obj, "__dlpack__"):
            return dt, shape, cai_device(obj, 0)
    imp = _dlpack.import_device(obj, -1, _dlpack.DEVICE_MEMORY_TYPES)
    if imp is None:
        return None if parsed is None else (dt, shape, cai_device(obj, 0))
    try:
        return imp.dtype, imp.shape, imp.device_id
    finally:
        imp.release()
