# cython: language_level=3, embedsignature=True
"""CUDA regions: device memory another process (the server) can open.

A :class:`CudaRegion` owns one reference to a native, reference-counted
device allocation (``tshm_cuda_alloc`` in csrc/).  Every view
(:class:`CudaArray`) and every DLPack capsule made from one holds a
reference of its own, so the memory is freed -- in C, without the GIL,
possibly from a consumer's DLPack deleter on another thread -- only when
the region is closed *and* the last view is gone.
"""

from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from libc.string cimport memcpy
from posix.unistd cimport getpid

from ._dlpack cimport Imported, export_capsule
from ._runtime cimport Runtime, current
from ._tshm cimport (
    TSHM_IPC_HANDLE_BYTES,
    kDLCUDA,
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

from ..errors import CudaError, DTypeMismatch, OutOfBounds, RegionClosed, UnsupportedBuffer
from . import _dlpack
from ._args import device_of as _device_of, index as _index, layout as _layout, span as _span

__all__ = ["CudaRegion", "CudaArray"]

# The handles of this process's live regions: opening one of them here is
# CUDA's error 201; say what is going on instead.
_own_handles = weakref.WeakValueDictionary()


cdef void _release_alloc(void *ctx) noexcept nogil:
    tshm_cuda_alloc_decref(<tshm_cuda_alloc *>ctx)


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
        dev = _device_of(device)
        size = n
        rt = current()
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
        dev = _device_of(device)
        mine = _own_handles.get(raw)
        if mine is not None:
            raise CudaError(f"{mine!r} was created by this process, which cannot open its own IPC handle "
                            f"(CUDA refuses: cudaErrorInvalidContext); use the region itself, or attach "
                            f"in another process", 201, "cudaErrorInvalidContext")
        memcpy(h.reserved, <const char *>raw, TSHM_IPC_HANDLE_BYTES)
        size = n
        rt = current()
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

    def write(self, src, offset=0):
        """Copy *src* in at byte *offset*; returns the number of bytes written.

        *src* is a host buffer (anything C-contiguous with the buffer
        protocol) or a device array (DLPack or the CUDA Array Interface:
        torch, cupy, jax, our views).  A device array's pending work on its
        stream is ordered before the copy; the copy is complete on return.
        Nothing is written unless the whole of *src* fits.
        """
        cdef Imported imp
        cdef Py_buffer buf
        self._live()
        imp = _dlpack.import_device(src)
        if imp is not None:
            try:
                return self._copy_in_device(imp.ptr, imp.nbytes, offset, 0)
            finally:
                imp.release()
        cai = _cuda_array_interface(src)
        if cai is not None:
            ptr, length, stream = cai
            return self._copy_in_device(ptr, length, offset, stream)
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
            return self._copy_in_device(<size_t>buf.buf, buf.len, offset, 0)
        finally:
            PyBuffer_Release(&buf)

    cdef object _copy_in_device(self, size_t src, size_t length, object offset, size_t stream):
        """Copy *length* bytes from *src* (host or device) in at *offset*, after *stream*'s work."""
        cdef tshm_cuda_alloc *a
        cdef size_t off
        off, _ = self.span(offset, length)
        a = self._live()  # span() can run __index__ code that closes us
        tshm_cuda_alloc_incref(a)
        with nogil:
            rc = tshm_cuda_copy_in(a, off, <const void *>src, length, <void *>stream)
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
    """Bytes [offset, offset + length) of *a* copied into a new numpy array of *shape* x *dtype*."""
    cdef Py_buffer dst
    out = np.empty(length, dtype=np.uint8)
    PyObject_GetBuffer(out, &dst, PyBUF_WRITABLE)
    tshm_cuda_alloc_incref(a)  # a concurrent close() must not free under the copy
    try:
        with nogil:
            rc = tshm_cuda_copy_out(a, offset, dst.buf, length)
    finally:
        tshm_cuda_alloc_decref(a)
        PyBuffer_Release(&dst)
    rt.check(rc, f"copying {length} bytes out of {owner!r}")
    return out.view(dtype).reshape(shape)


def _cuda_array_interface(obj):
    """``(ptr, nbytes, stream)`` of a C-contiguous CUDA Array Interface export, else None."""
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is None:
        return None
    try:
        shape = tuple(int(d) for d in cai["shape"])
        dt = np.dtype(cai["typestr"])
        ptr = int(cai["data"][0])
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
    return ptr, count * dt.itemsize, (0 if stream is None else int(stream))


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


cdef class CudaArray:
    """A C-contiguous array in device memory: a view of a :class:`CudaRegion`.

    torch, cupy, jax and numba consume it without a copy through
    ``__dlpack__`` or ``__cuda_array_interface__``.  It holds the memory:
    the region may be closed while views (or tensors made from them) live.
    Turn it into host memory with :meth:`get`, never implicitly.
    """

    def __cinit__(self):
        self._alloc = NULL

    def __init__(self, *args, **kwargs):
        raise TypeError("use CudaRegion.view(dtype, shape, offset)")

    def __dealloc__(self):
        if self._alloc != NULL:
            tshm_cuda_alloc_decref(self._alloc)
            self._alloc = NULL

    @property
    def ptr(self):
        """The device address of the first element."""
        return <size_t>self._alloc.ptr + self._offset

    @property
    def device(self):
        """The CUDA device the memory lives on."""
        return self._alloc.device

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
        return (kDLCUDA, self._alloc.device)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule of this array (versioned when *max_version* allows), zero-copy.

        The tensor holds the memory until its consumer's deleter runs (on any
        thread; the release is plain C).
        """
        versioned = _dlpack.check_request(stream, max_version, dl_device, copy, kDLCUDA, self._alloc.device)
        tshm_cuda_alloc_incref(self._alloc)  # the capsule's own; export_capsule takes it over
        return export_capsule(<void *>(self._alloc.ptr + self._offset), kDLCUDA, self._alloc.device,
                              self.dtype, self.shape, False, versioned, _release_alloc, self._alloc)

    def get(self):
        """A host copy of this array, as numpy."""
        return _to_host(self._runtime, self._alloc, self._offset, self.nbytes, self.dtype, self.shape, self)

    def __array__(self, *args, **kwargs):
        raise TypeError("a CudaArray lives in device memory: use .get() for a host copy "
                        "(implicit conversion to numpy is not allowed)")

    def __reduce__(self):
        raise TypeError("a CudaArray cannot be pickled; pickle its region and call view() there")
