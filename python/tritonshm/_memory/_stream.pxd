# CUDA streams, events and the device guard, for other Cython modules.
from ._runtime cimport Runtime


cdef class Stream:
    cdef void *_handle          # a non-blocking stream of ours; NULL once closed
    cdef int _device
    cdef Runtime _runtime
    cdef long _pid              # a forked child never destroys its parent's stream
    cdef bint _borrowed         # another library's (Stream.borrow): never destroyed by us
    cdef object __weakref__

    cdef void *_live(self) except NULL
    cdef _free(self)


cdef class Event:
    cdef void *_handle          # NULL once closed
    cdef int _device
    cdef Runtime _runtime
    cdef long _pid
    cdef object __weakref__

    cdef void *_live(self) except NULL
    cdef int _record(self, size_t stream) except -1
    cdef _free(self)


cdef class Pending:
    cdef public Event event     # recorded after the work; None once it is known complete


cdef class DeviceGuard:
    cdef Runtime _runtime
    cdef int _device
    cdef list _previous         # one entry per __enter__ not yet left


cdef Stream thread_copy_stream(Runtime rt, int device)
cdef Event new_event(Runtime rt, int device)
cpdef Event ordering_event(int device)
cdef size_t stream_handle(object stream) except? 0
cdef object handshake_stream(object obj, int device, size_t consumer, bint on_device=*)
