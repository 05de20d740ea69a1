# cython: language_level=3, embedsignature=True
"""The general copy: :func:`copy` between any two of regions, windows, views, captures, device arrays and host buffers.

Each end is resolved into a :class:`_Side` -- a range of host or device
memory held for the length of the copy: a native end (region, window,
view) by a reference on its allocation, so a concurrent ``close()`` cannot
free it; a producer's DLPack tensor by the imported capsule; a host buffer
by its buffer export.  Both ranges are checked before anything is copied,
then one ``cudaMemcpyAsync`` runs without the GIL on the calling thread's
copy stream (synchronized: complete on return) or on a given
:class:`~._stream.Stream` (asynchronous).

Ordering: a DLPack producer is told the copy's stream
(``__dlpack__(stream=...)``, under its device's guard); a CUDA Array
Interface producer's ``stream`` gets an event our stream waits for; a
:class:`~._capture.Capture` brings the event it was taken with.  Never the
legacy default stream unless it is the caller's own (:meth:`Stream.borrow`),
never a device-wide synchronization.
"""

from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBuffer_Release, PyObject_GetBuffer

from ._cai cimport producer_event
from ._capture cimport Capture
from ._cuda_array cimport CudaArray
from ._cuda_region cimport CudaRegion
from ._cuda_window cimport CudaWindow
from ._dlpack cimport Imported
from ._runtime cimport Runtime, current
from ._stream cimport Event, Pending, Stream, handshake_stream, stream_handle, thread_copy_stream
from ._tshm cimport (
    kDLCUDA,
    kDLCUDAManaged,
    tshm_cuda_alloc,
    tshm_cuda_alloc_decref,
    tshm_cuda_alloc_incref,
    tshm_cuda_memcpy,
    tshm_cuda_settle,
)

import numpy as np

from ..errors import DTypeMismatch, OutOfBounds, UnsupportedBuffer
from . import _dlpack
from ._args cimport index as _index
from ._cai import cai_device, cuda_array_interface

__all__ = ["copy"]


cdef class _Side:
    """One end of a :func:`copy`: a range of host or device memory, held until :meth:`close`."""

    cdef str describe(self):
        """What this end is, for an error message (a repr only when one is raised)."""
        return self.what if self.what is not None else repr(self.owner)

    def __cinit__(self):
        self.alloc = NULL
        self.has_buf = False
        self.device = -1

    def __dealloc__(self):
        self.close()

    cdef close(self):
        if self.has_buf:
            self.has_buf = False
            PyBuffer_Release(&self.buf)
        if self.imported is not None:
            self.imported.release()
            self.imported = None
        if self.alloc != NULL:
            tshm_cuda_alloc_decref(self.alloc)
            self.alloc = NULL
        self.keep = None
        self.event = None
        self.capture = None


cdef _Side _native(tshm_cuda_alloc *a, size_t base, size_t size, Runtime rt, object owner):
    # *a* is live when called (the caller checked it, no Python code since).  Held first: a
    # concurrent close() must not free under the copy, and the allocation below may run a
    # finalizer that closes *a*'s owner.
    cdef _Side side
    tshm_cuda_alloc_incref(a)
    try:
        side = _Side.__new__(_Side)
    except BaseException:
        tshm_cuda_alloc_decref(a)
        raise
    side.alloc = a
    side.base = base
    side.size = size
    side.device = a.device
    side.runtime = rt
    side.owner = owner
    return side


cdef int _device_hint(object obj) except -2:
    """The device an end says it is on without being asked for its memory, or -1."""
    cdef CudaArray array
    if isinstance(obj, CudaRegion):
        return (<CudaRegion>obj)._device
    if isinstance(obj, CudaWindow):
        return (<CudaWindow>obj)._h().alloc.device
    if isinstance(obj, CudaArray):
        array = <CudaArray>obj
        return array._alloc.device if array._alloc != NULL else -1
    if isinstance(obj, Capture):
        return (<Capture>obj).device
    where = _dlpack.dlpack_device(obj)
    if where is not None and where[0] in _dlpack.DEVICE_MEMORY_TYPES:
        return where[1]
    return -1


cdef Runtime _runtime_of(object obj):
    """A native end's runtime (regions keep the one they were made with), else None."""
    if isinstance(obj, CudaRegion):
        return (<CudaRegion>obj)._runtime
    if isinstance(obj, CudaWindow):
        return (<CudaWindow>obj)._runtime
    if isinstance(obj, CudaArray):
        return (<CudaArray>obj)._runtime
    return None


