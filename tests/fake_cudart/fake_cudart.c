/*
 * ======================================================================
 *  FAKE CUDA RUNTIME -- FOR TESTS ONLY.  NOT CUDA.  NEVER SHIP THIS.
 * ======================================================================
 *
 * A tiny shared library that exports a handful of libcudart entry points
 * with their real signatures (written with plain C types: cudaError_t is
 * int, streams and events are void *, cudaIpcMemHandle_t is 64 bytes passed
 * by value), so that tritonshm's CUDA layer -- which dlopen()s libcudart and
 * resolves exactly these symbols -- can be tested on machines without a GPU.
 * It is built by tests/fake_cuda.py into a cache directory at test time; it
 * is not part of the wheel.
 *
 * It is ADVERSARIAL on purpose: where CUDA leaves a result undefined until
 * something synchronizes, the fake shows the old bytes, so code that forgets
 * an event or a stream sync fails in CI instead of on a customer's GPU.
 *
 * What it models
 *   - "Device memory" is a POSIX shm segment ("/tshm-fakecuda-<pid>-<16hex>",
 *     0600) mapped MAP_SHARED; cudaMalloc returns the mapping's address, so
 *     all fake device memory is host-addressable (tests read it directly:
 *     that is what "the GPU holds now").  cudaFree unmaps and unlinks.  Only
 *     a base pointer can be freed.  The segment has one extra page after the
 *     data: the table of processes that have it open through IPC.
 *   - Asynchrony.  Every stream has a FIFO of queued operations (copies,
 *     test-only "kernel writes", event marks, waits).  NOTHING queued lands
 *     (touches its destination) until something synchronizes it:
 *     cudaStreamSynchronize of its stream, cudaEventSynchronize of an event
 *     recorded after it, cudaEventQuery/cudaStreamQuery (the FIRST query of
 *     unfinished work answers 600 cudaErrorNotReady, the next one lands it:
 *     progress, without letting a caller that never polls pass; an event
 *     recorded with nothing unfinished before it is complete at once),
 *     cudaDeviceSynchronize, an implicitly synchronizing call (cudaFree,
 *     cudaFreeHost, cudaHostUnregister, cudaIpcCloseMemHandle land all
 *     work), or a later op that depends on it being landed.  Until then
 *     every reader -- this process's host code, the server process -- sees
 *     the OLD bytes.
 *       cudaMemcpyAsync: every source -- pageable host memory too -- is
 *     read when the copy lands, so reusing (or freeing) a source before the
 *     copy is known complete is caught.  CUDA only says that a copy from
 *     pageable memory "might be synchronous" (the driver may stage it): the
 *     caller must keep it until the copy lands, as for pinned memory.  The
 *     destination is written when it lands, pageable host memory included.
 *       cudaMemcpy (legacy default stream), per CUDA's "API synchronization
 *     behavior": device->host, host->host and pinned host->device are
 *     complete on return (after what they depend on); pageable host->device
 *     (source staged at call time) and device->device are only queued.
 *   - Streams: NULL and 1 are the legacy default stream of the current
 *     device, 2 its per-thread default stream (one per thread and device);
 *     any other handle must come from cudaStreamCreateWithFlags (else 400).
 *     Legacy semantics: an op on the legacy stream first depends on all
 *     queued work of every *blocking* stream of its device (per-thread
 *     default streams are blocking), and later work on blocking streams
 *     depends on it.  cudaStreamNonBlocking streams have no implicit
 *     ordering with it.  Streams and events belong to the device current at
 *     creation; recording an event on a stream of another device, or a
 *     kernel write on a stream of another device, gives 400 (copies, waits
 *     and syncs across devices are allowed, as in CUDA).  cudaStreamWaitEvent
 *     makes the stream's later ops depend on the event's recorded point.
 *   - TSHM_FAKE_CUDA_SYNC=1: every op lands as soon as it is queued (the
 *     old, kind behaviour).  fake_cuda.server_env() sets it for a
 *     tritonserver (a stand-in, not under test).
 *   - Devices: TSHM_FAKE_CUDA_DEVICES (default 1; 0 -> cudaErrorNoDevice),
 *     TSHM_FAKE_CUDA_DRIVER=none -> cudaErrorInsufficientDriver (35).  The
 *     current device is per thread.  A few attributes (compute capability
 *     9.0, 132 SMs, host-register support, read-only host-register support
 *     113 unless TSHM_FAKE_CUDA_NO_READONLY_REGISTER=1, PCI bus id =
 *     ordinal), a name, 16 GiB per device (TSHM_FAKE_CUDA_TOTAL_MEM
 *     overrides) with free memory going down by what this process allocated
 *     on that device.
 *   - Contexts: one "has a primary context" flag per device.  cudaSetDevice(d)
 *     creates d's (CUDA 12 semantics); every call that works on memory,
 *     streams or events creates the current device's; device queries
 *     (count, current, attributes, properties, versions, error names) do
 *     not.  cuDevicePrimaryCtxGetState reports it; tests read the whole set
 *     with tshm_fake_cuda_contexts().
 *   - CUDA IPC: cudaIpcGetMemHandle (base pointers only) writes a handle
 *     {"TSHMFAKE", creator pid, device, size, segment name}; another process
 *     cudaIpcOpenMemHandle()s it by mapping the segment, so writes that have
 *     landed are seen both ways.  Opening in the exporting process fails
 *     with 201, as real CUDA does; opening the same handle twice in one
 *     process returns the same pointer and counts references (as
 *     cuIpcOpenMemHandle does); a freed allocation or a dead exporter gives
 *     400.  A new allocation at the base of a freed one that this process
 *     still has open (the exporter freed it while registered) gives 208
 *     cudaErrorAlreadyMapped until the old mapping is closed, as seen on an
 *     H200 (Triton answers "invalid args").  An opening process writes its pid into the segment's table until
 *     its last close.  cudaFree of an allocation that a live process still
 *     has open -- undefined behaviour in CUDA, the server may read freed or
 *     reused memory -- counts stat freed_while_open and fills the memory
 *     with 0xDB before unmapping, so the opener sees garbage.
 *   - Pinned host memory: cudaHostAlloc (an anonymous mapping) / cudaFreeHost;
 *     cudaHostRegister/Unregister bookkeeping: overlapping ranges (712),
 *     unknown bases (713), ranges that are not mapped, or not writable
 *     without cudaHostRegisterReadOnly (1), read from /proc/self/maps;
 *     cudaHostRegisterReadOnly where attribute 113 is 0: 801.
 *   - Fork: the first process to use the fake owns it; calls from a forked
 *     child return cudaErrorInitializationError (3), as real CUDA does after
 *     the parent initialized it.
 *   - The last error: every runtime call that fails records its error as
 *     the calling thread's last error (per thread, as in CUDA), until
 *     cudaGetLastError returns and clears it (cudaPeekAtLastError returns
 *     it and leaves it).  cudaErrorNotReady (600) from a query is not an
 *     error and records nothing; the driver entry points handed out below
 *     (cuMemGetAddressRange, cuPointerGetAttribute, ...) never touch it, as
 *     the driver API has no last error.  This is what a library sharing the
 *     process's runtime sees: torch calls cudaGetLastError after every
 *     kernel launch (C10_CUDA_KERNEL_LAUNCH_CHECK), so a failure tritonshm
 *     expected and handled but left recorded surfaces as the caller's next
 *     torch op failing ("CUDA error: invalid argument"); the torch-like
 *     double (tests/fake_producers.py) checks it the same way.
 *   - Allocation ids: every device allocation (cudaMalloc, pool, managed)
 *     and every IPC-opened mapping gets a new id from one counter, never
 *     reused in the process's life; the fake cuPointerGetAttribute answers
 *     it for CU_POINTER_ATTRIBUTE_BUFFER_ID (7), as the driver does (a new
 *     allocation at a freed one's base has a new id).
 *     TSHM_FAKE_CUDA_NO_BUFFER_ID=1: it answers CUDA_ERROR_NOT_SUPPORTED.
 *   - Fault injection: TSHM_FAKE_CUDA_FAIL="cudaMemcpy=700,cudaMalloc=2"
 *     makes every call of the named functions fail with that code while set.
 *   - TSHM_FAKE_CUDA_TRACE=<file> appends "<pid> <function>" per call.
 *   - Environment variables are read on every call, so tests can flip them
 *     with os.environ / monkeypatch (not while other threads call the fake).
 *   - Thread-safe: one mutex around all state; a "sync" does its landing
 *     under it (nothing ever really waits).
 *   - For tests: tshm_fake_cuda_stats() (counters: calls, syncs of each
 *     kind, freed_while_open, async copies with a pageable end, ...; the
 *     names are in fake_cuda.py), tshm_fake_cuda_calls() (calls per entry
 *     point, in two books: the code under test's, and those a thread made
 *     after tshm_fake_cuda_foreign(1) -- a test's torch/cupy double),
 *     tshm_fake_cuda_pointer_kind(),
 *     tshm_fake_cuda_kernel_write() (a "kernel" on a stream: writes dst from
 *     a snapshot of src when it lands), tshm_fake_cuda_contexts() /
 *     tshm_fake_cuda_reset_contexts(), tshm_fake_cuda_pending() (copies and
 *     kernel writes queued, not landed), tshm_fake_cuda_discard_pending()
 *     (drop them: a test's teardown).
 *   - A real tritonserver 2.51 (CUDA 12.6 runtime bundled, no driver on the
 *     machine) with this library LD_PRELOADed registers fake CUDA regions,
 *     refuses an oversized byte_size and runs inferences through them: for
 *     that, cudaMemcpyAsync and cudaGetDriverEntryPoint(ByVersion), which
 *     hands out fake cuMemGetAddressRange / cuGetErrorString (the section
 *     "server support" at the end; cuPointerGetAttribute and
 *     cuDevicePrimaryCtxGetState there are tritonshm's).  The server reaches every entry point
 *     above too (it syncs streams, allocates its pinned pool with
 *     cudaHostAlloc: fake_cuda.server_env makes that fail, as it did before
 *     the fake had it); every other runtime call it makes reaches its own
 *     libcudart, which fails (no driver).
 *
 * What it does NOT model
 *   - Any GPU: no kernels (only kernel_write), no concurrency between
 *     streams (ops land in an order the dependencies allow, when a sync asks
 *     for them), no timing (cudaEventElapsedTime is not exported), no graph
 *     capture, no stream priorities or callbacks (cudaLaunchHostFunc).
 *   - Errors from the device (sticky errors that no cudaGetLastError
 *     clears, illegal addresses, errors of asynchronous launches): an op whose
 *     memory is unmapped by the time it lands is dropped and counted
 *     (lost_ops); memory that was freed but is still mapped (a pageable
 *     buffer back in malloc's pool) is written anyway, as a GPU would.
 *   - Real handle bytes, real device numbering, peer access, UVA tricks,
 *     pool/managed memory, page-locking (registration is bookkeeping only).
 *   - Uninitialized device memory (shm pages read as zero), alignment beyond
 *     the page size, memory limits other than the 16 GiB budget.
 *   - cudaMemcpyAsync of device->pageable memory: CUDA returns only after
 *     the copy; the fake keeps it queued until a sync (stricter).
 *   - Exporter exit: real CUDA frees device memory at exit; the fake unlinks
 *     its live segments in a destructor on normal exit only (a killed test
 *     process leaves /dev/shm/tshm-fakecuda-<pid>-* behind; fake_cuda.py
 *     can remove those of dead processes).  Per-thread default streams of
 *     exited threads, destroyed streams and their events' targets are kept
 *     (small) so that no recorded point ever dangles.
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
    ALREADY_MAPPED = 208,
    INVALID_RESOURCE_HANDLE = 400,
    NOT_READY = 600,
    HOST_MEMORY_ALREADY_REGISTERED = 712,
    HOST_MEMORY_NOT_REGISTERED = 713,
    NOT_SUPPORTED = 801,
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
#define MAX_DEVICES 64   /* TSHM_FAKE_CUDA_DEVICES is capped there; one bit each */

