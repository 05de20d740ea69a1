/*
 * tshm_cuda: the CUDA half of the C core, without CUDA headers.
 *
 * The CUDA runtime (libcudart) is reached through dlopen() at run time, so
 * the wheel builds on a machine with no toolkit and `import tritonshm` loads
 * no CUDA library.  The few runtime entry points we use are declared here
 * with plain C types; their ABI has been stable across CUDA 11-13 (the
 * structs whose layout changed -- cudaPointerAttributes, cudaDeviceProp --
 * are avoided, except the name at offset 0 of the latter).
 *
 * Return convention, as in tshm.h but with a third case: 0 on success, a
 * negative errno value for our own failures (bad arguments, out of range,
 * out of memory), a positive cudaError_t when the runtime refused.
 *
 * The runtime is shared: dlopen() of the libcudart torch (or cupy) loaded
 * returns their instance, whose per-thread *last error* they read --
 * torch calls cudaGetLastError after every kernel launch.  So every
 * runtime failure these functions meet, returned or handled, is taken off
 * the calling thread's last error (tshm_cuda_settle) before they return:
 * it is ours to report, not the caller's next torch op's.
 */
#ifndef TSHM_CUDA_H
#define TSHM_CUDA_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "tshm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cudaIpcMemHandle_t: 64 opaque bytes, passed by value. */
#define TSHM_IPC_HANDLE_BYTES 64
typedef struct tshm_ipc_handle {
    char reserved[TSHM_IPC_HANDLE_BYTES];
} tshm_ipc_handle;

/* The cudaError_t values we act on. */
enum {
    TSHM_CUDA_SUCCESS = 0,
    TSHM_CUDA_ERROR_INVALID_VALUE = 1,
    TSHM_CUDA_ERROR_MEMORY_ALLOCATION = 2,
    TSHM_CUDA_ERROR_INITIALIZATION = 3,
    TSHM_CUDA_ERROR_INSUFFICIENT_DRIVER = 35,
    TSHM_CUDA_ERROR_NO_DEVICE = 100,
    TSHM_CUDA_ERROR_INVALID_DEVICE = 101,
    TSHM_CUDA_ERROR_INVALID_CONTEXT = 201,
    TSHM_CUDA_ERROR_INVALID_RESOURCE_HANDLE = 400,
    TSHM_CUDA_ERROR_NOT_READY = 600,
    TSHM_CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    TSHM_CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
};

/* cudaMemcpyKind: Default lets unified addressing infer the direction. */
#define TSHM_CUDA_MEMCPY_DEFAULT 4
/* cudaIpcOpenMemHandle flag. */
#define TSHM_CUDA_IPC_LAZY_ENABLE_PEER_ACCESS 1
/* cudaHostRegister flags. */
#define TSHM_CUDA_HOST_REGISTER_PORTABLE 1
#define TSHM_CUDA_HOST_REGISTER_READ_ONLY 8
/* cudaStreamNonBlocking: no implicit ordering with the legacy default stream. */
#define TSHM_CUDA_STREAM_NON_BLOCKING 1
/* cudaEventDisableTiming: the cheap kind of event, for ordering only. */
#define TSHM_CUDA_EVENT_DISABLE_TIMING 2
/* cudaHostAllocPortable. */
#define TSHM_CUDA_HOST_ALLOC_PORTABLE 1
/* The special stream handles: cudaStreamLegacy and cudaStreamPerThread. */
#define TSHM_CUDA_STREAM_LEGACY ((void *)1)
#define TSHM_CUDA_STREAM_PER_THREAD ((void *)2)
/* cudaDeviceAttr values (stable enum numbers). */
#define TSHM_CUDA_ATTR_MULTIPROCESSOR_COUNT 16
#define TSHM_CUDA_ATTR_PCI_BUS_ID 33
#define TSHM_CUDA_ATTR_COMPUTE_CAPABILITY_MAJOR 75
#define TSHM_CUDA_ATTR_COMPUTE_CAPABILITY_MINOR 76
#define TSHM_CUDA_ATTR_HOST_REGISTER_SUPPORTED 99
#define TSHM_CUDA_ATTR_HOST_REGISTER_READ_ONLY_SUPPORTED 113