cdef _Side _resolve(object obj, bint writable, str role, Runtime rt, int device, size_t consumer):
    """*obj* as one end of a copy on stream *consumer* of *device*; raises the project's errors for
    what cannot be one.  A DLPack producer is told *consumer* for its handshake (none where it is
    the producer's own current stream: :func:`~._stream.handshake_stream`)."""
    cdef _Side side
    cdef CudaRegion region
    cdef CudaWindow window
    cdef CudaArray array
    cdef Capture cap
    cdef Imported imp
    cdef tshm_cuda_alloc *a
    if isinstance(obj, CudaRegion):
        region = <CudaRegion>obj
        a = region._live()
        return _native(a, <size_t>a.ptr, region._nbytes, region._runtime, region)
    if isinstance(obj, CudaWindow):
        window = <CudaWindow>obj
        a = window._h().alloc
        return _native(a, <size_t>a.ptr + window._offset, window._nbytes, window._runtime, window)
    if isinstance(obj, CudaArray):
        array = <CudaArray>obj
        a = array._alloc
        if a == NULL:
            raise UnsupportedBuffer("this CudaArray was not made by view()")
        side = _native(a, <size_t>a.ptr + array._offset, array.nbytes, array._runtime, array)
        side.event = array._pending_event()  # a copy into it still landing: ordered after it
        if side.event is not None:
            side.wait = <size_t>side.event._live()
        return side
    name = type(obj).__name__
    side = _Side.__new__(_Side)
    if isinstance(obj, Capture):
        cap = <Capture>obj
        cap._live()
        if writable and cap.readonly:
            raise UnsupportedBuffer(f"the {role} ({cap!r}) is read-only")
        side.capture = cap
        side.base = cap.ptr
        side.size = cap.nbytes
        side.device = cap.device
        side.wait = <size_t>cap.event._live()
        side.what = repr(cap)
        return side
    imp = _dlpack.import_device(obj, handshake_stream(obj, device, consumer))
    if imp is not None:
        side.imported = imp
        if writable and imp.readonly:
            raise UnsupportedBuffer(f"the {role} ({name}) is a read-only DLPack tensor")
        side.base = imp.ptr
        side.size = imp.nbytes
        if imp.device_type == kDLCUDA or imp.device_type == kDLCUDAManaged:
            side.device = imp.device_id
        side.what = f"{name} (DLPack, {imp.nbytes} bytes)"
        return side
    cai = cuda_array_interface(obj)
    if cai is not None:
        ptr, length, stream, readonly = cai
        if writable and readonly:
            raise UnsupportedBuffer(f"the {role} ({name}) is read-only (__cuda_array_interface__)")
        side.base = ptr
        side.size = length
        side.event = producer_event(rt, cai_device(obj, device), stream)
        if side.event is not None:
            side.wait = <size_t>side.event._live()
        side.what = f"{name} (CUDA Array Interface, {length} bytes)"
        return side
    if isinstance(obj, np.ndarray) and obj.dtype.hasobject:
        raise DTypeMismatch(f"cannot copy an array of dtype {obj.dtype} (Python objects) "
                            f"{'into' if writable else 'from'} device memory")
    try:
        PyObject_GetBuffer(obj, &side.buf, PyBUF_C_CONTIGUOUS)
    except (BufferError, TypeError, ValueError) as exc:
        if isinstance(obj, np.ndarray) and obj.flags.c_contiguous:  # dtypes the buffer protocol lacks
            flat = obj.reshape(-1).view(np.uint8)
            PyObject_GetBuffer(flat, &side.buf, PyBUF_C_CONTIGUOUS)
            side.keep = flat
        else:
            raise UnsupportedBuffer(
                f"copy() needs a region, window, CudaArray, Capture, device array (DLPack or "
                f"__cuda_array_interface__) or C-contiguous host buffer as the {role}; "
                f"{name} is none of these ({exc})") from None
    side.has_buf = True
    if writable and side.buf.readonly:
        raise UnsupportedBuffer(f"the {role} ({name}) is a read-only buffer")
    side.base = <size_t>side.buf.buf
    side.size = side.buf.len
    side.what = f"{name} ({side.buf.len} bytes)"
    return side


cdef object _range(_Side side, str role, object offset, object nbytes):
    """Check ``[offset, offset + nbytes)`` against *side*; returns ``(offset, nbytes)``."""
    cap = side.size
    off = offset if type(offset) is int else _index(offset, f"{role}_offset")  # (ints: no Python call)
    if off < 0 or off > cap:
        raise OutOfBounds(f"{role}_offset={off} is outside the {role} {side.describe()}")
    size = cap - off if nbytes is None else nbytes
    if size > cap - off:
        raise OutOfBounds(f"{size} bytes at {role}_offset={off} do not fit in the {role} {side.describe()} "
                          f"({cap - off} available)")
    return off, size


