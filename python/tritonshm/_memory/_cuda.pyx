# cython: language_level=3, embedsignature=True
"""CUDA regions: device memory another process (the server) can open.

A :class:`CudaRegion` owns one reference to a native, reference-counted
device allocation (``tshm_cuda_alloc`` in csrc/).  Every view
(:class:`CudaArray`) and every DLPack capsule made from one holds a
reference of its own, so the memory is freed -- in C, without the GIL,
possibly from a consumer's DLPack deleter on another thread -- only when
the region is closed *and* the last view is gone.

A :class:`CudaWindow` is a byte range of a region with a count of its own
(``tshm_cuda_hold``): its window objects, their views and the DLPack
tensors made from those are its :attr:`~CudaWindow.holders`, so a pool
knows when every user of one slot is gone -- including a consumer's
kernels still reading it: a DLPack tensor handed out on a consumer's
stream leaves an event on that stream when its deleter runs
(:meth:`CudaWindow.readers_pending`).

:func:`copy` copies between any two of regions, windows, views, device
arrays, :class:`Capture`\ s and host buffers, on the calling thread's copy
stream (complete on return) or on a given :class:`~._stream.Stream`
(asynchronous); :func:`capture` takes a device array as it is *now*, on
the caller's thread (its producer's pending work marked by an event);
:func:`describe` tells a device array's dtype, shape and device.

Ordering, in short: nothing here uses the legacy default stream or a
device-wide synchronization.  A DLPack producer is told our stream
(``__dlpack__(stream=...)``, under its device's guard); a CUDA Array
Interface producer's ``stream`` gets an event our stream waits for.
"""

from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from libc.string cimport memcpy
from posix.unistd cimport getpid

from ._dlpack cimport Imported, export_capsule
from ._runtime cimport Runtime, current
from ._stream cimport Event, Stream, new_event, thread_copy_stream
from ._tshm cimport (
    TSHM_IPC_HANDLE_BYTES,
    tshm_cuda_device_enter,
    tshm_cuda_device_leave,
    kDLCUDA,
    kDLCUDAManaged,
    tshm_cuda_alloc,
    tshm_cuda_alloc_decref,
    tshm_cuda_alloc_incref,
    tshm_cuda_alloc_new,
    tshm_cuda_alloc_observe,
    tshm_cuda_alloc_open,
    tshm_cuda_alloc_refs,
    tshm_cuda_alloc_unobserve,
    tshm_cuda_copy_in,
    tshm_cuda_copy_out,
    tshm_cuda_ipc_handle,
    tshm_ipc_handle,
)

import secrets
import warnings
import weakref

import numpy as np

from ..errors import CudaError, DTypeMismatch, Error, OutOfBounds, RegionClosed, UnsupportedBuffer
from . import _dlpack
from ._args import device_of as _device_of, index as _index, layout as _layout, span as _span
from ._stream import current_stream as _current_stream

__all__ = ["CudaRegion", "CudaWindow", "CudaArray", "Capture", "capture", "copy", "describe", "empty"]

# The handles of this process's live regions: opening one of them here is
# CUDA's error 201; say what is going on instead.
_own_handles = weakref.WeakValueDictionary()


cdef void _release_alloc(void *ctx) noexcept nogil:
    tshm_cuda_alloc_decref(<tshm_cuda_alloc *>ctx)


cdef void _release_hold(void *ctx) noexcept nogil:
    tshm_cuda_hold_decref(<tshm_cuda_hold *>ctx)


def _unpickle(bytes handle, nbytes, int device, str key):
    """Pickle support: open the IPC handle in this (another) process."""
    return CudaRegion.attach(handle, nbytes, device=device, key=key)