/*
 * The runtime entry points tritonshm uses, resolved from one library.
 * A table is never freed: allocations made through it may outlive every
 * Python object (a DLPack capsule held by torch), and their release calls
 * back into it.
 */
typedef struct tshm_cudart {
    void *lib;                                   /* dlopen handle */
    int (*GetDeviceCount)(int *count);
    int (*GetDevice)(int *device);
    int (*SetDevice)(int device);
    int (*DeviceGetAttribute)(int *value, int attr, int device);
    int (*DriverGetVersion)(int *version);
    int (*RuntimeGetVersion)(int *version);
    const char *(*GetErrorName)(int error);
    const char *(*GetErrorString)(int error);
    int (*GetDeviceProperties)(void *prop, int device);   /* only name[256] at offset 0 is read */
    int (*MemGetInfo)(size_t *free_bytes, size_t *total_bytes);
    int (*Malloc)(void **ptr, size_t nbytes);
    int (*Free)(void *ptr);
    int (*MemcpyAsync)(void *dst, const void *src, size_t nbytes, int kind, void *stream);
    int (*DeviceSynchronize)(void);
    int (*StreamCreateWithFlags)(void **stream, unsigned int flags);
    int (*StreamDestroy)(void *stream);
    int (*StreamSynchronize)(void *stream);
    int (*StreamWaitEvent)(void *stream, void *event, unsigned int flags);
    int (*EventCreateWithFlags)(void **event, unsigned int flags);
    int (*EventRecord)(void *event, void *stream);
    int (*EventQuery)(void *event);
    int (*EventSynchronize)(void *event);
    int (*EventDestroy)(void *event);
    int (*GetLastError)(void);                   /* returns and clears the thread's last error */
    int (*IpcGetMemHandle)(tshm_ipc_handle *handle, void *ptr);
    int (*IpcOpenMemHandle)(void **ptr, tshm_ipc_handle handle, unsigned int flags);
    int (*IpcCloseMemHandle)(void *ptr);
    int (*HostRegister)(void *ptr, size_t nbytes, unsigned int flags);
    int (*HostUnregister)(void *ptr);
    int (*HostAlloc)(void **ptr, size_t nbytes, unsigned int flags);
    int (*FreeHost)(void *ptr);
    /* Optional, NULL when the runtime cannot hand it out: the driver's
     * cuDevicePrimaryCtxGetState (CUdevice is the ordinal), through
     * cudaGetDriverEntryPointByVersion or cudaGetDriverEntryPoint. */
    int (*PrimaryCtxGetState)(int device, unsigned int *flags, int *active);
    /* Optional likewise: the driver's cuMemGetAddressRange (v2: size_t
     * sizes), the allocation that holds a device pointer. */
    int (*MemGetAddressRange)(unsigned long long *base, size_t *nbytes, unsigned long long ptr);
    /* Optional likewise: the driver's cuPointerGetAttribute, for
     * CU_POINTER_ATTRIBUTE_BUFFER_ID (an allocation's id, never reused). */
    int (*PointerGetAttribute)(void *data, int attribute, unsigned long long ptr);
} tshm_cudart;

/* CU_POINTER_ATTRIBUTE_BUFFER_ID: an unsigned long long unique to an
 * allocation over the process's life (a new allocation at a freed one's
 * address has a new id). */
#define TSHM_CU_POINTER_ATTRIBUTE_BUFFER_ID 7

/* dlopen() `path` (a file path or a soname for the loader's search) and
 * resolve every entry point above.  On failure returns -ENOENT (cannot load)
 * or -ENOSYS (a required symbol is missing) and writes a one-line reason to
 * `why`. */
int tshm_cudart_open(const char *path, tshm_cudart **out, char *why, size_t why_cap);

/* The file the table's library was loaded from (dladdr), or NULL. */
const char *tshm_cudart_path(const tshm_cudart *rt);

