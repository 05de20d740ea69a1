"""Build and drive the FAKE CUDA runtime used by the tests (tests/fake_cudart/).

The fake is a small C library exporting the libcudart entry points that
tritonshm resolves, with "device memory" backed by POSIX shm segments named
``/tshm-fakecuda-<pid>-<16hex>``; see the comment at the top of
``fake_cudart/fake_cudart.c`` for what it models.  It is built at test time
with the system C compiler and never shipped.

This module needs neither a GPU nor tritonshm: only a C compiler and ctypes.

* :func:`build_fake_cudart` compiles it once per source version into a cache
  directory and returns the path of the ``.so`` (point ``TRITONSHM_CUDART``
  or tritonshm's test hook at it, or ``LD_PRELOAD`` it into a tritonserver).
* :class:`FakeCudart` loads that path with ctypes.  ``dlopen`` of the same
  path returns the already loaded instance, so the counters it reads
  (:meth:`FakeCudart.stats`) are those of the copy tritonshm uses.
* :class:`FakeCudaStats` is a snapshot of the fake's counters; subtracting
  two snapshots gives what happened in between.  :meth:`FakeCudart.calls`
  counts the calls of every entry point (a :class:`FakeCudaCalls`), in two
  books: the code under test's, and the producer doubles' (their calls go
  through :meth:`FakeCudart.as_foreign`): a budget of tritonshm's CUDA calls
  per request (tests/client/test_client_cuda_budget.py) reads the first.
* The fake is asynchronous like a GPU: copies and test-only kernel writes
  (:meth:`FakeCudart.kernel_write`) queued on a stream land only when
  something synchronizes it, so :meth:`FakeCudart.read` shows the old bytes
  until then; :meth:`FakeCudart.pending` counts what is queued.  Streams and
  events are plain ints (``None``/``LEGACY_STREAM``: the legacy default stream).
* The fake keeps CUDA's per-thread *last error* (set by every failing
  runtime call): :meth:`FakeCudart.peek_last_error` reads it,
  :meth:`FakeCudart.get_last_error` reads and clears it, as torch's launch
  check does; :meth:`FakeCudart.buffer_id` is the driver's per-allocation id
  (``cuPointerGetAttribute``, ``CU_POINTER_ATTRIBUTE_BUFFER_ID``).
* :func:`server_env` is the environment that makes a real tritonserver
  (2.51) open fake handles: ``LocalServer(env=server_env(lib))``; it sets
  ``TSHM_FAKE_CUDA_SYNC=1`` (the server is a stand-in: its copies land at once).
* tests/fake_producers.py builds torch-like and cupy-like producer doubles
  on :class:`FakeCudart`.
* :func:`consume_dlpack` takes a DLPack capsule's tensor as a consumer
  (torch, cupy) does, through ctypes: how the tests hold exported device
  memory without either library; :class:`ClosingIndex` is an offset that
  closes a region while it is being converted.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import dataclasses
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "fake_cudart" / "fake_cudart.c"

#: The compiler command (without output and source); part of the cache key.
CFLAGS = ("-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-pthread")
LIBS = ("-lrt",)
#: More compiler flags, read when the fake is built (not by the fake itself): tools/asan.sh sets
#: "-fsanitize=address ..." so the fake is checked with the extensions.  A library built so loads
#: only where the ASan runtime is preloaded.
ENV_EXTRA_CFLAGS = "TSHM_FAKE_CUDA_CFLAGS"

#: Environment variables the fake reads on every call.
ENV_DEVICES = "TSHM_FAKE_CUDA_DEVICES"  # device count, default 1; "0" -> cudaErrorNoDevice
ENV_DRIVER = "TSHM_FAKE_CUDA_DRIVER"  # "none" -> cudaErrorInsufficientDriver (35)
ENV_TOTAL_MEM = "TSHM_FAKE_CUDA_TOTAL_MEM"  # bytes per device, default 16 GiB
ENV_FAIL = "TSHM_FAKE_CUDA_FAIL"  # "cudaMemcpy=700,cudaMalloc=2": fail those calls
ENV_TRACE = "TSHM_FAKE_CUDA_TRACE"  # a file: "<pid> <function>" appended per call
ENV_SYNC = "TSHM_FAKE_CUDA_SYNC"  # "1": every queued op lands on return (the old, kind behaviour)
ENV_NO_READONLY_REGISTER = "TSHM_FAKE_CUDA_NO_READONLY_REGISTER"  # "1": attribute 113 is 0
ENV_NO_BUFFER_ID = "TSHM_FAKE_CUDA_NO_BUFFER_ID"  # "1": cuPointerGetAttribute(BUFFER_ID) is not supported

SHM_DIR = "/dev/shm"
#: "tshm-fakecuda-<pid>-<hex>": the fake's segments (never "tritonshm-").
SEGMENT_NAME = re.compile(r"^tshm-fakecuda-(\d+)-[0-9a-f]+$")

# cudaError_t values the fake returns.
SUCCESS = 0
ERROR_INVALID_VALUE = 1
ERROR_MEMORY_ALLOCATION = 2
ERROR_INITIALIZATION = 3
ERROR_INVALID_MEMCPY_DIRECTION = 21
ERROR_INSUFFICIENT_DRIVER = 35
ERROR_NO_DEVICE = 100
ERROR_INVALID_DEVICE = 101
ERROR_DEVICE_UNINITIALIZED = 201  # "invalid device context" (CUDA_ERROR_INVALID_CONTEXT)
ERROR_ALREADY_MAPPED = 208  # a new allocation where a freed one this process still maps was
ERROR_INVALID_RESOURCE_HANDLE = 400
ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712
ERROR_HOST_MEMORY_NOT_REGISTERED = 713
ERROR_NOT_READY = 600  # cudaEventQuery / cudaStreamQuery: work still queued
ERROR_NOT_SUPPORTED = 801
CU_ERROR_NOT_FOUND = 500  # driver API (the fake cuMemGetAddressRange)
CU_ERROR_NOT_SUPPORTED = 801  # driver API (the fake cuPointerGetAttribute with TSHM_FAKE_CUDA_NO_BUFFER_ID=1)
CU_POINTER_ATTRIBUTE_BUFFER_ID = 7

# tshm_fake_cuda_pointer_kind() results.
KIND_UNKNOWN, KIND_ALLOC, KIND_OPENED, KIND_HOST_REGISTERED, KIND_HOST_ALLOC = 0, 1, 2, 3, 4

# Special stream handles, and flags.
LEGACY_STREAM = 1  # (NULL, 0, is the legacy default stream too)
PER_THREAD_STREAM = 2
STREAM_DEFAULT, STREAM_NON_BLOCKING = 0, 1
EVENT_DISABLE_TIMING = 2
ATTR_HOST_REGISTER_READ_ONLY_SUPPORTED = 113

MEMCPY_DEFAULT = 4


def build_fake_cudart(dest_dir: str | os.PathLike) -> Path:
    """Compile the fake into *dest_dir* (created if needed) and return its path.

    The file name carries a hash of the source and the flags, so a session
    (or several, sharing *dest_dir*) compiles each version once; the library
    is written to a temporary name and renamed, so concurrent builders never
    load a half-written file.  ``$TSHM_FAKE_CUDA_CFLAGS`` adds flags (and so
    makes another file).
    """
    source = SOURCE.read_bytes()
    cc = os.environ.get("CC") or shutil.which("cc") or "cc"
    cflags = (*CFLAGS, *shlex.split(os.environ.get(ENV_EXTRA_CFLAGS, "")))
    key = hashlib.sha256(source + repr((cc, cflags, LIBS)).encode()).hexdigest()[:16]
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    lib = dest / f"libfakecudart-{key}.so"
    if lib.exists():
        return lib
    fd, tmp = tempfile.mkstemp(prefix=".libfakecudart-", suffix=".so", dir=dest)
    os.close(fd)
    try:
        result = subprocess.run(
            [cc, *cflags, "-o", tmp, str(SOURCE), *LIBS], capture_output=True, text=True
        )
        if result.returncode != 0:
            raise RuntimeError(f"building the fake cudart failed:\n{result.stderr}")
        if result.stderr.strip():  # -Wall -Wextra: keep the fake warning-free
            raise RuntimeError(f"building the fake cudart warned:\n{result.stderr}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, lib)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


#: The counters of tshm_fake_cuda_stats(), in the fake's order.
STAT_NAMES = (
    "live_allocs",  # cudaMalloc'ed and not yet freed
    "live_bytes",  # their bytes (all devices)
    "live_ipc_opens",  # successful cudaIpcOpenMemHandle not yet closed (each open counts)
    "live_host_registrations",  # cudaHostRegister'ed ranges not yet unregistered
    "free_calls",  # successful cudaFree of a non-NULL pointer
    "host_unregister_calls",  # successful cudaHostUnregister
    "malloc_calls",  # successful cudaMalloc of > 0 bytes
    "ipc_get_calls",  # successful cudaIpcGetMemHandle
    "ipc_open_calls",  # successful cudaIpcOpenMemHandle
    "ipc_close_calls",  # successful cudaIpcCloseMemHandle
    "host_register_calls",  # successful cudaHostRegister
    "memcpy_calls",  # successful cudaMemcpy of > 0 bytes
    "memcpy_bytes",  # their bytes
    "stream_sync_calls",  # cudaStreamSynchronize
    "errors",  # calls that returned an error (any entry point)
    # appended for streams, events and lifetimes
    "stream_creates",  # successful cudaStreamCreateWithFlags
    "event_records",  # successful cudaEventRecord
    "event_syncs",  # successful cudaEventSynchronize
    "event_queries",  # cudaEventQuery answered 0 or 600
    "stream_waits",  # successful cudaStreamWaitEvent
    "async_copies",  # successful cudaMemcpyAsync of > 0 bytes
    "legacy_syncs",  # syncs of the legacy default stream, incl. the implicit one in cudaMemcpy
    "device_syncs",  # cudaDeviceSynchronize
    "freed_while_open",  # cudaFree of memory another (live) process had open through IPC
    "host_allocs",  # successful cudaHostAlloc
    "live_host_allocs",  # cudaHostAlloc'ed and not yet cudaFreeHost'ed
    "async_copy_bytes",  # bytes of the async_copies
    "pageable_async_copies",  # async_copies with an end in pageable (not pinned) host memory
    "lost_ops",  # queued ops that found their memory unmapped when they landed (dropped)
    # appended for the last error and refused exports
    "ipc_get_refusals",  # cudaIpcGetMemHandle of memory it cannot export (pool, managed, not a base)
    "last_error_clears",  # cudaGetLastError calls that found (and cleared) an error
)


@dataclasses.dataclass(frozen=True)
class FakeCudaStats:
    """A snapshot of the fake's counters; ``after - before`` gives the deltas."""

    live_allocs: int = 0
    live_bytes: int = 0
    live_ipc_opens: int = 0
    live_host_registrations: int = 0
    free_calls: int = 0
    host_unregister_calls: int = 0
    malloc_calls: int = 0
    ipc_get_calls: int = 0
    ipc_open_calls: int = 0
    ipc_close_calls: int = 0
    host_register_calls: int = 0
    memcpy_calls: int = 0
    memcpy_bytes: int = 0
    stream_sync_calls: int = 0
    errors: int = 0
    stream_creates: int = 0
    event_records: int = 0
    event_syncs: int = 0
    event_queries: int = 0
    stream_waits: int = 0
    async_copies: int = 0
    legacy_syncs: int = 0
    device_syncs: int = 0
    freed_while_open: int = 0
    host_allocs: int = 0
    live_host_allocs: int = 0
    async_copy_bytes: int = 0
    pageable_async_copies: int = 0
    lost_ops: int = 0
    ipc_get_refusals: int = 0
    last_error_clears: int = 0

    def __sub__(self, other: FakeCudaStats) -> FakeCudaStats:
        return FakeCudaStats(
            *(getattr(self, n) - getattr(other, n) for n in STAT_NAMES)
        )

    @property
    def live(self) -> tuple[int, int, int]:
        """(allocations, IPC opens, host registrations) still outstanding."""
        return (self.live_allocs, self.live_ipc_opens, self.live_host_registrations)


