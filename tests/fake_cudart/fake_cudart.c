/*
 * ======================================================================
 *  FAKE CUDA RUNTIME -- FOR TESTS ONLY.  NOT CUDA.  NEVER SHIP THIS.
 * ======================================================================
 *
 * A tiny shared library that exports a handful of libcudart entry points
 * with their real signatures (written with plain C types: cudaError_t is
 * int, streams are void *, cudaIpcMemHandle_t is 64 bytes passed by value),
 * so that tritonshm's CUDA layer -- which dlopen()s libcudart and resolves
 * exactly these symbols -- can be tested on machines without a GPU.  It is
 * built by tests/fake_cuda.py into a cache directory at test time; it is not
 * part of the wheel.
 *
 * What it models
 *   - "Device memory" is a POSIX shm segment ("/tshm-fakecuda-<pid>-<16hex>",
 *     0600) mapped MAP_SHARED; cudaMalloc returns the mapping's address, so
 *     all fake device memory is host-addressable and cudaMemcpy is memmove.
 *     cudaFree unmaps and unlinks.  Only a base pointer can be freed.
 *   - CUDA IPC: cudaIpcGetMemHandle (base pointers only) writes a handle
 *     {"TSHMFAKE", creator pid, device, size, segment name}; another process
 *     cudaIpcOpenMemHandle()s it by mapping the segment, so writes are seen
 *     both ways.  Opening in the exporting process fails with 201, as real
 *     CUDA does; opening the same handle twice in one process returns the
 *     same pointer and counts references (as cuIpcOpenMemHandle does);
 *     a freed allocation or a dead exporter gives 400.
 *   - Devices: TSHM_FAKE_CUDA_DEVICES (default 1; 0 -> cudaErrorNoDevice),
 *     TSHM_FAKE_CUDA_DRIVER=none -> cudaErrorInsufficientDriver (35).  The
 *     current device is per thread.  A few attributes (compute capability
 *     9.0, 132 SMs, host-register support, PCI bus id = ordinal), a name,
 *     16 GiB per device (TSHM_FAKE_CUDA_TOTAL_MEM overrides) with free
 *     memory going down by what this process allocated on that device.
 *   - cudaHostRegister/Unregister bookkeeping: overlapping ranges (712),
 *     unknown bases (713), ranges that are not mapped, or not writable
 *     without cudaHostRegisterReadOnly (1), read from /proc/self/maps.
 *   - Fork: the first process to use the fake owns it; calls from a forked
 *     child return cudaErrorInitializationError (3), as real CUDA does after
 *     the parent initialized it.
 *   - Fault injection: TSHM_FAKE_CUDA_FAIL="cudaMemcpy=700,cudaMalloc=2"
 *     makes every call of the named functions fail with that code while set.
 *   - TSHM_FAKE_CUDA_TRACE=<file> appends "<pid> <function>" per call.
 *   - Environment variables are read on every call, so tests can flip them
 *     with os.environ / monkeypatch (not while other threads call the fake).
 *   - Counters for tests: tshm_fake_cuda_stats(), tshm_fake_cuda_pointer_kind().
 *   - A real tritonserver 2.51 (CUDA 12.6 runtime bundled, no driver on the
 *     machine) with this library LD_PRELOADed registers fake CUDA regions,
 *     refuses an oversized byte_size and runs inferences through them: for
 *     that, cudaMemcpyAsync and cudaGetDriverEntryPoint(ByVersion), which
 *     hands out fake cuMemGetAddressRange / cuGetErrorString (the section
 *     "server support" at the end).  Every other runtime call the server
 *     makes reaches its own libcudart, which fails (no driver) as before.
 *
 * What it does NOT model
 *   - Any GPU: no kernels, no real streams or events, no asynchrony (every
 *     call is complete on return), no contexts beyond "current device".
 *   - Real handle bytes, real device numbering, peer access, UVA tricks,
 *     pool/managed memory, page-locking (registration is bookkeeping only).
 *   - Uninitialized device memory (shm pages read as zero), alignment beyond
 *     the page size, memory limits other than the 16 GiB budget.
 *   - Exporter exit: real CUDA frees device memory at exit; the fake unlinks
 *     its live segments in a destructor on normal exit only (a killed test
 *     process leaves /dev/shm/tshm-fakecuda-<pid>-* behind; fake_cuda.py
 *     can remove those of dead processes).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

/* cudaError_t values used here. */
enum {
    OK = 0,
    INVALID_VALUE = 1,
    MEMORY_ALLOCATION = 2,
    INITIALIZATION = 3,
    INVALID_MEMCPY_DIRECTION = 21,
    INSUFFICIENT_DRIVER = 35,
    NO_DEVICE = 100,
    INVALID_DEVICE = 101,
    DEVICE_UNINITIALIZED = 201, /* "invalid device context" */
    INVALID_RESOURCE_HANDLE = 400,
    HOST_MEMORY_ALREADY_REGISTERED = 712,
    HOST_MEMORY_NOT_REGISTERED = 713,
    UNKNOWN = 999,
};

typedef struct fake_ipc_handle {
    char reserved[64];
} fake_ipc_handle;

/* The layout of a fake handle inside the 64 bytes. */
#define HANDLE_MAGIC "TSHMFAKE"
#define SEGMENT_PREFIX "tshm-fakecuda-"
typedef struct handle_body {
    char magic[8];
    int32_t pid;        /* creator */
    int32_t device;
    uint64_t size;
    char name[40];      /* segment name without the leading '/', NUL-terminated */
} handle_body;
_Static_assert(sizeof(handle_body) == 64, "fake IPC handle must be 64 bytes");