cdef class CudaRegion:
    """Device memory from ``cudaMalloc``, exportable to another process by IPC handle.

    Make one with :meth:`create` (which owns the memory) or :meth:`attach`
    (another process's memory, by its handle).  Hand out device views with
    :meth:`view`, copy with :meth:`write` and :meth:`read`, and register it
    with Triton as CUDA shared memory (:func:`tritonshm.register`).
    """

    #: Which Triton shared-memory extension registers this region.
    kind = "cuda"

    def __cinit__(self):
        self._alloc = NULL
        self._observed = NULL
        self._creator_pid = -1

    def __init__(self, *args, **kwargs):
        raise TypeError("use CudaRegion.create(nbytes, device=0) or CudaRegion.attach(handle, nbytes)")

    def __dealloc__(self):
        if self._alloc != NULL:
            tshm_cuda_alloc_decref(self._alloc)
            self._alloc = NULL
        if self._observed != NULL:
            tshm_cuda_alloc_unobserve(self._observed)
            self._observed = NULL

    def __del__(self):
        if self._alloc == NULL:
            return
        leaked = self._owner and getpid() == self._creator_pid
        description = repr(self)
        self.close()
        if leaked:
            warnings.warn(f"unclosed {description}: its memory was released; use close() or a with-block",
                          ResourceWarning, source=self)

    # -- construction -----------------------------------------------------

    @classmethod
    def create(cls, nbytes, device=0):
        """Allocate *nbytes* of device memory on *device* (``cudaMalloc``).

        The region owns the memory and gets an unguessable :attr:`key`, the
        name it is registered under by default.  Each region is its own
        allocation: only the base of an allocation can be shared by IPC.
        """
        cdef CudaRegion self
        cdef Runtime rt
        cdef tshm_cuda_alloc *a = NULL
        cdef tshm_ipc_handle handle
        cdef size_t size
        cdef int dev
        n = _index(nbytes, "nbytes")
        if n <= 0:
            raise OutOfBounds(f"a region needs a positive size, not nbytes={n}")
        if n > (<size_t>-1) // 2:
            raise OutOfBounds(f"nbytes={n} is larger than any allocation can be")
        _device_of(device)  # a malformed number is refused before CUDA is looked for
        size = n
        rt = current()
        dev = rt.valid_device(device)
        with nogil:
            rc = tshm_cuda_alloc_new(rt.rt, dev, size, &a)
        rt.check(rc, f"allocating {n} bytes on CUDA device {dev}")
        self = cls.__new__(cls)
        self._alloc = a
        self._runtime = rt
        try:
            rt.check(tshm_cuda_ipc_handle(a, &handle), "getting the CUDA IPC handle")
        except BaseException:
            self._alloc = NULL
            tshm_cuda_alloc_decref(a)
            raise
        self._handle = (<char *>handle.reserved)[:TSHM_IPC_HANDLE_BYTES]
        self._key = f"tritonshm-cuda-{getpid()}-{secrets.token_hex(8)}"
        self._nbytes = size
        self._device = dev
        self._owner = True
        self._creator_pid = getpid()
        _own_handles[self._handle] = self
        return self

    @classmethod
    def attach(cls, handle, nbytes, *, device=0, key=None):
        """Open another process's region from its 64-byte :attr:`ipc_handle`.

        *nbytes* is the size of the exporter's allocation (the handle does
        not carry it; pickling a region passes it along).  The memory stays
        the exporter's: ``close()`` only closes the handle here.
        """
        cdef CudaRegion self
        cdef Runtime rt
        cdef tshm_cuda_alloc *a = NULL
        cdef tshm_ipc_handle h
        cdef size_t size
        cdef int dev
        if not isinstance(handle, (bytes, bytearray, memoryview)):
            raise UnsupportedBuffer(f"an IPC handle is {TSHM_IPC_HANDLE_BYTES} bytes, not {type(handle).__name__}")
        raw = bytes(handle)
        if len(raw) != TSHM_IPC_HANDLE_BYTES:
            raise OutOfBounds(f"an IPC handle is {TSHM_IPC_HANDLE_BYTES} bytes, not {len(raw)}")
        n = _index(nbytes, "nbytes")
        if n <= 0:
            raise OutOfBounds(f"a region needs a positive size, not nbytes={n}")
        _device_of(device)
        mine = _own_handles.get(raw)
        if mine is not None:
            raise CudaError(f"{mine!r} was created by this process, which cannot open its own IPC handle "
                            f"(CUDA refuses: cudaErrorInvalidContext); use the region itself, or attach "
                            f"in another process", 201, "cudaErrorInvalidContext")
        memcpy(h.reserved, <const char *>raw, TSHM_IPC_HANDLE_BYTES)
        size = n
        rt = current()
        dev = rt.valid_device(device)
        with nogil:
            rc = tshm_cuda_alloc_open(rt.rt, dev, &h, size, &a)
        rt.check(rc, f"opening a CUDA IPC handle on device {dev}")
        self = cls.__new__(cls)
        self._alloc = a
        self._runtime = rt
        self._handle = raw
        self._key = key if key is not None else f"tritonshm-cuda-attached-{secrets.token_hex(8)}"
        self._nbytes = size
        self._device = dev
        self._owner = False
        return self

    # -- state ------------------------------------------------------------

    @property
    def key(self):
        """An unguessable name for this memory; the default registration name."""
        return self._key

    @property
    def nbytes(self):
        """The size of the region in bytes."""
        return self._nbytes

    @property
    def device(self):
        """The CUDA device (this process's numbering) the memory lives on."""
        return self._device

    @property
    def ptr(self):
        """The device address of the region's first byte."""
        return <size_t>self._live().ptr

    @property
    def ipc_handle(self):
        """The 64-byte ``cudaIpcMemHandle_t`` another process opens this memory with."""
        self._live()
        return self._handle

    @property
    def owner(self):
        """True when this object allocated the memory (and frees it)."""
        return self._owner

    @property
    def closed(self):
        """True after :meth:`close`."""
        return self._alloc == NULL

    @property
    def exports(self):
        """The number of live views and DLPack tensors holding this memory (in-flight copies too)."""
        if self._alloc != NULL:
            return tshm_cuda_alloc_refs(self._alloc) - 1
        if self._observed != NULL:
            return tshm_cuda_alloc_refs(self._observed)
        return 0

    def __repr__(self):
        state = "closed" if self._alloc == NULL else ("owner" if self._owner else "attached")
        return f"<CudaRegion {self._key!r} nbytes={self._nbytes} device={self._device} {state}>"

    cdef tshm_cuda_alloc *_live(self) except NULL:
        if self._alloc == NULL:
            raise RegionClosed(f"{self!r} is closed")
        return self._alloc

    def span(self, offset=0, nbytes=None):
        """Validate a byte range of this region and return it as ``(offset, nbytes)``.

        The same rules as :meth:`SystemRegion.span`: *nbytes* defaults to the
        rest; nothing out of range or wrapping is accepted or truncated.
        """
        self._live()
        return _span(self, self._nbytes, offset, nbytes)

    # -- lifetime ---------------------------------------------------------

    def close(self):
        """Release this region; idempotent.

        The memory is freed (or, for an attached region, its handle closed)
        when the last view and DLPack tensor are gone too, so views that
        outlive ``close()`` stay valid.  A forked child never frees its
        parent's memory.
        """
        cdef tshm_cuda_alloc *a = self._alloc
        if a == NULL:
            return
        self._alloc = NULL
        if self._observed == NULL:
            tshm_cuda_alloc_observe(a)
            self._observed = a
        _own_handles.pop(self._handle, None)
        with nogil:
            tshm_cuda_alloc_decref(a)

    def __enter__(self):
        self._live()
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __reduce__(self):
        self._live()
        return (_unpickle, (self._handle, self._nbytes, self._device, self._key))

    # -- views and copies -------------------------------------------------

    def view(self, dtype, shape, offset=0):
        """A zero-copy device array of *shape* x *dtype* at byte *offset*.

        It exports ``__dlpack__``, ``__dlpack_device__`` and
        ``__cuda_array_interface__``, and keeps the memory alive.
        """
        dt, dims, nbytes = _layout(dtype, shape)
        _dlpack.dl_dtype(dt)  # refuse what no consumer could describe
        off, _ = self.span(offset, nbytes)
        return _make_view(self._runtime, self._live(), off, dt, dims, nbytes)

    def window(self, offset=0, nbytes=None):
        """A :class:`CudaWindow` over bytes [offset, offset + nbytes) (default: the rest).

        The window counts its own :attr:`~CudaWindow.holders` (it, its
        :meth:`~CudaWindow.share`\ s, its views and their DLPack tensors) and
        keeps the memory alive: closing the region leaves it valid.  For
        :attr:`exports`, a window and everything made from it count as one.
        """
        cdef tshm_cuda_hold *h = NULL
        cdef CudaWindow w
        off, size = self.span(offset, nbytes)
        a = self._live()  # span() can run __index__ code that closes us
        self._runtime.check(tshm_cuda_hold_new(a, &h), f"making a window of {self!r}")
        w = CudaWindow.__new__(CudaWindow)
        w._hold = h
        w._runtime = self._runtime
        w._key = self._key
        w._offset = off
        w._nbytes = size
        return w

    def write(self, src, offset=0):
        """Copy *src* in at byte *offset*; returns the number of bytes written.

        *src* is a host buffer (anything C-contiguous with the buffer
        protocol), a device array (DLPack or the CUDA Array Interface:
        torch, cupy, jax, our views) or a :class:`Capture`.  A device
        array's pending work on its stream is ordered before the copy (the
        DLPack handshake, an event on a CUDA Array Interface ``stream``, a
        capture's event); the copy runs on this thread's copy stream and
        is complete on return.  Nothing is written unless the whole of
        *src* fits.
        """
        cdef Imported imp
        cdef Py_buffer buf
        cdef Stream cs
        cdef Capture cap
        self._live()
        cs = thread_copy_stream(self._runtime, self._device)
        if isinstance(src, Capture):
            cap = <Capture>src
            cap._live()
            return self._copy_in_device(cap.ptr, cap.nbytes, offset, cs, cap.event)
        imp = _dlpack.import_device(src, _dlpack.dlpack_stream(cs.handle))
        if imp is not None:
            try:
                return self._copy_in_device(imp.ptr, imp.nbytes, offset, cs, None)
            finally:
                imp.release()
        cai = _cuda_array_interface(src)
        if cai is not None:
            ptr, length, stream, _ = cai
            return self._copy_in_device(ptr, length, offset, cs,
                                        _producer_event(self._runtime, _cai_device(src, self._device), stream))
        if isinstance(src, np.ndarray) and src.dtype.hasobject:
            raise DTypeMismatch(f"cannot write an array of dtype {src.dtype} (Python objects) to device memory")
        try:
            PyObject_GetBuffer(src, &buf, PyBUF_C_CONTIGUOUS)
        except (BufferError, TypeError, ValueError) as exc:
            if isinstance(src, np.ndarray) and src.flags.c_contiguous:
                return self.write(src.reshape(-1).view(np.uint8), offset)
            raise UnsupportedBuffer(
                f"write() needs a C-contiguous host buffer or a device array (DLPack or "
                f"__cuda_array_interface__); {type(src).__name__} is neither ({exc})") from None
        try:
            return self._copy_in_device(<size_t>buf.buf, buf.len, offset, cs, None)
        finally:
            PyBuffer_Release(&buf)

    cdef object _copy_in_device(self, size_t src, size_t length, object offset, Stream stream, Event wait):
        """Copy *length* bytes from *src* (host or device) in at *offset* on *stream*, after *wait*."""
        cdef tshm_cuda_alloc *a
        cdef size_t off
        cdef void *h = stream._live()
        cdef void *w = NULL if wait is None else wait._live()
        off, _ = self.span(offset, length)
        a = self._live()  # span() can run __index__ code that closes us
        tshm_cuda_alloc_incref(a)
        with nogil:
            rc = tshm_cuda_copy_in(a, off, <const void *>src, length, h, w)
        tshm_cuda_alloc_decref(a)
        self._runtime.check(rc, f"copying {length} bytes into {self!r}")
        return length

    def read(self, dtype, shape, offset=0):
        """A host copy (numpy) of *shape* x *dtype* read from byte *offset*; that range only."""
        cdef size_t off, length
        dt, dims, nbytes = _layout(dtype, shape)
        off, length = self.span(offset, nbytes)
        return _to_host(self._runtime, self._live(), off, length, dt, dims, self)