class FakeCudaCalls(collections.Counter):
    """Calls per entry point ("cudaGetDevice": 3, ...), a snapshot of the fake's books
    (:meth:`FakeCudart.calls`); ``after - before`` gives the calls in between (a missing name
    reads 0).  Every call counts, failed ones too; driver entry points (``cuPointerGetAttribute``)
    are counted under their own names."""

    def __sub__(self, other):  # (Counter's drops zero and negative counts; so does this)
        return FakeCudaCalls({name: n - other.get(name, 0) for name, n in self.items() if n - other.get(name, 0) > 0})

    def total(self) -> int:  # (Counter.total is 3.10+)
        return sum(self.values())

    def __repr__(self) -> str:
        return f"FakeCudaCalls({dict(sorted(self.items()))})"


class IpcHandle(ctypes.Structure):
    """cudaIpcMemHandle_t: 64 opaque bytes, passed by value."""

    _fields_ = [("reserved", ctypes.c_char * 64)]

    @classmethod
    def from_bytes(cls, data: bytes) -> IpcHandle:
        if len(data) != 64:
            raise ValueError(f"an IPC handle is 64 bytes, not {len(data)}")
        return cls.from_buffer_copy(data)


class FakeCudaError(RuntimeError):
    def __init__(self, func: str, code: int, name: str):
        super().__init__(f"{func} returned {code} ({name})")
        self.func = func
        self.code = code


