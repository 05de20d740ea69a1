# The CUDA runtime as the other Cython modules see it.
from ._tshm cimport tshm_cudart

cdef class Runtime:
    cdef tshm_cudart *rt          # never freed: allocations made through it may outlive us
    cdef readonly str requested   # the path or soname it was loaded by
    cdef int _devices_seen        # the device count last read (0: not yet): valid_device's cache

    cdef tshm_cudart *_rt(self) except NULL
    cdef int check(self, int rc, str what) except -1
    cdef int valid_device(self, object device) except -1

cpdef Runtime current()