cdef object _to_host(Runtime rt, tshm_cuda_alloc *a, size_t offset, size_t length, object dtype,
                     tuple shape, object owner):
    """Bytes [offset, offset + length) of *a* copied into a new numpy array of *shape* x *dtype*.

    On this thread's copy stream of the memory's device, complete on return.
    """
    cdef Py_buffer dst
    cdef void *h = thread_copy_stream(rt, a.device)._live()
    out = np.empty(length, dtype=np.uint8)
    PyObject_GetBuffer(out, &dst, PyBUF_WRITABLE)
    tshm_cuda_alloc_incref(a)  # a concurrent close() must not free under the copy
    try:
        with nogil:
            rc = tshm_cuda_copy_out(a, offset, dst.buf, length, h, NULL)
    finally:
        tshm_cuda_alloc_decref(a)
        PyBuffer_Release(&dst)
    rt.check(rc, f"copying {length} bytes out of {owner!r}")
    return out.view(dtype).reshape(shape)


cdef Event _producer_event(Runtime rt, int device, size_t stream):
    """An event recorded now on a CUDA Array Interface producer's *stream* (0: none to wait for)."""
    cdef Event event
    if stream == 0:
        return None
    event = new_event(rt, device)
    event._record(stream)
    return event


def _cai_device(obj, int fallback):
    """The device of a CUDA Array Interface producer (its ``__dlpack_device__``), else *fallback*.

    The interface carries no device; finding it from the pointer would
    need ``cudaPointerGetAttributes``, whose struct changed between CUDA 12
    and 13.
    """
    where = _dlpack.dlpack_device(obj, False)
    if where is not None and where[0] in _dlpack.DEVICE_MEMORY_TYPES:
        return where[1]
    return fallback


