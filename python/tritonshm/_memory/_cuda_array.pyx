# cython: language_level=3, embedsignature=True
"""Device arrays: :class:`CudaArray`, a zero-copy view of device memory, and :func:`empty`.

A view holds the memory it shows: a :class:`~._cuda_region.CudaRegion`'s
view one reference to its allocation (``tshm_cuda_alloc``), a
:class:`~._cuda_window.CudaWindow`'s view one holder of the window's
count (``tshm_cuda_hold``, which holds the allocation).  Every DLPack
capsule made from a view takes a reference (or holder) of its own, released
by the consumer's deleter -- on any thread, without the GIL, in plain C --
so the memory is freed only when the region is closed *and* the last view
and tensor are gone.

:func:`make_view` and :func:`to_host` are the C-level helpers the region
and window types make views and host copies with.
"""

from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer

from ._dlpack cimport dl_dtype, export_capsule
from ._runtime cimport Runtime, current
from ._stream cimport Event, Pending, thread_copy_stream
from ._tshm cimport (
    kDLCUDA,
    tshm_cuda_alloc,
    tshm_cuda_alloc_decref,
    tshm_cuda_alloc_incref,
    tshm_cuda_alloc_new,
    tshm_cuda_copy_out,
    tshm_cuda_hold,
    tshm_cuda_hold_decref,
    tshm_cuda_hold_incref,
    tshm_cuda_reader,
    tshm_cuda_reader_new,
    tshm_cuda_reader_release,
    tshm_cuda_stream_wait,
)

import numpy as np

from ..errors import OutOfBounds
from . import _dlpack
from ._args cimport device_of as _device_of, layout as _layout

__all__ = ["CudaArray", "empty"]


cdef void _release_alloc(void *ctx) noexcept nogil:
    tshm_cuda_alloc_decref(<tshm_cuda_alloc *>ctx)


cdef void _release_hold(void *ctx) noexcept nogil:
    tshm_cuda_hold_decref(<tshm_cuda_hold *>ctx)


cdef object to_host(Runtime rt, tshm_cuda_alloc *a, size_t offset, size_t length, object dtype,
                    tuple shape, object owner, void *wait=NULL):
    """Bytes [offset, offset + length) of *a* copied into a new numpy array of *shape* x *dtype*.

    On this thread's copy stream of the memory's device, after the event *wait* (or NULL),
    complete on return.  *a* is live when called (the caller checked it, no Python code since).
    """
    cdef Py_buffer dst
    cdef void *h
    # Held before anything else: the copy stream's look-up and the allocation below run Python
    # code (a finalizer, another thread: a close() that would free *a* under the copy).
    tshm_cuda_alloc_incref(a)
    try:
        h = thread_copy_stream(rt, a.device)._live()
        out = np.empty(length, dtype=np.uint8)
        PyObject_GetBuffer(out, &dst, PyBUF_WRITABLE)
        try:
            with nogil:
                rc = tshm_cuda_copy_out(a, offset, dst.buf, length, h, wait)
        finally:
            PyBuffer_Release(&dst)
    finally:
        tshm_cuda_alloc_decref(a)
    if rc != 0:
        rt.check(rc, f"copying {length} bytes out of {owner!r}")
    return out.view(dtype).reshape(shape)


