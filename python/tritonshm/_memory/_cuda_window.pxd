# Counted windows of device memory, for other Cython modules.
from ._runtime cimport Runtime
from ._tshm cimport tshm_cuda_hold


cdef class CudaWindow:
    cdef tshm_cuda_hold *_hold       # one holder of the window's count, for as long as we live
    cdef Runtime _runtime
    cdef str _key
    cdef size_t _offset              # of the window in the allocation
    cdef size_t _nbytes
    cdef object __weakref__          # weakref.finalize: a pool's release when a handed-out window dies

    cdef tshm_cuda_hold *_h(self) except NULL