def _read_cai(obj):
    """``obj.__cuda_array_interface__`` (None when absent), read with the object's device current."""
    cdef Runtime rt
    cdef int previous = 0
    cdef int device
    where = _dlpack.dlpack_device(obj, False)
    if where is None or where[0] not in _dlpack.DEVICE_MEMORY_TYPES:
        return getattr(obj, "__cuda_array_interface__", None)
    rt = current()
    device = where[1]
    rt.check(tshm_cuda_device_enter(rt.rt, device, &previous), f"selecting CUDA device {device}")
    try:
        return getattr(obj, "__cuda_array_interface__", None)
    finally:
        tshm_cuda_device_leave(rt.rt, device, previous)


def _cuda_array_interface(obj):
    """``(ptr, nbytes, stream, readonly)`` of a C-contiguous CUDA Array Interface export, else None."""
    parsed = _parse_cai(obj)
    if parsed is None:
        return None
    ptr, dt, shape, stream, readonly = parsed
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    return ptr, count * dt.itemsize, stream, readonly


def _parse_cai(obj, cai=None):
    """``(ptr, dtype, shape, stream, readonly)`` of a C-contiguous CUDA Array Interface export, else None.

    *cai* is ``obj.__cuda_array_interface__`` when the caller has it already.
    *stream* is 0 when the producer gave None (nothing to wait for).
    """
    if cai is None:
        try:
            cai = _read_cai(obj)
        except Error:
            raise
        except Exception as exc:  # the producer's own refusal
            raise UnsupportedBuffer(f"{type(obj).__name__}.__cuda_array_interface__ refused "
                                    f"({type(exc).__name__}: {exc})") from exc
    if cai is None:
        return None
    try:
        shape = tuple(int(d) for d in cai["shape"])
        dt = np.dtype(cai["typestr"])
        ptr = int(cai["data"][0])
        readonly = bool(cai["data"][1])
        strides = cai.get("strides")
        stream = cai.get("stream")
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise UnsupportedBuffer(f"{type(obj).__name__} has a malformed __cuda_array_interface__ ({exc})") from None
    if cai.get("mask") is not None:
        raise UnsupportedBuffer(f"{type(obj).__name__} is a masked array; copy its data first")
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if strides is not None and count > 0:
        expected = dt.itemsize
        for d, s in zip(reversed(shape), reversed(tuple(strides))):
            if d != 1 and s != expected:
                raise UnsupportedBuffer(f"{type(obj).__name__} is not C-contiguous; make it so first")
            expected *= d
    if stream == 0:
        raise UnsupportedBuffer(f"{type(obj).__name__} gave stream 0 in __cuda_array_interface__, which v3 forbids")
    return ptr, dt, shape, (0 if stream is None else int(stream)), readonly


