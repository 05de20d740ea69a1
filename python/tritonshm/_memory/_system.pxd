# The system region types, for other Cython modules (PinnedRegion subclasses SystemRegion).
from ._region cimport Region
from ._tshm cimport tshm_mapping

cdef class SystemRegion(Region):
    cdef tshm_mapping *_mapping   # NULL once closed; we own one reference
    cdef bint _readonly
    cdef int _lock_fd             # an owner's descriptor holding flock(LOCK_SH), else -1
    cdef Py_ssize_t _exports      # live buffer exports of this object
    cdef Py_ssize_t _buffer_shape[1]
    cdef object __weakref__

    cdef bint _is_open(self) noexcept
    cdef str _unclosed_note(self)
    cdef tshm_mapping *_live_mapping(self) except NULL
    cdef _map_fd(self, int fd, str key, size_t size, bint readonly)
    cdef void _drop_lock(self) noexcept
    cdef int _copy(self, bint into_region, size_t offset, void *buf, size_t length) except -1


cdef class Window:
    cdef tshm_mapping *_mapping   # one reference, dropped when the window dies
    cdef str _key
    cdef size_t _offset
    cdef size_t _nbytes
    cdef Py_ssize_t _exports
    cdef Py_ssize_t _buffer_shape[1]
    cdef object __weakref__