_PROTOTYPES = {
    "cudaGetDeviceCount": (ctypes.c_int, [ctypes.POINTER(ctypes.c_int)]),
    "cudaGetDevice": (ctypes.c_int, [ctypes.POINTER(ctypes.c_int)]),
    "cudaSetDevice": (ctypes.c_int, [ctypes.c_int]),
    "cudaDeviceGetAttribute": (ctypes.c_int, [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]),
    "cudaDriverGetVersion": (ctypes.c_int, [ctypes.POINTER(ctypes.c_int)]),
    "cudaRuntimeGetVersion": (ctypes.c_int, [ctypes.POINTER(ctypes.c_int)]),
    "cudaGetErrorName": (ctypes.c_char_p, [ctypes.c_int]),
    "cudaGetErrorString": (ctypes.c_char_p, [ctypes.c_int]),
    "cudaGetDeviceProperties": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int]),
    "cudaGetDeviceProperties_v2": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int]),
    "cudaMemGetInfo": (ctypes.c_int, [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]),
    "cudaMalloc": (ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]),
    "cudaFree": (ctypes.c_int, [ctypes.c_void_p]),
    "cudaMemcpy": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]),
    "cudaStreamSynchronize": (ctypes.c_int, [ctypes.c_void_p]),
    "cudaIpcGetMemHandle": (ctypes.c_int, [ctypes.POINTER(IpcHandle), ctypes.c_void_p]),
    "cudaIpcOpenMemHandle": (ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p), IpcHandle, ctypes.c_uint]),
    "cudaIpcCloseMemHandle": (ctypes.c_int, [ctypes.c_void_p]),
    "cudaHostRegister": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]),
    "cudaHostUnregister": (ctypes.c_int, [ctypes.c_void_p]),
    # streams, events, pinned memory (streams and events are void *)
    "cudaStreamCreateWithFlags": (ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]),
    "cudaStreamDestroy": (ctypes.c_int, [ctypes.c_void_p]),
    "cudaStreamWaitEvent": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint]),
    "cudaStreamQuery": (ctypes.c_int, [ctypes.c_void_p]),
    "cudaEventCreateWithFlags": (ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]),
    "cudaEventRecord": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]),
    "cudaEventQuery": (ctypes.c_int, [ctypes.c_void_p]),
    "cudaEventSynchronize": (ctypes.c_int, [ctypes.c_void_p]),
    "cudaEventDestroy": (ctypes.c_int, [ctypes.c_void_p]),
    "cudaDeviceSynchronize": (ctypes.c_int, []),
    # the thread's last error: tritonshm clears what it handled; torch (and its double) checks it
    "cudaGetLastError": (ctypes.c_int, []),
    "cudaPeekAtLastError": (ctypes.c_int, []),
    "cudaHostAlloc": (ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]),
    "cudaFreeHost": (ctypes.c_int, [ctypes.c_void_p]),
    # server support: what a real tritonserver calls besides the above
    "cudaMemcpyAsync": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]),
    "cudaGetDriverEntryPoint": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_ulonglong, ctypes.POINTER(ctypes.c_int)]),
    "cudaGetDriverEntryPointByVersion": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint, ctypes.c_ulonglong, ctypes.POINTER(ctypes.c_int)]),
    # memory CUDA IPC cannot export (a caching allocator's expandable segments or cudaMallocAsync backend)
    "cudaMallocAsync": (ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_void_p]),
    "cudaFreeAsync": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]),
    "cudaMallocManaged": (ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]),
    "tshm_fake_cuda_stats": (ctypes.c_int, [ctypes.POINTER(ctypes.c_longlong), ctypes.c_int]),
    "tshm_fake_cuda_pointer_kind": (ctypes.c_int, [ctypes.c_void_p]),
    "tshm_fake_cuda_owner_pid": (ctypes.c_int, []),
    "tshm_fake_cuda_kernel_write": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]),
    "tshm_fake_cuda_contexts": (ctypes.c_ulonglong, []),
    "tshm_fake_cuda_reset_contexts": (None, []),
    "tshm_fake_cuda_pending": (ctypes.c_longlong, []),
    "tshm_fake_cuda_discard_pending": (ctypes.c_longlong, []),
    "tshm_fake_cuda_calls": (ctypes.c_int, [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_longlong),
                                            ctypes.POINTER(ctypes.c_longlong), ctypes.c_int]),
    "tshm_fake_cuda_foreign": (ctypes.c_int, [ctypes.c_int]),
}

