/* tshm_cuda: device allocations, IPC handles and pinned mappings through a
 * dlopen()ed CUDA runtime.  See tshm_cuda.h for the contract of each function. */
#define _GNU_SOURCE
#include "tshm_cuda.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* --- loading the runtime -------------------------------------------------- */

struct symbol {
    const char *names[2];   /* tried in order; the first is the preferred ABI */
    size_t offset;          /* of the function pointer in tshm_cudart */
};

#define SYM(field, ...) { { __VA_ARGS__ }, offsetof(tshm_cudart, field) }

static const struct symbol symbols[] = {
    SYM(GetDeviceCount, "cudaGetDeviceCount"),
    SYM(GetDevice, "cudaGetDevice"),
    SYM(SetDevice, "cudaSetDevice"),
    SYM(DeviceGetAttribute, "cudaDeviceGetAttribute"),
    SYM(DriverGetVersion, "cudaDriverGetVersion"),
    SYM(RuntimeGetVersion, "cudaRuntimeGetVersion"),
    SYM(GetErrorName, "cudaGetErrorName"),
    SYM(GetErrorString, "cudaGetErrorString"),
    /* 12.x's header maps the name to _v2 (the old symbol has the old layout);
     * 13.x exports the plain name only.  We read name[256] at offset 0,
     * which is the same in every layout. */
    SYM(GetDeviceProperties, "cudaGetDeviceProperties_v2", "cudaGetDeviceProperties"),
    SYM(MemGetInfo, "cudaMemGetInfo"),
    SYM(Malloc, "cudaMalloc"),
    SYM(Free, "cudaFree"),
    /* The plain names (not _ptsz): handle 0 means the legacy default
     * stream, which is only ever used to record an event on it. */
    SYM(MemcpyAsync, "cudaMemcpyAsync"),
    SYM(DeviceSynchronize, "cudaDeviceSynchronize"),
    SYM(StreamCreateWithFlags, "cudaStreamCreateWithFlags"),
    SYM(StreamDestroy, "cudaStreamDestroy"),
    SYM(StreamSynchronize, "cudaStreamSynchronize"),
    SYM(StreamWaitEvent, "cudaStreamWaitEvent"),
    SYM(EventCreateWithFlags, "cudaEventCreateWithFlags"),
    SYM(EventRecord, "cudaEventRecord"),
    SYM(EventQuery, "cudaEventQuery"),
    SYM(EventSynchronize, "cudaEventSynchronize"),
    SYM(EventDestroy, "cudaEventDestroy"),
    SYM(GetLastError, "cudaGetLastError"),
    SYM(IpcGetMemHandle, "cudaIpcGetMemHandle"),
    SYM(IpcOpenMemHandle, "cudaIpcOpenMemHandle"),
    SYM(IpcCloseMemHandle, "cudaIpcCloseMemHandle"),
    SYM(HostRegister, "cudaHostRegister"),
    SYM(HostUnregister, "cudaHostUnregister"),
    SYM(HostAlloc, "cudaHostAlloc"),
    SYM(FreeHost, "cudaFreeHost"),
};

typedef int (*entry_by_version_fn)(const char *symbol, void **fn, unsigned int version,
                                   unsigned long long flags, int *status);
typedef int (*entry_fn)(const char *symbol, void **fn, unsigned long long flags, int *status);

/* --- the thread's last error ---------------------------------------------- */

