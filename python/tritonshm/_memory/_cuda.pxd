# CUDA regions and their device views, for other Cython modules.
from ._runtime cimport Runtime
from ._tshm cimport tshm_cuda_alloc

cdef class CudaRegion:
    cdef tshm_cuda_alloc *_alloc     # our reference while open; NULL once closed
    cdef tshm_cuda_alloc *_observed  # kept readable (not alive) to count views after close
    cdef Runtime _runtime
    cdef str _key
    cdef size_t _nbytes
    cdef int _device
    cdef bint _owner
    cdef long _creator_pid
    cdef bytes _handle
    cdef object __weakref__

    cdef tshm_cuda_alloc *_live(self) except NULL
    cdef object _copy_in_device(self, size_t src, size_t length, object offset, size_t stream)


cdef class CudaArray:
    cdef tshm_cuda_alloc *_alloc     # one reference, for as long as the view lives
    cdef Runtime _runtime
    cdef size_t _offset
    cdef readonly object dtype
    cdef readonly tuple shape
    cdef readonly object nbytes
