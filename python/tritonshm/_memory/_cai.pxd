# The CUDA Array Interface, for other Cython modules.
from ._runtime cimport Runtime
from ._stream cimport Event

cdef Event producer_event(Runtime rt, int device, size_t stream)