#: The extra entry points for a real tritonserver with the fake LD_PRELOADed.
SERVER_SYMBOLS = ("cudaMemcpyAsync", "cudaGetDriverEntryPoint", "cudaGetDriverEntryPointByVersion")

#: Exported for the producer doubles only (memory tritonshm must refuse to share, never allocates).
UNSHAREABLE_ALLOCATORS = ("cudaMallocAsync", "cudaFreeAsync", "cudaMallocManaged")

#: The cudart entry points tritonshm resolves (csrc/tshm_cuda.h), all exported by the fake.
CUDART_SYMBOLS = tuple(n for n in _PROTOTYPES if n.startswith("cuda") and not n.startswith("cudaGetDriverEntryPoint")
                       and n not in UNSHAREABLE_ALLOCATORS)

#: Driver entry points handed out by the fake's cudaGetDriverEntryPoint(ByVersion).
DRIVER_SYMBOLS = ("cuMemGetAddressRange", "cuMemGetAddressRange_v2", "cuGetErrorString", "cuDevicePrimaryCtxGetState",
                  "cuPointerGetAttribute")

# cuMemGetAddressRange(CUdeviceptr *base, size_t *size, CUdeviceptr ptr), cuGetErrorString
_CU_MEM_GET_ADDRESS_RANGE = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_ulonglong), ctypes.POINTER(ctypes.c_size_t), ctypes.c_ulonglong)
_CU_GET_ERROR_STRING = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p))
# cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
_CU_POINTER_GET_ATTRIBUTE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_ulonglong)
# cuDevicePrimaryCtxGetState(CUdevice dev, unsigned *flags, int *active)
_CU_DEVICE_PRIMARY_CTX_GET_STATE = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_int))