#define DEFAULT_TOTAL_MEM (16ULL << 30)

/* ------------------------------------------------------------------ state */

enum { KIND_ALLOC = 1, KIND_OPENED = 2, KIND_HOSTREG = 3 };

typedef struct entry {
    struct entry *next;
    int kind;
    uint8_t *base;
    size_t size;
    int device;
    long refs;            /* opened mappings: open count */
    char name[48];        /* shm name, with the leading '/' */
} entry;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static entry *entries;
static pid_t owner_pid;   /* the process that first used the fake */
static __thread int current_device;

enum {
    ST_LIVE_ALLOCS, ST_LIVE_BYTES, ST_LIVE_IPC_OPENS, ST_LIVE_HOST_REGS,
    ST_FREE_CALLS, ST_HOST_UNREGISTER_CALLS, ST_MALLOC_CALLS, ST_IPC_GET_CALLS,
    ST_IPC_OPEN_CALLS, ST_IPC_CLOSE_CALLS, ST_HOST_REGISTER_CALLS, ST_MEMCPY_CALLS,
    ST_MEMCPY_BYTES, ST_STREAM_SYNC_CALLS, ST_ERRORS,
    /* appended for streams, events and lifetimes (keep the order above) */
    ST_STREAM_CREATES, ST_EVENT_RECORDS, ST_EVENT_SYNCS, ST_EVENT_QUERIES, ST_STREAM_WAITS,
    ST_ASYNC_COPIES, ST_LEGACY_SYNCS, ST_DEVICE_SYNCS, ST_FREED_WHILE_OPEN, ST_HOST_ALLOCS,
    ST_LIVE_HOST_ALLOCS, ST_ASYNC_COPY_BYTES,
    ST_COUNT
};
static long long stats[ST_COUNT];

static int device_count(void)
{
    const char *s = getenv("TSHM_FAKE_CUDA_DEVICES");
    if (s == NULL || *s == '\0')
        return 1;
    char *end;
    long n = strtol(s, &end, 10);
    return (*end != '\0' || n < 0 || n > 64) ? 1 : (int)n;
}

static int driver_missing(void)
{
    const char *s = getenv("TSHM_FAKE_CUDA_DRIVER");
    return s != NULL && strcmp(s, "none") == 0;
}

static unsigned long long total_mem(void)
{
    const char *s = getenv("TSHM_FAKE_CUDA_TOTAL_MEM");
    if (s == NULL || *s == '\0')
        return DEFAULT_TOTAL_MEM;
    char *end;
    unsigned long long n = strtoull(s, &end, 10);
    return *end != '\0' ? DEFAULT_TOTAL_MEM : n;
}

/* TSHM_FAKE_CUDA_FAIL="cudaMemcpy=700,cudaMalloc=2": the code for `fn`, or 0. */
static int injected_failure(const char *fn)
{
    const char *s = getenv("TSHM_FAKE_CUDA_FAIL");
    size_t n = strlen(fn);
    while (s != NULL && *s != '\0') {
        if (strncmp(s, fn, n) == 0 && s[n] == '=')
            return atoi(s + n + 1);
        s = strchr(s, ',');
        if (s != NULL)
            s++;
    }
    return 0;
}

/* TSHM_FAKE_CUDA_TRACE=<file>: append "<pid> <function>" for every call. */
static void trace(const char *fn)
{
    const char *path = getenv("TSHM_FAKE_CUDA_TRACE");
    if (path == NULL || *path == '\0')
        return;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    char line[128];
    int n = snprintf(line, sizeof line, "%d %s\n", (int)getpid(), fn);
    if (n > 0 && write(fd, line, (size_t)n) < 0)
        n = 0;
    close(fd);
}

static int fail(int rc)
{
    if (rc != OK)
        __atomic_add_fetch(&stats[ST_ERRORS], 1, __ATOMIC_RELAXED);
    return rc;
}

/* The checks every "real" entry point starts with: driver, fork, devices,
 * injected failures.  Returns 0 to go on. */
static int checks(const char *fn, int need_device)
{
    if (driver_missing())
        return fail(INSUFFICIENT_DRIVER);
    pid_t me = getpid(), expected = 0;
    if (!__atomic_compare_exchange_n(&owner_pid, &expected, me, 0, __ATOMIC_SEQ_CST,
                                     __ATOMIC_SEQ_CST) && expected != me)
        return fail(INITIALIZATION);
    if (need_device && device_count() == 0)
        return fail(NO_DEVICE);
    return fail(injected_failure(fn));
}

static int enter(const char *fn, int need_device)
{
    trace(fn);
    return checks(fn, need_device);
}

#define ENTER(fn, need_device)            \
    do {                                  \
        int enter_rc = enter(fn, need_device); \
        if (enter_rc != OK)               \
            return enter_rc;              \
    } while (0)

static void stat_add(int which, long long n)
{
    __atomic_add_fetch(&stats[which], n, __ATOMIC_RELAXED);
}

/* The entry of `kind` (0: alloc or opened) containing [p, p+n), or NULL.
 * With `base_only`, p must be the entry's base.  Caller holds the lock. */
