# CUDA regions (cudaMalloc + IPC), for other Cython modules.
from ._region cimport Region
from ._runtime cimport Runtime
from ._stream cimport Event, Stream
from ._tshm cimport tshm_cuda_alloc


cdef class CudaRegion(Region):
    cdef tshm_cuda_alloc *_alloc     # our reference while open; NULL once closed
    cdef tshm_cuda_alloc *_observed  # kept readable (not alive) to count views after close
    cdef Runtime _runtime
    cdef int _device
    cdef bytes _handle
    cdef object _lender    # a borrowed region: the Capture that keeps the lent allocation alive
    cdef object __weakref__

    cdef bint _is_open(self) noexcept
    cdef str _unclosed_note(self)
    cdef tshm_cuda_alloc *_live(self) except NULL
    cdef int _refuse_views(self) except -1
    cdef object _copy_in_device(self, size_t src, size_t length, object offset, Stream stream, Event wait)