class FakeCudart:
    """The fake loaded through ctypes, with prototypes set.

    ``self.lib`` gives the raw entry points (return codes, for tests of error
    paths); the methods below raise :class:`FakeCudaError` on failure.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        self.lib = ctypes.CDLL(self.path)
        for name, (restype, argtypes) in _PROTOTYPES.items():
            fn = getattr(self.lib, name)
            fn.restype = restype
            fn.argtypes = argtypes

    def error_name(self, code: int) -> str:
        return self.lib.cudaGetErrorName(code).decode()

    def error_string(self, code: int) -> str:
        return self.lib.cudaGetErrorString(code).decode()

    def check(self, func: str, code: int) -> None:
        if code != SUCCESS:
            raise FakeCudaError(func, code, self.error_name(code))

    # --- counters --------------------------------------------------------

    def stats(self) -> FakeCudaStats:
        out = (ctypes.c_longlong * len(STAT_NAMES))()
        have = self.lib.tshm_fake_cuda_stats(out, len(STAT_NAMES))
        if have < len(STAT_NAMES):
            raise RuntimeError(f"the fake at {self.path} has {have} counters, expected {len(STAT_NAMES)}")
        return FakeCudaStats(*out)

    def calls(self, foreign: bool = False) -> FakeCudaCalls:
        """The calls of each entry point in this process so far: the code under test's, or
        (*foreign*) those made for the producer doubles (:meth:`as_foreign`, :meth:`foreign`)."""
        cap = 256
        names = (ctypes.c_char_p * cap)()
        ours, theirs = (ctypes.c_longlong * cap)(), (ctypes.c_longlong * cap)()
        n = min(self.lib.tshm_fake_cuda_calls(names, ours, theirs, cap), cap)
        counts = theirs if foreign else ours
        return FakeCudaCalls({names[i].decode(): counts[i] for i in range(n) if counts[i]})

    @contextlib.contextmanager
    def foreign(self):
        """While in the block, this thread's calls count as a producer double's, not as the
        code under test's (:meth:`calls`)."""
        previous = self.lib.tshm_fake_cuda_foreign(1)
        try:
            yield
        finally:
            self.lib.tshm_fake_cuda_foreign(previous)

    def as_foreign(self) -> "FakeCudart":
        """This fake as a producer double uses it: every call through the returned object counts
        in the doubles' book (:meth:`calls` ``foreign=True``), not in the code under test's --
        torch's own calls are no part of a budget of tritonshm's."""
        return _ForeignFakeCudart(self.path)

    def pointer_kind(self, ptr: int) -> int:
        """KIND_ALLOC, KIND_OPENED, KIND_HOST_REGISTERED or KIND_UNKNOWN."""
        return self.lib.tshm_fake_cuda_pointer_kind(ptr)

    def owner_pid(self) -> int:
        return self.lib.tshm_fake_cuda_owner_pid()

    def pending(self) -> int:
        """Copies and kernel writes queued and not landed yet (all streams)."""
        return self.lib.tshm_fake_cuda_pending()

    def discard_pending(self) -> int:
        """Drop all queued work without landing it (a test's teardown); returns how many ops."""
        return self.lib.tshm_fake_cuda_discard_pending()

    def contexts(self) -> set[int]:
        """The devices that have a primary context in this process."""
        mask = self.lib.tshm_fake_cuda_contexts()
        return {d for d in range(64) if mask >> d & 1}

    def reset_contexts(self) -> None:
        """Forget every context (as if the process had just started)."""
        self.lib.tshm_fake_cuda_reset_contexts()

    def primary_ctx_active(self, device: int) -> bool:
        """cuDevicePrimaryCtxGetState(*device*)'s ``active``, through the driver entry point."""
        fn = _CU_DEVICE_PRIMARY_CTX_GET_STATE(self.driver_entry_point("cuDevicePrimaryCtxGetState"))
        flags, active = ctypes.c_uint(), ctypes.c_int(-1)
        rc = fn(device, ctypes.byref(flags), ctypes.byref(active))
        if rc != SUCCESS:
            raise FakeCudaError("cuDevicePrimaryCtxGetState", rc, str(rc))
        return bool(active.value)

    # --- calls that raise ------------------------------------------------

    def device_count(self) -> int:
        n = ctypes.c_int(-1)
        self.check("cudaGetDeviceCount", self.lib.cudaGetDeviceCount(ctypes.byref(n)))
        return n.value

    def get_device(self) -> int:
        d = ctypes.c_int(-1)
        self.check("cudaGetDevice", self.lib.cudaGetDevice(ctypes.byref(d)))
        return d.value

    def set_device(self, device: int) -> None:
        self.check("cudaSetDevice", self.lib.cudaSetDevice(device))

    def mem_get_info(self) -> tuple[int, int]:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.check("cudaMemGetInfo", self.lib.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)))
        return free.value, total.value

    def malloc(self, nbytes: int) -> int:
        p = ctypes.c_void_p()
        self.check("cudaMalloc", self.lib.cudaMalloc(ctypes.byref(p), nbytes))
        return p.value or 0

    def free(self, ptr: int) -> None:
        self.check("cudaFree", self.lib.cudaFree(ptr))

    def malloc_unshareable(self, nbytes: int, how: str = "cudaMallocAsync") -> int:
        """Device memory CUDA IPC refuses to export: pool memory (``cudaMallocAsync``, on the
        legacy stream) or ``cudaMallocManaged``; freed with :meth:`free`."""
        p = ctypes.c_void_p()
        if how == "cudaMallocAsync":
            rc = self.lib.cudaMallocAsync(ctypes.byref(p), nbytes, None)
        elif how == "cudaMallocManaged":
            rc = self.lib.cudaMallocManaged(ctypes.byref(p), nbytes, 1)
        else:
            raise ValueError(f"no unshareable allocator {how!r}")
        self.check(how, rc)
        return p.value or 0

    def ipc_get_handle(self, ptr: int) -> bytes:
        h = IpcHandle()
        self.check("cudaIpcGetMemHandle", self.lib.cudaIpcGetMemHandle(ctypes.byref(h), ptr))
        return bytes(h)

    def ipc_open(self, handle: bytes, flags: int = 1) -> int:
        p = ctypes.c_void_p()
        rc = self.lib.cudaIpcOpenMemHandle(ctypes.byref(p), IpcHandle.from_bytes(handle), flags)
        self.check("cudaIpcOpenMemHandle", rc)
        return p.value

    def ipc_close(self, ptr: int) -> None:
        self.check("cudaIpcCloseMemHandle", self.lib.cudaIpcCloseMemHandle(ptr))

    def memcpy(self, dst: int, src: int, nbytes: int, kind: int = MEMCPY_DEFAULT) -> None:
        self.check("cudaMemcpy", self.lib.cudaMemcpy(dst, src, nbytes, kind))

    def memcpy_async(self, dst: int, src: int, nbytes: int, stream: int | None, kind: int = MEMCPY_DEFAULT) -> None:
        self.check("cudaMemcpyAsync", self.lib.cudaMemcpyAsync(dst, src, nbytes, kind, stream))

    def kernel_write(self, stream: int | None, dst: int, data: bytes) -> None:
        """A test-only "kernel" on *stream* writing *data* (copied now) at *dst* when it lands."""
        self.check("tshm_fake_cuda_kernel_write", self.lib.tshm_fake_cuda_kernel_write(stream, dst, data, len(data)))

    def device_attribute(self, attr: int, device: int = 0) -> int:
        v = ctypes.c_int()
        self.check("cudaDeviceGetAttribute", self.lib.cudaDeviceGetAttribute(ctypes.byref(v), attr, device))
        return v.value

    def device_synchronize(self) -> None:
        self.check("cudaDeviceSynchronize", self.lib.cudaDeviceSynchronize())

    def get_last_error(self) -> int:
        """cudaGetLastError: this thread's last error, cleared (0 when none)."""
        return self.lib.cudaGetLastError()

    def peek_last_error(self) -> int:
        """cudaPeekAtLastError: this thread's last error, left set (0 when none)."""
        return self.lib.cudaPeekAtLastError()

    # streams and events: handles are ints (None / LEGACY_STREAM: the legacy default stream)

    def stream_create(self, flags: int = STREAM_NON_BLOCKING) -> int:
        s = ctypes.c_void_p()
        self.check("cudaStreamCreateWithFlags", self.lib.cudaStreamCreateWithFlags(ctypes.byref(s), flags))
        return s.value

    def stream_destroy(self, stream: int) -> None:
        self.check("cudaStreamDestroy", self.lib.cudaStreamDestroy(stream))

    def stream_synchronize(self, stream: int | None) -> None:
        self.check("cudaStreamSynchronize", self.lib.cudaStreamSynchronize(stream))

    def stream_query(self, stream: int | None) -> bool:
        """True when done; False for 600 (not ready: the next query lands the work)."""
        rc = self.lib.cudaStreamQuery(stream)
        if rc == ERROR_NOT_READY:
            return False
        self.check("cudaStreamQuery", rc)
        return True

    def stream_wait_event(self, stream: int | None, event: int) -> None:
        self.check("cudaStreamWaitEvent", self.lib.cudaStreamWaitEvent(stream, event, 0))

    def event_create(self, flags: int = EVENT_DISABLE_TIMING) -> int:
        e = ctypes.c_void_p()
        self.check("cudaEventCreateWithFlags", self.lib.cudaEventCreateWithFlags(ctypes.byref(e), flags))
        return e.value

    def event_record(self, event: int, stream: int | None) -> None:
        self.check("cudaEventRecord", self.lib.cudaEventRecord(event, stream))

    def event_query(self, event: int) -> bool:
        """True when done; False for 600 (not ready: the next query lands the work)."""
        rc = self.lib.cudaEventQuery(event)
        if rc == ERROR_NOT_READY:
            return False
        self.check("cudaEventQuery", rc)
        return True

    def event_synchronize(self, event: int) -> None:
        self.check("cudaEventSynchronize", self.lib.cudaEventSynchronize(event))

    def event_destroy(self, event: int) -> None:
        self.check("cudaEventDestroy", self.lib.cudaEventDestroy(event))

    def host_alloc(self, nbytes: int, flags: int = 0) -> int:
        p = ctypes.c_void_p()
        self.check("cudaHostAlloc", self.lib.cudaHostAlloc(ctypes.byref(p), nbytes, flags))
        return p.value or 0

    def free_host(self, ptr: int) -> None:
        self.check("cudaFreeHost", self.lib.cudaFreeHost(ptr))

    def host_register(self, ptr: int, nbytes: int, flags: int = 1) -> None:
        self.check("cudaHostRegister", self.lib.cudaHostRegister(ptr, nbytes, flags))

    def host_unregister(self, ptr: int) -> None:
        self.check("cudaHostUnregister", self.lib.cudaHostUnregister(ptr))

    def driver_entry_point(self, symbol: str) -> int | None:
        """cudaGetDriverEntryPoint(*symbol*): the fake driver function's address, or None."""
        fn, status = ctypes.c_void_p(), ctypes.c_int(-1)
        rc = self.lib.cudaGetDriverEntryPoint(symbol.encode(), ctypes.byref(fn), 0, ctypes.byref(status))
        self.check("cudaGetDriverEntryPoint", rc)
        assert (status.value == 0) == (fn.value is not None)
        return fn.value

    def mem_get_address_range(self, ptr: int) -> tuple[int, int, int]:
        """(CUresult, base, size) of the fake cuMemGetAddressRange, as Triton calls it."""
        fn = _CU_MEM_GET_ADDRESS_RANGE(self.driver_entry_point("cuMemGetAddressRange"))
        base, size = ctypes.c_ulonglong(), ctypes.c_size_t()
        rc = fn(ctypes.byref(base), ctypes.byref(size), ptr)
        return rc, base.value, size.value

    def buffer_id(self, ptr: int) -> tuple[int, int]:
        """(CUresult, id) of the fake cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_BUFFER_ID, *ptr*):
        the allocation's id, new for every allocation (0 when refused)."""
        fn = _CU_POINTER_GET_ATTRIBUTE(self.driver_entry_point("cuPointerGetAttribute"))
        value = ctypes.c_ulonglong(0)
        rc = fn(ctypes.byref(value), CU_POINTER_ATTRIBUTE_BUFFER_ID, ptr)
        return rc, value.value

    def cu_error_string(self, result: int) -> str:
        fn = _CU_GET_ERROR_STRING(self.driver_entry_point("cuGetErrorString"))
        text = ctypes.c_char_p()
        assert fn(result, ctypes.byref(text)) == 0
        return text.value.decode()

    def read(self, ptr: int, nbytes: int) -> bytes:
        """The bytes at a fake device pointer as they are now (fake device memory is host
        memory): queued work that has not landed is not in them."""
        return ctypes.string_at(ptr, nbytes)

    def write(self, ptr: int, data: bytes) -> None:
        ctypes.memmove(ptr, data, len(data))


