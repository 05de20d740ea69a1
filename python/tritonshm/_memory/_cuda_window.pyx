# cython: language_level=3, embedsignature=True
"""Counted byte ranges of device memory: :class:`CudaWindow`, a pool's slot.

A :class:`CudaWindow` is a byte range of a
:class:`~._cuda_region.CudaRegion` with a count of its own
(``tshm_cuda_hold`` in csrc/): its window objects, their views and the
DLPack tensors made from those are its :attr:`~CudaWindow.holders`, so a
pool knows when every user of one slot is gone -- including a consumer's
kernels still reading it: a DLPack tensor handed out on a consumer's
stream leaves an event on that stream when its deleter runs
(:meth:`CudaWindow.readers_pending`).  The hold keeps the allocation
alive, so a window outlives its region's ``close()``.
"""

from ._cuda_array cimport CudaArray
from ._dlpack cimport dl_dtype
from ._tshm cimport (
    tshm_cuda_hold,
    tshm_cuda_hold_decref,
    tshm_cuda_hold_incref,
    tshm_cuda_hold_readers_pending,
    tshm_cuda_hold_refs,
)

from ._args cimport layout as _layout, span as _span

__all__ = ["CudaWindow"]


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
        cdef int rc = tshm_cuda_hold_readers_pending(self._h(), &pending)
        if rc != 0:  # (the message is made only for a failure: a pool asks on every lease)
            self._runtime.check(rc, f"querying the readers of {self!r}")
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
        dl_dtype(dt)  # refuse what no consumer could describe
        off, _ = _span(self, self._nbytes, offset, nbytes)
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
