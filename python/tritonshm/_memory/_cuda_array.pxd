# Device arrays (views of device memory), for other Cython modules.
from ._runtime cimport Runtime
from ._stream cimport Event, Pending
from ._tshm cimport tshm_cuda_alloc, tshm_cuda_hold


cdef class CudaArray:
    cdef tshm_cuda_alloc *_alloc     # a region view: one reference; a window view: borrowed from _hold
    cdef tshm_cuda_hold *_hold       # a window view: one holder of its count; NULL for region views
    cdef Runtime _runtime
    cdef size_t _offset
    cdef readonly object dtype
    cdef readonly tuple shape
    cdef readonly object nbytes
    cdef Pending _pending            # a copy into the array not yet known complete, or None
    cdef object __weakref__

    cdef tshm_cuda_alloc *_a(self) except NULL
    cdef Event _pending_event(self)
    cdef int _order_before(self, size_t stream) except -1
    cdef void _landed(self, Pending p)


cdef CudaArray make_view(Runtime rt, tshm_cuda_alloc *a, size_t offset, object dtype, tuple shape,
                         object nbytes)
cdef object to_host(Runtime rt, tshm_cuda_alloc *a, size_t offset, size_t length, object dtype,
                    tuple shape, object owner, void *wait=*)