cdef CudaArray _make_view(Runtime rt, tshm_cuda_alloc *a, size_t offset, object dtype, tuple shape,
                          object nbytes):
    cdef CudaArray v = CudaArray.__new__(CudaArray)
    tshm_cuda_alloc_incref(a)
    v._alloc = a
    v._runtime = rt
    v._offset = offset
    v.dtype = dtype
    v.shape = shape
    v.nbytes = nbytes
    return v


def empty(dtype, shape, device=0):
    """A new, uninitialised :class:`CudaArray` of *shape* x *dtype* in an allocation of its own.

    A plain ``cudaMalloc`` (no IPC handle, no region): the array is its only
    holder, and the memory is freed when it and its DLPack tensors are gone.
    """
    cdef Runtime rt
    cdef tshm_cuda_alloc *a = NULL
    cdef size_t size
    cdef int dev
    dt, dims, nbytes = _layout(dtype, shape)
    _dlpack.dl_dtype(dt)  # refuse what no consumer could describe
    if nbytes > (<size_t>-1) // 2:
        raise OutOfBounds(f"{nbytes} bytes is larger than any allocation can be")
    _device_of(device)
    size = max(<size_t>nbytes, 1)  # cudaMalloc of 0 bytes gives no pointer
    rt = current()
    dev = rt.valid_device(device)
    with nogil:
        rc = tshm_cuda_alloc_new(rt.rt, dev, size, &a)
    rt.check(rc, f"allocating {nbytes} bytes on CUDA device {dev}")
    view = _make_view(rt, a, 0, dt, dims, nbytes)
    tshm_cuda_alloc_decref(a)  # the view's reference is the only one
    return view