static entry *find(const void *p, size_t n, int kind, int base_only)
{
    uintptr_t a = (uintptr_t)p;
    for (entry *e = entries; e != NULL; e = e->next) {
        if (kind != 0 ? e->kind != kind : e->kind >= KIND_HOSTREG)
            continue;
        uintptr_t b = (uintptr_t)e->base;
        if (base_only ? a == b : (a >= b && a - b < e->size && n <= e->size - (a - b)))
            return e;
    }
    return NULL;
}

/* Any device entry that contains the byte at p (to tell device from host). */
static entry *find_containing(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    for (entry *e = entries; e != NULL; e = e->next) {
        uintptr_t b = (uintptr_t)e->base;
        if (e->kind < KIND_HOSTREG && a >= b && a - b < e->size)
            return e;
    }
    return NULL;
}

static void unlink_entry(entry *e)
{
    for (entry **pp = &entries; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == e) {
            *pp = e->next;
            return;
        }
    }
}

static size_t bytes_on_device(int device)
{
    size_t n = 0;
    for (entry *e = entries; e != NULL; e = e->next)
        if (e->kind == KIND_ALLOC && e->device == device)
            n += e->size;
    return n;
}

static uint64_t random64(void)
{
    uint64_t r;
    if (getrandom(&r, sizeof r, 0) == (ssize_t)sizeof r)
        return r;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    static uint64_t counter;
    return (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ULL ^ __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
}

static void prepare_fork(void) { pthread_mutex_lock(&lock); }
static void after_fork(void) { pthread_mutex_unlock(&lock); }

__attribute__((constructor)) static void fake_init(void)
{
    pthread_atfork(prepare_fork, after_fork, after_fork);
}

/* Real CUDA frees device memory when the process exits: on a normal exit,
 * unlink the names of what is still allocated (mappings die with us). */
__attribute__((destructor)) static void fake_fini(void)
{
    if (__atomic_load_n(&owner_pid, __ATOMIC_SEQ_CST) != getpid())
        return;
    if (pthread_mutex_trylock(&lock) != 0)
        return;
    for (entry *e = entries; e != NULL; e = e->next)
        if (e->kind == KIND_ALLOC)
            shm_unlink(e->name);
    pthread_mutex_unlock(&lock);
}

/* ------------------------------------------------------------ error names */

static const struct {
    int code;
    const char *name, *text;
} errors[] = {
    {OK, "cudaSuccess", "no error"},
    {INVALID_VALUE, "cudaErrorInvalidValue", "invalid argument"},
    {MEMORY_ALLOCATION, "cudaErrorMemoryAllocation", "out of memory"},
    {INITIALIZATION, "cudaErrorInitializationError", "initialization error"},
    {INVALID_MEMCPY_DIRECTION, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {INSUFFICIENT_DRIVER, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {NO_DEVICE, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {INVALID_DEVICE, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {DEVICE_UNINITIALIZED, "cudaErrorDeviceUninitialized", "invalid device context"},
    {INVALID_RESOURCE_HANDLE, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {700, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {HOST_MEMORY_ALREADY_REGISTERED, "cudaErrorHostMemoryAlreadyRegistered",
     "part or all of the requested memory range is already mapped"},
    {HOST_MEMORY_NOT_REGISTERED, "cudaErrorHostMemoryNotRegistered",
     "pointer does not correspond to a registered memory region"},
    {UNKNOWN, "cudaErrorUnknown", "unknown error"},
};

API const char *cudaGetErrorName(int error)
{
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == error)
            return errors[i].name;
    return "cudaErrorUnknown";
}

API const char *cudaGetErrorString(int error)
{
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == error)
            return errors[i].text;
    return "unknown error";
}

/* ----------------------------------------------------------- device calls */

API int cudaDriverGetVersion(int *version)
{
    if (version == NULL)
        return fail(INVALID_VALUE);
    *version = driver_missing() ? 0 : 13000;
    return OK;
}

API int cudaRuntimeGetVersion(int *version)
{
    if (version == NULL)
        return fail(INVALID_VALUE);
    *version = 13000;  /* like the real one, needs no driver */
    return OK;
}

API int cudaGetDeviceCount(int *count)
{
    if (count == NULL)
        return fail(INVALID_VALUE);
    *count = 0;
    ENTER("cudaGetDeviceCount", 1);
    *count = device_count();
    return OK;
}

API int cudaGetDevice(int *device)
{
    ENTER("cudaGetDevice", 1);
    if (device == NULL)
        return fail(INVALID_VALUE);
    *device = current_device;
    return OK;
}

API int cudaSetDevice(int device)
{
    ENTER("cudaSetDevice", 1);
    if (device < 0 || device >= device_count())
        return fail(INVALID_DEVICE);
    current_device = device;
    return OK;
}

API int cudaDeviceGetAttribute(int *value, int attr, int device)
{
    ENTER("cudaDeviceGetAttribute", 1);
    if (value == NULL)
        return fail(INVALID_VALUE);
    if (device < 0 || device >= device_count())
        return fail(INVALID_DEVICE);
    switch (attr) {
    case 16: *value = 132; return OK;        /* MultiProcessorCount */
    case 33: *value = device; return OK;     /* PciBusId */
    case 75: *value = 9; return OK;          /* ComputeCapabilityMajor */
    case 76: *value = 0; return OK;          /* ComputeCapabilityMinor */
    case 99: *value = 1; return OK;          /* HostRegisterSupported */
    case 113: *value = 1; return OK;         /* HostRegisterReadOnlySupported */
    default: return fail(INVALID_VALUE);
    }
}

static int get_properties(const char *fn, void *prop, int device)
{
    ENTER(fn, 1);
    if (prop == NULL)
        return fail(INVALID_VALUE);
    if (device < 0 || device >= device_count())
        return fail(INVALID_DEVICE);
    /* Only name[256] at offset 0: the rest of cudaDeviceProp differs
     * between versions and is left untouched. */
    memset(prop, 0, 256);
    snprintf((char *)prop, 256, "Fake CUDA device %d (tritonshm tests)", device);
    return OK;
}

API int cudaGetDeviceProperties_v2(void *prop, int device)
{
    return get_properties("cudaGetDeviceProperties_v2", prop, device);
}

API int cudaGetDeviceProperties(void *prop, int device)
{
    return get_properties("cudaGetDeviceProperties", prop, device);
}

API int cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    ENTER("cudaMemGetInfo", 1);
    if (free_bytes == NULL || total_bytes == NULL)
        return fail(INVALID_VALUE);
    unsigned long long total = total_mem();
    pthread_mutex_lock(&lock);
    size_t used = bytes_on_device(current_device);
    pthread_mutex_unlock(&lock);
    *total_bytes = (size_t)total;
    *free_bytes = used >= total ? 0 : (size_t)(total - used);
    return OK;
}

/* ----------------------------------------------------------------- memory */

API int cudaMalloc(void **ptr, size_t nbytes)
{
    ENTER("cudaMalloc", 1);
    if (ptr == NULL)
        return fail(INVALID_VALUE);
    *ptr = NULL;
    if (nbytes == 0)
        return OK;  /* as CUDA: success and a NULL pointer */
    entry *e = calloc(1, sizeof *e);
    if (e == NULL)
        return fail(MEMORY_ALLOCATION);
    e->kind = KIND_ALLOC;
    e->size = nbytes;
    e->device = current_device;

    pthread_mutex_lock(&lock);
    unsigned long long total = total_mem();
    size_t used = bytes_on_device(e->device);
    if (used > total || nbytes > total - used) {
        pthread_mutex_unlock(&lock);
        free(e);
        return fail(MEMORY_ALLOCATION);
    }
    int fd = -1;
    for (int tries = 0; fd < 0 && tries < 16; tries++) {
        snprintf(e->name, sizeof e->name, "/" SEGMENT_PREFIX "%d-%016llx", (int)getpid(),
                 (unsigned long long)random64());
        fd = shm_open(e->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0 && errno != EEXIST)
            break;
    }
    void *p = MAP_FAILED;
    if (fd >= 0) {
        if (ftruncate(fd, (off_t)nbytes) == 0)
            p = mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (p == MAP_FAILED)
            shm_unlink(e->name);
    }
    if (p == MAP_FAILED) {
        pthread_mutex_unlock(&lock);
        free(e);
        return fail(MEMORY_ALLOCATION);
    }
    e->base = p;
    e->next = entries;
    entries = e;
    stats[ST_LIVE_ALLOCS]++;
    stats[ST_LIVE_BYTES] += (long long)nbytes;
    stats[ST_MALLOC_CALLS]++;
    pthread_mutex_unlock(&lock);
    *ptr = p;
    return OK;
}

API int cudaFree(void *ptr)
{
    ENTER("cudaFree", 1);
    if (ptr == NULL)
        return OK;
    pthread_mutex_lock(&lock);
    entry *e = find(ptr, 0, KIND_ALLOC, 1);
    if (e == NULL) {
        pthread_mutex_unlock(&lock);
        return fail(INVALID_VALUE);
    }
    unlink_entry(e);
    stats[ST_LIVE_ALLOCS]--;
    stats[ST_LIVE_BYTES] -= (long long)e->size;
    stats[ST_FREE_CALLS]++;
    pthread_mutex_unlock(&lock);
    munmap(e->base, e->size);
    shm_unlink(e->name);
    free(e);
    return OK;
}

/* A device endpoint must lie inside one allocation or opened mapping. */
static int check_endpoint(const void *p, size_t n, int must_be_device)
{
    entry *e = find_containing(p);
    if (e == NULL)
        return must_be_device ? INVALID_VALUE : OK;
    return find(p, n, 0, 0) != NULL ? OK : INVALID_VALUE;
}

static int memcpy_impl(const char *fn, void *dst, const void *src, size_t nbytes, int kind)
{
    ENTER(fn, 1);
    /* cudaMemcpyKind: 0 HostToHost, 1 HostToDevice, 2 DeviceToHost,
     * 3 DeviceToDevice, 4 Default (inferred; the fake can always do it). */
    if (kind < 0 || kind > 4)
        return fail(INVALID_MEMCPY_DIRECTION);
    if (nbytes == 0)
        return OK;
    if (dst == NULL || src == NULL)
        return fail(INVALID_VALUE);
    pthread_mutex_lock(&lock);
    int rc = check_endpoint(dst, nbytes, kind == 1 || kind == 3);
    if (rc == OK)
        rc = check_endpoint(src, nbytes, kind == 2 || kind == 3);
    pthread_mutex_unlock(&lock);
    if (rc != OK)
        return fail(rc);
    memmove(dst, src, nbytes);
    stat_add(ST_MEMCPY_CALLS, 1);
    stat_add(ST_MEMCPY_BYTES, (long long)nbytes);
    return OK;
}

API int cudaMemcpy(void *dst, const void *src, size_t nbytes, int kind)
{
    return memcpy_impl("cudaMemcpy", dst, src, nbytes, kind);
}

API int cudaStreamSynchronize(void *stream)
{
    (void)stream;
    ENTER("cudaStreamSynchronize", 1);
    stat_add(ST_STREAM_SYNC_CALLS, 1);
    return OK;
}

/* -------------------------------------------------------------------- IPC */

API int cudaIpcGetMemHandle(fake_ipc_handle *handle, void *ptr)
{
    ENTER("cudaIpcGetMemHandle", 1);
    if (handle == NULL || ptr == NULL)
        return fail(INVALID_VALUE);
    handle_body body;
    memset(&body, 0, sizeof body);
    pthread_mutex_lock(&lock);
    entry *e = find(ptr, 0, KIND_ALLOC, 1);  /* only the base of our own cudaMalloc */
    if (e != NULL) {
        memcpy(body.magic, HANDLE_MAGIC, sizeof body.magic);
        body.pid = (int32_t)getpid();
        body.device = e->device;
        body.size = e->size;
        snprintf(body.name, sizeof body.name, "%s", e->name + 1);
        stats[ST_IPC_GET_CALLS]++;
    }
    pthread_mutex_unlock(&lock);
    if (e == NULL)
        return fail(INVALID_VALUE);
    memcpy(handle, &body, sizeof body);
    return OK;
}

API int cudaIpcOpenMemHandle(void **ptr, fake_ipc_handle handle, unsigned int flags)
{
    ENTER("cudaIpcOpenMemHandle", 1);
    if (ptr == NULL || flags > 1)
        return fail(INVALID_VALUE);
    *ptr = NULL;
    handle_body body;
    memcpy(&body, &handle, sizeof body);
    if (memcmp(body.magic, HANDLE_MAGIC, sizeof body.magic) != 0 ||
        memchr(body.name, '\0', sizeof body.name) == NULL ||
        strncmp(body.name, SEGMENT_PREFIX, strlen(SEGMENT_PREFIX)) != 0 ||
        strchr(body.name, '/') != NULL || body.size == 0)
        return fail(INVALID_RESOURCE_HANDLE);
    if (body.pid == (int32_t)getpid())
        return fail(DEVICE_UNINITIALIZED);
    /* The exporter is gone: real CUDA has freed its memory. */
    if (body.pid <= 0 || (kill(body.pid, 0) != 0 && errno == ESRCH))
        return fail(INVALID_RESOURCE_HANDLE);

    char name[48];
    snprintf(name, sizeof name, "/%s", body.name);
    size_t size = (size_t)body.size;

    pthread_mutex_lock(&lock);
    for (entry *e = entries; e != NULL; e = e->next) {
        if (e->kind == KIND_OPENED && strcmp(e->name, name) == 0) {
            e->refs++;
            stats[ST_LIVE_IPC_OPENS]++;
            stats[ST_IPC_OPEN_CALLS]++;
            pthread_mutex_unlock(&lock);
            *ptr = e->base;
            return OK;
        }
    }
    pthread_mutex_unlock(&lock);

    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0)
        return fail(INVALID_RESOURCE_HANDLE);  /* freed by its exporter */
    struct stat st;
    void *p = MAP_FAILED;
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size >= body.size)
        p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return fail(INVALID_RESOURCE_HANDLE);

    entry *e = calloc(1, sizeof *e);
    if (e == NULL) {
        munmap(p, size);
        return fail(MEMORY_ALLOCATION);
    }
    e->kind = KIND_OPENED;
    e->base = p;
    e->size = size;
    e->device = current_device;
    e->refs = 1;
    snprintf(e->name, sizeof e->name, "%s", name);

    pthread_mutex_lock(&lock);
    entry *twin = NULL;  /* another thread opened the same handle meanwhile */
    for (entry *t = entries; t != NULL; t = t->next)
        if (t->kind == KIND_OPENED && strcmp(t->name, name) == 0)
            twin = t;
    if (twin != NULL) {
        twin->refs++;
        *ptr = twin->base;
    } else {
        e->next = entries;
        entries = e;
        *ptr = p;
    }
    stats[ST_LIVE_IPC_OPENS]++;
    stats[ST_IPC_OPEN_CALLS]++;
    pthread_mutex_unlock(&lock);
    if (twin != NULL) {
        munmap(p, size);
        free(e);
    }
    return OK;
}

API int cudaIpcCloseMemHandle(void *ptr)
{
    ENTER("cudaIpcCloseMemHandle", 1);
    pthread_mutex_lock(&lock);
    entry *e = ptr != NULL ? find(ptr, 0, KIND_OPENED, 1) : NULL;
    if (e == NULL) {
        pthread_mutex_unlock(&lock);
        return fail(INVALID_RESOURCE_HANDLE);
    }
    stats[ST_LIVE_IPC_OPENS]--;
    stats[ST_IPC_CLOSE_CALLS]++;
    int last = --e->refs == 0;
    if (last)
        unlink_entry(e);
    pthread_mutex_unlock(&lock);
    if (last) {
        munmap(e->base, e->size);
        free(e);
    }
    return OK;
}

/* ---------------------------------------------------- host registration */

/* 0 when every page of [p, p+n) is mapped readable, and writable unless
 * `read_only` is allowed; from /proc/self/maps. */
static int check_host_range(const void *p, size_t n, int read_only_ok)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t cursor = (uintptr_t)p & ~(page - 1);
    uintptr_t end = (uintptr_t)p + n;
    if (end < (uintptr_t)p)
        return INVALID_VALUE;
    FILE *maps = fopen("/proc/self/maps", "re");
    if (maps == NULL)
        return OK;  /* cannot tell: accept */
    char line[512];
    int rc = INVALID_VALUE;
    while (fgets(line, sizeof line, maps) != NULL) {
        unsigned long lo, hi;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3)
            continue;
        if (hi <= cursor)
            continue;
        if (lo > cursor)
            break;  /* a hole */
        if (perms[0] != 'r' || (perms[1] != 'w' && !read_only_ok))
            break;
        cursor = hi;
        if (cursor >= end) {
            rc = OK;
            break;
        }
    }
    fclose(maps);
    return rc;
}