class _ForeignFakeCudart(FakeCudart):
    """:meth:`FakeCudart.as_foreign`: each public method runs with the thread's calls counted
    in the producer doubles' book (re-entrant: a method calling another keeps the setting)."""

    def __init__(self, path: str | os.PathLike):
        super().__init__(path)
        self.lib = _ForeignLib(self.lib)

    def as_foreign(self) -> "FakeCudart":
        return self


def _foreign_method(method):
    def wrapper(self, *args, **kwargs):
        previous = self.lib.raw.tshm_fake_cuda_foreign(1)
        try:
            return method(self, *args, **kwargs)
        finally:
            self.lib.raw.tshm_fake_cuda_foreign(previous)

    wrapper.__name__ = method.__name__
    wrapper.__doc__ = method.__doc__
    return wrapper


for _name, _method in list(vars(FakeCudart).items()):
    if callable(_method) and not _name.startswith("_") and _name not in ("calls", "foreign", "as_foreign", "stats"):
        setattr(_ForeignFakeCudart, _name, _foreign_method(_method))


class _ForeignLib:
    """The fake's entry points, each call counted in the producer doubles' book."""

    def __init__(self, raw: ctypes.CDLL):
        self.raw = raw

    def __getattr__(self, name: str):
        fn = getattr(self.raw, name)
        if not name.startswith("cuda"):
            return fn
        raw = self.raw

        def call(*args):
            previous = raw.tshm_fake_cuda_foreign(1)
            try:
                return fn(*args)
            finally:
                raw.tshm_fake_cuda_foreign(previous)

        return call