def copy(dst, src, nbytes=None, *, dst_offset=0, src_offset=0, stream=None, done=None, then=None):
    """Copy *nbytes* bytes from ``src[src_offset:]`` to ``dst[dst_offset:]``; returns *nbytes*.

    Each end is a :class:`CudaRegion`, a :class:`CudaWindow`, a
    :class:`CudaArray` (their memory directly), a :class:`Capture` (the
    copy waits for its event), a device array speaking DLPack (torch,
    cupy, jax: told the copy's stream, its producer orders its pending work
    before it) or the CUDA Array Interface (an event on its ``stream`` is
    waited for), or a C-contiguous host buffer (numpy of any dtype, bytes;
    *dst* must be writable).  Offsets are in bytes; *nbytes* defaults to
    the rest of *src* after *src_offset*.

    Both ranges are checked first (:class:`OutOfBounds`; partially
    overlapping ranges too): on any error nothing is copied.  The copy is
    a ``cudaMemcpyAsync`` (direction from unified addressing; host to host
    works too) with the GIL released:

    * without *stream*: on this thread's :func:`copy_stream` of the copy's
      device, which is then synchronized -- complete on return;
    * with *stream* (a :class:`Stream`: one of ours, or the caller's own
      through :meth:`Stream.borrow`): enqueued on it and **not** complete
      on return; record an event or synchronize the stream before relying
      on the bytes, and keep the ends alive until then (a :class:`Capture`
      keeps a producer's memory).  A producer whose current stream is
      *stream* is asked for no handshake: its work there is in order.

    A :class:`CudaArray` end with a copy into it still pending (a client's
    result) is read or written after that copy.  *done* (an :class:`Event`
    of the copy's device) is recorded on the copy's stream after the copy,
    and *then* (a stream handle or :class:`Stream`: the consumer's) made to
    wait for it -- one guarded runtime call for all three.

    Never the legacy default stream unless given, never a device-wide synchronization.
    Zero bytes make no CUDA call (nor record *done*).  The copy's device is *stream*'s, else
    that of a region, window, view or capture end (*dst*'s first), else of a
    DLPack device end, else the calling thread's current device.
    """
    cdef _Side d = None
    cdef _Side s = None
    cdef Runtime rt
    cdef Stream cs
    cdef size_t c_doff, c_soff, c_len
    cdef void *waits[2]
    cdef void *h
    cdef size_t consumer
    cdef void *c_done = NULL
    cdef void *c_then = NULL
    cdef int device
    cdef int sync
    cdef int rc
    # (each a plain int on every request's copies: no Python call for those)
    n = None if nbytes is None else nbytes if type(nbytes) is int else _index(nbytes, "nbytes")
    if n is not None and n < 0:
        raise OutOfBounds(f"nbytes={n} is negative")
    doff = dst_offset if type(dst_offset) is int else _index(dst_offset, "dst_offset")
    soff = src_offset if type(src_offset) is int else _index(src_offset, "src_offset")
    if stream is not None and not isinstance(stream, Stream):
        raise UnsupportedBuffer(f"stream must be a tritonshm.cuda.Stream (Stream.create(device), "
                                f"copy_stream(device) or Stream.borrow(handle, device)), not {type(stream).__name__}")
    try:
        rt = _runtime_of(dst)
        if rt is None:
            rt = _runtime_of(src)
        if stream is not None:
            cs = <Stream>stream
            h = cs._live()
            device = cs._device
            if rt is None:
                rt = cs._runtime
        else:
            if rt is None:
                rt = current()
            device = _device_hint(dst)
            if device < 0:
                device = _device_hint(src)
            if device < 0:
                rt.check(tshm_cuda_settle(rt.rt, rt.rt.GetDevice(&device)), "reading the current CUDA device")
            cs = thread_copy_stream(rt, device)
            h = cs._live()
        consumer = 0 if <size_t>h == 1 else <size_t>h  # (1: the legacy default stream, as producers call it)
        d = _resolve(dst, True, "destination", rt, device, consumer)
        s = _resolve(src, False, "source", rt, device, consumer)
        soff, n = _range(s, "src", soff, n)
        doff, n = _range(d, "dst", doff, n)
        h = cs._live()  # (the producers' exports and the offsets' __index__ ran Python code: still open?)
        if n == 0:
            return 0
        if d.base + doff != s.base + soff and d.base + doff < s.base + soff + n \
                and s.base + soff < d.base + doff + n:
            raise OutOfBounds(f"the destination and source ranges of {n} bytes overlap")
        c_doff = doff
        c_soff = soff
        c_len = n
        waits[0] = <void *>d.wait
        waits[1] = <void *>s.wait
        if done is not None:
            if not isinstance(done, Event) or (<Event>done)._device != device:
                raise UnsupportedBuffer(f"done must be a tritonshm.cuda.Event of device {device}, not {done!r}")
            c_done = (<Event>done)._live()
        if then is not None:
            if c_done == NULL:
                raise UnsupportedBuffer("then= orders a stream after done=: give both")
            c_then = <void *>stream_handle(then)
        sync = stream is None
        with nogil:
            rc = tshm_cuda_memcpy(rt.rt, device, h, <void *>d.base, d.size, c_doff,
                                  <const void *>s.base, s.size, c_soff, c_len, waits, 2, sync, c_done, c_then)
        if rc != 0:
            rt.check(rc, f"copying {n} bytes from {s.describe()} to {d.describe()}")
        return n
    finally:
        if s is not None:
            s.close()
        if d is not None:
            d.close()