/*
 * Every runtime call below that fails goes through settle(): its error is
 * taken off the calling thread's last error.  The runtime instance is the
 * one torch or cupy loaded, and torch reads cudaGetLastError after every
 * kernel launch (C10_CUDA_KERNEL_LAUNCH_CHECK): an error we left there
 * would fail the caller's next torch op ("CUDA error: invalid argument",
 * seen on an H200 after a refused export).  cupy's check_status clears
 * the same way.  Failures that are expected and handled, never reported:
 *   - cudaIpcGetMemHandle refusing pool, virtual or managed memory
 *     (tshm_cuda_ipc_handle: borrow() turns it into NotShareable, the
 *     client copies the tensor);
 *   - the driver entry point probes of tshm_cudart_open (a symbol this
 *     runtime or driver lacks);
 *   - tshm_cuda_reader_release's event record on a consumer's stream that
 *     is gone (it synchronizes the device instead), run in a DLPack
 *     deleter on the consumer's thread;
 *   - the releases whose failure nothing can act on (cudaFree,
 *     cudaIpcCloseMemHandle, cudaHostUnregister, cudaEventDestroy, the
 *     device guard's restore).
 * The rest are returned, and reported by the caller as its own error.
 * cudaErrorNotReady from a query is an answer: CUDA records nothing for it.
 */
static int settle(const tshm_cudart *rt, int rc)
{
    if (rc > 0 && rc != TSHM_CUDA_ERROR_NOT_READY)
        rt->GetLastError();
    return rc;
}

int tshm_cuda_settle(const tshm_cudart *rt, int rc)
{
    return rt != NULL ? settle(rt, rc) : rc;
}

/* A driver entry point through the runtime (which found the driver), or
 * NULL.  ByVersion is the only one left in 13.x; 11.x's plain one takes no
 * status argument, which the x86-64 and aarch64 conventions let us pass
 * regardless.  Flags 0: cudaEnableDefault.  A refusal (a symbol this
 * runtime does not know) is expected: settled. */
static void *driver_entry_point(const tshm_cudart *rt, const char *symbol)
{
    void *fn = NULL;
    int status = 0;
    entry_by_version_fn by_version = (entry_by_version_fn)dlsym(rt->lib, "cudaGetDriverEntryPointByVersion");
    if (by_version != NULL && settle(rt, by_version(symbol, &fn, 12000, 0, &status)) == 0 && status == 0
        && fn != NULL)
        return fn;
    fn = NULL;
    status = 0;
    entry_fn plain = (entry_fn)dlsym(rt->lib, "cudaGetDriverEntryPoint");
    if (plain != NULL && settle(rt, plain(symbol, &fn, 0, &status)) == 0 && status == 0)
        return fn;
    return NULL;
}

int tshm_cudart_open(const char *path, tshm_cudart **out, char *why, size_t why_cap)
{
    if (path == NULL || out == NULL)
        return -EINVAL;
    /* RTLD_LOCAL: our copy must not interpose on another runtime the
     * process has loaded (torch's, cupy's, a test's fake). */
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        if (why != NULL)
            snprintf(why, why_cap, "%s", dlerror());
        return -ENOENT;
    }
    tshm_cudart *rt = calloc(1, sizeof *rt);
    if (rt == NULL) {
        dlclose(lib);
        return -ENOMEM;
    }
    rt->lib = lib;
    for (size_t i = 0; i < sizeof symbols / sizeof symbols[0]; i++) {
        void *fn = NULL;
        for (size_t j = 0; j < 2 && fn == NULL && symbols[i].names[j] != NULL; j++)
            fn = dlsym(lib, symbols[i].names[j]);
        if (fn == NULL) {
            if (why != NULL)
                snprintf(why, why_cap, "%s has no %s", path, symbols[i].names[0]);
            free(rt);
            dlclose(lib);
            return -ENOSYS;
        }
        memcpy((char *)rt + symbols[i].offset, &fn, sizeof fn);
    }
    /* Before CUDA 12, cudaSetDevice created no context: putting the
     * previous device back is then harmless, and always done (no query). */
    int version = 0;
    if (settle(rt, rt->RuntimeGetVersion(&version)) == 0 && version >= 12000) {
        void *state = driver_entry_point(rt, "cuDevicePrimaryCtxGetState");
        memcpy(&rt->PrimaryCtxGetState, &state, sizeof state);
    }
    void *range = driver_entry_point(rt, "cuMemGetAddressRange");
    memcpy(&rt->MemGetAddressRange, &range, sizeof range);
    void *attribute = driver_entry_point(rt, "cuPointerGetAttribute");
    memcpy(&rt->PointerGetAttribute, &attribute, sizeof attribute);
    *out = rt;
    return 0;
}

