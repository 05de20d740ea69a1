# Declarations of the C core (csrc/) for the Cython modules of this package.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from posix.types cimport pid_t

cdef extern from "tshm.h" nogil:
    enum: TSHM_NAME_MAX

    ctypedef struct tshm_mapping:
        uint8_t *addr
        size_t nbytes
        int readonly

    int tshm_segment_create(size_t nbytes, char *name_out, size_t name_cap, int *fd_out)
    int tshm_segment_open(const char *name, int readonly, int *fd_out, size_t *nbytes_out)
    int tshm_segment_unlink(const char *name)
    int tshm_name_check(const char *name)
    int tshm_mapping_new(int fd, size_t nbytes, int readonly, tshm_mapping **out)
    void tshm_mapping_incref(tshm_mapping *m)
    void tshm_mapping_decref(tshm_mapping *m)
    size_t tshm_mapping_refs(const tshm_mapping *m)
    int tshm_copy_in(tshm_mapping *m, size_t offset, const void *src, size_t length)
    int tshm_copy_out(const tshm_mapping *m, size_t offset, void *dst, size_t length)


cdef extern from "tshm_cuda.h" nogil:
    enum: TSHM_IPC_HANDLE_BYTES
    enum:
        TSHM_CUDA_ERROR_INVALID_VALUE
        TSHM_CUDA_ERROR_MEMORY_ALLOCATION
        TSHM_CUDA_ERROR_INITIALIZATION
        TSHM_CUDA_ERROR_INSUFFICIENT_DRIVER
        TSHM_CUDA_ERROR_NO_DEVICE
        TSHM_CUDA_ERROR_INVALID_DEVICE
        TSHM_CUDA_ERROR_INVALID_CONTEXT
        TSHM_CUDA_ERROR_INVALID_RESOURCE_HANDLE
        TSHM_CUDA_ERROR_NOT_READY
    enum:
        TSHM_CUDA_ATTR_MULTIPROCESSOR_COUNT
        TSHM_CUDA_ATTR_PCI_BUS_ID
        TSHM_CUDA_ATTR_COMPUTE_CAPABILITY_MAJOR
        TSHM_CUDA_ATTR_COMPUTE_CAPABILITY_MINOR
        TSHM_CUDA_ATTR_HOST_REGISTER_SUPPORTED
        TSHM_CUDA_ATTR_HOST_REGISTER_READ_ONLY_SUPPORTED

    ctypedef struct tshm_ipc_handle:
        char reserved[64]

    enum: TSHM_CU_POINTER_ATTRIBUTE_BUFFER_ID

    ctypedef struct tshm_cudart:
        # (a few of its entry points: the rest are the C core's to call)
        int (*PointerGetAttribute)(void *data, int attribute, unsigned long long ptr)  # optional: NULL
        int (*GetDeviceCount)(int *count)
        int (*GetDevice)(int *device)
        int (*SetDevice)(int device)
        int (*DeviceGetAttribute)(int *value, int attr, int device)
        int (*DriverGetVersion)(int *version)
        int (*RuntimeGetVersion)(int *version)
        int (*GetDeviceProperties)(void *prop, int device)
        int (*MemGetInfo)(size_t *free_bytes, size_t *total_bytes)

    int tshm_cudart_open(const char *path, tshm_cudart **out, char *why, size_t why_cap)
    const char *tshm_cudart_path(const tshm_cudart *rt)
    int tshm_cuda_settle(const tshm_cudart *rt, int rc)
    const char *tshm_cuda_error_name(const tshm_cudart *rt, int error)
    const char *tshm_cuda_error_string(const tshm_cudart *rt, int error)

    int tshm_cuda_device_enter(const tshm_cudart *rt, int device, int *previous)
    void tshm_cuda_device_leave(const tshm_cudart *rt, int device, int previous)
    int tshm_cuda_device_has_context(const tshm_cudart *rt, int device)
    int tshm_cuda_stream_new(const tshm_cudart *rt, int device, void **out)
    int tshm_cuda_stream_free(const tshm_cudart *rt, int device, void *stream)
    int tshm_cuda_stream_sync(const tshm_cudart *rt, int device, void *stream)
    int tshm_cuda_stream_wait(const tshm_cudart *rt, int device, void *stream, void *event)
    int tshm_cuda_event_new(const tshm_cudart *rt, int device, void **out)
    int tshm_cuda_event_free(const tshm_cudart *rt, int device, void *event)
    int tshm_cuda_event_record(const tshm_cudart *rt, int device, void *event, void *stream)
    int tshm_cuda_event_query(const tshm_cudart *rt, int device, void *event)
    int tshm_cuda_event_sync(const tshm_cudart *rt, int device, void *event)

    ctypedef struct tshm_cuda_alloc:
        const tshm_cudart *rt
        uint8_t *ptr
        size_t nbytes
        int device
        int imported
        int borrowed
        unsigned long long buffer_id

    int tshm_cuda_alloc_new(const tshm_cudart *rt, int device, size_t nbytes, tshm_cuda_alloc **out)
    int tshm_cuda_alloc_open(const tshm_cudart *rt, int device, const tshm_ipc_handle *handle,
                             size_t nbytes, tshm_cuda_alloc **out)
    int tshm_cuda_alloc_borrow(const tshm_cudart *rt, int device, const void *ptr, tshm_cuda_alloc **out)
    void tshm_cuda_alloc_incref(tshm_cuda_alloc *a)
    void tshm_cuda_alloc_decref(tshm_cuda_alloc *a)
    size_t tshm_cuda_alloc_refs(const tshm_cuda_alloc *a)
    void tshm_cuda_alloc_observe(tshm_cuda_alloc *a)
    void tshm_cuda_alloc_unobserve(tshm_cuda_alloc *a)
    int tshm_cuda_ipc_handle(const tshm_cuda_alloc *a, tshm_ipc_handle *out)
    int tshm_cuda_copy_in(tshm_cuda_alloc *a, size_t offset, const void *src, size_t length,
                          void *stream, void *wait)
    int tshm_cuda_copy_out(tshm_cuda_alloc *a, size_t offset, void *dst, size_t length,
                           void *stream, void *wait)

    # Windows' counted holds and their readers (_cuda_window, _cuda_array), and
    # the general copy (_copy).
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
                         size_t len, void *const *waits, size_t nwaits, int sync,
                         void *done, void *then)
    int tshm_cuda_pin_mapping(const tshm_cudart *rt, int device, tshm_mapping *m)