def server_env(lib: str | os.PathLike, trace: str | os.PathLike | None = None, *, pinned_pool: bool = False,
               **settings: str) -> dict[str, str]:
    """Environment for a tritonserver that should open fake CUDA handles.

    ``LocalServer(env=server_env(lib))`` preloads the fake into the server
    (2.51 with its bundled CUDA 12.6 runtime: the fake's symbols win over the
    runtime's, and every call the fake does not export still fails for want
    of a driver).  The server is a stand-in, not under test:

    * ``TSHM_FAKE_CUDA_SYNC=1``: its queued copies land on return;
    * its pinned memory pool stays off (``cudaHostAlloc`` fails in the server,
      as it did before the fake exported it) unless *pinned_pool*: with the
      pool, 2.51 releases a request a little after its response, so an
      unregister right after the response can be refused with "it is
      currently in use" -- a race a real GPU server has too; pass
      ``pinned_pool=True`` to test a client against it.

    *trace* names a file for the fake's call trace (see :func:`read_trace`);
    *settings* are more variables, e.g. ``TSHM_FAKE_CUDA_DEVICES="2"`` (a
    ``TSHM_FAKE_CUDA_FAIL`` given there replaces the pool's).  The server's
    python backend stubs inherit the preload; they make no CUDA call for
    KIND_CPU models.
    """
    env = {"LD_PRELOAD": str(lib), ENV_SYNC: "1"}
    if not pinned_pool:
        env[ENV_FAIL] = "cudaHostAlloc=2"
    env.update(settings)
    if trace is not None:
        env[ENV_TRACE] = str(trace)
    return env