const char *tshm_cudart_path(const tshm_cudart *rt)
{
    Dl_info info;
    if (rt == NULL || dladdr((void *)rt->Malloc, &info) == 0)
        return NULL;
    return info.dli_fname;
}

const char *tshm_cuda_error_name(const tshm_cudart *rt, int error)
{
    const char *name = rt != NULL ? rt->GetErrorName(error) : NULL;
    return name != NULL ? name : "cudaErrorUnknown";
}

const char *tshm_cuda_error_string(const tshm_cudart *rt, int error)
{
    const char *text = rt != NULL ? rt->GetErrorString(error) : NULL;
    return text != NULL ? text : "unknown error";
}

/* --- the current device ---------------------------------------------------- */

int tshm_cuda_device_has_context(const tshm_cudart *rt, int device)
{
    unsigned int flags = 0;
    int active = 0;
    if (rt == NULL || rt->PrimaryCtxGetState == NULL || rt->PrimaryCtxGetState(device, &flags, &active) != 0)
        return -1;
    return active != 0;
}

/* The runtime's current device is per thread.  Switch for one operation and
 * put the caller's back -- we never move a user's thread to another GPU
 * behind their back -- unless putting it back would create a context on a
 * device the process never used (tshm_cuda.h). */
int tshm_cuda_device_enter(const tshm_cudart *rt, int device, int *previous)
{
    if (rt == NULL || previous == NULL || device < 0)
        return -EINVAL;
    int rc = settle(rt, rt->GetDevice(previous));
    if (rc != 0)
        return rc;
    if (*previous == device)
        return 0;
    /* Decided before switching: our own call cannot make a context on the
     * previous device, so its state now is its state at leave. */
    if (tshm_cuda_device_has_context(rt, *previous) == 0)
        *previous = device;
    return settle(rt, rt->SetDevice(device));
}

void tshm_cuda_device_leave(const tshm_cudart *rt, int device, int previous)
{
    if (rt != NULL && previous != device && previous >= 0)
        settle(rt, rt->SetDevice(previous));
}

static int device_enter(const tshm_cudart *rt, int device, int *previous)
{
    return tshm_cuda_device_enter(rt, device, previous);
}

static void device_leave(const tshm_cudart *rt, int device, int previous)
{
    tshm_cuda_device_leave(rt, device, previous);
}

/* --- streams and events ------------------------------------------------------ */

/* Each wrapper is one runtime call under the device's guard: even a query
 * or a destroy would otherwise run with whatever device the thread has
 * current, and the runtime creates that device's context first. */
#define GUARDED(rt, device, call)                                   \
    do {                                                            \
        if ((rt) == NULL)                                           \
            return -EINVAL;                                         \
        int previous_;                                              \
        int rc_ = device_enter((rt), (device), &previous_);         \
        if (rc_ != 0)                                               \
            return rc_;                                             \
        rc_ = settle((rt), (call));                                 \
        device_leave((rt), (device), previous_);                    \
        return rc_;                                                 \
    } while (0)

int tshm_cuda_stream_new(const tshm_cudart *rt, int device, void **out)
{
    if (out == NULL)
        return -EINVAL;
    GUARDED(rt, device, rt->StreamCreateWithFlags(out, TSHM_CUDA_STREAM_NON_BLOCKING));
}

int tshm_cuda_stream_free(const tshm_cudart *rt, int device, void *stream)
{
    if (stream == NULL)
        return -EINVAL;
    GUARDED(rt, device, rt->StreamDestroy(stream));
}

int tshm_cuda_stream_sync(const tshm_cudart *rt, int device, void *stream)
{
    GUARDED(rt, device, rt->StreamSynchronize(stream));
}