/* Returns `rc`; a runtime failure (positive, not cudaErrorNotReady, which
 * is an answer and sets nothing) is first taken off the calling thread's
 * last error with cudaGetLastError.  For the runtime calls made outside
 * this file (the Cython modules' direct calls).  A sticky error (a faulted
 * context) stays whatever is done. */
int tshm_cuda_settle(const tshm_cudart *rt, int rc);

/* cudaGetErrorName / cudaGetErrorString, never NULL. */
const char *tshm_cuda_error_name(const tshm_cudart *rt, int error);
const char *tshm_cuda_error_string(const tshm_cudart *rt, int error);

/*
 * The device guard.  The runtime's current device is per thread; every
 * call that works on memory, streams or events runs with its device
 * current, entered with tshm_cuda_device_enter and left with
 * tshm_cuda_device_leave.  Leaving puts the caller's previous device back
 * only if that device has an active primary context (torch's
 * MaybeSetDevice): since CUDA 12 cudaSetDevice creates a context, and a
 * thread that never used a device reads device 0 as "current", so an
 * unconditional restore would create a context (hundreds of MiB) on GPU 0
 * in a process that only ever used GPU 1.  The thread then stays on the
 * device it entered.  When the runtime cannot tell (no driver entry
 * point), or is older than 12.0 (whose cudaSetDevice creates no context),
 * the previous device is always put back.
 *
 * `*previous` is what to hand to leave (it equals `device` when nothing is
 * to be restored).  Entering the current device makes no runtime call
 * beyond cudaGetDevice.
 */
int tshm_cuda_device_enter(const tshm_cudart *rt, int device, int *previous);
void tshm_cuda_device_leave(const tshm_cudart *rt, int device, int previous);

/* 1 when `device`'s primary context is active, 0 when not, -1 when the
 * runtime cannot tell.  Creates nothing. */
int tshm_cuda_device_has_context(const tshm_cudart *rt, int device);

/*
 * Streams and events, each under the guard of the device it belongs to.
 * Streams are non-blocking (no implicit ordering with the legacy default
 * stream, so threads and other libraries do not serialize on each other);
 * events are DisableTiming.  A stream argument may also be one of the
 * special handles (NULL or TSHM_CUDA_STREAM_LEGACY, _PER_THREAD) or another
 * library's stream.  tshm_cuda_event_query returns 0 (complete),
 * TSHM_CUDA_ERROR_NOT_READY, or an error.
 */
int tshm_cuda_stream_new(const tshm_cudart *rt, int device, void **out);
int tshm_cuda_stream_free(const tshm_cudart *rt, int device, void *stream);
int tshm_cuda_stream_sync(const tshm_cudart *rt, int device, void *stream);
int tshm_cuda_stream_wait(const tshm_cudart *rt, int device, void *stream, void *event);
int tshm_cuda_event_new(const tshm_cudart *rt, int device, void **out);
int tshm_cuda_event_free(const tshm_cudart *rt, int device, void *event);
int tshm_cuda_event_record(const tshm_cudart *rt, int device, void *event, void *stream);
int tshm_cuda_event_query(const tshm_cudart *rt, int device, void *event);
int tshm_cuda_event_sync(const tshm_cudart *rt, int device, void *event);

/*
 * A device allocation shared by every view of it.
 *
 * Either our own cudaMalloc (freed with cudaFree) or a peer's memory opened
 * from an IPC handle (closed with cudaIpcCloseMemHandle).  `refs` counts the
 * holders: the region until close(), every device view, every DLPack capsule
 * and every in-flight copy.  The last decref releases the memory, in plain C
 * and without the GIL, so a DLPack deleter running on any thread may do it.
 * A forked child never releases its parent's memory (CUDA is not usable
 * after fork, and the memory is the parent's).
 */
typedef struct tshm_cuda_alloc {
    const tshm_cudart *rt;
    uint8_t *ptr;       /* device pointer of the allocation's base */
    size_t nbytes;
    int device;
    int imported;       /* opened from an IPC handle */
    int borrowed;       /* another library's allocation: never freed by us */
    unsigned long long buffer_id;  /* borrowed: the driver's id of the allocation
                                    * (CU_POINTER_ATTRIBUTE_BUFFER_ID), 0 when unknown */
    pid_t pid;          /* the process that allocated or opened it */
    size_t refs;        /* holders of the memory; accessed atomically only */
    size_t observers;   /* holders of this struct, +1 for all `refs` together */
} tshm_cuda_alloc;

