# cython: language_level=3, embedsignature=True
"""CUDA regions: device memory another process (the server) can open -- :class:`CudaRegion`.

A :class:`CudaRegion` owns one reference to a native, reference-counted
device allocation (``tshm_cuda_alloc`` in csrc/) from ``cudaMalloc``, and
its ``cudaIpcMemHandle_t``.  Every view (:class:`~._cuda_array.CudaArray`),
every window (:class:`~._cuda_window.CudaWindow`) and every DLPack capsule
made from one holds a reference of its own, so the memory is freed -- in
C, without the GIL, possibly from a consumer's DLPack deleter on another
thread -- only when the region is closed *and* the last view is gone.  The
lifecycle (``closed``, ``with``, the ResourceWarning of a dropped owner) is
:class:`~._region.Region`'s.

:meth:`CudaRegion.write` copies a host buffer, a device array or a
:class:`~._capture.Capture` in, on this thread's copy stream: a DLPack
producer is told that stream (``__dlpack__(stream=...)``, under its
device's guard), a CUDA Array Interface producer's ``stream`` gets an
event the copy waits for.
"""

from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBuffer_Release, PyObject_GetBuffer
from libc.string cimport memcpy
from posix.unistd cimport getpid

from ._cai cimport producer_event
from ._capture cimport Capture
from ._capture import capture as _capture
from ._cuda_array cimport make_view, to_host
from ._cuda_window cimport CudaWindow
from ._dlpack cimport Imported, dl_dtype
from ._runtime cimport Runtime, current
from ._stream cimport Event, Stream, thread_copy_stream
from ._tshm cimport (
    TSHM_CUDA_ERROR_INVALID_VALUE,
    TSHM_IPC_HANDLE_BYTES,
    tshm_cuda_alloc,
    tshm_cuda_alloc_decref,
    tshm_cuda_alloc_incref,
    tshm_cuda_alloc_borrow,
    tshm_cuda_alloc_new,
    tshm_cuda_alloc_observe,
    tshm_cuda_alloc_open,
    tshm_cuda_alloc_refs,
    tshm_cuda_alloc_unobserve,
    tshm_cuda_copy_in,
    tshm_cuda_hold,
    tshm_cuda_hold_new,
    tshm_cuda_ipc_handle,
    tshm_ipc_handle,
)

import collections
import errno
import secrets
import threading
import weakref

import numpy as np

from ..errors import CudaError, DTypeMismatch, NotShareable, OutOfBounds, UnsupportedBuffer
from . import _dlpack
from ._args cimport device_of as _device_of, index as _index, layout as _layout
from ._cai import cai_device, cuda_array_interface

__all__ = ["CudaRegion", "export_refusals"]

# The handles of this process's live regions: opening one of them here is
# CUDA's error 201; say what is going on instead.
_own_handles = weakref.WeakValueDictionary()

# Allocations CUDA IPC refused to export (pool, virtual, managed memory), so that borrowing one
# again -- every request of a tensor living there -- asks cudaIpcGetMemHandle no second time.
# Keyed by (runtime, device, base); the value tells the refused allocation from a later one at
# the same address: the driver's buffer id (never reused), or its size where the driver gives
# none.  Another allocation found at a remembered base means the refused one is gone: forgotten
# then.  Bounded, least recently seen dropped first.
_MAX_REFUSED = 256
_refused = collections.OrderedDict()
_refused_lock = threading.Lock()
_export_refusals = 0


def export_refusals():
    """How many times ``cudaIpcGetMemHandle`` refused an allocation in this process.

    :meth:`CudaRegion.borrow` asks once per allocation: a later borrow of
    an allocation refused before (and still there) is refused without
    asking.
    """
    return _export_refusals


cdef bint _refused_before(tuple key, object identity):
    with _refused_lock:
        seen = _refused.get(key)
        if seen is None:
            return False
        if seen != identity:  # a new allocation at the refused one's base: that one is gone
            del _refused[key]
            return False
        _refused.move_to_end(key)
        return True