int tshm_cuda_stream_wait(const tshm_cudart *rt, int device, void *stream, void *event)
{
    if (event == NULL)
        return -EINVAL;
    GUARDED(rt, device, rt->StreamWaitEvent(stream, event, 0));
}

int tshm_cuda_event_new(const tshm_cudart *rt, int device, void **out)
{
    if (out == NULL)
        return -EINVAL;
    GUARDED(rt, device, rt->EventCreateWithFlags(out, TSHM_CUDA_EVENT_DISABLE_TIMING));
}

int tshm_cuda_event_free(const tshm_cudart *rt, int device, void *event)
{
    if (event == NULL)
        return -EINVAL;
    GUARDED(rt, device, rt->EventDestroy(event));
}

int tshm_cuda_event_record(const tshm_cudart *rt, int device, void *event, void *stream)
{
    if (event == NULL)
        return -EINVAL;
    GUARDED(rt, device, rt->EventRecord(event, stream));
}

int tshm_cuda_event_query(const tshm_cudart *rt, int device, void *event)
{
    if (event == NULL)
        return -EINVAL;
    GUARDED(rt, device, rt->EventQuery(event));
}

int tshm_cuda_event_sync(const tshm_cudart *rt, int device, void *event)
{
    if (event == NULL)
        return -EINVAL;
    GUARDED(rt, device, rt->EventSynchronize(event));
}

/* --- allocations ----------------------------------------------------------- */

static int alloc_wrap(const tshm_cudart *rt, int device, void *ptr, size_t nbytes,
                      int imported, tshm_cuda_alloc **out)
{
    if (out == NULL)
        return -EINVAL;
    tshm_cuda_alloc *a = calloc(1, sizeof *a);
    if (a == NULL)
        return -ENOMEM;
    a->rt = rt;
    a->ptr = ptr;
    a->nbytes = nbytes;
    a->device = device;
    a->imported = imported;
    a->pid = getpid();
    a->observers = 1;  /* the one all references share */
    __atomic_store_n(&a->refs, 1, __ATOMIC_RELEASE);
    *out = a;
    return 0;
}

int tshm_cuda_alloc_new(const tshm_cudart *rt, int device, size_t nbytes, tshm_cuda_alloc **out)
{
    if (rt == NULL || out == NULL || nbytes == 0 || device < 0)
        return -EINVAL;
    int previous;
    int rc = device_enter(rt, device, &previous);
    if (rc != 0)
        return rc;
    void *ptr = NULL;
    rc = settle(rt, rt->Malloc(&ptr, nbytes));
    if (rc == 0) {
        rc = alloc_wrap(rt, device, ptr, nbytes, 0, out);
        if (rc != 0)
            settle(rt, rt->Free(ptr));
    }
    device_leave(rt, device, previous);
    return rc;
}

int tshm_cuda_alloc_open(const tshm_cudart *rt, int device, const tshm_ipc_handle *handle,
                         size_t nbytes, tshm_cuda_alloc **out)
{
    if (rt == NULL || handle == NULL || out == NULL || nbytes == 0 || device < 0)
        return -EINVAL;
    int previous;
    int rc = device_enter(rt, device, &previous);
    if (rc != 0)
        return rc;
    void *ptr = NULL;
    rc = settle(rt, rt->IpcOpenMemHandle(&ptr, *handle, TSHM_CUDA_IPC_LAZY_ENABLE_PEER_ACCESS));
    if (rc == 0) {
        rc = alloc_wrap(rt, device, ptr, nbytes, 1, out);
        if (rc != 0)
            settle(rt, rt->IpcCloseMemHandle(ptr));
    }
    device_leave(rt, device, previous);
    return rc;
}

