# Pinned (page-locked) system regions, for other Cython modules.
from ._system cimport SystemRegion

cdef class PinnedRegion(SystemRegion):
    cdef int _device

    cdef _pin(self, device)
