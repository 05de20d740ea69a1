# The lifecycle every region type shares (SystemRegion, PinnedRegion, CudaRegion).

cdef class Region:
    cdef str _key
    cdef size_t _nbytes
    cdef bint _owner
    cdef long _creator_pid        # the creating process, -1 when attached: a forked child neither
                                  # unlinks its parent's segment nor warns about it
    # No __weakref__ here: each region type declares its own, so that its
    # tp_dealloc clears weak references before its __dealloc__ runs.

    cdef bint _is_open(self) noexcept
    cdef str _unclosed_note(self)
    cdef int _check_open(self) except -1
    cdef str _state(self)