int tshm_cuda_alloc_borrow(const tshm_cudart *rt, int device, const void *ptr, tshm_cuda_alloc **out)
{
    if (rt == NULL || out == NULL || ptr == NULL || device < 0)
        return -EINVAL;
    if (rt->MemGetAddressRange == NULL)
        return -ENOSYS;
    int previous;
    int rc = device_enter(rt, device, &previous);
    if (rc != 0)
        return rc;
    unsigned long long base = 0, id = 0, at = (unsigned long long)(uintptr_t)ptr;
    size_t nbytes = 0;
    /* Driver calls: the driver API keeps no last error to settle. */
    rc = rt->MemGetAddressRange(&base, &nbytes, at);
    if (rc == 0 && rt->PointerGetAttribute != NULL
        && rt->PointerGetAttribute(&id, TSHM_CU_POINTER_ATTRIBUTE_BUFFER_ID, at) != 0)
        id = 0;  /* unknown: the caller tells allocations apart by base and size */
    device_leave(rt, device, previous);
    if (rc != 0)
        return rc;
    if (base == 0 || nbytes == 0 || (uintptr_t)ptr < base || (uintptr_t)ptr - base >= nbytes)
        return -EFAULT;  /* a driver answer that does not hold the pointer */
    rc = alloc_wrap(rt, device, (void *)(uintptr_t)base, nbytes, 0, out);
    if (rc == 0) {
        (*out)->borrowed = 1;
        (*out)->buffer_id = id;
    }
    return rc;
}

void tshm_cuda_alloc_incref(tshm_cuda_alloc *a)
{
    __atomic_add_fetch(&a->refs, 1, __ATOMIC_RELAXED);
}