API int cudaHostRegister(void *ptr, size_t nbytes, unsigned int flags)
{
    ENTER("cudaHostRegister", 1);
    /* Portable 1, DeviceMap 2, IoMemory 4, ReadOnly 8. */
    if (ptr == NULL || nbytes == 0 || (flags & ~0xFu) != 0)
        return fail(INVALID_VALUE);
    int rc = check_host_range(ptr, nbytes, (flags & 8) != 0);
    if (rc != OK)
        return fail(rc);
    entry *e = calloc(1, sizeof *e);
    if (e == NULL)
        return fail(MEMORY_ALLOCATION);
    e->kind = KIND_HOSTREG;
    e->base = ptr;
    e->size = nbytes;
    e->device = current_device;
    uintptr_t a = (uintptr_t)ptr;
    pthread_mutex_lock(&lock);
    for (entry *o = entries; o != NULL; o = o->next) {
        uintptr_t b = (uintptr_t)o->base;
        if (o->kind == KIND_HOSTREG && a < b + o->size && b < a + nbytes) {
            pthread_mutex_unlock(&lock);
            free(e);
            return fail(HOST_MEMORY_ALREADY_REGISTERED);
        }
    }
    e->next = entries;
    entries = e;
    stats[ST_LIVE_HOST_REGS]++;
    stats[ST_HOST_REGISTER_CALLS]++;
    pthread_mutex_unlock(&lock);
    return OK;
}