cdef extern from "tshm_dlpack.h" nogil:
    enum:
        kDLCPU
        kDLCUDA
        kDLCUDAHost
        kDLCUDAManaged
    enum:
        kDLInt
        kDLUInt
        kDLFloat
        kDLBfloat
        kDLComplex
        kDLBool
    enum: DLPACK_FLAG_BITMASK_READ_ONLY

    ctypedef struct DLPackVersion:
        uint32_t major
        uint32_t minor
    ctypedef struct DLDevice:
        int32_t device_type
        int32_t device_id
    ctypedef struct DLDataType:
        uint8_t code
        uint8_t bits
        uint16_t lanes
    ctypedef struct DLTensor:
        void *data
        DLDevice device
        int32_t ndim
        DLDataType dtype
        int64_t *shape
        int64_t *strides
        uint64_t byte_offset
    ctypedef struct DLManagedTensor:
        DLTensor dl_tensor
        void *manager_ctx
        void (*deleter)(DLManagedTensor *self)
    ctypedef struct DLManagedTensorVersioned:
        DLPackVersion version
        void *manager_ctx
        void (*deleter)(DLManagedTensorVersioned *self)
        uint64_t flags
        DLTensor dl_tensor

    ctypedef void (*tshm_release_fn)(void *ctx)
    void *tshm_dlpack_new(int versioned, void *data, DLDevice device, DLDataType dtype,
                          int32_t ndim, const int64_t *shape, int readonly,
                          tshm_release_fn release, void *ctx)
    int tshm_dlpack_is_c_contiguous(const DLTensor *t)