cdef int _remember_refusal(tuple key, object identity) except -1:
    global _export_refusals
    with _refused_lock:
        _export_refusals += 1
        _refused[key] = identity
        _refused.move_to_end(key)
        while len(_refused) > _MAX_REFUSED:
            _refused.popitem(last=False)
    return 0


def _unpickle(bytes handle, nbytes, int device, str key):
    """Pickle support: open the IPC handle in this (another) process."""
    return CudaRegion.attach(handle, nbytes, device=device, key=key)


cdef class CudaRegion(Region):
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

    def __init__(self, *args, **kwargs):
        raise TypeError("use CudaRegion.create(nbytes, device=0) or CudaRegion.attach(handle, nbytes)")

    def __dealloc__(self):
        if self._alloc != NULL:
            tshm_cuda_alloc_decref(self._alloc)
            self._alloc = NULL
        if self._observed != NULL:
            tshm_cuda_alloc_unobserve(self._observed)
            self._observed = NULL

    cdef bint _is_open(self) noexcept:
        return self._alloc != NULL

    cdef str _unclosed_note(self):
        return "its memory was released"

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

    @classmethod
    def borrow(cls, array, device=None):
        """The whole allocation that holds device *array*, lent to this process's servers.

        *array* is any device array :func:`~tritonshm.cuda.capture` takes (a
        torch tensor, a cupy array, a :class:`CudaArray`) or a
        :class:`~tritonshm.cuda.Capture`.  The allocation holding its first
        byte is found with ``cuMemGetAddressRange`` -- a caching allocator's
        segment, a memory pool's chunk, a :class:`CudaRegion` -- and its IPC
        handle taken at its base, so the region can be registered with
        Triton and a request can name the array at ``array_ptr - region.ptr``
        with no copy.  The region holds the capture of *array* until
        :meth:`close`: a live tensor keeps its allocation (torch and cupy
        never free a segment with a block in use), so the memory cannot be
        freed while the region is open.  Unregister it before closing it.

        Memory CUDA IPC cannot export (``cudaMallocAsync`` pools, virtual
        memory such as torch's expandable segments, managed memory) is
        refused with :class:`~tritonshm.NotShareable`, leaving nothing on
        the thread's CUDA last error (torch's next kernel launch checks
        it); the refusal is remembered for as long as that allocation is
        seen, so borrowing it again asks CUDA nothing more (see
        :func:`export_refusals`).  A borrowed region
        hands out no views or windows (the array itself is the view) and
        never frees anything.
        """
        cdef CudaRegion self
        cdef Capture cap
        cdef Runtime rt
        cdef tshm_cuda_alloc *a = NULL
        cdef tshm_ipc_handle handle
        cdef size_t ptr
        cap = _capture(array, device)
        rt = current()
        ptr = cap.ptr
        with nogil:
            rc = tshm_cuda_alloc_borrow(rt.rt, cap.device, <const void *>ptr, &a)
        if rc == -errno.ENOMEM:
            raise MemoryError("out of memory borrowing a CUDA allocation")
        if rc != 0:
            why = ("this CUDA runtime hands out no cuMemGetAddressRange" if rc == -errno.ENOSYS
                   else "the driver's answer does not hold the pointer" if rc < 0
                   else f"cuMemGetAddressRange answered CUresult {rc}")
            raise NotShareable(f"cannot find the allocation holding {cap!r}: {why}")
        self = cls.__new__(cls)
        self._alloc = a
        self._runtime = rt
        self._lender = cap
        key = (<size_t>rt.rt, a.device, <size_t>a.ptr)
        identity = a.buffer_id if a.buffer_id != 0 else ("nbytes", a.nbytes)
        if _refused_before(key, identity):
            rc = TSHM_CUDA_ERROR_INVALID_VALUE
        else:
            rc = tshm_cuda_ipc_handle(a, &handle)
            if rc == TSHM_CUDA_ERROR_INVALID_VALUE:  # what CUDA IPC says of memory it cannot export
                _remember_refusal(key, identity)
        if rc != 0:
            self._alloc = NULL
            self._lender = None
            tshm_cuda_alloc_decref(a)  # borrowed: frees nothing
            raise NotShareable(
                f"CUDA IPC cannot export the allocation holding {cap!r} ({rt.error_name(rc) if rc > 0 else rc}): "
                f"pool (cudaMallocAsync), virtual (expandable segments) or managed memory")
        self._handle = (<char *>handle.reserved)[:TSHM_IPC_HANDLE_BYTES]
        self._key = f"tritonshm-lent-{getpid()}-{secrets.token_hex(8)}"
        self._nbytes = a.nbytes
        self._device = cap.device
        self._owner = False
        self._creator_pid = getpid()
        return self

    # -- state ------------------------------------------------------------

    @property
    def borrowed(self):
        """True for a region made by :meth:`borrow` (another library's allocation)."""
        return self._lender is not None or (self._alloc != NULL and self._alloc.borrowed)

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
    def exports(self):
        """The number of live views and DLPack tensors holding this memory (in-flight copies too)."""
        if self._alloc != NULL:
            return tshm_cuda_alloc_refs(self._alloc) - 1
        if self._observed != NULL:
            return tshm_cuda_alloc_refs(self._observed)
        return 0

    def __repr__(self):
        lent = " borrowed" if self._lender is not None else ""
        return f"<CudaRegion {self._key!r} nbytes={self._nbytes} device={self._device}{lent} {self._state()}>"

    cdef tshm_cuda_alloc *_live(self) except NULL:
        self._check_open()
        return self._alloc

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
        self._lender = None  # a borrowed region: the lent memory is its owner's again

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
        dl_dtype(dt)  # refuse what no consumer could describe
        off, _ = self.span(offset, nbytes)
        self._refuse_views()
        return make_view(self._runtime, self._live(), off, dt, dims, nbytes)

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
        self._refuse_views()
        a = self._live()  # span() can run __index__ code that closes us
        self._runtime.check(tshm_cuda_hold_new(a, &h), f"making a window of {self!r}")
        w = CudaWindow.__new__(CudaWindow)
        w._hold = h
        w._runtime = self._runtime
        w._key = self._key
        w._offset = off
        w._nbytes = size
        return w

    cdef int _refuse_views(self) except -1:
        # A view would outlive close(), which gives the lent memory back to its owner.
        if self._lender is not None:
            raise UnsupportedBuffer(f"{self!r} is borrowed: it lends no views (use the array it was "
                                    f"borrowed for)")
        return 0

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
        cai = cuda_array_interface(src)
        if cai is not None:
            ptr, length, stream, _ = cai
            return self._copy_in_device(ptr, length, offset, cs,
                                        producer_event(self._runtime, cai_device(src, self._device), stream))
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
        cdef void *h
        cdef void *w
        off, _ = self.span(offset, length)
        # Read after span(), whose __index__ code can close us, the stream or the event
        a = self._live()
        h = stream._live()
        w = NULL if wait is None else wait._live()
        tshm_cuda_alloc_incref(a)
        with nogil:
            rc = tshm_cuda_copy_in(a, off, <const void *>src, length, h, w)
        tshm_cuda_alloc_decref(a)
        if rc != 0:
            self._runtime.check(rc, f"copying {length} bytes into {self!r}")
        return length

    def read(self, dtype, shape, offset=0):
        """A host copy (numpy) of *shape* x *dtype* read from byte *offset*; that range only."""
        cdef size_t off, length
        dt, dims, nbytes = _layout(dtype, shape)
        off, length = self.span(offset, nbytes)
        return to_host(self._runtime, self._live(), off, length, dt, dims, self)
