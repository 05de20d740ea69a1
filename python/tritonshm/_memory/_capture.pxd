# Captures of device arrays, for other Cython modules.
from ._dlpack cimport Imported
from ._stream cimport Event


cdef class Capture:
    cdef readonly size_t ptr
    cdef readonly object nbytes
    cdef readonly int device
    cdef readonly object dtype
    cdef readonly tuple shape
    cdef readonly bint readonly
    cdef readonly Event event
    cdef readonly size_t stream  # where the event is recorded: the producer's stream (0: legacy default)
    cdef readonly unsigned long long buffer_id  # the driver's id of its allocation (record=False), else 0
    cdef object _obj           # a CUDA Array Interface producer or a CudaArray, kept alive
    cdef Imported _imported    # a DLPack producer's tensor
    cdef bint _released

    cdef int _live(self) except -1