API int cudaHostUnregister(void *ptr)
{
    ENTER("cudaHostUnregister", 1);
    pthread_mutex_lock(&lock);
    entry *e = find(ptr, 0, KIND_HOSTREG, 1);
    if (e != NULL) {
        unlink_entry(e);
        stats[ST_LIVE_HOST_REGS]--;
        stats[ST_HOST_UNREGISTER_CALLS]++;
    }
    pthread_mutex_unlock(&lock);
    if (e == NULL)
        return fail(HOST_MEMORY_NOT_REGISTERED);
    free(e);
    return OK;
}

/* --------------------------------------------------- test-only interface */

/* Copy up to `cap` counters into `out` (order: see fake_cuda.py STAT_NAMES);
 * returns how many the fake has. */
API int tshm_fake_cuda_stats(long long *out, int cap)
{
    pthread_mutex_lock(&lock);
    for (int i = 0; i < cap && i < ST_COUNT; i++)
        out[i] = __atomic_load_n(&stats[i], __ATOMIC_RELAXED);
    pthread_mutex_unlock(&lock);
    return ST_COUNT;
}

/* What `ptr` points into: 0 nothing known, 1 a cudaMalloc allocation,
 * 2 an IPC-opened mapping, 3 a cudaHostRegister'ed range. */