/* cudaMalloc `nbytes` (> 0) on `device`; refs = 1. */
int tshm_cuda_alloc_new(const tshm_cudart *rt, int device, size_t nbytes, tshm_cuda_alloc **out);

/* Open a peer's allocation of `nbytes` from its IPC handle on `device`; refs = 1. */
int tshm_cuda_alloc_open(const tshm_cudart *rt, int device, const tshm_ipc_handle *handle,
                         size_t nbytes, tshm_cuda_alloc **out);

/*
 * Borrow the allocation that holds `ptr` on `device` (another library's:
 * torch's caching allocator, cupy's pool, a tritonshm region): its base and
 * size come from cuMemGetAddressRange.  The memory is never freed or closed
 * by us -- the caller keeps its owner alive for as long as the allocation
 * (and every registration of it with a server) is in use.  Returns -ENOSYS
 * where the runtime cannot hand out cuMemGetAddressRange, a positive
 * CUresult where the driver refuses (e.g. a pointer it does not know).
 * `buffer_id` is the allocation's id where the driver tells it (else 0).
 */
int tshm_cuda_alloc_borrow(const tshm_cudart *rt, int device, const void *ptr, tshm_cuda_alloc **out);

void tshm_cuda_alloc_incref(tshm_cuda_alloc *a);
/* Drop one reference; the last one frees (or closes) the device memory. */
void tshm_cuda_alloc_decref(tshm_cuda_alloc *a);
size_t tshm_cuda_alloc_refs(const tshm_cuda_alloc *a);

/* Observers keep the struct (not the memory) readable: a closed region
 * still reports how many views hold its memory.  The struct is freed when
 * the memory is released and the last observer is gone. */
void tshm_cuda_alloc_observe(tshm_cuda_alloc *a);
void tshm_cuda_alloc_unobserve(tshm_cuda_alloc *a);

/* cudaIpcGetMemHandle of the allocation's base.  Memory CUDA IPC cannot
 * export (pools, virtual or managed memory) is refused with
 * TSHM_CUDA_ERROR_INVALID_VALUE, taken off the thread's last error. */
int tshm_cuda_ipc_handle(const tshm_cuda_alloc *a, tshm_ipc_handle *out);

/*
 * Copy `len` bytes between the allocation at `offset` and `other` (host or
 * device memory; unified addressing tells which), range-checked without any
 * addition that can wrap, on `stream` (a stream of the allocation's device)
 * after `wait` (an event, or NULL: e.g. a producer's work on `other`), then
 * synchronize `stream`: the copy is complete on return, so another process
 * (the server) may read the result at once.  Never the legacy default
 * stream, never a device-wide synchronization.
 */
int tshm_cuda_copy_in(tshm_cuda_alloc *a, size_t offset, const void *src, size_t len,
                      void *stream, void *wait);
int tshm_cuda_copy_out(tshm_cuda_alloc *a, size_t offset, void *dst, size_t len,
                       void *stream, void *wait);

/*
 * A window's holders: one reference count for a byte range of an
 * allocation (a pool's slot), shared by every object that uses the range --
 * the window objects, their device views, the DLPack tensors made from
 * those.  The hold owns one reference to the allocation, released (and the
 * struct freed) by its last decref, in plain C and without the GIL, so a
 * DLPack deleter on any thread may drop the last holder.  The range itself
 * is the caller's business (the hold only counts).
 */
typedef struct tshm_cuda_hold {
    tshm_cuda_alloc *alloc;   /* one reference, for as long as refs > 0 */
    size_t refs;              /* holders; accessed atomically only */
    /* Readers: events recorded on consumers' streams when their DLPack
     * tensors were let go, not yet seen complete (see tshm_cuda_reader). */
    pthread_mutex_t lock;     /* guards the three below */
    void **readers;
    size_t nreaders, readers_cap;
} tshm_cuda_hold;

