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
 */
#ifndef TSHM_CUDA_H
#define TSHM_CUDA_H

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
/* cudaDeviceAttr values (stable enum numbers). */
#define TSHM_CUDA_ATTR_MULTIPROCESSOR_COUNT 16
#define TSHM_CUDA_ATTR_PCI_BUS_ID 33
#define TSHM_CUDA_ATTR_COMPUTE_CAPABILITY_MAJOR 75
#define TSHM_CUDA_ATTR_COMPUTE_CAPABILITY_MINOR 76
#define TSHM_CUDA_ATTR_HOST_REGISTER_SUPPORTED 99

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
    int (*Memcpy)(void *dst, const void *src, size_t nbytes, int kind);
    int (*StreamSynchronize)(void *stream);
    int (*IpcGetMemHandle)(tshm_ipc_handle *handle, void *ptr);
    int (*IpcOpenMemHandle)(void **ptr, tshm_ipc_handle handle, unsigned int flags);
    int (*IpcCloseMemHandle)(void *ptr);
    int (*HostRegister)(void *ptr, size_t nbytes, unsigned int flags);
    int (*HostUnregister)(void *ptr);
} tshm_cudart;

/* dlopen() `path` (a file path or a soname for the loader's search) and
 * resolve every entry point above.  On failure returns -ENOENT (cannot load)
 * or -ENOSYS (a symbol is missing) and writes a one-line reason to `why`. */
int tshm_cudart_open(const char *path, tshm_cudart **out, char *why, size_t why_cap);

/* The file the table's library was loaded from (dladdr), or NULL. */
const char *tshm_cudart_path(const tshm_cudart *rt);

/* cudaGetErrorName / cudaGetErrorString, never NULL. */
const char *tshm_cuda_error_name(const tshm_cudart *rt, int error);
const char *tshm_cuda_error_string(const tshm_cudart *rt, int error);

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
    pid_t pid;          /* the process that allocated or opened it */
    size_t refs;        /* holders of the memory; accessed atomically only */
    size_t observers;   /* holders of this struct, +1 for all `refs` together */
} tshm_cuda_alloc;

/* cudaMalloc `nbytes` (> 0) on `device`; refs = 1. */
int tshm_cuda_alloc_new(const tshm_cudart *rt, int device, size_t nbytes, tshm_cuda_alloc **out);

/* Open a peer's allocation of `nbytes` from its IPC handle on `device`; refs = 1. */
int tshm_cuda_alloc_open(const tshm_cudart *rt, int device, const tshm_ipc_handle *handle,
                         size_t nbytes, tshm_cuda_alloc **out);

void tshm_cuda_alloc_incref(tshm_cuda_alloc *a);
/* Drop one reference; the last one frees (or closes) the device memory. */
void tshm_cuda_alloc_decref(tshm_cuda_alloc *a);
size_t tshm_cuda_alloc_refs(const tshm_cuda_alloc *a);

/* Observers keep the struct (not the memory) readable: a closed region
 * still reports how many views hold its memory.  The struct is freed when
 * the memory is released and the last observer is gone. */
void tshm_cuda_alloc_observe(tshm_cuda_alloc *a);
void tshm_cuda_alloc_unobserve(tshm_cuda_alloc *a);

/* cudaIpcGetMemHandle of the allocation's base. */
int tshm_cuda_ipc_handle(const tshm_cuda_alloc *a, tshm_ipc_handle *out);

/*
 * Copy `len` bytes between the allocation at `offset` and `other` (host or
 * device memory; unified addressing tells which), range-checked without any
 * addition that can wrap.  `producer_stream`, when not NULL, is synchronized
 * first (the CUDA Array Interface's "stream": work that writes `other`).
 * The copy runs on the legacy default stream and is complete on return, so
 * another process (the server) may read the result at once.
 */
int tshm_cuda_copy_in(tshm_cuda_alloc *a, size_t offset, const void *src, size_t len,
                      void *producer_stream);
int tshm_cuda_copy_out(tshm_cuda_alloc *a, size_t offset, void *dst, size_t len);

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
} tshm_cuda_hold;

/* A hold on `a` with refs = 1; takes a reference to `a` of its own. */
int tshm_cuda_hold_new(tshm_cuda_alloc *a, tshm_cuda_hold **out);
void tshm_cuda_hold_incref(tshm_cuda_hold *h);
/* Drop one holder; the last one releases the allocation reference and frees `h`. */
void tshm_cuda_hold_decref(tshm_cuda_hold *h);
size_t tshm_cuda_hold_refs(const tshm_cuda_hold *h);

/*
 * Copy `len` bytes from `src + src_offset` to `dst + dst_offset`, where
 * `src` and `dst` are the bases of ranges of `src_size` and `dst_size`
 * bytes in host or device memory (unified addressing tells which).  Both
 * ranges are checked without any addition that can wrap (-ERANGE), and so
 * are the address ranges themselves; partially overlapping ranges are
 * refused (-EINVAL: cudaMemcpy does not define them).  `device` (>= 0) is
 * made current for the copy, or -1 to keep the caller's.  `dst_stream` and
 * `src_stream`, when not NULL, are synchronized first (CUDA Array
 * Interface producers' streams).  The copy runs on the legacy default
 * stream and is complete on return (device-to-device included: the legacy
 * stream is synchronized after it).  `len` 0 makes no CUDA call.
 */
int tshm_cuda_memcpy(const tshm_cudart *rt, int device,
                     void *dst, size_t dst_size, size_t dst_offset,
                     const void *src, size_t src_size, size_t src_offset,
                     size_t len, void *dst_stream, void *src_stream);

/*
 * Page-lock a host mapping with cudaHostRegister (Portable; ReadOnly for a
 * read-only mapping).  The mapping is unregistered by its own last decref,
 * just before munmap, and only by the process that registered it.
 * Refuses a mapping that is already pinned (-EALREADY).
 */
int tshm_cuda_pin_mapping(const tshm_cudart *rt, tshm_mapping *m);

#ifdef __cplusplus
}
#endif

#endif /* TSHM_CUDA_H */