API int tshm_fake_cuda_pointer_kind(const void *ptr)
{
    int kind = 0;
    uintptr_t a = (uintptr_t)ptr;
    pthread_mutex_lock(&lock);
    for (entry *e = entries; e != NULL && kind == 0; e = e->next) {
        uintptr_t b = (uintptr_t)e->base;
        if (a >= b && a - b < e->size)
            kind = e->kind;
    }
    pthread_mutex_unlock(&lock);
    return kind;
}

/* The pid that owns the fake (first user), 0 before first use. */
API int tshm_fake_cuda_owner_pid(void)
{
    return (int)__atomic_load_n(&owner_pid, __ATOMIC_SEQ_CST);
}

/* ------------------------------------------------------- server support
 *
 * Entry points a real tritonserver (2.51, with its bundled libcudart 12.6)
 * calls when this library is LD_PRELOADed into it and a client registers
 * fake CUDA shared memory.  tritonshm itself never calls these.
 */

/* Every call is complete on return: an asynchronous copy is a copy. */
API int cudaMemcpyAsync(void *dst, const void *src, size_t nbytes, int kind, void *stream)
{
    (void)stream;
    return memcpy_impl("cudaMemcpyAsync", dst, src, nbytes, kind);
}

/* Driver API (reached through cudaGetDriverEntryPoint, never linked):
 * CUresult values and CUdeviceptr as unsigned long long. */
enum { CU_SUCCESS = 0, CU_INVALID_VALUE = 1, CU_NOT_FOUND = 500 };

/* cuMemGetAddressRange(_v2): the allocation or opened mapping containing
 * dptr; the server passes pbase == NULL. */
