# CUDA regions and their device views, for other Cython modules.
from ._runtime cimport Runtime
from ._stream cimport Event, Stream
from ._tshm cimport tshm_cuda_alloc, tshm_cudart

# Windows' holds and the general copy (csrc/tshm_cuda.h); declared here, beside
# their only user, rather than in _tshm.pxd.
cdef extern from "tshm_cuda.h" nogil:
    ctypedef struct tshm_cuda_hold:
        tshm_cuda_alloc *alloc
    int tshm_cuda_hold_new(tshm_cuda_alloc *a, tshm_cuda_hold **out)
    void tshm_cuda_hold_incref(tshm_cuda_hold *h)
    void tshm_cuda_hold_decref(tshm_cuda_hold *h)
    size_t tshm_cuda_hold_refs(const tshm_cuda_hold *h)
    ctypedef struct tshm_cuda_reader
    int tshm_cuda_reader_new(tshm_cuda_hold *h, void *stream, tshm_cuda_reader **out)
    void tshm_cuda_reader_release(void *reader)
    int tshm_cuda_hold_readers_pending(tshm_cuda_hold *h, int *pending)
    int tshm_cuda_memcpy(const tshm_cudart *rt, int device, void *stream,
                         void *dst, size_t dst_size, size_t dst_offset,
                         const void *src, size_t src_size, size_t src_offset,
                         size_t len, void *const *waits, size_t nwaits, int sync)


cdef class CudaRegion:
    cdef tshm_cuda_alloc *_alloc     # our reference while open; NULL once closed
    cdef tshm_cuda_alloc *_observed  # kept readable (not alive) to count views after close
    cdef Runtime _runtime
    cdef str _key
    cdef size_t _nbytes
    cdef int _device
    cdef bint _owner
    cdef long _creator_pid
    cdef bytes _handle
    cdef object __weakref__

    cdef tshm_cuda_alloc *_live(self) except NULL
    cdef object _copy_in_device(self, size_t src, size_t length, object offset, Stream stream, Event wait)


cdef class CudaWindow:
    cdef tshm_cuda_hold *_hold       # one holder of the window's count, for as long as we live
    cdef Runtime _runtime
    cdef str _key
    cdef size_t _offset              # of the window in the allocation
    cdef size_t _nbytes
    cdef object __weakref__          # weakref.finalize: a pool's release when a handed-out window dies

    cdef tshm_cuda_hold *_h(self) except NULL


cdef class CudaArray:
    cdef tshm_cuda_alloc *_alloc     # a region view: one reference; a window view: borrowed from _hold
    cdef tshm_cuda_hold *_hold       # a window view: one holder of its count; NULL for region views
    cdef Runtime _runtime
    cdef size_t _offset
    cdef readonly object dtype
    cdef readonly tuple shape
    cdef readonly object nbytes
    cdef object __weakref__

    cdef tshm_cuda_alloc *_a(self) except NULL
