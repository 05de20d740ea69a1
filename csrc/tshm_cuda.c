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
    SYM(Memcpy, "cudaMemcpy"),
    SYM(StreamSynchronize, "cudaStreamSynchronize"),
    SYM(IpcGetMemHandle, "cudaIpcGetMemHandle"),
    SYM(IpcOpenMemHandle, "cudaIpcOpenMemHandle"),
    SYM(IpcCloseMemHandle, "cudaIpcCloseMemHandle"),
    SYM(HostRegister, "cudaHostRegister"),
    SYM(HostUnregister, "cudaHostUnregister"),
};

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

/* The runtime's current device is per thread.  Switch for one operation and
 * put the caller's back, so that we never move a user's thread to another
 * GPU behind their back. */
static int device_enter(const tshm_cudart *rt, int device, int *previous)
{
    int rc = rt->GetDevice(previous);
    if (rc != 0)
        return rc;
    return *previous == device ? 0 : rt->SetDevice(device);
}

static void device_leave(const tshm_cudart *rt, int device, int previous)
{
    if (previous != device)
        rt->SetDevice(previous);
}

/* --- allocations ----------------------------------------------------------- */

static int alloc_wrap(const tshm_cudart *rt, int device, void *ptr, size_t nbytes,
                      int imported, tshm_cuda_alloc **out)
{
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
    rc = rt->Malloc(&ptr, nbytes);
    if (rc == 0) {
        rc = alloc_wrap(rt, device, ptr, nbytes, 0, out);
        if (rc != 0)
            rt->Free(ptr);
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
    rc = rt->IpcOpenMemHandle(&ptr, *handle, TSHM_CUDA_IPC_LAZY_ENABLE_PEER_ACCESS);
    if (rc == 0) {
        rc = alloc_wrap(rt, device, ptr, nbytes, 1, out);
        if (rc != 0)
            rt->IpcCloseMemHandle(ptr);
    }
    device_leave(rt, device, previous);
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
    if (a->pid == getpid()) {
        const tshm_cudart *rt = a->rt;
        int previous;
        if (device_enter(rt, a->device, &previous) == 0) {
            if (a->imported)
                rt->IpcCloseMemHandle(a->ptr);
            else
                rt->Free(a->ptr);
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
    rc = a->rt->IpcGetMemHandle(out, a->ptr);
    device_leave(a->rt, a->device, previous);
    return rc;
}

/* --- copies ----------------------------------------------------------------- */

static int check_range(const tshm_cuda_alloc *a, size_t offset, size_t len)
{
    return tshm_check_range(a->nbytes, offset, len);
}

/* cudaMemcpy runs on the legacy default stream, which waits for every
 * blocking stream's earlier work.  It returns once host memory was read or
 * written, but a device-to-device copy may still be in flight then: the
 * legacy stream is synchronized after it, so that the bytes have landed on
 * return (another process -- the server -- may read them at once). */
static int memcpy_complete(const tshm_cudart *rt, void *dst, const void *src, size_t len)
{
    int rc = rt->Memcpy(dst, src, len, TSHM_CUDA_MEMCPY_DEFAULT);
    if (rc == 0)
        rc = rt->StreamSynchronize(NULL);
    return rc;
}

static int copy(tshm_cuda_alloc *a, void *dst, const void *src, size_t len, void *producer_stream)
{
    int previous;
    int rc = device_enter(a->rt, a->device, &previous);
    if (rc != 0)
        return rc;
    if (producer_stream != NULL)
        rc = a->rt->StreamSynchronize(producer_stream);
    if (rc == 0 && len != 0)
        rc = memcpy_complete(a->rt, dst, src, len);
    device_leave(a->rt, a->device, previous);
    return rc;
}

int tshm_cuda_copy_in(tshm_cuda_alloc *a, size_t offset, const void *src, size_t len,
                      void *producer_stream)
{
    if (a == NULL || (src == NULL && len != 0))
        return -EINVAL;
    int rc = check_range(a, offset, len);
    if (rc != 0)
        return rc;
    return copy(a, a->ptr + offset, src, len, producer_stream);
}

int tshm_cuda_copy_out(tshm_cuda_alloc *a, size_t offset, void *dst, size_t len)
{
    if (a == NULL || (dst == NULL && len != 0))
        return -EINVAL;
    int rc = check_range(a, offset, len);
    if (rc != 0)
        return rc;
    return copy(a, dst, a->ptr + offset, len, NULL);
}

int tshm_cuda_memcpy(const tshm_cudart *rt, int device,
                     void *dst, size_t dst_size, size_t dst_offset,
                     const void *src, size_t src_size, size_t src_offset,
                     size_t len, void *dst_stream, void *src_stream)
{
    if (rt == NULL || device < -1)
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
    /* Partial overlap is undefined for cudaMemcpy; the same range is a no-op. */
    if (d != s && d < s + len && s < d + len)
        return -EINVAL;
    int previous = device;
    if (device >= 0) {
        rc = device_enter(rt, device, &previous);
        if (rc != 0)
            return rc;
    }
    if (dst_stream != NULL)
        rc = rt->StreamSynchronize(dst_stream);
    if (rc == 0 && src_stream != NULL && src_stream != dst_stream)
        rc = rt->StreamSynchronize(src_stream);
    if (rc == 0 && d != s)
        rc = memcpy_complete(rt, (void *)d, (const void *)s, len);
    if (device >= 0)
        device_leave(rt, device, previous);
    return rc;
}

/* --- window holds ------------------------------------------------------------ */

int tshm_cuda_hold_new(tshm_cuda_alloc *a, tshm_cuda_hold **out)
{
    if (a == NULL || out == NULL)
        return -EINVAL;
    tshm_cuda_hold *h = malloc(sizeof *h);
    if (h == NULL)
        return -ENOMEM;
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
    free(h);
    tshm_cuda_alloc_decref(a);
}

size_t tshm_cuda_hold_refs(const tshm_cuda_hold *h)
{
    return __atomic_load_n(&h->refs, __ATOMIC_ACQUIRE);
}

/* --- pinned host mappings ----------------------------------------------------- */

struct pin {
    const tshm_cudart *rt;
    pid_t pid;
};

static void unpin(tshm_mapping *m, void *ctx)
{
    struct pin *pin = ctx;
    if (pin->pid == getpid())
        pin->rt->HostUnregister(m->addr);
    free(pin);
}

int tshm_cuda_pin_mapping(const tshm_cudart *rt, tshm_mapping *m)
{
    if (rt == NULL || m == NULL)
        return -EINVAL;
    if (__atomic_load_n(&m->unmap_hook, __ATOMIC_ACQUIRE) != NULL)
        return -EALREADY;
    struct pin *pin = malloc(sizeof *pin);
    if (pin == NULL)
        return -ENOMEM;
    pin->rt = rt;
    pin->pid = getpid();
    unsigned flags = TSHM_CUDA_HOST_REGISTER_PORTABLE;
    if (m->readonly)
        flags |= TSHM_CUDA_HOST_REGISTER_READ_ONLY;
    int rc = rt->HostRegister(m->addr, m->nbytes, flags);
    if (rc != 0) {
        free(pin);
        return rc;
    }
    rc = tshm_mapping_set_unmap_hook(m, unpin, pin);
    if (rc != 0) {
        /* Another thread pinned it between our check and now. */
        rt->HostUnregister(m->addr);
        free(pin);
    }
    return rc;
}