cdef CudaArray make_view(Runtime rt, tshm_cuda_alloc *a, size_t offset, object dtype, tuple shape,
                         object nbytes):
    """A :class:`CudaArray` of *shape* x *dtype* at byte *offset* of *a*, holding a reference of its own.
    *a* is live when called (the caller checked it, no Python code since)."""
    cdef CudaArray v
    tshm_cuda_alloc_incref(a)  # before the allocation below, which may run a finalizer that closes *a*'s owner
    try:
        v = CudaArray.__new__(CudaArray)
    except BaseException:
        tshm_cuda_alloc_decref(a)
        raise
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
    dl_dtype(dt)  # refuse what no consumer could describe
    if nbytes > (<size_t>-1) // 2:
        raise OutOfBounds(f"{nbytes} bytes is larger than any allocation can be")
    _device_of(device)
    size = max(<size_t>nbytes, 1)  # cudaMalloc of 0 bytes gives no pointer
    rt = current()
    dev = rt.valid_device(device)
    with nogil:
        rc = tshm_cuda_alloc_new(rt.rt, dev, size, &a)
    rt.check(rc, f"allocating {nbytes} bytes on CUDA device {dev}")
    view = make_view(rt, a, 0, dt, dims, nbytes)
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
        self._pending = None

    def __init__(self, *args, **kwargs):
        raise TypeError("use CudaRegion.view(dtype, shape, offset) or CudaWindow.view(dtype, shape, offset)")

    cdef Event _pending_event(self):
        """The event of a copy into this array not yet known complete, else None (no CUDA call)."""
        cdef Pending p = self._pending
        if p is None:
            return None
        if p.event is None:  # seen complete elsewhere (a slot's reuse, a later wait): let go of it
            self._pending = None
            return None
        return p.event

    def _after(self, Pending pending):
        """The array is being written by queued work that *pending* marks (a client's copy out
        of a slot): every reader orders after it -- :meth:`get` and :func:`tritonshm.cuda.copy`
        wait for its event, ``__dlpack__(stream=s)`` makes *s* wait for it, and
        ``__cuda_array_interface__`` waits for it on the CPU.  None: nothing pending."""
        self._pending = pending

    @property
    def pending(self):
        """True while a copy into this array (a client's result) may still be landing; asks no CUDA
        call.  Readers through :meth:`get`, ``__dlpack__``, ``__cuda_array_interface__`` and
        :func:`tritonshm.cuda.copy` are ordered after it; nothing else need be done."""
        return self._pending_event() is not None

    cdef int _order_before(self, size_t stream) except -1:
        """Make *stream* (a handle; 1 the legacy default stream) wait for a copy into this array
        still pending, if any: a reader on that stream then reads what the copy wrote."""
        cdef Event pending = self._pending_event()
        if pending is None:
            return 0
        cdef int rc = tshm_cuda_stream_wait(self._runtime.rt, self._a().device, <void *>stream, pending._live())
        if rc != 0:  # (the message is made only for a failure)
            self._runtime.check(rc, f"ordering stream 0x{stream:x} after the copy into {self!r}")
        return 0

    def synchronize(self):
        """Wait (GIL released) until a copy into this array, if any is pending, has landed."""
        cdef Pending p = self._pending
        if p is not None:
            p.synchronize()
            self._landed(p)

    cdef void _landed(self, Pending p):
        # *p*, waited for, is complete: let go of it -- unless another reader's wait (the GIL was
        # released meanwhile) let go of it first, or a newer copy took its place.
        if self._pending is p:
            self._pending = None

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
        """The CUDA Array Interface, version 3, with ``"stream": None`` (nothing to wait for).

        A copy into the array still pending (a client's result) is waited for here, on the CPU,
        rather than named as a stream: the only stream there is to name is the copying thread's
        copy stream, which dies with its thread (a consumer could then sync on a destroyed
        handle) and carries later, unrelated copies; and CAI consumers may ignore ``stream``.
        """
        if self._pending is not None:
            self.synchronize()
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
        the consumer's work queued before the deleter ran is done.  A copy
        into the array still pending (a client's result) is waited for on
        *stream* (-1: on the CPU, as nothing else orders the consumer).
        """
        cdef tshm_cuda_reader *reader = NULL
        cdef int rc
        versioned = _dlpack.check_request(stream, max_version, dl_device, copy, kDLCUDA, self._a().device)
        if self._pending is not None:
            if stream == -1:
                self.synchronize()
            else:
                self._order_before(1 if stream is None else <size_t>stream)
        if self._hold != NULL:
            if stream == -1:
                tshm_cuda_hold_incref(self._hold)  # the capsule's own; export_capsule takes it over
                return export_capsule(<void *>(self._alloc.ptr + self._offset), kDLCUDA, self._alloc.device,
                                      self.dtype, self.shape, False, versioned, _release_hold, self._hold)
            # The deleter runs on any thread, where the per-thread default stream (2) is another
            # stream than the consumer's: the legacy one (1) is ordered after every blocking
            # stream, the consumer thread's per-thread stream included.
            handle = 1 if stream is None or stream == 2 else <size_t>stream
            rc = tshm_cuda_reader_new(self._hold, <void *><size_t>handle, &reader)
            if rc != 0:  # (the message is made only for a failure: an export per result handed on)
                self._runtime.check(rc, f"preparing a DLPack export of {self!r}")
            # The reader holds one holder; export_capsule takes it over.
            return export_capsule(<void *>(self._alloc.ptr + self._offset), kDLCUDA, self._alloc.device,
                                  self.dtype, self.shape, False, versioned, tshm_cuda_reader_release, reader)
        tshm_cuda_alloc_incref(self._alloc)  # the capsule's own; export_capsule takes it over
        return export_capsule(<void *>(self._alloc.ptr + self._offset), kDLCUDA, self._alloc.device,
                              self.dtype, self.shape, False, versioned, _release_alloc, self._alloc)

    def get(self):
        """A host copy of this array, as numpy (after a copy into it still pending, if any)."""
        cdef Pending p = self._pending  # (taken now: another reader may let go of it meanwhile)
        cdef Event pending = self._pending_event()
        if pending is None:
            return to_host(self._runtime, self._a(), self._offset, self.nbytes, self.dtype, self.shape, self)
        out = to_host(self._runtime, self._a(), self._offset, self.nbytes, self.dtype, self.shape, self,
                      <void *><size_t>pending.handle)
        if self.nbytes:  # (our copy stream waited for it, and was synchronized: it is complete)
            p.completed()
            self._landed(p)
        return out

    def __array__(self, *args, **kwargs):
        raise TypeError("a CudaArray lives in device memory: use .get() for a host copy "
                        "(implicit conversion to numpy is not allowed)")

    def __reduce__(self):
        raise TypeError("a CudaArray cannot be pickled; pickle its region and call view() there")