/* ------------------------------------------------------------------ state */

enum { KIND_ALLOC = 1, KIND_OPENED = 2, KIND_HOSTREG = 3, KIND_HOSTALLOC = 4 };

/* Device memory (ours, or opened through IPC) vs pinned host memory. */
static int is_device_kind(int kind) { return kind == KIND_ALLOC || kind == KIND_OPENED; }
static int is_pinned_kind(int kind) { return kind == KIND_HOSTREG || kind == KIND_HOSTALLOC; }

typedef struct entry {
    struct entry *next;
    int kind;
    uint8_t *base;
    size_t size;          /* usable bytes */
    size_t map_size;      /* bytes mapped: alloc/opened add the open table page */
    int device;
    long refs;            /* opened mappings: open count in this process */
    int32_t *open_slot;   /* opened mappings: our pid's slot in the open table */
    int32_t exporter_pid; /* opened mappings: the process that allocated it ... */
    uint64_t exporter_base;  /* ... and where it is in that process */
    int no_ipc;           /* pool or managed memory: cudaIpcGetMemHandle refuses it */
    unsigned long long buffer_id;  /* CU_POINTER_ATTRIBUTE_BUFFER_ID: unique over the process's life */
    char name[48];        /* shm name, with the leading '/' */
} entry;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static entry *entries;
static pid_t owner_pid;   /* the process that first used the fake */
/* This process's pid, read once per process: every entry point checks it (CUDA after a fork
 * fails), and getpid() is a system call -- CUDA makes none per call.  A forked child reads it
 * again (after_fork_child). */
static pid_t self_pid;

static pid_t my_pid(void)
{
    pid_t pid = __atomic_load_n(&self_pid, __ATOMIC_RELAXED);
    if (pid == 0) {
        pid = getpid();
        __atomic_store_n(&self_pid, pid, __ATOMIC_RELAXED);
    }
    return pid;
}
static __thread int current_device;
static __thread int last_error;      /* cudaGetLastError's: the thread's last failure */
static unsigned long long last_buffer_id;  /* ids handed out so far (under the lock) */
static unsigned long long contexts;  /* bit d: device d has a primary context */

enum {
    ST_LIVE_ALLOCS, ST_LIVE_BYTES, ST_LIVE_IPC_OPENS, ST_LIVE_HOST_REGS,
    ST_FREE_CALLS, ST_HOST_UNREGISTER_CALLS, ST_MALLOC_CALLS, ST_IPC_GET_CALLS,
    ST_IPC_OPEN_CALLS, ST_IPC_CLOSE_CALLS, ST_HOST_REGISTER_CALLS, ST_MEMCPY_CALLS,
    ST_MEMCPY_BYTES, ST_STREAM_SYNC_CALLS, ST_ERRORS,
    /* appended for streams, events and lifetimes (keep the order above) */
    ST_STREAM_CREATES, ST_EVENT_RECORDS, ST_EVENT_SYNCS, ST_EVENT_QUERIES, ST_STREAM_WAITS,
    ST_ASYNC_COPIES, ST_LEGACY_SYNCS, ST_DEVICE_SYNCS, ST_FREED_WHILE_OPEN, ST_HOST_ALLOCS,
    ST_LIVE_HOST_ALLOCS, ST_ASYNC_COPY_BYTES, ST_PAGEABLE_ASYNC_COPIES, ST_LOST_OPS,
    /* appended for the last error and refused exports */
    ST_IPC_GET_REFUSALS, ST_LAST_ERROR_CLEARS,
    ST_COUNT
};
static long long stats[ST_COUNT];

static int env_flag(const char *name)
{
    const char *s = getenv(name);
    return s != NULL && strcmp(s, "1") == 0;
}

static int device_count(void)
{
    const char *s = getenv("TSHM_FAKE_CUDA_DEVICES");
    if (s == NULL || *s == '\0')
        return 1;
    char *end;
    long n = strtol(s, &end, 10);
    return (*end != '\0' || n < 0 || n > MAX_DEVICES) ? 1 : (int)n;
}

static int driver_missing(void)
{
    const char *s = getenv("TSHM_FAKE_CUDA_DRIVER");
    return s != NULL && strcmp(s, "none") == 0;
}

/* TSHM_FAKE_CUDA_SYNC=1: ops land as soon as they are queued. */
static int sync_mode(void) { return env_flag("TSHM_FAKE_CUDA_SYNC"); }

static int readonly_register_supported(void) { return !env_flag("TSHM_FAKE_CUDA_NO_READONLY_REGISTER"); }

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