static int fake_cuMemGetAddressRange(unsigned long long *pbase, size_t *psize, unsigned long long dptr)
{
    if (enter("cuMemGetAddressRange", 1) != OK)
        return CU_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    entry *e = find_containing((const void *)(uintptr_t)dptr);
    if (e != NULL) {
        if (pbase != NULL)
            *pbase = (uintptr_t)e->base;
        if (psize != NULL)
            *psize = e->size;
    }
    pthread_mutex_unlock(&lock);
    return e != NULL ? CU_SUCCESS : CU_NOT_FOUND;
}

static int fake_cuGetErrorString(int result, const char **text)
{
    if (text == NULL)
        return CU_INVALID_VALUE;
    *text = result == CU_NOT_FOUND ? "named symbol not found" : cudaGetErrorString(result);
    return CU_SUCCESS;
}

static int fake_cuDevicePrimaryCtxGetState(int dev, unsigned *flags, int *active);

static int driver_entry_point(const char *fn, const char *symbol, void **func, int *status)
{
    char label[160];  /* traced as "cudaGetDriverEntryPoint:cuMemGetAddressRange" */
    snprintf(label, sizeof label, "%s:%.100s", fn, symbol != NULL ? symbol : "(null)");
    trace(label);
    int rc = checks(fn, 0);
    if (rc != OK)
        return rc;
    if (symbol == NULL || func == NULL)
        return fail(INVALID_VALUE);
    *func = NULL;
    if (strcmp(symbol, "cuMemGetAddressRange") == 0 || strcmp(symbol, "cuMemGetAddressRange_v2") == 0)
        *func = (void *)fake_cuMemGetAddressRange;
    else if (strcmp(symbol, "cuGetErrorString") == 0)
        *func = (void *)fake_cuGetErrorString;
    else if (strcmp(symbol, "cuDevicePrimaryCtxGetState") == 0)
        *func = (void *)fake_cuDevicePrimaryCtxGetState;
    if (status != NULL)
        *status = *func != NULL ? 0 : 1;  /* cudaDriverEntryPointSuccess / SymbolNotFound */
    return OK;  /* as 12.x: success, with NULL for a symbol it does not know */
}

/* cudaGetDriverEntryPoint(symbol, funcPtr, flags, driverStatus) (12.x;
 * Triton 2.51 reaches cuMemGetAddressRange through it). */
API int cudaGetDriverEntryPoint(const char *symbol, void **func, unsigned long long flags, int *status)
{
    (void)flags;
    return driver_entry_point("cudaGetDriverEntryPoint", symbol, func, status);
}

/* cudaGetDriverEntryPointByVersion (12.5+, the only one left in 13.x). */
API int cudaGetDriverEntryPointByVersion(const char *symbol, void **func, unsigned int version,
                                         unsigned long long flags, int *status)
{
    (void)version;
    (void)flags;
    return driver_entry_point("cudaGetDriverEntryPointByVersion", symbol, func, status);
}

/* ------------------------------------------------- streams, events, pinned
 *
 * (first cut: synchronous -- every call is complete on return.)
 */

#define LEGACY_STREAM ((void *)1)
#define PER_THREAD_STREAM ((void *)2)

typedef struct fake_stream {
    struct fake_stream *next;
    int device;
    unsigned flags;
} fake_stream;

typedef struct fake_event {
    struct fake_event *next;
    int device;
    unsigned flags;
} fake_event;

static fake_stream *streams;
static fake_event *events;

/* NULL, 1 and 2 are the default streams; anything else must be ours. */
static int check_stream(void *s)
{
    if (s == NULL || s == LEGACY_STREAM || s == PER_THREAD_STREAM)
        return OK;
    int rc = INVALID_RESOURCE_HANDLE;
    pthread_mutex_lock(&lock);
    for (fake_stream *x = streams; x != NULL; x = x->next)
        if ((void *)x == s)
            rc = OK;
    pthread_mutex_unlock(&lock);
    return rc;
}

static fake_event *find_event(void *e)
{
    for (fake_event *x = events; x != NULL; x = x->next)
        if ((void *)x == e)
            return x;
    return NULL;
}

API int cudaStreamCreateWithFlags(void **stream, unsigned flags)
{
    ENTER("cudaStreamCreateWithFlags", 1);
    if (stream == NULL || flags > 1)
        return fail(INVALID_VALUE);
    fake_stream *s = calloc(1, sizeof *s);
    if (s == NULL)
        return fail(MEMORY_ALLOCATION);
    s->device = current_device;
    s->flags = flags;
    pthread_mutex_lock(&lock);
    s->next = streams;
    streams = s;
    stats[ST_STREAM_CREATES]++;
    pthread_mutex_unlock(&lock);
    *stream = s;
    return OK;
}

API int cudaStreamDestroy(void *stream)
{
    ENTER("cudaStreamDestroy", 1);
    pthread_mutex_lock(&lock);
    fake_stream **pp = &streams;
    while (*pp != NULL && (void *)*pp != stream)
        pp = &(*pp)->next;
    fake_stream *s = *pp;
    if (s != NULL)
        *pp = s->next;
    pthread_mutex_unlock(&lock);
    if (s == NULL)
        return fail(INVALID_RESOURCE_HANDLE);
    free(s);
    return OK;
}

API int cudaEventCreateWithFlags(void **event, unsigned flags)
{
    ENTER("cudaEventCreateWithFlags", 1);
    if (event == NULL || flags > 7)
        return fail(INVALID_VALUE);
    fake_event *e = calloc(1, sizeof *e);
    if (e == NULL)
        return fail(MEMORY_ALLOCATION);
    e->device = current_device;
    e->flags = flags;
    pthread_mutex_lock(&lock);
    e->next = events;
    events = e;
    pthread_mutex_unlock(&lock);
    *event = e;
    return OK;
}