cdef class CudaArray:
    """A C-contiguous array in device memory: a view of a :class:`CudaRegion`.

    torch, cupy, jax and numba consume it without a copy through
    ``__dlpack__`` or ``__cuda_array_interface__``.  It holds the memory:
    the region may be closed while views (or tensors made from them) live.
    Turn it into host memory with :meth:`get`, never implicitly.
    """

    def __cinit__(self):
        self._alloc = NULL
        self._hold = NULL

    def __init__(self, *args, **kwargs):
        raise TypeError("use CudaRegion.view(dtype, shape, offset) or CudaWindow.view(dtype, shape, offset)")

    def __dealloc__(self):
        if self._hold != NULL:  # a window's view: its alloc is the hold's
            tshm_cuda_hold_decref(self._hold)
            self._hold = NULL
            self._alloc = NULL
        elif self._alloc != NULL:
            tshm_cuda_alloc_decref(self._alloc)
            self._alloc = NULL

    cdef tshm_cuda_alloc *_a(self) except NULL:
        if self._alloc == NULL:  # only CudaArray.__new__ without view() makes one
            raise TypeError("this CudaArray was not made by view() or empty()")
        return self._alloc

    @property
    def ptr(self):
        """The device address of the first element."""
        return <size_t>self._a().ptr + self._offset

    @property
    def device(self):
        """The CUDA device the memory lives on."""
        return self._a().device

    @property
    def ndim(self):
        """The number of dimensions."""
        return len(self.shape)

    @property
    def size(self):
        """The number of elements."""
        return self.nbytes // self.dtype.itemsize

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __repr__(self):
        if self._alloc == NULL:
            return "<CudaArray (not made by view())>"
        return f"<CudaArray {self.dtype} {self.shape} on cuda:{self.device} at 0x{self.ptr:x}>"

    @property
    def __cuda_array_interface__(self):
        """The CUDA Array Interface, version 3 (no stream: nothing is pending on our memory)."""
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "descr": self.dtype.descr,
            "data": (self.ptr, False),
            "strides": None,
            "version": 3,
            "stream": None,
        }

    def __dlpack_device__(self):
        """``(kDLCUDA, device)``."""
        return (kDLCUDA, self._a().device)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule of this array (versioned when *max_version* allows), zero-copy.

        The tensor holds the memory until its consumer's deleter runs (on any
        thread; the release is plain C).  A window's view gives the tensor
        a holder of the window's count instead (which holds the memory),
        and remembers the consumer's *stream* (None and 1: the legacy
        default stream, 2: per-thread, a handle; -1: the consumer promised
        nothing to order): the deleter records an event on it, and the
        window counts as read (:meth:`CudaWindow.readers_pending`) until
        the consumer's work queued before the deleter ran is done.  Our
        memory has no pending work of ours, so *stream* needs no wait.
        """
        cdef tshm_cuda_reader *reader = NULL
        versioned = _dlpack.check_request(stream, max_version, dl_device, copy, kDLCUDA, self._a().device)
        if self._hold != NULL:
            if stream == -1:
                tshm_cuda_hold_incref(self._hold)  # the capsule's own; export_capsule takes it over
                return export_capsule(<void *>(self._alloc.ptr + self._offset), kDLCUDA, self._alloc.device,
                                      self.dtype, self.shape, False, versioned, _release_hold, self._hold)
            # The deleter runs on any thread, where the per-thread default stream (2) is another
            # stream than the consumer's: the legacy one (1) is ordered after every blocking
            # stream, the consumer thread's per-thread stream included.
            handle = 1 if stream is None or stream == 2 else <size_t>stream
            self._runtime.check(tshm_cuda_reader_new(self._hold, <void *><size_t>handle, &reader),
                                f"preparing a DLPack export of {self!r}")
            # The reader holds one holder; export_capsule takes it over.
            return export_capsule(<void *>(self._alloc.ptr + self._offset), kDLCUDA, self._alloc.device,
                                  self.dtype, self.shape, False, versioned, tshm_cuda_reader_release, reader)
        tshm_cuda_alloc_incref(self._alloc)  # the capsule's own; export_capsule takes it over
        return export_capsule(<void *>(self._alloc.ptr + self._offset), kDLCUDA, self._alloc.device,
                              self.dtype, self.shape, False, versioned, _release_alloc, self._alloc)

    def get(self):
        """A host copy of this array, as numpy."""
        return _to_host(self._runtime, self._a(), self._offset, self.nbytes, self.dtype, self.shape, self)

    def __array__(self, *args, **kwargs):
        raise TypeError("a CudaArray lives in device memory: use .get() for a host copy "
                        "(implicit conversion to numpy is not allowed)")

    def __reduce__(self):
        raise TypeError("a CudaArray cannot be pickled; pickle its region and call view() there")


cdef class CudaWindow:
    """A byte range of a :class:`CudaRegion` whose users are counted: a pool's slot.

    Made by :meth:`CudaRegion.window`.  Its :attr:`holders` are every
    window object of the range (this one and its :meth:`share`\\ s), every
    :class:`CudaArray` from :meth:`view`, and every DLPack tensor made from
    those -- including a consumer's (torch, cupy), released by its deleter on
    any thread without the GIL.  A pool keeps one :meth:`share` as a probe:
    the range is free again when ``probe.holders == 1``.

    The window keeps the memory alive: it, its views and their tensors stay
    valid after the region is closed.  It cannot be pickled.
    """

    def __cinit__(self):
        self._hold = NULL

    def __init__(self, *args, **kwargs):
        raise TypeError("use CudaRegion.window(offset, nbytes)")

    def __dealloc__(self):
        if self._hold != NULL:
            tshm_cuda_hold_decref(self._hold)
            self._hold = NULL

    cdef tshm_cuda_hold *_h(self) except NULL:
        if self._hold == NULL:  # only CudaWindow.__new__ without window() makes one
            raise TypeError("this CudaWindow was not made by CudaRegion.window()")
        return self._hold

    @property
    def offset(self):
        """The window's first byte, as an offset in its region."""
        return self._offset

    @property
    def nbytes(self):
        """The size of the window in bytes."""
        return self._nbytes

    @property
    def device(self):
        """The CUDA device the memory lives on."""
        return self._h().alloc.device

    @property
    def ptr(self):
        """The device address of the window's first byte."""
        return <size_t>self._h().alloc.ptr + self._offset

    @property
    def key(self):
        """The :attr:`CudaRegion.key` of the region this is a window of."""
        return self._key

    @property
    def holders(self):
        """How many window objects, views and DLPack tensors of this range are alive (>= 1: this one)."""
        return tshm_cuda_hold_refs(self._h())

    def readers_pending(self):
        """True while a consumer that let go of a DLPack tensor of this range may still be reading it.

        When a consumer's tensor (made with ``__dlpack__(stream=s)``) is
        deleted, an event is recorded on *s*; this queries those events
        (never blocks) and forgets the complete ones.  A pool reuses the
        range only when ``holders <= 1 and not readers_pending()``.
        Consumers through the CUDA Array Interface name no stream of
        theirs: only their holding the view counts for them.
        """
        cdef int pending = 0
        self._runtime.check(tshm_cuda_hold_readers_pending(self._h(), &pending),
                            f"querying the readers of {self!r}")
        return pending != 0

    def share(self):
        """Another window object over the same range and the same count (one more holder)."""
        cdef CudaWindow w = CudaWindow.__new__(CudaWindow)
        tshm_cuda_hold_incref(self._h())
        w._hold = self._hold
        w._runtime = self._runtime
        w._key = self._key
        w._offset = self._offset
        w._nbytes = self._nbytes
        return w

    def span(self, offset=0, nbytes=None):
        """Validate a byte range of this window (offsets relative to it) and return ``(offset, nbytes)``."""
        return _span(self, self._nbytes, offset, nbytes)

    def view(self, dtype, shape, offset=0):
        """A zero-copy device array of *shape* x *dtype* at byte *offset* of the window.

        The view lies inside the window, holds one holder of its count and
        keeps the memory alive; so does every DLPack tensor made from it.
        """
        cdef CudaArray v
        dt, dims, nbytes = _layout(dtype, shape)
        _dlpack.dl_dtype(dt)  # refuse what no consumer could describe
        off, _ = self.span(offset, nbytes)
        v = CudaArray.__new__(CudaArray)
        tshm_cuda_hold_incref(self._h())
        v._hold = self._hold
        v._alloc = self._hold.alloc  # borrowed: the hold keeps it
        v._runtime = self._runtime
        v._offset = self._offset + <size_t>off
        v.dtype = dt
        v.shape = dims
        v.nbytes = nbytes
        return v

    def __repr__(self):
        if self._hold == NULL:
            return "<CudaWindow (not made by CudaRegion.window())>"
        return (f"<CudaWindow of {self._key!r} offset={self._offset} nbytes={self._nbytes} "
                f"device={self.device} holders={self.holders}>")

    def __reduce__(self):
        raise TypeError("a CudaWindow cannot be pickled; pickle its region and call window() there")