/* Calls per entry point in this process, by name: every call that reaches trace() (successful
 * or not), in one of two books -- the code under test's, or, while the calling thread says so
 * (tshm_fake_cuda_foreign), a test's producer double's (torch's or cupy's own calls, which a
 * budget of tritonshm's calls leaves out).  Names are copied (a driver entry point's label is
 * made on the stack). */
#define MAX_COUNTED 128
static struct { char fn[64]; long long n[2]; } call_counts[MAX_COUNTED];
static int n_counted;
static pthread_mutex_t count_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int foreign_calls;

static void count_call(const char *fn)
{
    int book = foreign_calls ? 1 : 0;
    pthread_mutex_lock(&count_lock);
    int i = 0;
    while (i < n_counted && strncmp(call_counts[i].fn, fn, sizeof call_counts[i].fn - 1) != 0)
        i++;
    if (i == n_counted && n_counted < MAX_COUNTED)
        snprintf(call_counts[n_counted++].fn, sizeof call_counts[i].fn, "%s", fn);
    if (i < n_counted)
        call_counts[i].n[book]++;
    pthread_mutex_unlock(&count_lock);
}

/* TSHM_FAKE_CUDA_TRACE=<file>: append "<pid> <function>" for every call. */
static void trace(const char *fn)
{
    count_call(fn);
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

/* Count an error (any entry point, driver ones too). */
static int counted(int rc)
{
    if (rc != OK)
        __atomic_add_fetch(&stats[ST_ERRORS], 1, __ATOMIC_RELAXED);
    return rc;
}

/* Every runtime entry point's errors go through here: counted, and
 * recorded as the thread's last error -- except 600 from a query, which
 * is an answer, not an error (CUDA records nothing for it either). */
static int fail(int rc)
{
    if (rc != OK && rc != NOT_READY)
        last_error = rc;
    return rc == NOT_READY ? rc : counted(rc);
}

/* The checks every "real" entry point starts with: driver, fork, devices,
 * injected failures.  Returns 0 to go on; nothing recorded or counted. */
static int check_state(const char *fn, int need_device)
{
    if (driver_missing())
        return INSUFFICIENT_DRIVER;
    pid_t me = my_pid(), expected = 0;
    if (!__atomic_compare_exchange_n(&owner_pid, &expected, me, 0, __ATOMIC_SEQ_CST,
                                     __ATOMIC_SEQ_CST) && expected != me)
        return INITIALIZATION;
    if (need_device && device_count() == 0)
        return NO_DEVICE;
    return injected_failure(fn);
}

/* For runtime entry points: a failed check is the thread's last error. */
static int checks(const char *fn, int need_device)
{
    return fail(check_state(fn, need_device));
}

static int enter(const char *fn, int need_device)
{
    trace(fn);
    return checks(fn, need_device);
}

/* For the driver entry points: the driver API has no last error. */
static int driver_enter(const char *fn, int need_device)
{
    trace(fn);
    return counted(check_state(fn, need_device));
}

static void create_context(int device)
{
    if (device >= 0 && device < MAX_DEVICES)
        __atomic_or_fetch(&contexts, 1ULL << device, __ATOMIC_SEQ_CST);
}

#define ENTER(fn, need_device)            \
    do {                                  \
        int enter_rc = enter(fn, need_device); \
        if (enter_rc != OK)               \
            return enter_rc;              \
    } while (0)

/* ENTER for calls that work on memory, streams or events: like the real
 * runtime, they create the current device's primary context. */
#define ENTER_CTX(fn)                     \
    do {                                  \
        ENTER(fn, 1);                     \
        create_context(current_device);   \
    } while (0)

/* The entry of `kind` (0: any device kind) containing [p, p+n), or NULL.
 * With `base_only`, p must be the entry's base.  Caller holds the lock. */
static entry *find(const void *p, size_t n, int kind, int base_only)
{
    uintptr_t a = (uintptr_t)p;
    for (entry *e = entries; e != NULL; e = e->next) {
        if (kind != 0 ? e->kind != kind : !is_device_kind(e->kind))
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
        if (is_device_kind(e->kind) && a >= b && a - b < e->size)
            return e;
    }
    return NULL;
}

/* Is all of [p, p+n) inside one pinned (allocated or registered) host range? */
static int is_pinned(const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    for (entry *e = entries; e != NULL; e = e->next) {
        uintptr_t b = (uintptr_t)e->base;
        if (is_pinned_kind(e->kind) && a >= b && a - b < e->size && n <= e->size - (a - b))
            return 1;
    }
    return 0;
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

/* ------------------------------------------------- the IPC open table
 *
 * A device segment is [data, rounded up to a page][one page: the exporter's
 * base address (8 bytes), then int32 pids].  The base lets an opener see a
 * new allocation at an address it still maps (cudaErrorAlreadyMapped).
 * A process that opens the segment through IPC claims a slot with its pid
 * (atomically: the page is shared by every process that maps it) and clears
 * it at its last close, so the exporter's cudaFree can tell that someone
 * still reads the memory.  Slots of dead processes do not count: real CUDA
 * closes a process's IPC mappings when it exits.
 */

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

static size_t data_span(size_t n)
{
    size_t page = page_size();
    return (n + page - 1) / page * page;
}

static size_t segment_size(size_t n) { return data_span(n) + page_size(); }

/* The exporter's base address, at the head of the page after the data. */
static uint64_t *exporter_base_of(const entry *e) { return (uint64_t *)(e->base + data_span(e->size)); }

static int32_t *open_table(const entry *e) { return (int32_t *)(exporter_base_of(e) + 1); }

static size_t open_table_slots(void) { return (page_size() - sizeof(uint64_t)) / sizeof(int32_t); }

static int32_t *claim_open_slot(entry *e)
{
    int32_t *table = open_table(e), me = (int32_t)getpid();
    for (size_t i = 0; i < open_table_slots(); i++) {
        int32_t expected = 0;
        if (__atomic_compare_exchange_n(&table[i], &expected, me, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
            return &table[i];
    }
    return NULL;  /* full: this open goes unseen (never in practice) */
}

/* How many live processes other than us have the allocation open. */
static int live_openers(const entry *e)
{
    const int32_t *table = open_table(e);
    int n = 0;
    for (size_t i = 0; i < open_table_slots(); i++) {
        int32_t pid = __atomic_load_n(&table[i], __ATOMIC_SEQ_CST);
        if (pid > 0 && pid != (int32_t)getpid() && (kill(pid, 0) == 0 || errno == EPERM))
            n++;
    }
    return n;
}

/* ---------------------------------------------------- streams and landing
 *
 * Every op gets a ticket from one process-wide counter, so "everything
 * stream s had queued when X happened" is the point (s, ticket).  An op
 * lands only after the ops before it on its stream and after the points it
 * depends on (a waited event, the legacy stream's implicit barrier).  A
 * dependency always points at an earlier ticket, so landing terminates.
 */

enum { STREAM_LEGACY, STREAM_BLOCKING, STREAM_NON_BLOCKING };

#define LEGACY_HANDLE ((void *)1)
#define PER_THREAD_HANDLE ((void *)2)

struct fake_stream;

typedef struct point {
    struct fake_stream *stream;
    uint64_t ticket;
} point;

typedef struct op {
    struct op *next;
    uint64_t ticket;
    uint8_t *dst;           /* NULL: a mark (event record, wait, sync barrier) */
    const uint8_t *src;     /* read when it lands (device or pinned source) ... */
    uint8_t *snapshot;      /* ... or the source as it was when queued */
    size_t n;
    int ndeps;
    point deps[];           /* land these first */
} op;

typedef struct fake_stream {
    struct fake_stream *next;
    int device;
    int kind;               /* STREAM_* */
    int user;               /* made by cudaStreamCreateWithFlags: a valid handle */
    int destroyed;          /* cudaStreamDestroy'ed (or its thread exited) */
    int polled;             /* cudaStreamQuery answered 600 for the current tail */
    op *head, *tail;
} fake_stream;

typedef struct fake_event {
    struct fake_event *next;
    int device;
    unsigned flags;
    point at;               /* stream NULL: never recorded */
    int polled;             /* cudaEventQuery answered 600 for this record */
} fake_event;

static fake_stream *streams;       /* every stream with a use: live, or destroyed with work left */
static fake_stream *graveyard;     /* destroyed and empty: kept so no point dangles */
static fake_stream *legacy_streams[MAX_DEVICES];
static fake_event *events;
static uint64_t last_ticket;
static long long pending_ops;      /* copies and kernel writes queued, not landed */

/* Per-thread default streams ((void *)2), one per device, released at thread exit. */
typedef struct thread_streams {
    fake_stream *of_device[MAX_DEVICES];
} thread_streams;
static __thread thread_streams *my_streams;
static pthread_key_t thread_key;

static fake_stream *new_stream(int device, int kind, int user)
{
    fake_stream *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    s->device = device;
    s->kind = kind;
    s->user = user;
    s->next = streams;
    streams = s;
    return s;
}

/* Destroyed streams whose work has all landed move to the graveyard. */
static void reap_streams(void)
{
    fake_stream **pp = &streams;
    while (*pp != NULL) {
        fake_stream *s = *pp;
        if (s->destroyed && s->head == NULL) {
            *pp = s->next;
            s->next = graveyard;
            graveyard = s;
        } else {
            pp = &s->next;
        }
    }
}

static void release_thread_streams(void *p)
{
    thread_streams *ts = p;
    my_streams = NULL;  /* a later destructor's call on this thread starts afresh */
    pthread_mutex_lock(&lock);
    for (int d = 0; d < MAX_DEVICES; d++)
        if (ts->of_device[d] != NULL)
            ts->of_device[d]->destroyed = 1;  /* its queued work still lands */
    reap_streams();
    pthread_mutex_unlock(&lock);
    free(ts);
}

/* The stream a handle names, on the current device for the default ones.
 * Caller holds the lock. */
static int resolve_stream(void *handle, fake_stream **out)
{
    int d = current_device;
    *out = NULL;
    if (handle == NULL || handle == LEGACY_HANDLE) {
        if (legacy_streams[d] == NULL)
            legacy_streams[d] = new_stream(d, STREAM_LEGACY, 0);
        *out = legacy_streams[d];
        return *out != NULL ? OK : MEMORY_ALLOCATION;
    }
    if (handle == PER_THREAD_HANDLE) {
        if (my_streams == NULL) {
            my_streams = calloc(1, sizeof *my_streams);
            if (my_streams == NULL)
                return MEMORY_ALLOCATION;
            pthread_setspecific(thread_key, my_streams);
        }
        if (my_streams->of_device[d] == NULL)  /* blocking: it syncs with the legacy stream */
            my_streams->of_device[d] = new_stream(d, STREAM_BLOCKING, 0);
        *out = my_streams->of_device[d];
        return *out != NULL ? OK : MEMORY_ALLOCATION;
    }
    for (fake_stream *s = streams; s != NULL; s = s->next) {
        if ((void *)s == handle && s->user && !s->destroyed) {
            *out = s;
            return OK;
        }
    }
    return INVALID_RESOURCE_HANDLE;
}

static fake_event *find_event(const void *handle)
{
    for (fake_event *e = events; e != NULL; e = e->next)
        if ((const void *)e == handle)
            return e;
    return NULL;
}

static int has_landed(point p)
{
    return p.stream == NULL || p.stream->head == NULL || p.stream->head->ticket > p.ticket;
}

/* Is every page of [p, p+n) mapped?  msync fails with ENOMEM for a hole.
 * Landing checks: a GPU writing unmapped (freed) memory is a fault, not a
 * crash of the test process at some later sync. */
static int is_mapped(const void *p, size_t n)
{
    uintptr_t page = (uintptr_t)page_size();
    uintptr_t lo = (uintptr_t)p & ~(page - 1), hi = (uintptr_t)p + n;
    return msync((void *)lo, hi - lo, MS_ASYNC) == 0 || errno != ENOMEM;
}

/* Drop the marks at the head of s whose dependencies have landed: a mark
 * with nothing unfinished before it is complete at once (an event recorded
 * on an idle stream is done, as on a GPU).  One level only: a mark that
 * waits for another stream's mark stays until a sync or query lands it.
 * Caller holds the lock. */
static void settle(fake_stream *s)
{
    while (s->head != NULL && s->head->dst == NULL) {
        op *o = s->head;
        for (int i = 0; i < o->ndeps; i++)
            if (!has_landed(o->deps[i]))
                return;
        s->head = o->next;
        if (s->head == NULL)
            s->tail = NULL;
        free(o);
    }
}

/* Land every op of s up to ticket t, dependencies first.  Caller holds the lock. */
static void land(fake_stream *s, uint64_t t)
{
    while (s->head != NULL && s->head->ticket <= t) {
        op *o = s->head;
        for (int i = 0; i < o->ndeps; i++)
            land(o->deps[i].stream, o->deps[i].ticket);  /* earlier tickets: never o itself */
        s->head = o->next;
        if (s->head == NULL)
            s->tail = NULL;
        if (o->dst != NULL) {
            const void *from = o->snapshot != NULL ? o->snapshot : o->src;
            if (is_mapped(o->dst, o->n) && is_mapped(from, o->n))
                memmove(o->dst, from, o->n);
            else
                stats[ST_LOST_OPS]++;  /* the caller unmapped memory with work queued on it */
            pending_ops--;
        }
        free(o->snapshot);
        free(o);
    }
}

static void land_stream(fake_stream *s) { land(s, UINT64_MAX); }

/* Land all work of one device (-1: of every device).  Caller holds the lock. */
static void land_device(int device)
{
    for (fake_stream *s = streams; s != NULL; s = s->next)
        if (device < 0 || s->device == device)
            land_stream(s);
    reap_streams();
}

/* Queue an op on s: a copy of n bytes to dst (from src when it lands, or
 * from `snapshot`, which it takes over), or a mark (dst NULL), after `wait`
 * if given and after what the legacy-stream rules order before it.
 * Returns its ticket, 0 when out of memory.  Caller holds the lock. */
static uint64_t enqueue(fake_stream *s, void *dst, const void *src, uint8_t *snapshot, size_t n,
                        const point *wait)
{
    fake_stream *legacy = legacy_streams[s->device];
    int ndeps = wait != NULL && !has_landed(*wait);
    if (s->kind == STREAM_LEGACY) {
        for (fake_stream *x = streams; x != NULL; x = x->next)
            ndeps += x->kind == STREAM_BLOCKING && x->device == s->device && x->tail != NULL;
    } else if (s->kind == STREAM_BLOCKING) {
        ndeps += legacy != NULL && legacy->tail != NULL;
    }
    op *o = calloc(1, sizeof *o + (size_t)ndeps * sizeof(point));
    if (o == NULL) {
        free(snapshot);
        return 0;
    }
    int i = 0;
    if (wait != NULL && !has_landed(*wait))
        o->deps[i++] = *wait;
    if (s->kind == STREAM_LEGACY) {  /* after all queued work of the device's blocking streams */
        for (fake_stream *x = streams; x != NULL; x = x->next)
            if (x->kind == STREAM_BLOCKING && x->device == s->device && x->tail != NULL)
                o->deps[i++] = (point){x, x->tail->ticket};
    } else if (s->kind == STREAM_BLOCKING && legacy != NULL && legacy->tail != NULL) {
        o->deps[i++] = (point){legacy, legacy->tail->ticket};  /* after the legacy stream's */
    }
    o->ndeps = i;
    o->ticket = ++last_ticket;
    o->dst = dst;
    o->src = src;
    o->snapshot = snapshot;
    o->n = n;
    if (s->tail != NULL)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
    s->polled = 0;
    if (dst != NULL)
        pending_ops++;
    uint64_t t = o->ticket;
    settle(s);  /* o may be gone now (a mark with nothing before it): t stays valid */
    if (sync_mode())
        land(s, t);
    return t;
}

/* A copy of [p, p+n) made now (what CUDA does with pageable sources). */
static uint8_t *snapshot_of(const void *p, size_t n)
{
    uint8_t *copy = malloc(n);
    if (copy != NULL)
        memcpy(copy, p, n);
    return copy;
}

/* Synchronize s: everything it has queued, and for the legacy stream
 * everything the device's blocking streams queued before (a barrier).
 * Caller holds the lock. */
static int sync_stream(fake_stream *s)
{
    if (s->kind == STREAM_LEGACY) {
        uint64_t t = enqueue(s, NULL, NULL, NULL, 0, NULL);
        if (t == 0)
            return MEMORY_ALLOCATION;
        land(s, t);
        stats[ST_LEGACY_SYNCS]++;
    } else {
        land_stream(s);
    }
    reap_streams();
    return OK;
}

static void prepare_fork(void) { pthread_mutex_lock(&lock); }
static void after_fork(void) { pthread_mutex_unlock(&lock); }
static void after_fork_child(void)
{
    __atomic_store_n(&self_pid, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&lock);
}

__attribute__((constructor)) static void fake_init(void)
{
    pthread_atfork(prepare_fork, after_fork, after_fork_child);
    pthread_key_create(&thread_key, release_thread_streams);
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
    {ALREADY_MAPPED, "cudaErrorAlreadyMapped", "resource already mapped"},
    {INVALID_RESOURCE_HANDLE, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {NOT_READY, "cudaErrorNotReady", "device not ready"},
    {700, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {HOST_MEMORY_ALREADY_REGISTERED, "cudaErrorHostMemoryAlreadyRegistered",
     "part or all of the requested memory range is already mapped"},
    {HOST_MEMORY_NOT_REGISTERED, "cudaErrorHostMemoryNotRegistered",
     "pointer does not correspond to a registered memory region"},
    {NOT_SUPPORTED, "cudaErrorNotSupported", "operation not supported"},
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

/* ------------------------------------------------------------- last error */

/* The thread's last error, cleared (what torch calls after every launch). */
API int cudaGetLastError(void)
{
    trace("cudaGetLastError");
    int rc = last_error;
    last_error = OK;
    if (rc != OK)
        __atomic_add_fetch(&stats[ST_LAST_ERROR_CLEARS], 1, __ATOMIC_RELAXED);
    return rc;
}

/* The thread's last error, left as it is. */
API int cudaPeekAtLastError(void)
{
    trace("cudaPeekAtLastError");
    return last_error;
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

/* CUDA 12: setting a device initializes its primary context. */
API int cudaSetDevice(int device)
{
    ENTER("cudaSetDevice", 1);
    if (device < 0 || device >= device_count())
        return fail(INVALID_DEVICE);
    current_device = device;
    create_context(device);
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
    case 113: *value = readonly_register_supported(); return OK;  /* HostRegisterReadOnlySupported */
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
    ENTER_CTX("cudaMemGetInfo");
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

/* Wait for all work of the current device. */
API int cudaDeviceSynchronize(void)
{
    ENTER_CTX("cudaDeviceSynchronize");
    pthread_mutex_lock(&lock);
    land_device(current_device);
    stats[ST_DEVICE_SYNCS]++;
    pthread_mutex_unlock(&lock);
    return OK;
}

/* ----------------------------------------------------------------- memory */

/* The bases of the last device allocations freed, by mapped size: a new
 * allocation of the same size is mapped there again when it can be, as
 * real CUDA often hands the same address out again -- with a new IPC
 * handle (a new segment), which is what a consumer caching registrations
 * by address must notice. */
#define REUSE_SLOTS 16
static struct { void *base; size_t map_size; } freed_bases[REUSE_SLOTS];
static int freed_next;  /* where the next freed base goes (a ring, newest last) */

/* The most recently freed base of that size (as an allocator reuses what it just let go of). */
static void *reuse_hint(size_t map_size)
{
    for (int k = 1; k <= REUSE_SLOTS; k++) {
        int i = (freed_next - k + REUSE_SLOTS) % REUSE_SLOTS;
        if (freed_bases[i].base != NULL && freed_bases[i].map_size == map_size) {
            void *hint = freed_bases[i].base;
            freed_bases[i].base = NULL;
            return hint;
        }
    }
    return NULL;
}

static void remember_freed(void *base, size_t map_size)
{
    freed_bases[freed_next].base = base;
    freed_bases[freed_next].map_size = map_size;
    freed_next = (freed_next + 1) % REUSE_SLOTS;
}

/* A device allocation of `nbytes` on the current device: a new segment,
 * mapped at a freed allocation's old base when one of the same size is
 * free.  `no_ipc`: pool or managed memory, which CUDA IPC cannot export. */
static int device_alloc(void **ptr, size_t nbytes, int no_ipc)
{
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
    e->map_size = segment_size(nbytes);  /* + the IPC open table */
    e->device = current_device;
    e->no_ipc = no_ipc;

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
        if (ftruncate(fd, (off_t)e->map_size) == 0) {
            void *hint = reuse_hint(e->map_size);
            if (hint != NULL)
                p = mmap(hint, e->map_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
            if (p != MAP_FAILED && p != hint) {  /* a kernel without MAP_FIXED_NOREPLACE: anywhere is fine */
                munmap(p, e->map_size);
                p = MAP_FAILED;
            }
            if (p == MAP_FAILED)
                p = mmap(NULL, e->map_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        }
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
    *exporter_base_of(e) = (uint64_t)(uintptr_t)p;
    e->buffer_id = ++last_buffer_id;
    e->next = entries;
    entries = e;
    stats[ST_LIVE_ALLOCS]++;
    stats[ST_LIVE_BYTES] += (long long)nbytes;
    stats[ST_MALLOC_CALLS]++;
    pthread_mutex_unlock(&lock);
    *ptr = p;
    return OK;
}

API int cudaMalloc(void **ptr, size_t nbytes)
{
    ENTER_CTX("cudaMalloc");
    return device_alloc(ptr, nbytes, 0);
}

/* Stream-ordered pool memory: cuMemGetAddressRange knows it, CUDA IPC
 * refuses it (cudaIpcGetMemHandle: invalid value), as torch's
 * backend:cudaMallocAsync and expandable segments give.  The fake allocates
 * at once (no stream order) and frees through cudaFree's path. */
API int cudaMallocAsync(void **ptr, size_t nbytes, void *stream)
{
    ENTER_CTX("cudaMallocAsync");
    (void)stream;
    return device_alloc(ptr, nbytes, 1);
}

/* Managed memory: likewise not exportable by CUDA IPC. */
API int cudaMallocManaged(void **ptr, size_t nbytes, unsigned int flags)
{
    ENTER_CTX("cudaMallocManaged");
    (void)flags;
    return device_alloc(ptr, nbytes, 1);
}

/* cudaFree synchronizes (the fake lands the work of every device, so no
 * queued op can write into the unmapped range); freeing what another live
 * process has open is counted and poisoned. */
API int cudaFree(void *ptr)
{
    ENTER_CTX("cudaFree");
    if (ptr == NULL)
        return OK;
    pthread_mutex_lock(&lock);
    entry *e = find(ptr, 0, KIND_ALLOC, 1);
    if (e == NULL) {
        pthread_mutex_unlock(&lock);
        return fail(INVALID_VALUE);
    }
    land_device(-1);
    unlink_entry(e);
    stats[ST_LIVE_ALLOCS]--;
    stats[ST_LIVE_BYTES] -= (long long)e->size;
    stats[ST_FREE_CALLS]++;
    int poisoned = live_openers(e) > 0;
    if (poisoned)
        stats[ST_FREED_WHILE_OPEN]++;
    pthread_mutex_unlock(&lock);
    if (poisoned)
        memset(e->base, 0xDB, e->size);  /* what the opener reads from now on */
    munmap(e->base, e->map_size);
    shm_unlink(e->name);
    pthread_mutex_lock(&lock);
    remember_freed(e->base, e->map_size);
    pthread_mutex_unlock(&lock);
    free(e);
    return OK;
}

API int cudaFreeAsync(void *ptr, void *stream)
{
    (void)stream;
    return cudaFree(ptr);
}

/* ----------------------------------------------------------------- copies */

enum { AT_PAGEABLE, AT_PINNED, AT_DEVICE };

/* Where [p, p+n) lives; a device range must lie inside one allocation or
 * opened mapping.  Caller holds the lock. */
static int locate(const void *p, size_t n, int *at)
{
    if (find_containing(p) != NULL) {
        *at = AT_DEVICE;
        return find(p, n, 0, 0) != NULL ? OK : INVALID_VALUE;
    }
    *at = is_pinned(p, n) ? AT_PINNED : AT_PAGEABLE;
    return OK;
}

/* Check a copy's arguments; on success, where its ends live.  Caller holds the lock. */
static int check_copy(void *dst, const void *src, size_t nbytes, int kind, int *dst_at, int *src_at)
{
    /* cudaMemcpyKind: 0 HostToHost, 1 HostToDevice, 2 DeviceToHost,
     * 3 DeviceToDevice, 4 Default (inferred; the fake can always do it).
     * Pointers that do not match the kind are undefined behaviour in CUDA:
     * refused here, each end checked against its side of the kind. */
    int rc = locate(dst, nbytes, dst_at);
    if (rc == OK)
        rc = locate(src, nbytes, src_at);
    if (rc == OK && kind != 4) {
        int dst_device = kind == 1 || kind == 3, src_device = kind == 2 || kind == 3;
        if ((*dst_at == AT_DEVICE) != dst_device || (*src_at == AT_DEVICE) != src_device)
            rc = INVALID_VALUE;
    }
    return rc;
}

/* cudaMemcpy: on the legacy default stream.  Per CUDA's "API
 * synchronization behavior": pageable host->device returns once the source
 * is staged, device->device does not synchronize at all (both stay queued);
 * pinned host->device, device->host and host->host are complete on return. */
API int cudaMemcpy(void *dst, const void *src, size_t nbytes, int kind)
{
    ENTER_CTX("cudaMemcpy");
    if (kind < 0 || kind > 4)
        return fail(INVALID_MEMCPY_DIRECTION);
    if (nbytes == 0)
        return OK;
    if (dst == NULL || src == NULL)
        return fail(INVALID_VALUE);
    pthread_mutex_lock(&lock);
    int dst_at = AT_PAGEABLE, src_at = AT_PAGEABLE;
    fake_stream *s = NULL;
    int rc = check_copy(dst, src, nbytes, kind, &dst_at, &src_at);
    if (rc == OK)
        rc = resolve_stream(LEGACY_HANDLE, &s);
    uint8_t *snapshot = NULL;
    if (rc == OK && src_at == AT_PAGEABLE && (snapshot = snapshot_of(src, nbytes)) == NULL)
        rc = MEMORY_ALLOCATION;
    uint64_t t = 0;
    if (rc == OK && (t = enqueue(s, dst, src, snapshot, nbytes, NULL)) == 0)
        rc = MEMORY_ALLOCATION;
    if (rc == OK) {
        int queued_only = dst_at == AT_DEVICE && src_at != AT_PINNED;
        if (!queued_only) {
            land(s, t);
            stats[ST_LEGACY_SYNCS]++;
        }
        stats[ST_MEMCPY_CALLS]++;
        stats[ST_MEMCPY_BYTES] += (long long)nbytes;
    }
    pthread_mutex_unlock(&lock);
    return fail(rc);
}

/* Queued on `stream`; the source is read (and the destination written) when
 * the copy lands, a pageable source too (CUDA may stage it now, or not). */
API int cudaMemcpyAsync(void *dst, const void *src, size_t nbytes, int kind, void *stream)
{
    ENTER_CTX("cudaMemcpyAsync");
    if (kind < 0 || kind > 4)
        return fail(INVALID_MEMCPY_DIRECTION);
    pthread_mutex_lock(&lock);
    fake_stream *s = NULL;
    int rc = resolve_stream(stream, &s);  /* a stream of another device is fine for copies */
    int dst_at = AT_PAGEABLE, src_at = AT_PAGEABLE;
    if (rc == OK && nbytes > 0) {
        if (dst == NULL || src == NULL)
            rc = INVALID_VALUE;
        if (rc == OK)
            rc = check_copy(dst, src, nbytes, kind, &dst_at, &src_at);
        if (rc == OK && enqueue(s, dst, src, NULL, nbytes, NULL) == 0)
            rc = MEMORY_ALLOCATION;
        if (rc == OK) {
            stats[ST_ASYNC_COPIES]++;
            stats[ST_ASYNC_COPY_BYTES] += (long long)nbytes;
            if (src_at == AT_PAGEABLE || dst_at == AT_PAGEABLE)
                stats[ST_PAGEABLE_ASYNC_COPIES]++;  /* slow on a GPU: not staged through pinned memory */
        }
    }
    pthread_mutex_unlock(&lock);
    return fail(rc);
}

/* ---------------------------------------------------------------- streams */

API int cudaStreamCreateWithFlags(void **stream, unsigned flags)
{
    ENTER_CTX("cudaStreamCreateWithFlags");
    if (stream == NULL || flags > 1)  /* cudaStreamDefault 0, cudaStreamNonBlocking 1 */
        return fail(INVALID_VALUE);
    pthread_mutex_lock(&lock);
    fake_stream *s = new_stream(current_device, flags ? STREAM_NON_BLOCKING : STREAM_BLOCKING, 1);
    if (s != NULL)
        stats[ST_STREAM_CREATES]++;
    pthread_mutex_unlock(&lock);
    if (s == NULL)
        return fail(MEMORY_ALLOCATION);
    *stream = s;
    return OK;
}

/* As CUDA: returns at once; work already queued still lands later. */
API int cudaStreamDestroy(void *stream)
{
    ENTER_CTX("cudaStreamDestroy");
    pthread_mutex_lock(&lock);
    fake_stream *s = NULL;
    int rc = INVALID_RESOURCE_HANDLE;  /* the default streams cannot be destroyed */
    if (stream != NULL && stream != LEGACY_HANDLE && stream != PER_THREAD_HANDLE)
        rc = resolve_stream(stream, &s);
    if (rc == OK) {
        s->destroyed = 1;
        reap_streams();
    }
    pthread_mutex_unlock(&lock);
    return fail(rc);
}

API int cudaStreamSynchronize(void *stream)
{
    ENTER_CTX("cudaStreamSynchronize");
    pthread_mutex_lock(&lock);
    fake_stream *s = NULL;
    int rc = resolve_stream(stream, &s);
    if (rc == OK)
        rc = sync_stream(s);
    stats[ST_STREAM_SYNC_CALLS]++;
    pthread_mutex_unlock(&lock);
    return fail(rc);
}

/* 600 the first time the stream has unlanded work; the next query lands it. */
API int cudaStreamQuery(void *stream)
{
    ENTER_CTX("cudaStreamQuery");
    pthread_mutex_lock(&lock);
    fake_stream *s = NULL;
    int rc = resolve_stream(stream, &s);
    if (rc == OK)
        settle(s);
    if (rc == OK && s->tail != NULL) {
        if (!s->polled) {
            s->polled = 1;
            rc = NOT_READY;
        } else {
            land_stream(s);
            reap_streams();
        }
    }
    pthread_mutex_unlock(&lock);
    return rc == NOT_READY ? rc : fail(rc);
}

/* Later ops of `stream` wait for what the event's record covered. */
API int cudaStreamWaitEvent(void *stream, void *event, unsigned flags)
{
    ENTER_CTX("cudaStreamWaitEvent");
    if (flags > 1)  /* cudaEventWaitDefault 0, cudaEventWaitExternal 1 */
        return fail(INVALID_VALUE);
    pthread_mutex_lock(&lock);
    fake_stream *s = NULL;
    int rc = resolve_stream(stream, &s);  /* the event may be of another device */
    fake_event *e = rc == OK ? find_event(event) : NULL;
    if (rc == OK && e == NULL)
        rc = INVALID_RESOURCE_HANDLE;
    if (rc == OK && !has_landed(e->at) && enqueue(s, NULL, NULL, NULL, 0, &e->at) == 0)
        rc = MEMORY_ALLOCATION;
    if (rc == OK)
        stats[ST_STREAM_WAITS]++;
    pthread_mutex_unlock(&lock);
    return fail(rc);
}

/* ----------------------------------------------------------------- events */

API int cudaEventCreateWithFlags(void **event, unsigned flags)
{
    ENTER_CTX("cudaEventCreateWithFlags");
    /* Default 0, BlockingSync 1, DisableTiming 2, Interprocess 4 (which CUDA
     * takes only with DisableTiming) */
    if (event == NULL || flags > 7 || ((flags & 4) && !(flags & 2)))
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
    ENTER_CTX("cudaEventDestroy");
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
    free(e);  /* ops depend on points, never on events: nothing dangles */
    return OK;
}

/* The event now stands for everything `stream` has queued (a mark op, so
 * the legacy stream's implicit barrier is part of it). */
API int cudaEventRecord(void *event, void *stream)
{
    ENTER_CTX("cudaEventRecord");
    pthread_mutex_lock(&lock);
    fake_stream *s = NULL;
    int rc = resolve_stream(stream, &s);
    fake_event *e = rc == OK ? find_event(event) : NULL;
    if (rc == OK && (e == NULL || e->device != s->device))
        rc = INVALID_RESOURCE_HANDLE;
    uint64_t t = 0;
    if (rc == OK && (t = enqueue(s, NULL, NULL, NULL, 0, NULL)) == 0)
        rc = MEMORY_ALLOCATION;
    if (rc == OK) {
        e->at = (point){s, t};
        e->polled = 0;
        stats[ST_EVENT_RECORDS]++;
    }
    pthread_mutex_unlock(&lock);
    return fail(rc);
}

/* 0 when the recorded work has landed (or nothing was recorded); 600 the
 * first time it has not; the next query lands it and answers 0. */
API int cudaEventQuery(void *event)
{
    ENTER_CTX("cudaEventQuery");
    pthread_mutex_lock(&lock);
    fake_event *e = find_event(event);
    int rc = e != NULL ? OK : INVALID_RESOURCE_HANDLE;
    if (e != NULL) {
        stats[ST_EVENT_QUERIES]++;
        if (e->at.stream != NULL)
            settle(e->at.stream);
        if (!has_landed(e->at)) {
            if (!e->polled) {
                e->polled = 1;
                rc = NOT_READY;
            } else {
                land(e->at.stream, e->at.ticket);
                reap_streams();
            }
        }
    }
    pthread_mutex_unlock(&lock);
    return rc == NOT_READY ? rc : fail(rc);
}

API int cudaEventSynchronize(void *event)
{
    ENTER_CTX("cudaEventSynchronize");
    pthread_mutex_lock(&lock);
    fake_event *e = find_event(event);
    if (e != NULL) {
        if (!has_landed(e->at)) {
            land(e->at.stream, e->at.ticket);
            reap_streams();
        }
        stats[ST_EVENT_SYNCS]++;
    }
    pthread_mutex_unlock(&lock);
    return e != NULL ? OK : fail(INVALID_RESOURCE_HANDLE);
}

/* -------------------------------------------------------------------- IPC */

API int cudaIpcGetMemHandle(fake_ipc_handle *handle, void *ptr)
{
    ENTER_CTX("cudaIpcGetMemHandle");
    if (handle == NULL || ptr == NULL)
        return fail(INVALID_VALUE);
    handle_body body;
    memset(&body, 0, sizeof body);
    pthread_mutex_lock(&lock);
    entry *e = find(ptr, 0, KIND_ALLOC, 1);  /* only the base of our own cudaMalloc */
    if (e != NULL && e->no_ipc)
        e = NULL;  /* pool or managed memory: CUDA IPC cannot export it */
    if (e != NULL) {
        memcpy(body.magic, HANDLE_MAGIC, sizeof body.magic);
        body.pid = (int32_t)getpid();
        body.device = e->device;
        body.size = e->size;
        snprintf(body.name, sizeof body.name, "%s", e->name + 1);
        stats[ST_IPC_GET_CALLS]++;
    } else {
        stats[ST_IPC_GET_REFUSALS]++;
    }
    pthread_mutex_unlock(&lock);
    if (e == NULL)
        return fail(INVALID_VALUE);
    memcpy(handle, &body, sizeof body);
    return OK;
}

API int cudaIpcOpenMemHandle(void **ptr, fake_ipc_handle handle, unsigned int flags)
{
    ENTER_CTX("cudaIpcOpenMemHandle");
    if (ptr == NULL || flags > 1)
        return fail(INVALID_VALUE);
    *ptr = NULL;
    handle_body body;
    memcpy(&body, &handle, sizeof body);
    if (memcmp(body.magic, HANDLE_MAGIC, sizeof body.magic) != 0 ||
        memchr(body.name, '\0', sizeof body.name) == NULL ||
        strncmp(body.name, SEGMENT_PREFIX, strlen(SEGMENT_PREFIX)) != 0 ||
        strchr(body.name, '/') != NULL || body.size == 0 || body.size > (1ULL << 48))
        return fail(INVALID_RESOURCE_HANDLE);
    if (body.pid == (int32_t)getpid())
        return fail(DEVICE_UNINITIALIZED);
    /* The exporter is gone: real CUDA has freed its memory. */
    if (body.pid <= 0 || (kill(body.pid, 0) != 0 && errno == ESRCH))
        return fail(INVALID_RESOURCE_HANDLE);

    char name[48];
    snprintf(name, sizeof name, "/%s", body.name);
    size_t size = (size_t)body.size, map_size = segment_size(size);

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
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size >= map_size)
        p = mmap(NULL, map_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return fail(INVALID_RESOURCE_HANDLE);

    entry *e = calloc(1, sizeof *e);
    if (e == NULL) {
        munmap(p, map_size);
        return fail(MEMORY_ALLOCATION);
    }
    e->kind = KIND_OPENED;
    e->base = p;
    e->size = size;
    e->map_size = map_size;
    e->device = current_device;
    e->refs = 1;
    e->exporter_pid = body.pid;
    e->exporter_base = *exporter_base_of(e);
    snprintf(e->name, sizeof e->name, "%s", name);

    pthread_mutex_lock(&lock);
    entry *twin = NULL;  /* another thread opened the same handle meanwhile */
    for (entry *t = entries; t != NULL; t = t->next) {
        if (t->kind != KIND_OPENED)
            continue;
        if (strcmp(t->name, name) == 0) {
            twin = t;
        } else if (t->exporter_pid == e->exporter_pid && t->exporter_base == e->exporter_base) {
            /* A new allocation where one we still map was: the exporter freed that one while
             * we had it open, and CUDA refuses the new one until the old mapping is closed. */
            pthread_mutex_unlock(&lock);
            munmap(p, map_size);
            free(e);
            return fail(ALREADY_MAPPED);
        }
    }
    if (twin != NULL) {
        twin->refs++;
        *ptr = twin->base;
    } else {
        e->open_slot = claim_open_slot(e);  /* the exporter's cudaFree sees us now */
        e->buffer_id = ++last_buffer_id;
        e->next = entries;
        entries = e;
        *ptr = p;
    }
    stats[ST_LIVE_IPC_OPENS]++;
    stats[ST_IPC_OPEN_CALLS]++;
    pthread_mutex_unlock(&lock);
    if (twin != NULL) {
        munmap(p, map_size);
        free(e);
    }
    return OK;
}

API int cudaIpcCloseMemHandle(void *ptr)
{
    ENTER_CTX("cudaIpcCloseMemHandle");
    pthread_mutex_lock(&lock);
    entry *e = ptr != NULL ? find(ptr, 0, KIND_OPENED, 1) : NULL;
    if (e == NULL) {
        pthread_mutex_unlock(&lock);
        return fail(INVALID_RESOURCE_HANDLE);
    }
    stats[ST_LIVE_IPC_OPENS]--;
    stats[ST_IPC_CLOSE_CALLS]++;
    int last = --e->refs == 0;
    if (last) {
        land_device(-1);  /* nothing queued may write into the mapping once it is gone */
        unlink_entry(e);
        if (e->open_slot != NULL)
            __atomic_store_n(e->open_slot, 0, __ATOMIC_SEQ_CST);
    }
    pthread_mutex_unlock(&lock);
    if (last) {
        munmap(e->base, e->map_size);
        free(e);
    }
    return OK;
}

/* ------------------------------------------------------- pinned host memory */

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
    ENTER_CTX("cudaHostRegister");
    /* Portable 1, DeviceMap 2, IoMemory 4, ReadOnly 8. */
    if (ptr == NULL || nbytes == 0 || (flags & ~0xFu) != 0)
        return fail(INVALID_VALUE);
    if ((flags & 8) != 0 && !readonly_register_supported())
        return fail(NOT_SUPPORTED);  /* attribute 113 says so: callers must ask first */
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
        if (is_pinned_kind(o->kind) && a < b + o->size && b < a + nbytes) {  /* cudaHostAlloc'ed too */
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

/* Unpinning waits for the copies that read or write the range (the fake:
 * for all work), so no queued copy touches memory its owner may unmap next. */
API int cudaHostUnregister(void *ptr)
{
    ENTER_CTX("cudaHostUnregister");
    pthread_mutex_lock(&lock);
    entry *e = find(ptr, 0, KIND_HOSTREG, 1);
    if (e != NULL) {
        land_device(-1);
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

/* Pinned host memory of the current device's context: an anonymous mapping. */
API int cudaHostAlloc(void **ptr, size_t nbytes, unsigned flags)
{
    ENTER_CTX("cudaHostAlloc");
    /* Default 0, Portable 1, Mapped 2, WriteCombined 4 */
    if (ptr == NULL || flags > 7)
        return fail(INVALID_VALUE);
    *ptr = NULL;
    if (nbytes == 0)
        return OK;
    void *p = mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return fail(MEMORY_ALLOCATION);
    entry *e = calloc(1, sizeof *e);
    if (e == NULL) {
        munmap(p, nbytes);
        return fail(MEMORY_ALLOCATION);
    }
    e->kind = KIND_HOSTALLOC;
    e->base = p;
    e->size = e->map_size = nbytes;
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

/* Synchronizes, as CUDA's cudaFreeHost does (the fake: all work). */
API int cudaFreeHost(void *ptr)
{
    ENTER_CTX("cudaFreeHost");
    if (ptr == NULL)
        return OK;
    pthread_mutex_lock(&lock);
    entry *e = find(ptr, 0, KIND_HOSTALLOC, 1);
    if (e != NULL) {
        land_device(-1);
        unlink_entry(e);
        stats[ST_LIVE_HOST_ALLOCS]--;
    }
    pthread_mutex_unlock(&lock);
    if (e == NULL)
        return fail(INVALID_VALUE);
    munmap(e->base, e->map_size);
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

/* The calls counted per entry point (count_call): up to `cap` of them, their names in `names`,
 * the code under test's counts in `ours` and the producer doubles' in `foreign`; returns how
 * many entry points were called so far. */
API int tshm_fake_cuda_calls(const char **names, long long *ours, long long *foreign, int cap)
{
    pthread_mutex_lock(&count_lock);
    int n = n_counted;
    for (int i = 0; i < cap && i < n; i++) {
        names[i] = call_counts[i].fn;
        ours[i] = call_counts[i].n[0];
        foreign[i] = call_counts[i].n[1];
    }
    pthread_mutex_unlock(&count_lock);
    return n;
}

/* From now on, this thread's calls go in the producer doubles' book (`on`), or the code under
 * test's; returns the previous setting. */
API int tshm_fake_cuda_foreign(int on)
{
    int previous = foreign_calls;
    foreign_calls = on != 0;
    return previous;
}

/* What `ptr` points into: 0 nothing known, 1 a cudaMalloc allocation,
 * 2 an IPC-opened mapping, 3 a cudaHostRegister'ed range, 4 cudaHostAlloc'ed. */
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

/* A "kernel" on `stream`: writes n bytes of device memory at dst from a
 * snapshot of src taken now, when it lands (what torch's copy_/fill_ is to
 * the fake).  Like a launch, the stream must belong to the current device. */
API int tshm_fake_cuda_kernel_write(void *stream, void *dst, const void *src, size_t n)
{
    ENTER_CTX("tshm_fake_cuda_kernel_write");
    if (n == 0)
        return OK;
    if (dst == NULL || src == NULL)
        return fail(INVALID_VALUE);
    pthread_mutex_lock(&lock);
    fake_stream *s = NULL;
    int rc = resolve_stream(stream, &s);
    if (rc == OK && s->device != current_device)
        rc = INVALID_RESOURCE_HANDLE;
    if (rc == OK && find(dst, n, 0, 0) == NULL)
        rc = INVALID_VALUE;
    uint8_t *snapshot = NULL;
    if (rc == OK && (snapshot = snapshot_of(src, n)) == NULL)
        rc = MEMORY_ALLOCATION;
    if (rc == OK && enqueue(s, dst, NULL, snapshot, n, NULL) == 0)
        rc = MEMORY_ALLOCATION;
    pthread_mutex_unlock(&lock);
    return fail(rc);
}

/* Bit d set: device d has a primary context in this process. */
API unsigned long long tshm_fake_cuda_contexts(void)
{
    return __atomic_load_n(&contexts, __ATOMIC_SEQ_CST);
}

/* Forget every context (as if the process had just started). */
API void tshm_fake_cuda_reset_contexts(void)
{
    __atomic_store_n(&contexts, 0, __ATOMIC_SEQ_CST);
}

/* Copies and kernel writes queued and not landed yet. */
API long long tshm_fake_cuda_pending(void)
{
    pthread_mutex_lock(&lock);
    long long n = pending_ops;
    pthread_mutex_unlock(&lock);
    return n;
}

/* Drop every queued op without landing it; returns how many copies and
 * kernel writes were dropped.  For a test's teardown: work a test left
 * queued must not land in the next test (its pageable destination may be
 * freed memory by then). */
API long long tshm_fake_cuda_discard_pending(void)
{
    pthread_mutex_lock(&lock);
    long long dropped = pending_ops;
    for (fake_stream *s = streams; s != NULL; s = s->next) {
        while (s->head != NULL) {
            op *o = s->head;
            s->head = o->next;
            free(o->snapshot);
            free(o);
        }
        s->tail = NULL;
    }
    pending_ops = 0;
    reap_streams();
    pthread_mutex_unlock(&lock);
    return dropped;
}

/* ------------------------------------------------------- server support
 *
 * Entry points a real tritonserver (2.51, with its bundled libcudart 12.6)
 * reaches through cudaGetDriverEntryPoint when this library is LD_PRELOADed
 * into it (and that tritonshm may resolve the same way).
 */

/* Driver API (reached through cudaGetDriverEntryPoint, never linked):
 * CUresult values and CUdeviceptr as unsigned long long. */
enum { CU_SUCCESS = 0, CU_INVALID_VALUE = 1, CU_INVALID_DEVICE = 101, CU_NOT_FOUND = 500, CU_NOT_SUPPORTED = 801 };
#define CU_POINTER_ATTRIBUTE_BUFFER_ID 7

/* cuMemGetAddressRange(_v2): the allocation or opened mapping containing
 * dptr; the server passes pbase == NULL. */
static int fake_cuMemGetAddressRange(unsigned long long *pbase, size_t *psize, unsigned long long dptr)
{
    if (driver_enter("cuMemGetAddressRange", 1) != OK)
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

/* cuPointerGetAttribute(data, attribute, ptr): CU_POINTER_ATTRIBUTE_BUFFER_ID
 * (7, an unsigned long long) of the allocation or opened mapping holding
 * ptr, the only attribute the fake knows (others: CUDA_ERROR_INVALID_VALUE,
 * as for a pointer it does not know).  TSHM_FAKE_CUDA_NO_BUFFER_ID=1 makes
 * it refuse (a driver without the attribute). */
static int fake_cuPointerGetAttribute(void *data, int attribute, unsigned long long ptr)
{
    int rc = driver_enter("cuPointerGetAttribute", 1);
    if (rc != OK)
        return rc;
    if (env_flag("TSHM_FAKE_CUDA_NO_BUFFER_ID"))
        return counted(CU_NOT_SUPPORTED);
    if (data == NULL || attribute != CU_POINTER_ATTRIBUTE_BUFFER_ID)
        return counted(CU_INVALID_VALUE);
    pthread_mutex_lock(&lock);
    entry *e = find_containing((const void *)(uintptr_t)ptr);
    unsigned long long id = e != NULL ? e->buffer_id : 0;
    pthread_mutex_unlock(&lock);
    if (e == NULL)
        return counted(CU_INVALID_VALUE);
    memcpy(data, &id, sizeof id);
    return CU_SUCCESS;
}

static int fake_cuGetErrorString(int result, const char **text)
{
    if (text == NULL)
        return CU_INVALID_VALUE;
    *text = result == CU_NOT_FOUND ? "named symbol not found" : cudaGetErrorString(result);
    return CU_SUCCESS;
}

/* cuDevicePrimaryCtxGetState(dev, &flags, &active): does `dev` have a
 * primary context yet?  Creates none. */
static int fake_cuDevicePrimaryCtxGetState(int dev, unsigned *flags, int *active)
{
    int rc = driver_enter("cuDevicePrimaryCtxGetState", 1);
    if (rc != OK)
        return rc;
    if (flags == NULL || active == NULL)
        return CU_INVALID_VALUE;
    if (dev < 0 || dev >= device_count())
        return CU_INVALID_DEVICE;
    *flags = 0;
    *active = (int)((tshm_fake_cuda_contexts() >> dev) & 1);
    return CU_SUCCESS;
}

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
    else if (strcmp(symbol, "cuPointerGetAttribute") == 0)
        *func = (void *)fake_cuPointerGetAttribute;
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