void tshm_cuda_alloc_decref(tshm_cuda_alloc *a)
{
    if (__atomic_sub_fetch(&a->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    /* A forked child inherits the struct but not the CUDA context: the
     * memory is the parent's, and CUDA calls fail after fork anyway. */
    if (a->pid == getpid() && !a->borrowed) {
        const tshm_cudart *rt = a->rt;
        int previous;
        if (device_enter(rt, a->device, &previous) == 0) {
            if (a->imported)
                settle(rt, rt->IpcCloseMemHandle(a->ptr));
            else
                settle(rt, rt->Free(a->ptr));
            device_leave(rt, a->device, previous);
        }
    }
    tshm_cuda_alloc_unobserve(a);
}

void tshm_cuda_alloc_observe(tshm_cuda_alloc *a)
{
    __atomic_add_fetch(&a->observers, 1, __ATOMIC_RELAXED);
}

void tshm_cuda_alloc_unobserve(tshm_cuda_alloc *a)
{
    if (__atomic_sub_fetch(&a->observers, 1, __ATOMIC_ACQ_REL) == 0)
        free(a);
}

size_t tshm_cuda_alloc_refs(const tshm_cuda_alloc *a)
{
    return __atomic_load_n(&a->refs, __ATOMIC_ACQUIRE);
}

int tshm_cuda_ipc_handle(const tshm_cuda_alloc *a, tshm_ipc_handle *out)
{
    if (a == NULL || out == NULL)
        return -EINVAL;
    int previous;
    int rc = device_enter(a->rt, a->device, &previous);
    if (rc != 0)
        return rc;
    /* Refused for memory CUDA IPC cannot export: expected, the caller copies instead. */
    rc = settle(a->rt, a->rt->IpcGetMemHandle(out, a->ptr));
    device_leave(a->rt, a->device, previous);
    return rc;
}

/* --- copies ----------------------------------------------------------------- */

static int check_range(const tshm_cuda_alloc *a, size_t offset, size_t len)
{
    return tshm_check_range(a->nbytes, offset, len);
}

/* Enqueue the waits and the copy on `stream`, then synchronize it if asked:
 * the caller is under the device's guard.  A non-blocking stream and an
 * event per producer order exactly what must be ordered: the legacy
 * stream (cudaMemcpy) would serialize every thread and library, and a
 * device synchronization would wait for all of their work. */
static int enqueue_copy(const tshm_cudart *rt, void *stream, void *dst, const void *src, size_t len,
                        void *const *waits, size_t nwaits, int sync, void *done, void *then)
{
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < nwaits; i++)
        if (waits[i] != NULL)
            rc = settle(rt, rt->StreamWaitEvent(stream, waits[i], 0));
    if (rc == 0 && dst != src)
        rc = settle(rt, rt->MemcpyAsync(dst, src, len, TSHM_CUDA_MEMCPY_DEFAULT, stream));
    /* The copy's end marked, and the consumer's stream ordered after it, under the same guard. */
    if (rc == 0 && done != NULL)
        rc = settle(rt, rt->EventRecord(done, stream));
    if (rc == 0 && done != NULL && then != NULL)
        rc = settle(rt, rt->StreamWaitEvent(then, done, 0));
    if (rc == 0 && sync)
        rc = settle(rt, rt->StreamSynchronize(stream));
    return rc;
}

static int copy(tshm_cuda_alloc *a, void *dst, const void *src, size_t len, void *stream, void *wait)
{
    if (len == 0)
        return 0;
    int previous;
    int rc = device_enter(a->rt, a->device, &previous);
    if (rc != 0)
        return rc;
    rc = enqueue_copy(a->rt, stream, dst, src, len, &wait, 1, 1, NULL, NULL);
    device_leave(a->rt, a->device, previous);
    return rc;
}

int tshm_cuda_copy_in(tshm_cuda_alloc *a, size_t offset, const void *src, size_t len,
                      void *stream, void *wait)
{
    if (a == NULL || (src == NULL && len != 0))
        return -EINVAL;
    int rc = check_range(a, offset, len);
    if (rc != 0)
        return rc;
    return copy(a, a->ptr + offset, src, len, stream, wait);
}

int tshm_cuda_copy_out(tshm_cuda_alloc *a, size_t offset, void *dst, size_t len,
                       void *stream, void *wait)
{
    if (a == NULL || (dst == NULL && len != 0))
        return -EINVAL;
    int rc = check_range(a, offset, len);
    if (rc != 0)
        return rc;
    return copy(a, dst, a->ptr + offset, len, stream, wait);
}

int tshm_cuda_memcpy(const tshm_cudart *rt, int device, void *stream,
                     void *dst, size_t dst_size, size_t dst_offset,
                     const void *src, size_t src_size, size_t src_offset,
                     size_t len, void *const *waits, size_t nwaits, int sync, void *done, void *then)
{
    if (rt == NULL || device < 0 || (waits == NULL && nwaits != 0) || (then != NULL && done == NULL))
        return -EINVAL;
    int rc = tshm_check_range(dst_size, dst_offset, len);
    if (rc == 0)
        rc = tshm_check_range(src_size, src_offset, len);
    if (rc != 0)
        return rc;
    if (len == 0)
        return 0;
    if (dst == NULL || src == NULL)
        return -EINVAL;
    uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    /* The ranges themselves must not wrap the address space. */
    if (dst_size > UINTPTR_MAX - d || src_size > UINTPTR_MAX - s)
        return -ERANGE;
    d += dst_offset;
    s += src_offset;
    /* Partial overlap is undefined for CUDA copies; the same range is a no-op. */
    if (d != s && d < s + len && s < d + len)
        return -EINVAL;
    int previous;
    rc = device_enter(rt, device, &previous);
    if (rc != 0)
        return rc;
    rc = enqueue_copy(rt, stream, (void *)d, (const void *)s, len, waits, nwaits, sync, done, then);
    device_leave(rt, device, previous);
    return rc;
}

/* --- window holds ------------------------------------------------------------ */

int tshm_cuda_hold_new(tshm_cuda_alloc *a, tshm_cuda_hold **out)
{
    if (a == NULL || out == NULL)
        return -EINVAL;
    tshm_cuda_hold *h = calloc(1, sizeof *h);
    if (h == NULL)
        return -ENOMEM;
    if (pthread_mutex_init(&h->lock, NULL) != 0) {
        free(h);
        return -ENOMEM;
    }
    tshm_cuda_alloc_incref(a);
    h->alloc = a;
    __atomic_store_n(&h->refs, 1, __ATOMIC_RELEASE);
    *out = h;
    return 0;
}

void tshm_cuda_hold_incref(tshm_cuda_hold *h)
{
    __atomic_add_fetch(&h->refs, 1, __ATOMIC_RELAXED);
}

void tshm_cuda_hold_decref(tshm_cuda_hold *h)
{
    if (__atomic_sub_fetch(&h->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    tshm_cuda_alloc *a = h->alloc;
    /* Nobody can reuse the range any more; the events only need freeing
     * (cudaEventDestroy of a pending event is fine: it is released when it
     * completes).  A forked child has no CUDA to call. */
    if (h->nreaders != 0 && a->pid == getpid()) {
        int previous;
        if (device_enter(a->rt, a->device, &previous) == 0) {
            for (size_t i = 0; i < h->nreaders; i++)
                settle(a->rt, a->rt->EventDestroy(h->readers[i]));
            device_leave(a->rt, a->device, previous);
        }
    }
    free(h->readers);
    pthread_mutex_destroy(&h->lock);
    free(h);
    tshm_cuda_alloc_decref(a);
}

size_t tshm_cuda_hold_refs(const tshm_cuda_hold *h)
{
    return __atomic_load_n(&h->refs, __ATOMIC_ACQUIRE);
}

/* --- readers of a window ------------------------------------------------------ */

struct tshm_cuda_reader {
    tshm_cuda_hold *hold;   /* one holder */
    void *stream;           /* the consumer's stream */
    void *event;            /* created on the hold's device, recorded at release */
};

int tshm_cuda_reader_new(tshm_cuda_hold *h, void *stream, tshm_cuda_reader **out)
{
    if (h == NULL || out == NULL)
        return -EINVAL;
    tshm_cuda_reader *r = malloc(sizeof *r);
    if (r == NULL)
        return -ENOMEM;
    tshm_cuda_alloc *a = h->alloc;
    int rc = tshm_cuda_event_new(a->rt, a->device, &r->event);
    if (rc != 0) {
        free(r);
        return rc;
    }
    tshm_cuda_hold_incref(h);
    r->hold = h;
    r->stream = stream;
    *out = r;
    return 0;
}

/* Park `event` on the hold; 0, or -ENOMEM (the caller then waits for it). */
static int park(tshm_cuda_hold *h, void *event)
{
    int rc = 0;
    pthread_mutex_lock(&h->lock);
    if (h->nreaders == h->readers_cap) {
        size_t cap = h->readers_cap != 0 ? 2 * h->readers_cap : 4;
        void **grown = cap > SIZE_MAX / sizeof *grown ? NULL : realloc(h->readers, cap * sizeof *grown);
        if (grown == NULL)
            rc = -ENOMEM;
        else {
            h->readers = grown;
            h->readers_cap = cap;
        }
    }
    if (rc == 0)
        h->readers[h->nreaders++] = event;
    pthread_mutex_unlock(&h->lock);
    return rc;
}

void tshm_cuda_reader_release(void *ctx)
{
    tshm_cuda_reader *r = ctx;
    tshm_cuda_hold *h = r->hold;
    tshm_cuda_alloc *a = h->alloc;
    const tshm_cudart *rt = a->rt;
    int previous;
    if (a->pid == getpid() && device_enter(rt, a->device, &previous) == 0) {
        int parked = 0;
        /* This runs in the consumer's DLPack deleter, on its thread: nothing
         * may be left on that thread's last error. */
        if (settle(rt, rt->EventRecord(r->event, r->stream)) == 0) {
            parked = park(h, r->event) == 0;
            if (!parked)  /* no memory to park it: wait for the reader here */
                settle(rt, rt->EventSynchronize(r->event));
        } else {
            /* The consumer's stream is gone (or foreign to the device): its
             * work can only be known finished by waiting for the device. */
            settle(rt, rt->DeviceSynchronize());
        }
        if (!parked)
            settle(rt, rt->EventDestroy(r->event));
        device_leave(rt, a->device, previous);
    }
    free(r);
    tshm_cuda_hold_decref(h);
}

int tshm_cuda_hold_readers_pending(tshm_cuda_hold *h, int *pending)
{
    if (h == NULL || pending == NULL)
        return -EINVAL;
    tshm_cuda_alloc *a = h->alloc;
    int rc = 0;
    *pending = 0;
    pthread_mutex_lock(&h->lock);
    if (h->nreaders != 0) {
        int previous;
        rc = device_enter(a->rt, a->device, &previous);
        if (rc == 0) {
            size_t kept = 0;
            for (size_t i = 0; i < h->nreaders; i++) {
                int q = rc == 0 ? settle(a->rt, a->rt->EventQuery(h->readers[i])) : TSHM_CUDA_ERROR_NOT_READY;
                if (q == 0) {
                    settle(a->rt, a->rt->EventDestroy(h->readers[i]));
                    continue;
                }
                if (q != TSHM_CUDA_ERROR_NOT_READY)
                    rc = q;
                h->readers[kept++] = h->readers[i];
            }
            h->nreaders = kept;
            *pending = kept != 0;
            device_leave(a->rt, a->device, previous);
        }
    }
    pthread_mutex_unlock(&h->lock);
    return rc;
}

/* --- pinned host mappings ----------------------------------------------------- */

struct pin {
    const tshm_cudart *rt;
    int device;
    pid_t pid;
};

static void unpin(tshm_mapping *m, void *ctx)
{
    struct pin *pin = ctx;
    int previous;
    if (pin->pid == getpid() && device_enter(pin->rt, pin->device, &previous) == 0) {
        settle(pin->rt, pin->rt->HostUnregister(m->addr));
        device_leave(pin->rt, pin->device, previous);
    }
    free(pin);
}

int tshm_cuda_pin_mapping(const tshm_cudart *rt, int device, tshm_mapping *m)
{
    if (rt == NULL || m == NULL || device < 0)
        return -EINVAL;
    if (__atomic_load_n(&m->unmap_hook, __ATOMIC_ACQUIRE) != NULL)
        return -EALREADY;
    unsigned flags = TSHM_CUDA_HOST_REGISTER_PORTABLE;
    if (m->readonly) {
        /* Without the attribute the ReadOnly flag is refused, and a
         * read-only mapping cannot be registered without it. */
        int supported = 0;
        int attr = TSHM_CUDA_ATTR_HOST_REGISTER_READ_ONLY_SUPPORTED;
        int rc = settle(rt, rt->DeviceGetAttribute(&supported, attr, device));
        if (rc != 0)
            return rc;
        if (!supported)
            return -EOPNOTSUPP;
        flags |= TSHM_CUDA_HOST_REGISTER_READ_ONLY;
    }
    struct pin *pin = malloc(sizeof *pin);
    if (pin == NULL)
        return -ENOMEM;
    pin->rt = rt;
    pin->device = device;
    pin->pid = getpid();
    int previous;
    int rc = device_enter(rt, device, &previous);
    if (rc != 0) {
        free(pin);
        return rc;
    }
    rc = settle(rt, rt->HostRegister(m->addr, m->nbytes, flags));
    if (rc == 0) {
        rc = tshm_mapping_set_unmap_hook(m, unpin, pin);
        if (rc != 0)  /* another thread pinned it between our check and now */
            settle(rt, rt->HostUnregister(m->addr));
    }
    device_leave(rt, device, previous);
    if (rc != 0)
        free(pin);
    return rc;
}