API int cudaEventDestroy(void *event)
{
    ENTER("cudaEventDestroy", 1);
    pthread_mutex_lock(&lock);
    fake_event **pp = &events;
    while (*pp != NULL && (void *)*pp != event)
        pp = &(*pp)->next;
    fake_event *e = *pp;
    if (e != NULL)
        *pp = e->next;
    pthread_mutex_unlock(&lock);
    if (e == NULL)
        return fail(INVALID_RESOURCE_HANDLE);
    free(e);
    return OK;
}

API int cudaEventRecord(void *event, void *stream)
{
    ENTER("cudaEventRecord", 1);
    int rc = check_stream(stream);
    if (rc != OK)
        return fail(rc);
    pthread_mutex_lock(&lock);
    fake_event *e = find_event(event);
    if (e != NULL)
        stats[ST_EVENT_RECORDS]++;
    pthread_mutex_unlock(&lock);
    return e != NULL ? OK : fail(INVALID_RESOURCE_HANDLE);
}

static int event_call(const char *fn, void *event, int stat)
{
    ENTER(fn, 1);
    pthread_mutex_lock(&lock);
    fake_event *e = find_event(event);
    if (e != NULL)
        stats[stat]++;
    pthread_mutex_unlock(&lock);
    return e != NULL ? OK : fail(INVALID_RESOURCE_HANDLE);
}

API int cudaEventQuery(void *event)
{
    return event_call("cudaEventQuery", event, ST_EVENT_QUERIES);
}

API int cudaEventSynchronize(void *event)
{
    return event_call("cudaEventSynchronize", event, ST_EVENT_SYNCS);
}

API int cudaStreamWaitEvent(void *stream, void *event, unsigned flags)
{
    ENTER("cudaStreamWaitEvent", 1);
    int rc = check_stream(stream);
    if (rc != OK)
        return fail(rc);
    if (flags > 1)
        return fail(INVALID_VALUE);
    return event_call("cudaStreamWaitEvent", event, ST_STREAM_WAITS);
}

API int cudaDeviceSynchronize(void)
{
    ENTER("cudaDeviceSynchronize", 1);
    stat_add(ST_DEVICE_SYNCS, 1);
    return OK;
}

API int cudaHostAlloc(void **ptr, size_t nbytes, unsigned flags)
{
    ENTER("cudaHostAlloc", 1);
    if (ptr == NULL || flags > 0xF)
        return fail(INVALID_VALUE);
    *ptr = NULL;
    void *p = mmap(NULL, nbytes ? nbytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return fail(MEMORY_ALLOCATION);
    entry *e = calloc(1, sizeof *e);
    if (e == NULL) {
        munmap(p, nbytes ? nbytes : 1);
        return fail(MEMORY_ALLOCATION);
    }
    e->kind = 4;
    e->base = p;
    e->size = nbytes ? nbytes : 1;
    e->device = current_device;
    pthread_mutex_lock(&lock);
    e->next = entries;
    entries = e;
    stats[ST_HOST_ALLOCS]++;
    stats[ST_LIVE_HOST_ALLOCS]++;
    pthread_mutex_unlock(&lock);
    *ptr = p;
    return OK;
}

API int cudaFreeHost(void *ptr)
{
    ENTER("cudaFreeHost", 1);
    if (ptr == NULL)
        return OK;
    pthread_mutex_lock(&lock);
    entry *e = find(ptr, 0, 4, 1);
    if (e != NULL) {
        unlink_entry(e);
        stats[ST_LIVE_HOST_ALLOCS]--;
    }
    pthread_mutex_unlock(&lock);
    if (e == NULL)
        return fail(INVALID_VALUE);
    munmap(e->base, e->size);
    free(e);
    return OK;
}

/* --------------------------------------------------- test-only additions */

API int tshm_fake_cuda_kernel_write(void *stream, void *dst, const void *src, size_t n)
{
    ENTER("tshm_fake_cuda_kernel_write", 1);
    int rc = check_stream(stream);
    if (rc != OK)
        return fail(rc);
    if (n == 0)
        return OK;
    pthread_mutex_lock(&lock);
    rc = dst != NULL && src != NULL && find(dst, n, 0, 0) != NULL ? OK : INVALID_VALUE;
    pthread_mutex_unlock(&lock);
    if (rc != OK)
        return fail(rc);
    memmove(dst, src, n);
    return OK;
}

static unsigned long long contexts;

API unsigned long long tshm_fake_cuda_contexts(void)
{
    return __atomic_load_n(&contexts, __ATOMIC_SEQ_CST);
}

API void tshm_fake_cuda_reset_contexts(void)
{
    __atomic_store_n(&contexts, 0, __ATOMIC_SEQ_CST);
}

API long long tshm_fake_cuda_pending(void)
{
    return 0;
}

static int fake_cuDevicePrimaryCtxGetState(int dev, unsigned *flags, int *active)
{
    if (flags == NULL || active == NULL)
        return CU_INVALID_VALUE;
    if (dev < 0 || dev >= device_count())
        return INVALID_DEVICE;
    *flags = 0;
    *active = (int)((tshm_fake_cuda_contexts() >> dev) & 1);
    return CU_SUCCESS;
}