# -- capture() -------------------------------------------------------------------

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

    cdef readonly size_t ptr
    cdef readonly object nbytes
    cdef readonly int device
    cdef readonly object dtype
    cdef readonly tuple shape
    cdef readonly bint readonly
    cdef readonly Event event
    cdef object _obj           # a CUDA Array Interface producer or a CudaArray, kept alive
    cdef Imported _imported    # a DLPack producer's tensor
    cdef bint _released

    def __init__(self, *args, **kwargs):
        raise TypeError("use tritonshm.cuda.capture(device_array)")

    cdef int _live(self) except -1:
        if self.event is None:  # only Capture.__new__ without capture() makes one
            raise TypeError("this Capture was not made by capture()")
        if self._released:
            raise RegionClosed(f"{self!r} was released")
        return 0

    @property
    def closed(self):
        """True after :meth:`release`."""
        return self._released

    def release(self):
        """Hand the memory back to its producer and drop the event; idempotent."""
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


def capture(obj, device=None):
    """Take a device array as it is now, on the caller's thread: a :class:`Capture`.

    *obj* is a :class:`CudaArray`, a DLPack producer of CUDA memory (torch,
    cupy, jax) or a CUDA Array Interface producer.  What "its work so far"
    means, per kind:

    * DLPack: ``__dlpack__(stream=copy_stream(device))`` under the tensor's
      device guard (the producer orders its pending work on *its* current
      stream before our copy stream: torch's handshake), then the event is
      recorded on the copy stream;
    * CUDA Array Interface: recorded on its ``stream``, or on
      :func:`current_stream` of the device when it gives none;
    * :class:`CudaArray`: recorded on :func:`current_stream` of its device.

    Call it where the work was queued: torch's and cupy's current streams are
    per thread.  *device* is the device of a CUDA Array Interface producer
    that does not say (default 0), or a check for the others.  A producer's
    refusal is :class:`UnsupportedBuffer`; host memory too.
    """
    cdef Capture cap
    cdef CudaArray array
    cdef Runtime rt
    cdef Imported imp
    cdef Stream cs
    cdef int dev
    want = None if device is None else _device_of(device)
    if isinstance(obj, Capture):
        (<Capture>obj)._live()
        return obj
    cap = Capture.__new__(Capture)
    if isinstance(obj, CudaArray):
        array = <CudaArray>obj
        if array._alloc == NULL:
            raise UnsupportedBuffer("this CudaArray was not made by view()")
        dev = array._alloc.device
        _device_wanted(want, dev, obj)
        cap.event = new_event(array._runtime, dev)
        cap.event._record(_current_stream(dev))
        cap._obj = obj
        cap.ptr = array.ptr
        cap.nbytes = array.nbytes
        cap.dtype = array.dtype
        cap.shape = array.shape
        cap.readonly = False
        cap.device = dev
        return cap
    where = _dlpack.dlpack_device(obj)
    if where is not None and where[0] in _dlpack.DEVICE_MEMORY_TYPES:
        rt = current()
        dev = rt.valid_device(where[1])
        _device_wanted(want, dev, obj)
        cs = thread_copy_stream(rt, dev)
        imp = _dlpack.import_device(obj, _dlpack.dlpack_stream(cs.handle), _dlpack.DEVICE_MEMORY_TYPES)
        try:
            cap.event = new_event(rt, dev)
            cap.event._record(<size_t>cs._live())
            try:
                cap.dtype = imp.dtype
            except DTypeMismatch:  # bfloat16 and co: the bytes can still be copied
                cap.dtype = None
        except BaseException:
            imp.release()
            raise
        cap._imported = imp
        cap.ptr = imp.ptr
        cap.nbytes = imp.nbytes
        cap.shape = imp.shape
        cap.readonly = imp.readonly
        cap.device = dev
        return cap
    parsed = _parse_cai(obj)
    if parsed is None:
        raise UnsupportedBuffer(
            f"capture() takes a device array (a CudaArray, DLPack CUDA memory or __cuda_array_interface__); "
            f"{type(obj).__name__} is none of these: copy host memory directly")
    ptr, dt, shape, stream, readonly = parsed
    rt = current()
    dev = rt.valid_device(_cai_device(obj, want if want is not None else 0))
    _device_wanted(want, dev, obj)
    cap.event = new_event(rt, dev)
    cap.event._record(stream if stream != 0 else _current_stream(dev))
    cap._obj = obj
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    cap.ptr = ptr
    cap.nbytes = count * dt.itemsize
    cap.dtype = dt
    cap.shape = shape
    cap.readonly = readonly
    cap.device = dev
    return cap


