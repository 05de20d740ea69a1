# The cdef type of copy()'s ends.
from ._capture cimport Capture
from ._dlpack cimport Imported
from ._runtime cimport Runtime
from ._stream cimport Event
from ._tshm cimport tshm_cuda_alloc


cdef class _Side:
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

    cdef str describe(self)
    cdef close(self)