def read_trace(path: str | os.PathLike) -> dict[int, list[str]]:
    """A TSHM_FAKE_CUDA_TRACE file as {pid: [function, ...]} in call order."""
    calls: dict[int, list[str]] = {}
    try:
        with open(path) as f:
            for line in f:
                pid, _, fn = line.strip().partition(" ")
                calls.setdefault(int(pid), []).append(fn)
    except FileNotFoundError:
        pass
    return calls


def fake_segments() -> dict[str, int]:
    """The fake's segments in /dev/shm (name without '/') -> creator pid."""
    out = {}
    for name in os.listdir(SHM_DIR):
        match = SEGMENT_NAME.match(name)
        if match:
            out[name] = int(match.group(1))
    return out


def remove_orphan_segments() -> list[str]:
    """Unlink the fake's segments whose creator is no longer running.

    A test process killed while holding fake device memory leaves them
    behind (real CUDA would free the memory at exit).  Returns their names.
    """
    removed = []
    for name, pid in fake_segments().items():
        try:
            os.kill(pid, 0)
            continue
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        try:
            os.unlink(os.path.join(SHM_DIR, name))
            removed.append(name)
        except FileNotFoundError:
            pass
    return removed


# --------------------------------------------------------------------------
# DLPack consumption without torch: what a consumer does, through ctypes
# --------------------------------------------------------------------------

_api = ctypes.pythonapi
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetName.restype = ctypes.c_char_p
_api.PyCapsule_GetName.argtypes = [ctypes.py_object]
_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # calling one releases the GIL

# PyCapsule_SetName keeps the pointer it is given, not a copy: a consumed capsule's name must live
# as long as the capsule (its destructor compares it), so these are module constants, never a
# temporary such as ``b"used_" + name`` (freed as soon as the call returns).
_USED_NAMES = {b"dltensor_versioned": b"used_dltensor_versioned", b"dltensor": b"used_dltensor"}


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


def consume_dlpack(capsule, versioned=True):
    """Take the tensor as a consumer does (rename the capsule 'used_'); returns (ptr, struct, deleter).

    *struct* is the managed tensor at *ptr* (``DLManagedTensorVersioned``, or
    the legacy ``DLManagedTensor`` with ``versioned=False``); ``deleter(ptr)``
    is the consumer letting it go, with the GIL released.
    """
    name = b"dltensor_versioned" if versioned else b"dltensor"
    assert _api.PyCapsule_GetName(capsule) == name
    ptr = _api.PyCapsule_GetPointer(capsule, name)
    _api.PyCapsule_SetName(capsule, _USED_NAMES[name])
    t = (DLManagedTensorVersioned if versioned else DLManagedTensor).from_address(ptr)
    return ptr, t, ctypes.cast(t.deleter, _Deleter)


class ClosingIndex:
    """An offset whose conversion (``__index__``) closes *region* and gives 0: what a call must
    survive when its own arguments close the region it is working on."""

    def __init__(self, region):
        self.region = region

    def __index__(self):
        self.region.close()
        return 0