# -- copy() --------------------------------------------------------------------

cdef class _Side:
    """One end of a :func:`copy`: a range of host or device memory, held until :meth:`close`."""

    cdef size_t base          # address of byte 0
    cdef size_t size          # bytes addressable from base
    cdef int device           # CUDA device, or -1 when unknown
    cdef size_t wait          # an event the copy's stream waits for first, or 0
    cdef Event event          # the event behind `wait` when this end made it (a CAI producer's stream)
    cdef Capture capture      # a Capture end, kept for the copy
    cdef tshm_cuda_alloc *alloc  # our reference to a native allocation during the copy
    cdef Runtime runtime      # a native end's runtime
    cdef Imported imported
    cdef Py_buffer buf
    cdef bint has_buf
    cdef object keep          # an object the buffer was taken from (a uint8 view)
    cdef str what             # what this end is, for messages; None: repr(owner)
    cdef object owner         # a native end's region, window or view

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
    cdef _Side side = _Side.__new__(_Side)
    tshm_cuda_alloc_incref(a)  # a concurrent close() must not free under the copy
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


cdef _Side _resolve(object obj, bint writable, str role, Runtime rt, int device, object dl_stream):
    """*obj* as one end of a copy on a stream of *device*; raises the project's errors for what cannot be one.

    *dl_stream* is the copy's stream in ``__dlpack__``'s terms, for the
    DLPack handshake.
    """
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
        return _native(a, <size_t>a.ptr + array._offset, array.nbytes, array._runtime, array)
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
    imp = _dlpack.import_device(obj, dl_stream)
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
    cai = _cuda_array_interface(obj)
    if cai is not None:
        ptr, length, stream, readonly = cai
        if writable and readonly:
            raise UnsupportedBuffer(f"the {role} ({name}) is read-only (__cuda_array_interface__)")
        side.base = ptr
        side.size = length
        side.event = _producer_event(rt, _cai_device(obj, device), stream)
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
    off = _index(offset, f"{role}_offset")
    if off < 0 or off > cap:
        raise OutOfBounds(f"{role}_offset={off} is outside the {role} {side.describe()}")
    size = cap - off if nbytes is None else nbytes
    if size > cap - off:
        raise OutOfBounds(f"{size} bytes at {role}_offset={off} do not fit in the {role} {side.describe()} "
                          f"({cap - off} available)")
    return off, size


def copy(dst, src, nbytes=None, *, dst_offset=0, src_offset=0, stream=None):
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
    * with *stream* (a :class:`Stream`): enqueued on it and **not** complete
      on return; record an event or synchronize the stream before relying
      on the bytes, and keep the ends alive until then (a :class:`Capture`
      keeps a producer's memory).

    Never the legacy default stream, never a device-wide synchronization.
    Zero bytes make no CUDA call.  The copy's device is *stream*'s, else
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
    cdef int device
    cdef int sync
    cdef int rc
    n = None if nbytes is None else _index(nbytes, "nbytes")
    if n is not None and n < 0:
        raise OutOfBounds(f"nbytes={n} is negative")
    doff = _index(dst_offset, "dst_offset")
    soff = _index(src_offset, "src_offset")
    if stream is not None and not isinstance(stream, Stream):
        raise UnsupportedBuffer(f"stream must be a tritonshm.cuda.Stream (Stream.create(device) or "
                                f"copy_stream(device)), not {type(stream).__name__}")
    try:
        rt = _runtime_of(dst)
        if rt is None:
            rt = _runtime_of(src)
        if stream is not None:
            cs = <Stream>stream
            cs._live()
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
                rt.check(rt.rt.GetDevice(&device), "reading the current CUDA device")
            cs = thread_copy_stream(rt, device)
        dl_stream = _dlpack.dlpack_stream(<size_t>cs._live())
        d = _resolve(dst, True, "destination", rt, device, dl_stream)
        s = _resolve(src, False, "source", rt, device, dl_stream)
        soff, n = _range(s, "src", soff, n)
        doff, n = _range(d, "dst", doff, n)
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
        h = cs._live()
        sync = stream is None
        with nogil:
            rc = tshm_cuda_memcpy(rt.rt, device, h, <void *>d.base, d.size, c_doff,
                                  <const void *>s.base, s.size, c_soff, c_len, waits, 2, sync)
        if rc != 0:
            rt.check(rc, f"copying {n} bytes from {s.describe()} to {d.describe()}")
        return n
    finally:
        if s is not None:
            s.close()
        if d is not None:
            d.close()


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
        cai = _read_cai(obj)
    except Error:
        raise
    except Exception:  # torch raises for dtypes the interface cannot name (bfloat16): ask DLPack
        cai = None
    parsed = _parse_cai(obj, cai) if cai is not None else None
    if parsed is not None:
        _, dt, shape, _, _ = parsed
        return dt, shape, _cai_device(obj, 0)
    imp = _dlpack.import_device(obj, -1, _dlpack.DEVICE_MEMORY_TYPES)
    if imp is None:
        return None
    try:
        return imp.dtype, imp.shape, imp.device_id
    finally:
        imp.release()