/* A hold on `a` with refs = 1; takes a reference to `a` of its own. */
int tshm_cuda_hold_new(tshm_cuda_alloc *a, tshm_cuda_hold **out);
void tshm_cuda_hold_incref(tshm_cuda_hold *h);
/* Drop one holder; the last one releases the allocation reference and frees `h`. */
void tshm_cuda_hold_decref(tshm_cuda_hold *h);
size_t tshm_cuda_hold_refs(const tshm_cuda_hold *h);

/*
 * A consumer of a window's memory (a DLPack tensor handed to torch, cupy)
 * that said which stream it reads on (`__dlpack__(stream=s)`).  Its
 * deleter runs when the consumer's object dies, not when the consumer's
 * kernels are done, so the release records an event on that stream and
 * leaves it on the hold before dropping the holder: the range may be
 * reused only when tshm_cuda_hold_readers_pending says the events are
 * complete.
 *
 * tshm_cuda_reader_new takes one holder of `h` for the reader and creates
 * its event now (on the caller's thread, where an error can be reported);
 * tshm_cuda_reader_release (a tshm_release_fn: plain C, any thread, no
 * GIL) records the event on `stream`, parks it on the hold and drops the
 * holder.  A record that fails (a stream destroyed meanwhile) falls back to
 * synchronizing the device, so nothing is reused under a reader.
 */
typedef struct tshm_cuda_reader tshm_cuda_reader;
int tshm_cuda_reader_new(tshm_cuda_hold *h, void *stream, tshm_cuda_reader **out);
void tshm_cuda_reader_release(void *reader);

/* Query the hold's parked reader events, destroying the complete ones;
 * `*pending` = 1 while any is not complete.  Returns a CUDA error when a
 * query fails (the event stays parked). */
int tshm_cuda_hold_readers_pending(tshm_cuda_hold *h, int *pending);

/*
 * Copy `len` bytes from `src + src_offset` to `dst + dst_offset`, where
 * `src` and `dst` are the bases of ranges of `src_size` and `dst_size`
 * bytes in host or device memory (unified addressing tells which).  Both
 * ranges are checked without any addition that can wrap (-ERANGE), and so
 * are the address ranges themselves; partially overlapping ranges are
 * refused (-EINVAL: CUDA does not define them).  The copy is enqueued
 * with cudaMemcpyAsync on `stream` (a stream of `device`, which is made
 * current for the call) after the `nwaits` events of `waits` (producers'
 * work); with `sync`, `stream` is synchronized before returning and the
 * copy is complete, else it is the caller's to order or synchronize.
 * `done` (an event of `device`, or NULL) is recorded on `stream` after the
 * copy, and `then` (a consumer's stream, or NULL; needs `done`) made to
 * wait for it -- under the same device guard as the copy, so a copy whose
 * end a consumer orders after costs one guarded call, not three.
 * `len` 0 makes no CUDA call (nothing is recorded).
 */
int tshm_cuda_memcpy(const tshm_cudart *rt, int device, void *stream,
                     void *dst, size_t dst_size, size_t dst_offset,
                     const void *src, size_t src_size, size_t src_offset,
                     size_t len, void *const *waits, size_t nwaits, int sync,
                     void *done, void *then);

/*
 * Page-lock a host mapping with cudaHostRegister (Portable; ReadOnly for a
 * read-only mapping), under `device`'s guard: the registration attaches to
 * the current device's context.  The mapping is unregistered by its own
 * last decref, just before munmap, under the same guard, and only by the
 * process that registered it.  Refuses a mapping that is already pinned
 * (-EALREADY), and a read-only one when the device cannot register
 * read-only memory (cudaDevAttrHostRegisterReadOnlySupported: -EOPNOTSUPP).
 */
int tshm_cuda_pin_mapping(const tshm_cudart *rt, int device, tshm_mapping *m);

#ifdef __cplusplus
}
#endif

#endif /* TSHM_CUDA_H */
