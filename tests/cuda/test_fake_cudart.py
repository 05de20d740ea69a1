"""Tests of the FAKE CUDA runtime itself (tests/fake_cudart/), through ctypes.

The CUDA layer's tests run against this fake on machines without a GPU, so
the fake has to be known-good on its own: these tests use no tritonshm code.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

import fake_cuda
from fake_cuda import FakeCudart, FakeCudaError

TESTS_DIR = Path(__file__).resolve().parent.parent  # where fake_cuda.py lives

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
PAGE = mmap.PAGESIZE


@pytest.fixture(scope="module")
def fake(request, tmp_path_factory) -> FakeCudart:
    return FakeCudart(fake_cuda.build_fake_cudart(build_dir(request, tmp_path_factory)))


def build_dir(request, tmp_path_factory) -> Path:
    """pytest's cache (kept between sessions) when enabled, else a temp dir."""
    cache = getattr(request.config, "cache", None)
    return cache.mkdir("fake_cudart") if cache is not None else tmp_path_factory.mktemp("fake_cudart")


ENV_VARS = (fake_cuda.ENV_DEVICES, fake_cuda.ENV_DRIVER, fake_cuda.ENV_TOTAL_MEM, fake_cuda.ENV_FAIL,
            fake_cuda.ENV_SYNC, fake_cuda.ENV_NO_READONLY_REGISTER, fake_cuda.ENV_NO_BUFFER_ID)


@pytest.fixture(autouse=True)
def clean_fake(fake, monkeypatch):
    """Each test starts with the default environment and device 0, and
    must give back everything it took from the fake, with no work queued."""
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    before = fake.stats()
    segments = set(fake_cuda.fake_segments())
    yield
    for var in ENV_VARS:
        os.environ.pop(var, None)
    fake.set_device(0)
    fake.get_last_error()  # the failures these tests provoke are no later test's (torch-like doubles check it)
    assert fake.pending() == 0, "the test left queued work (sync what you queue)"
    assert fake.stats().live == before.live, "the test left fake allocations, opens or registrations"
    assert fake.stats().live_host_allocs == before.live_host_allocs, "the test left cudaHostAlloc'ed memory"
    mine = {n for n, pid in fake_cuda.fake_segments().items() if pid == os.getpid()}
    assert mine <= segments, f"fake segments left in /dev/shm: {mine - segments}"


def anon_map(npages: int, prot: int = mmap.PROT_READ | mmap.PROT_WRITE) -> int:
    addr = _libc.mmap(None, npages * PAGE, prot, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
    return addr


def unmap(addr: int, npages: int) -> None:
    assert _libc.munmap(addr, npages * PAGE) == 0


def run_child(script: str, *args: str, stdin: str | None = None) -> dict:
    """Run *script* in a fresh Python (no fork: its own fake instance); its
    last stdout line is JSON."""
    code = f"import sys; sys.path.insert(0, {str(TESTS_DIR)!r})\n" + textwrap.dedent(script)
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], input=stdin, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- the library ------------------------------------------------------------


def test_build_is_cached_and_exports_the_cudart_table(fake, request, tmp_path_factory):
    again = fake_cuda.build_fake_cudart(Path(fake.path).parent)
    assert str(again) == fake.path
    assert "fake" in Path(fake.path).name
    for name in fake_cuda.CUDART_SYMBOLS:
        assert hasattr(fake.lib, name), name
    # The names tritonshm resolves (csrc/tshm_cuda.h), besides the _v2 alias.
    assert set(fake_cuda.CUDART_SYMBOLS) >= {
        "cudaGetDeviceCount", "cudaGetDevice", "cudaSetDevice", "cudaDeviceGetAttribute",
        "cudaDriverGetVersion", "cudaRuntimeGetVersion", "cudaGetErrorName", "cudaGetErrorString",
        "cudaGetDeviceProperties_v2", "cudaGetDeviceProperties", "cudaMemGetInfo", "cudaMalloc",
        "cudaFree", "cudaMemcpy", "cudaStreamSynchronize", "cudaIpcGetMemHandle",
        "cudaIpcOpenMemHandle", "cudaIpcCloseMemHandle", "cudaHostRegister", "cudaHostUnregister",
    }


def test_extra_cflags_reach_the_compiler_and_make_another_file(fake, tmp_path, monkeypatch):
    """$TSHM_FAKE_CUDA_CFLAGS (tools/asan.sh: the sanitizer's flags) is part of the build and of
    its cache key, so an instrumented fake never stands in for a plain one, or the other way round."""
    monkeypatch.setenv(fake_cuda.ENV_EXTRA_CFLAGS, "-DTSHM_FAKE_TEST_FLAG=1 -g")
    other = fake_cuda.build_fake_cudart(tmp_path)
    assert other.name != Path(fake.path).name and other.exists()
    monkeypatch.setenv(fake_cuda.ENV_EXTRA_CFLAGS, "-Werror=tshm-no-such-warning")
    with pytest.raises(RuntimeError, match="tshm-no-such-warning"):
        fake_cuda.build_fake_cudart(tmp_path)


def test_same_path_is_the_same_instance(fake):
    other = FakeCudart(fake.path)
    ptr = fake.malloc(100)
    try:
        assert other.stats().live_allocs == fake.stats().live_allocs
        assert other.pointer_kind(ptr) == fake_cuda.KIND_ALLOC
    finally:
        other.free(ptr)


def test_calls_are_counted_per_entry_point_in_two_books(fake):
    """Every call counts under its entry point's name, failed ones too; a thread's calls after
    tshm_fake_cuda_foreign(1) -- a producer double's, through as_foreign() -- go in the other book."""
    ours, theirs = fake.calls(), fake.calls(foreign=True)
    fake.get_device()
    fake.lib.cudaSetDevice(999)  # refused: counted all the same
    fake.get_last_error()
    fake.mem_get_address_range(0)  # a driver entry point, under its own name (and its lookup's)
    double = fake.as_foreign()
    event = double.event_create()
    double.event_destroy(event)
    double.lib.cudaGetDevice(ctypes.byref(ctypes.c_int()))
    with fake.foreign():
        fake.get_device()
    assert fake.calls() - ours == {"cudaGetDevice": 1, "cudaSetDevice": 1, "cudaGetLastError": 1,
                                   "cuMemGetAddressRange": 1, "cudaGetDriverEntryPoint:cuMemGetAddressRange": 1}
    assert fake.calls(foreign=True) - theirs == {"cudaEventCreateWithFlags": 1, "cudaEventDestroy": 1,
                                                 "cudaGetDevice": 2}
    assert (fake.calls() - ours).total() == 5


def test_error_names(fake):
    assert fake.error_name(0) == "cudaSuccess"
    assert fake.error_name(1) == "cudaErrorInvalidValue"
    assert fake.error_string(1) == "invalid argument"
    assert fake.error_name(2) == "cudaErrorMemoryAllocation"
    assert fake.error_name(3) == "cudaErrorInitializationError"
    assert fake.error_name(35) == "cudaErrorInsufficientDriver"
    assert fake.error_name(100) == "cudaErrorNoDevice"
    assert fake.error_name(101) == "cudaErrorInvalidDevice"
    assert fake.error_string(201) == "invalid device context"
    assert fake.error_name(400) == "cudaErrorInvalidResourceHandle"
    assert fake.error_name(712) == "cudaErrorHostMemoryAlreadyRegistered"
    assert fake.error_name(713) == "cudaErrorHostMemoryNotRegistered"
    assert fake.error_name(12345) == "cudaErrorUnknown"
    assert fake.error_string(-7) == "unknown error"


# --- memory -------------------------------------------------------------------


def test_alloc_free_accounting(fake):
    before = fake.stats()
    free0, total = fake.mem_get_info()
    assert total == 16 << 30
    sizes = [1, 4096, 3 * 1024 * 1024 + 5]
    ptrs = [fake.malloc(n) for n in sizes]
    try:
        s = fake.stats() - before
        assert (s.live_allocs, s.live_bytes, s.malloc_calls) == (3, sum(sizes), 3)
        assert fake.mem_get_info() == (free0 - sum(sizes), total)
        mine = [n for n, pid in fake_cuda.fake_segments().items() if pid == os.getpid()]
        assert len(mine) >= 3
        for p, n in zip(ptrs, sizes):
            assert p % PAGE == 0
            assert fake.pointer_kind(p) == fake.pointer_kind(p + n - 1) == fake_cuda.KIND_ALLOC
            fake.write(p + n - 1, b"x")  # host-addressable to its last byte
        # interior and unknown pointers are not freeable
        assert fake.lib.cudaFree(ptrs[1] + 8) == fake_cuda.ERROR_INVALID_VALUE
        host = ctypes.c_int()  # a live host address the fake never handed out (not a freed one)
        assert fake.lib.cudaFree(ctypes.addressof(host)) == fake_cuda.ERROR_INVALID_VALUE
        assert fake.lib.cudaFree(None) == 0
    finally:
        for p in ptrs:
            fake.free(p)
    s = fake.stats() - before
    assert (s.live_allocs, s.live_bytes, s.free_calls) == (0, 0, 3)
    assert fake.mem_get_info() == (free0, total)
    assert fake.lib.cudaFree(ptrs[0]) == fake_cuda.ERROR_INVALID_VALUE  # double free


def test_malloc_zero_and_out_of_memory(fake, monkeypatch):
    p = ctypes.c_void_p(1)
    assert fake.lib.cudaMalloc(ctypes.byref(p), 0) == 0 and p.value is None
    assert fake.lib.cudaMalloc(None, 10) == fake_cuda.ERROR_INVALID_VALUE
    monkeypatch.setenv(fake_cuda.ENV_TOTAL_MEM, str(1 << 20))
    a = fake.malloc(1 << 19)
    try:
        assert fake.mem_get_info() == (1 << 19, 1 << 20)
        assert fake.lib.cudaMalloc(ctypes.byref(p), (1 << 19) + 1) == fake_cuda.ERROR_MEMORY_ALLOCATION
        b = fake.malloc(1 << 19)
        fake.free(b)
    finally:
        fake.free(a)


def test_memcpy(fake):
    n = 10000
    dev = fake.malloc(n)
    other = fake.malloc(n)
    try:
        src = ctypes.create_string_buffer((bytes(range(256)) * 40)[:n], n)
        dst = ctypes.create_string_buffer(n)
        fake.memcpy(dev, ctypes.addressof(src), n, 1)  # HostToDevice: source staged, copy queued
        fake.memcpy(other, dev, n, 3)  # DeviceToDevice: queued
        assert fake.read(other, 8) == bytes(8) and fake.pending() == 2
        fake.memcpy(ctypes.addressof(dst), other, n)  # Default (DeviceToHost): complete on return
        assert dst.raw == src.raw and fake.pending() == 0
        fake.memcpy(ctypes.addressof(dst), dev + 100, 50, 2)  # DeviceToHost, interior
        assert dst.raw[:50] == src.raw[100:150]
        assert fake.lib.cudaMemcpy(None, None, 0, 4) == 0  # nothing to copy
        assert fake.lib.cudaMemcpy(dev, ctypes.addressof(src), 1, 7) == fake_cuda.ERROR_INVALID_MEMCPY_DIRECTION
        # a device range must stay inside its allocation
        assert fake.lib.cudaMemcpy(dev + 1, ctypes.addressof(src), n, 4) == fake_cuda.ERROR_INVALID_VALUE
        assert fake.lib.cudaMemcpy(ctypes.addressof(dst), dev + n - 10, 11, 2) == fake_cuda.ERROR_INVALID_VALUE
        # HostToDevice into host memory is refused
        assert fake.lib.cudaMemcpy(ctypes.addressof(dst), ctypes.addressof(src), 8, 1) == fake_cuda.ERROR_INVALID_VALUE
        assert fake.lib.cudaMemcpy(ctypes.addressof(dst), ctypes.addressof(src), 8, 0) == 0  # HostToHost
        # pointers that do not match the kind (undefined behaviour in CUDA) are refused, either end
        for d, s_, kind in ((ctypes.addressof(dst), dev, 0), (dev, ctypes.addressof(src), 0),
                            (dev, other, 1), (other, ctypes.addressof(src), 2), (dev, ctypes.addressof(src), 3),
                            (ctypes.addressof(dst), dev, 3), (ctypes.addressof(dst), dev, 1)):
            assert fake.lib.cudaMemcpy(d, s_, 8, kind) == fake_cuda.ERROR_INVALID_VALUE, kind
        assert fake.lib.cudaStreamSynchronize(None) == 0
        assert fake.lib.cudaStreamSynchronize(fake_cuda.LEGACY_STREAM) == 0
        assert fake.lib.cudaStreamSynchronize(fake_cuda.PER_THREAD_STREAM) == 0
        assert fake.lib.cudaStreamSynchronize(0x1234) == fake_cuda.ERROR_INVALID_RESOURCE_HANDLE  # not ours
    finally:
        fake.free(dev)
        fake.free(other)


def test_frees_from_many_threads(fake):
    before = fake.stats()
    ptrs = [fake.malloc(4096 + i) for i in range(64)]
    errors = []

    def free_some(chunk):
        for p in chunk:
            rc = fake.lib.cudaFree(p)  # ctypes drops the GIL around the call
            if rc:
                errors.append(rc)

    threads = [threading.Thread(target=free_some, args=(ptrs[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    s = fake.stats() - before
    assert (s.live_allocs, s.live_bytes, s.free_calls) == (0, 0, 64)


# --- IPC ----------------------------------------------------------------------

CHILD_ROUND_TRIP = """
    import ctypes, json
    from fake_cuda import FakeCudart, IpcHandle
    fake = FakeCudart(sys.argv[1])
    handle, n = bytes.fromhex(sys.argv[2]), int(sys.argv[3])
    p = fake.ipc_open(handle)
    seen = fake.read(p, n).hex()
    fake.write(p, b"child!" * (n // 6))
    again = fake.ipc_open(handle, 0)           # same handle: same pointer, counted
    # a handle cannot be re-exported from an importer
    reexport = fake.lib.cudaIpcGetMemHandle(ctypes.byref(IpcHandle()), p)
    print("ready", flush=True)
    sys.stdin.readline()                       # the parent wrote again
    seen_later = fake.read(p, 8).hex()
    opens = fake.stats().live_ipc_opens
    kind = fake.pointer_kind(p + n - 1)
    address_range = fake.mem_get_address_range(p + 10) == (0, p, n)
    fake.ipc_close(again)
    still = fake.read(p, 8).hex()              # still mapped after one close
    fake.ipc_close(p)
    closed_twice = fake.lib.cudaIpcCloseMemHandle(p)
    print(json.dumps(dict(seen=seen, same=again == p, reexport=reexport, seen_later=seen_later,
                          opens=opens, kind=kind, still=still, closed_twice=closed_twice,
                          address_range=address_range, live=fake.stats().live_ipc_opens)))
"""


def test_ipc_round_trip_in_another_process(fake):
    n = 600
    ptr = fake.malloc(n)
    try:
        pattern = bytes(range(200)) * 3
        fake.write(ptr, pattern)
        handle = fake.ipc_get_handle(ptr)
        assert len(handle) == 64 and handle.startswith(b"TSHMFAKE")
        code = f"import sys; sys.path.insert(0, {str(TESTS_DIR)!r})\n" + textwrap.dedent(CHILD_ROUND_TRIP)
        with subprocess.Popen(
            [sys.executable, "-c", code, fake.path, handle.hex(), str(n)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ) as child:
            assert child.stdout.readline().strip() == "ready", child.stderr.read()
            assert fake.read(ptr, n) == b"child!" * 100  # the child's writes, seen here
            fake.write(ptr, b"PARENT!!")
            out, err = child.communicate("go\n", timeout=60)
        assert child.returncode == 0, err
        got = json.loads(out.strip().splitlines()[-1])
        assert got == dict(
            seen=pattern.hex(), same=True, reexport=fake_cuda.ERROR_INVALID_VALUE,
            seen_later=b"PARENT!!".hex(), opens=2, kind=fake_cuda.KIND_OPENED,
            still=b"PARENT!!".hex(), closed_twice=fake_cuda.ERROR_INVALID_RESOURCE_HANDLE,
            address_range=True, live=0,
        )
    finally:
        fake.free(ptr)


def test_ipc_open_in_the_exporting_process_is_refused(fake):
    ptr = fake.malloc(64)
    try:
        handle = fake.ipc_get_handle(ptr)
        out = ctypes.c_void_p()
        rc = fake.lib.cudaIpcOpenMemHandle(ctypes.byref(out), fake_cuda.IpcHandle.from_bytes(handle), 1)
        assert rc == fake_cuda.ERROR_DEVICE_UNINITIALIZED == 201
        assert out.value is None
    finally:
        fake.free(ptr)


def test_ipc_bad_handles(fake):
    out = ctypes.c_void_p()
    for junk in (bytes(64), b"\xff" * 64, b"TSHMFAKE" + bytes(56)):
        rc = fake.lib.cudaIpcOpenMemHandle(ctypes.byref(out), fake_cuda.IpcHandle.from_bytes(junk), 1)
        assert rc == fake_cuda.ERROR_INVALID_RESOURCE_HANDLE
    assert fake.lib.cudaIpcCloseMemHandle(ctypes.addressof(out)) == fake_cuda.ERROR_INVALID_RESOURCE_HANDLE
    assert fake.lib.cudaIpcCloseMemHandle(None) == fake_cuda.ERROR_INVALID_RESOURCE_HANDLE


def test_ipc_handle_of_interior_or_unknown_pointer_is_refused(fake):
    ptr = fake.malloc(8192)
    try:
        h = fake_cuda.IpcHandle()
        assert fake.lib.cudaIpcGetMemHandle(ctypes.byref(h), ptr + 4096) == fake_cuda.ERROR_INVALID_VALUE
        assert fake.lib.cudaIpcGetMemHandle(ctypes.byref(h), ctypes.addressof(h)) == fake_cuda.ERROR_INVALID_VALUE
        assert fake.lib.cudaIpcGetMemHandle(ctypes.byref(h), ptr) == 0
    finally:
        fake.free(ptr)


CHILD_OPEN = """
    import ctypes, json
    from fake_cuda import FakeCudart, IpcHandle
    fake = FakeCudart(sys.argv[1])
    out = ctypes.c_void_p()
    rc = fake.lib.cudaIpcOpenMemHandle(ctypes.byref(out), IpcHandle.from_bytes(bytes.fromhex(sys.argv[2])), 1)
    print(json.dumps(dict(rc=rc)))
"""


def test_ipc_open_after_the_exporter_freed(fake):
    ptr = fake.malloc(4096)
    handle = fake.ipc_get_handle(ptr)
    fake.free(ptr)
    assert run_child(CHILD_OPEN, fake.path, handle.hex()) == dict(rc=fake_cuda.ERROR_INVALID_RESOURCE_HANDLE)


CHILD_EXPORT = """
    import json, os
    from fake_cuda import FakeCudart
    fake = FakeCudart(sys.argv[1])
    p = fake.malloc(4096)
    print(json.dumps(dict(handle=fake.ipc_get_handle(p).hex(), pid=os.getpid())), flush=True)
    if sys.argv[2] == "crash":
        os._exit(0)   # no destructors: the segment stays behind
    # a normal exit: the fake unlinks what is still allocated, as CUDA frees it
"""


def test_ipc_open_after_the_exporter_exited(fake):
    got = run_child(CHILD_EXPORT, fake.path, "exit")
    assert not any(pid == got["pid"] for pid in fake_cuda.fake_segments().values())
    out = ctypes.c_void_p()
    h = fake_cuda.IpcHandle.from_bytes(bytes.fromhex(got["handle"]))
    assert fake.lib.cudaIpcOpenMemHandle(ctypes.byref(out), h, 1) == fake_cuda.ERROR_INVALID_RESOURCE_HANDLE


def test_ipc_open_after_the_exporter_crashed(fake):
    got = run_child(CHILD_EXPORT, fake.path, "crash")
    left = [n for n, pid in fake_cuda.fake_segments().items() if pid == got["pid"]]
    assert len(left) == 1
    out = ctypes.c_void_p()
    h = fake_cuda.IpcHandle.from_bytes(bytes.fromhex(got["handle"]))
    assert fake.lib.cudaIpcOpenMemHandle(ctypes.byref(out), h, 1) == fake_cuda.ERROR_INVALID_RESOURCE_HANDLE
    assert left[0] in fake_cuda.remove_orphan_segments()
    assert left[0] not in fake_cuda.fake_segments()


# --- host registration --------------------------------------------------------


def test_host_register(fake):
    addr = anon_map(4)
    try:
        before = fake.stats()
        fake.host_register(addr, 2 * PAGE)
        assert fake.pointer_kind(addr + PAGE) == fake_cuda.KIND_HOST_REGISTERED
        reg = fake.lib.cudaHostRegister
        assert reg(addr, 2 * PAGE, 1) == fake_cuda.ERROR_HOST_MEMORY_ALREADY_REGISTERED  # twice
        assert reg(addr + PAGE, 2 * PAGE, 1) == fake_cuda.ERROR_HOST_MEMORY_ALREADY_REGISTERED  # overlap
        assert reg(addr + 10, 1, 0) == fake_cuda.ERROR_HOST_MEMORY_ALREADY_REGISTERED  # inside
        fake.host_register(addr + 2 * PAGE, PAGE + 100, 1)  # adjacent, not page-sized
        assert (fake.stats() - before).live_host_registrations == 2
        assert fake.lib.cudaHostUnregister(addr + PAGE) == fake_cuda.ERROR_HOST_MEMORY_NOT_REGISTERED
        fake.host_unregister(addr + 2 * PAGE)
        fake.host_unregister(addr)
        assert fake.lib.cudaHostUnregister(addr) == fake_cuda.ERROR_HOST_MEMORY_NOT_REGISTERED
        assert fake.lib.cudaHostUnregister(None) == fake_cuda.ERROR_HOST_MEMORY_NOT_REGISTERED
        s = fake.stats() - before
        assert (s.live_host_registrations, s.host_register_calls, s.host_unregister_calls) == (0, 2, 2)
        assert reg(addr, 0, 1) == fake_cuda.ERROR_INVALID_VALUE
        assert reg(addr, PAGE, 0x100) == fake_cuda.ERROR_INVALID_VALUE  # unknown flag
    finally:
        unmap(addr, 4)


def test_host_register_needs_mapped_and_writable_memory(fake):
    addr = anon_map(3)
    unmap(addr + PAGE, 1)  # a hole in the middle
    try:
        reg = fake.lib.cudaHostRegister
        assert reg(addr, 3 * PAGE, 1) == fake_cuda.ERROR_INVALID_VALUE
        assert reg(addr + PAGE, 10, 1) == fake_cuda.ERROR_INVALID_VALUE
    finally:
        unmap(addr, 1)
        unmap(addr + 2 * PAGE, 1)
    ro = anon_map(2, mmap.PROT_READ)
    try:
        assert fake.lib.cudaHostRegister(ro, 2 * PAGE, 1) == fake_cuda.ERROR_INVALID_VALUE
        fake.host_register(ro, 2 * PAGE, 1 | 8)  # Portable | ReadOnly
        fake.host_unregister(ro)
    finally:
        unmap(ro, 2)


def test_host_register_fake_device_memory_and_shm(fake):
    # tritonshm pins its own shm mappings: a MAP_SHARED file mapping works too
    ptr = fake.malloc(3 * PAGE)
    try:
        fake.host_register(ptr, 3 * PAGE)
        fake.host_unregister(ptr)
    finally:
        fake.free(ptr)


# --- devices and modes --------------------------------------------------------


def test_default_device(fake):
    assert fake.device_count() == 1
    assert fake.get_device() == 0
    assert fake.lib.cudaSetDevice(1) == fake_cuda.ERROR_INVALID_DEVICE
    assert fake.lib.cudaSetDevice(-1) == fake_cuda.ERROR_INVALID_DEVICE
    v = ctypes.c_int()
    assert fake.lib.cudaDriverGetVersion(ctypes.byref(v)) == 0 and v.value == 13000
    assert fake.lib.cudaRuntimeGetVersion(ctypes.byref(v)) == 0 and v.value == 13000
    attrs = {16: 132, 33: 0, 75: 9, 76: 0, 99: 1}
    for attr, want in attrs.items():
        assert fake.lib.cudaDeviceGetAttribute(ctypes.byref(v), attr, 0) == 0
        assert v.value == want, attr
    assert fake.lib.cudaDeviceGetAttribute(ctypes.byref(v), 12345, 0) == fake_cuda.ERROR_INVALID_VALUE
    assert fake.lib.cudaDeviceGetAttribute(ctypes.byref(v), 75, 1) == fake_cuda.ERROR_INVALID_DEVICE


@pytest.mark.parametrize("symbol", ["cudaGetDeviceProperties_v2", "cudaGetDeviceProperties"])
def test_device_properties_write_only_the_name(fake, symbol):
    buf = ctypes.create_string_buffer(b"\xab" * 4096, 4096)
    assert getattr(fake.lib, symbol)(buf, 0) == 0
    assert buf.value == b"Fake CUDA device 0 (tritonshm tests)"
    assert buf.raw[len(buf.value):256] == bytes(256 - len(buf.value))
    assert buf.raw[256:] == b"\xab" * (4096 - 256)
    assert getattr(fake.lib, symbol)(buf, 1) == fake_cuda.ERROR_INVALID_DEVICE


def test_several_devices_and_per_thread_current_device(fake, monkeypatch):
    monkeypatch.setenv(fake_cuda.ENV_DEVICES, "3")
    assert fake.device_count() == 3
    fake.set_device(2)
    assert fake.get_device() == 2
    seen = []
    t = threading.Thread(target=lambda: seen.append(fake.get_device()))
    t.start()
    t.join()
    assert seen == [0]  # the current device is per thread
    assert fake.lib.cudaSetDevice(3) == fake_cuda.ERROR_INVALID_DEVICE
    v = ctypes.c_int()
    assert fake.lib.cudaDeviceGetAttribute(ctypes.byref(v), 33, 2) == 0 and v.value == 2
    buf = ctypes.create_string_buffer(4096)
    assert fake.lib.cudaGetDeviceProperties_v2(buf, 2) == 0
    assert buf.value == b"Fake CUDA device 2 (tritonshm tests)"
    # memory is accounted per device
    free2, total = fake.mem_get_info()
    ptr = fake.malloc(1 << 20)
    try:
        assert fake.mem_get_info() == (free2 - (1 << 20), total)
        fake.set_device(1)
        assert fake.mem_get_info() == (total, total)
        fake.set_device(2)
        handle = fake.ipc_get_handle(ptr)
        assert int.from_bytes(handle[12:16], "little") == 2  # the handle records the device
    finally:
        fake.free(ptr)


def test_no_device(fake, monkeypatch):
    monkeypatch.setenv(fake_cuda.ENV_DEVICES, "0")
    n = ctypes.c_int(7)
    assert fake.lib.cudaGetDeviceCount(ctypes.byref(n)) == fake_cuda.ERROR_NO_DEVICE
    assert n.value == 0
    p = ctypes.c_void_p()
    assert fake.lib.cudaMalloc(ctypes.byref(p), 16) == fake_cuda.ERROR_NO_DEVICE
    assert fake.lib.cudaSetDevice(0) == fake_cuda.ERROR_NO_DEVICE
    assert fake.error_name(fake_cuda.ERROR_NO_DEVICE) == "cudaErrorNoDevice"


def test_no_driver(fake, monkeypatch):
    monkeypatch.setenv(fake_cuda.ENV_DRIVER, "none")
    n = ctypes.c_int(7)
    v = ctypes.c_int(7)
    p = ctypes.c_void_p()
    buf = ctypes.create_string_buffer(4096)
    h = fake_cuda.IpcHandle()
    calls = {
        "cudaGetDeviceCount": lambda: fake.lib.cudaGetDeviceCount(ctypes.byref(n)),
        "cudaGetDevice": lambda: fake.lib.cudaGetDevice(ctypes.byref(v)),
        "cudaSetDevice": lambda: fake.lib.cudaSetDevice(0),
        "cudaDeviceGetAttribute": lambda: fake.lib.cudaDeviceGetAttribute(ctypes.byref(v), 75, 0),
        "cudaGetDeviceProperties_v2": lambda: fake.lib.cudaGetDeviceProperties_v2(buf, 0),
        "cudaMemGetInfo": lambda: fake.lib.cudaMemGetInfo(ctypes.byref(ctypes.c_size_t()), ctypes.byref(ctypes.c_size_t())),
        "cudaMalloc": lambda: fake.lib.cudaMalloc(ctypes.byref(p), 16),
        "cudaFree": lambda: fake.lib.cudaFree(None),
        "cudaMemcpy": lambda: fake.lib.cudaMemcpy(buf, buf, 0, 4),
        "cudaStreamSynchronize": lambda: fake.lib.cudaStreamSynchronize(None),
        "cudaIpcGetMemHandle": lambda: fake.lib.cudaIpcGetMemHandle(ctypes.byref(h), buf),
        "cudaIpcOpenMemHandle": lambda: fake.lib.cudaIpcOpenMemHandle(ctypes.byref(p), h, 1),
        "cudaIpcCloseMemHandle": lambda: fake.lib.cudaIpcCloseMemHandle(buf),
        "cudaHostRegister": lambda: fake.lib.cudaHostRegister(buf, 4096, 1),
        "cudaHostUnregister": lambda: fake.lib.cudaHostUnregister(buf),
    }
    for name, call in calls.items():
        assert call() == fake_cuda.ERROR_INSUFFICIENT_DRIVER, name
    assert n.value == 0
    assert fake.lib.cudaDriverGetVersion(ctypes.byref(v)) == 0 and v.value == 0
    assert fake.error_name(35) == "cudaErrorInsufficientDriver"
    # the runtime's own version needs no driver, as in real CUDA
    assert fake.lib.cudaRuntimeGetVersion(ctypes.byref(v)) == 0 and v.value == 13000


def test_injected_failures(fake, monkeypatch):
    ptr = fake.malloc(64)
    try:
        monkeypatch.setenv(fake_cuda.ENV_FAIL, "cudaHostRegister=2,cudaMemcpy=700")
        buf = ctypes.create_string_buffer(64)
        with pytest.raises(FakeCudaError) as info:
            fake.memcpy(ptr, ctypes.addressof(buf), 64)
        assert info.value.code == 700 and "cudaErrorIllegalAddress" in str(info.value)
        assert fake.lib.cudaMalloc(ctypes.byref(ctypes.c_void_p()), 0) == 0  # not listed
        monkeypatch.delenv(fake_cuda.ENV_FAIL)
        fake.memcpy(ptr, ctypes.addressof(buf), 64)
    finally:
        fake.free(ptr)


def test_forked_child_gets_initialization_error(fake):
    assert fake.device_count() == 1  # this process owns the fake now
    assert fake.owner_pid() == os.getpid()
    ptr = fake.malloc(4096)
    try:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: write the codes, never return into pytest
            try:
                n = ctypes.c_int()
                p = ctypes.c_void_p()
                codes = [
                    fake.lib.cudaGetDeviceCount(ctypes.byref(n)),
                    fake.lib.cudaMalloc(ctypes.byref(p), 16),
                    fake.lib.cudaFree(ptr),  # a child never frees its parent's memory
                    fake.lib.cudaHostUnregister(None),
                ]
                os.write(w, (json.dumps([codes, fake.error_name(3)]) + "\n").encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r) as reader:
            out = reader.read()
        os.waitpid(pid, 0)
        codes, name = json.loads(out)
        assert codes == [fake_cuda.ERROR_INITIALIZATION] * 4
        assert name == "cudaErrorInitializationError"
        assert fake.pointer_kind(ptr) == fake_cuda.KIND_ALLOC  # the parent still has it
    finally:
        fake.free(ptr)


def test_trace(fake, monkeypatch, tmp_path):
    trace = tmp_path / "trace"
    monkeypatch.setenv(fake_cuda.ENV_TRACE, str(trace))
    fake.device_count()
    fake.free(fake.malloc(10))
    monkeypatch.delenv(fake_cuda.ENV_TRACE)
    fake.device_count()
    assert fake_cuda.read_trace(trace) == {os.getpid(): ["cudaGetDeviceCount", "cudaMalloc", "cudaFree"]}


# --- the thread's last error and allocation ids ----------------------------------


def test_a_failing_call_sets_the_threads_last_error_until_get_clears_it(fake):
    """As CUDA: the last failure of a runtime call, per thread; Peek leaves it, Get returns and
    clears it; a successful call does not clear it."""
    fake.get_last_error()
    assert fake.peek_last_error() == 0
    assert fake.lib.cudaSetDevice(99) == fake_cuda.ERROR_INVALID_DEVICE
    fake.free(fake.malloc(16))  # succeeds, and leaves the error
    assert fake.peek_last_error() == fake.peek_last_error() == fake_cuda.ERROR_INVALID_DEVICE
    seen = []
    thread = threading.Thread(target=lambda: seen.append(fake.peek_last_error()))
    thread.start()
    thread.join()
    assert seen == [0]  # another thread's is its own
    before = fake.stats()
    assert fake.get_last_error() == fake_cuda.ERROR_INVALID_DEVICE
    assert fake.get_last_error() == 0 and fake.peek_last_error() == 0
    assert (fake.stats() - before).last_error_clears == 1
    ptr = fake.malloc_unshareable(4096)
    try:
        with pytest.raises(FakeCudaError):
            fake.ipc_get_handle(ptr)  # what a refused export leaves
        assert fake.get_last_error() == fake_cuda.ERROR_INVALID_VALUE
    finally:
        fake.free(ptr)


def test_not_ready_and_driver_calls_set_no_last_error(fake, dev_buffers, streams, events):
    """cudaErrorNotReady is a query's answer, not an error; the driver API keeps no last error."""
    fake.get_last_error()
    s, e = streams(), events()
    fake.kernel_write(s, dev_buffers[0], b"x")
    fake.event_record(e, s)
    assert not fake.event_query(e) and not fake.stream_query(s)  # 600 from both
    assert fake.peek_last_error() == 0
    host = ctypes.create_string_buffer(8)
    assert fake.mem_get_address_range(ctypes.addressof(host))[0] == fake_cuda.CU_ERROR_NOT_FOUND
    assert fake.buffer_id(ctypes.addressof(host))[0] != 0
    assert fake.peek_last_error() == 0
    fake.stream_synchronize(s)


def test_every_allocation_has_an_id_of_its_own(fake, monkeypatch):
    """cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_BUFFER_ID): the same id anywhere in an
    allocation, a new one for a new allocation at a freed one's base."""
    a, b = fake.malloc(8192), fake.malloc_unshareable(4096)
    try:
        (rc_a, id_a), (rc_b, id_b) = fake.buffer_id(a), fake.buffer_id(b)
        assert rc_a == rc_b == 0 and 0 < id_a != id_b > 0
        assert fake.buffer_id(a + 8191) == (0, id_a)
        monkeypatch.setenv(fake_cuda.ENV_NO_BUFFER_ID, "1")
        assert fake.buffer_id(a)[0] == fake_cuda.CU_ERROR_NOT_SUPPORTED
        monkeypatch.delenv(fake_cuda.ENV_NO_BUFFER_ID)
    finally:
        fake.free(b)
    again = fake.malloc(4096)
    try:
        assert again == b and fake.buffer_id(again) == (0, fake.buffer_id(again)[1])
        assert fake.buffer_id(again)[1] not in (id_a, id_b)
    finally:
        fake.free(again)
        fake.free(a)


def test_refused_exports_are_counted(fake):
    ptr = fake.malloc_unshareable(4096, "cudaMallocManaged")
    before = fake.stats()
    try:
        with pytest.raises(FakeCudaError):
            fake.ipc_get_handle(ptr)
        used = fake.stats() - before
        assert (used.ipc_get_refusals, used.ipc_get_calls) == (1, 0)
    finally:
        fake.get_last_error()
        fake.free(ptr)


# --- asynchrony: streams, events, waits ------------------------------------------

NB = fake_cuda.STREAM_NON_BLOCKING
LEGACY = fake_cuda.LEGACY_STREAM


@pytest.fixture
def dev_buffers(fake):
    """Two 4 KiB device buffers, freed (and so all work landed) at the end."""
    ptrs = [fake.malloc(4096), fake.malloc(4096)]
    yield ptrs
    for p in ptrs:
        fake.free(p)


@pytest.fixture
def streams(fake):
    """stream(flags) makes a stream that is destroyed at the end of the test."""
    made = []

    def make(flags=NB):
        made.append(fake.stream_create(flags))
        return made[-1]

    yield make
    fake.device_synchronize()
    for s in made:
        fake.stream_destroy(s)


@pytest.fixture
def events(fake):
    made = []

    def make():
        made.append(fake.event_create())
        return made[-1]

    yield make
    for e in made:
        fake.event_destroy(e)


def test_new_entry_points_are_exported(fake):
    for name in ("cudaStreamCreateWithFlags", "cudaStreamDestroy", "cudaStreamWaitEvent", "cudaStreamQuery",
                 "cudaEventCreateWithFlags", "cudaEventRecord", "cudaEventQuery", "cudaEventSynchronize",
                 "cudaEventDestroy", "cudaMemcpyAsync", "cudaDeviceSynchronize", "cudaHostAlloc", "cudaFreeHost",
                 "tshm_fake_cuda_kernel_write", "tshm_fake_cuda_contexts", "tshm_fake_cuda_reset_contexts",
                 "tshm_fake_cuda_pending"):
        assert hasattr(fake.lib, name), name
        assert name in fake_cuda.CUDART_SYMBOLS or name.startswith("tshm_"), name
    for name in fake_cuda.DRIVER_SYMBOLS:
        assert fake.driver_entry_point(name) is not None, name
    assert fake.error_name(600) == "cudaErrorNotReady"
    assert fake.error_name(801) == "cudaErrorNotSupported"


def test_a_queued_copy_is_invisible_until_its_stream_is_synchronized(fake, dev_buffers, streams):
    dev, _ = dev_buffers
    s = streams()
    before = fake.stats()
    src = ctypes.create_string_buffer(b"new bytes", 9)
    fake.memcpy_async(dev, ctypes.addressof(src), 9, s, 1)
    assert fake.read(dev, 9) == bytes(9)  # the GPU has not done it yet
    assert fake.pending() == 1
    other = streams()
    fake.stream_synchronize(other)  # another stream's sync lands nothing
    fake.stream_synchronize(None)  # nor does the legacy stream's (s is non-blocking)
    assert fake.read(dev, 9) == bytes(9)
    fake.stream_synchronize(s)
    assert fake.read(dev, 9) == b"new bytes" and fake.pending() == 0
    d = fake.stats() - before
    assert (d.async_copies, d.async_copy_bytes, d.memcpy_calls, d.stream_creates) == (1, 9, 0, 1)


def test_device_to_pageable_host_lands_at_sync(fake, dev_buffers, streams):
    dev, _ = dev_buffers
    fake.write(dev, b"on the device")
    s = streams()
    host = ctypes.create_string_buffer(13)
    fake.memcpy_async(ctypes.addressof(host), dev, 13, s, 2)
    assert host.raw == bytes(13)
    fake.stream_synchronize(s)
    assert host.raw == b"on the device"


def test_an_async_copy_reads_its_source_when_it_lands_pageable_or_pinned(fake, dev_buffers, streams):
    """CUDA only says that an async copy from pageable memory "might be synchronous" (the driver
    may stage it at the call, or read it later): reusing the source before the copy is known
    complete is caught, pageable or pinned."""
    a, b = dev_buffers
    s = streams()
    before = fake.stats()
    pageable = ctypes.create_string_buffer(b"first", 5)
    fake.memcpy_async(a, ctypes.addressof(pageable), 5, s, 1)
    ctypes.memmove(pageable, b"later", 5)  # reusing a pageable buffer before the sync: caught
    pinned = fake.host_alloc(4096)
    try:
        assert fake.pointer_kind(pinned) == fake_cuda.KIND_HOST_ALLOC
        fake.write(pinned, b"first")
        fake.memcpy_async(b, pinned, 5, s, 1)
        fake.write(pinned, b"later")  # reusing a pinned staging buffer before the sync: caught
        fake.stream_synchronize(s)
        assert fake.read(a, 5) == b"later"
        assert fake.read(b, 5) == b"later"
    finally:
        fake.free_host(pinned)
    assert (fake.stats() - before).pageable_async_copies == 1  # the pageable one
    # cudaHostRegister'ed memory is pinned too
    addr = anon_map(1)
    try:
        fake.host_register(addr, PAGE)
        fake.write(addr, b"first")
        fake.memcpy_async(a, addr, 5, s, 1)
        fake.write(addr, b"again")
        fake.stream_synchronize(s)
        assert fake.read(a, 5) == b"again"
        fake.host_unregister(addr)
    finally:
        unmap(addr, 1)


def test_work_landing_on_unmapped_memory_is_dropped_and_counted(fake, dev_buffers, streams):
    a, _ = dev_buffers
    s = streams()
    fake.write(a, b"x" * 64)
    addr = anon_map(2)
    fake.memcpy_async(addr + PAGE - 10, a, 64, s, 2)  # lands across both pages
    unmap(addr + PAGE, 1)  # the caller frees its buffer before the copy is known done
    before = fake.stats()
    fake.stream_synchronize(s)  # a GPU would fault; the fake drops the copy instead of crashing
    assert (fake.stats() - before).lost_ops == 1
    assert fake.read(addr + PAGE - 10, 10) == bytes(10)
    unmap(addr, 1)


def test_memcpy_follows_cuda_synchronization_rules(fake, dev_buffers):
    a, b = dev_buffers
    before = fake.stats()
    pageable = ctypes.create_string_buffer(b"pageable", 8)
    fake.memcpy(a, ctypes.addressof(pageable), 8, 1)  # returns once staged: still queued
    assert fake.read(a, 8) == bytes(8) and fake.pending() == 1
    fake.memcpy(b, a, 8, 3)  # device to device: no host synchronization at all
    assert fake.read(b, 8) == bytes(8) and fake.pending() == 2
    out = ctypes.create_string_buffer(8)
    fake.memcpy(ctypes.addressof(out), b, 8, 2)  # device to host: complete on return, after the others
    assert out.raw == b"pageable" and fake.pending() == 0
    pinned = fake.host_alloc(64)
    try:
        fake.write(pinned, b"pinned!!")
        fake.memcpy(a, pinned, 8, 1)  # pinned host to device: complete on return
        assert fake.read(a, 8) == b"pinned!!"
    finally:
        fake.free_host(pinned)
    d = fake.stats() - before
    assert (d.memcpy_calls, d.memcpy_bytes, d.legacy_syncs, d.async_copies) == (4, 32, 2, 0)


def test_event_query_answers_not_ready_once_then_lands(fake, dev_buffers, streams, events):
    dev, _ = dev_buffers
    s, e = streams(), events()
    assert fake.event_query(e)  # never recorded: done
    before = fake.stats()
    fake.kernel_write(s, dev, b"kernel")
    fake.event_record(e, s)
    assert fake.lib.cudaEventQuery(e) == fake_cuda.ERROR_NOT_READY
    assert fake.read(dev, 6) == bytes(6)
    assert fake.lib.cudaEventQuery(e) == 0  # progress: the second query finds it done
    assert fake.read(dev, 6) == b"kernel"
    assert fake.event_query(e)
    d = fake.stats() - before
    assert (d.event_records, d.event_queries, d.errors) == (1, 3, 0)  # 600 is not counted as an error
    # a new record re-arms it
    fake.kernel_write(s, dev, b"again!")
    fake.event_record(e, s)
    assert not fake.event_query(e) and fake.read(dev, 6) == b"kernel"
    assert fake.event_query(e) and fake.read(dev, 6) == b"again!"


def test_event_recorded_with_nothing_unfinished_is_complete_at_once(fake, dev_buffers, streams, events):
    a, _ = dev_buffers
    s, e, e2 = streams(), events(), events()
    fake.event_record(e, s)
    assert fake.event_query(e)  # an idle stream: done, as on a GPU
    fake.event_record(e, None)  # the legacy stream, with no blocking stream busy
    assert fake.event_query(e)
    fake.event_record(e2, s)
    fake.stream_wait_event(s, e)
    assert fake.stream_query(s)  # marks and satisfied waits are no work
    fake.kernel_write(s, a, b"w")
    fake.event_record(e, s)
    assert not fake.event_query(e)  # real work before it: not at once
    assert fake.event_query(e)
    blocking = streams(fake_cuda.STREAM_DEFAULT)
    fake.kernel_write(blocking, a, b"b")
    fake.event_record(e, None)  # the legacy stream waits for the blocking stream's write
    assert not fake.event_query(e) and fake.read(a, 1) == b"w"
    assert fake.event_query(e) and fake.read(a, 1) == b"b"


def test_stream_query_answers_not_ready_once_then_lands(fake, dev_buffers, streams):
    dev, _ = dev_buffers
    s = streams()
    assert fake.stream_query(s)
    fake.kernel_write(s, dev, b"x")
    assert not fake.stream_query(s) and fake.read(dev, 1) == b"\0"
    assert fake.stream_query(s) and fake.read(dev, 1) == b"x"


def test_event_covers_only_the_work_before_its_record(fake, dev_buffers, streams, events):
    a, b = dev_buffers
    s, e = streams(), events()
    fake.kernel_write(s, a, b"before")
    fake.event_record(e, s)
    fake.kernel_write(s, b, b"after!")
    before = fake.stats()
    fake.event_synchronize(e)
    assert fake.read(a, 6) == b"before" and fake.read(b, 6) == bytes(6)
    assert fake.pending() == 1 and (fake.stats() - before).event_syncs == 1
    fake.stream_synchronize(s)
    assert fake.read(b, 6) == b"after!"


def test_stream_wait_event_orders_work_across_streams(fake, dev_buffers, streams, events):
    a, b = dev_buffers
    producer, consumer, e = streams(), streams(), events()
    # without a wait: the consumer's copy reads a before the producer's write lands
    fake.kernel_write(producer, a, b"produced")
    fake.memcpy_async(b, a, 8, consumer, 3)
    fake.stream_synchronize(consumer)
    assert fake.read(b, 8) == bytes(8) and fake.read(a, 8) == bytes(8)
    fake.stream_synchronize(producer)
    # with one: syncing only the consumer lands the producer's work first
    fake.write(a, bytes(8))
    fake.kernel_write(producer, a, b"produced")
    fake.event_record(e, producer)
    before = fake.stats()
    fake.stream_wait_event(consumer, e)
    fake.kernel_write(producer, a, b"too late")  # after the record: not waited for
    fake.memcpy_async(b, a, 8, consumer, 3)
    fake.stream_synchronize(consumer)
    assert fake.read(b, 8) == b"produced"
    assert fake.pending() == 1  # "too late" is still queued on the producer
    assert (fake.stats() - before).stream_waits == 1
    fake.stream_synchronize(producer)
    assert fake.read(a, 8) == b"too late"


def test_legacy_stream_orders_blocking_streams_not_non_blocking_ones(fake, dev_buffers, streams):
    a, b = dev_buffers
    blocking, non_blocking = streams(fake_cuda.STREAM_DEFAULT), streams(NB)
    fake.kernel_write(blocking, a, b"blocking")
    fake.kernel_write(non_blocking, b, b"nonblock")
    out = ctypes.create_string_buffer(8)
    fake.memcpy(ctypes.addressof(out), a, 8, 2)  # legacy stream: waits for the blocking stream
    assert out.raw == b"blocking"
    fake.memcpy(ctypes.addressof(out), b, 8, 2)  # but not for the non-blocking one
    assert out.raw == bytes(8) and fake.pending() == 1
    fake.stream_synchronize(non_blocking)
    # later work on a blocking stream waits for the legacy stream's
    src = ctypes.create_string_buffer(b"legacy!!", 8)
    fake.memcpy(a, ctypes.addressof(src), 8, 1)  # queued on the legacy stream
    fake.memcpy_async(b, a, 8, blocking, 3)
    fake.memcpy_async(ctypes.addressof(out), a, 8, non_blocking, 2)
    fake.stream_synchronize(non_blocking)  # no implicit order: reads a before the legacy copy lands
    assert out.raw == b"blocking"
    fake.stream_synchronize(blocking)
    assert fake.read(b, 8) == b"legacy!!"
    # syncing the legacy stream is a barrier for the blocking streams' work
    fake.kernel_write(blocking, a, b"barrier!")
    before = fake.stats()
    fake.stream_synchronize(None)
    assert fake.read(a, 8) == b"barrier!" and (fake.stats() - before).legacy_syncs == 1


def test_per_thread_default_stream_is_per_thread_and_blocking(fake, dev_buffers):
    a, b = dev_buffers
    ptds = fake_cuda.PER_THREAD_STREAM
    fake.kernel_write(ptds, a, b"mine")

    def other_thread():
        fake.stream_synchronize(ptds)  # its own per-thread stream: lands nothing of ours

    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert fake.read(a, 4) == bytes(4)
    out = ctypes.create_string_buffer(4)
    fake.memcpy(ctypes.addressof(out), a, 4, 2)  # the legacy stream waits for it (it is blocking)
    assert out.raw == b"mine"

    # a thread that exits with work queued on its per-thread stream: it still lands at a device sync
    t = threading.Thread(target=lambda: fake.kernel_write(ptds, b, b"orphan"))
    t.start()
    t.join()
    assert fake.read(b, 6) == bytes(6)
    fake.device_synchronize()
    assert fake.read(b, 6) == b"orphan"


def test_device_synchronize_and_free_land_work(fake, dev_buffers, streams, monkeypatch):
    monkeypatch.setenv(fake_cuda.ENV_DEVICES, "2")
    a, b = dev_buffers
    s0 = streams()
    fake.kernel_write(s0, a, b"dev0")
    fake.set_device(1)
    try:
        s1 = streams()
        src = ctypes.create_string_buffer(b"dev1", 4)  # referenced until the copy has read it
        fake.memcpy_async(b, ctypes.addressof(src), 4, s1, 1)
        before = fake.stats()
        fake.device_synchronize()  # device 1 only
        assert fake.read(b, 4) == b"dev1" and fake.read(a, 4) == bytes(4)
        assert (fake.stats() - before).device_syncs == 1
    finally:
        fake.set_device(0)
    spare = fake.malloc(16)
    fake.free(spare)  # cudaFree synchronizes
    assert fake.read(a, 4) == b"dev0" and fake.pending() == 0


def test_destroyed_stream_keeps_its_queued_work(fake, dev_buffers, events):
    a, _ = dev_buffers
    s, e = fake.stream_create(), events()
    fake.kernel_write(s, a, b"queued")
    fake.event_record(e, s)
    fake.stream_destroy(s)  # returns at once, as CUDA
    assert fake.lib.cudaStreamSynchronize(s) == fake_cuda.ERROR_INVALID_RESOURCE_HANDLE
    assert fake.lib.cudaStreamDestroy(s) == fake_cuda.ERROR_INVALID_RESOURCE_HANDLE
    assert fake.read(a, 6) == bytes(6)
    fake.event_synchronize(e)  # the event still stands for it
    assert fake.read(a, 6) == b"queued"


def test_stream_and_event_handles_are_checked(fake, dev_buffers, streams, events, monkeypatch):
    a, _ = dev_buffers
    bad = 0x1234
    lib = fake.lib
    e, s = events(), streams()
    host = ctypes.create_string_buffer(8)
    assert lib.cudaStreamDestroy(None) == lib.cudaStreamDestroy(LEGACY) == fake_cuda.ERROR_INVALID_RESOURCE_HANDLE
    assert lib.cudaStreamDestroy(fake_cuda.PER_THREAD_STREAM) == fake_cuda.ERROR_INVALID_RESOURCE_HANDLE
    for call in (lambda: lib.cudaStreamSynchronize(bad), lambda: lib.cudaStreamQuery(bad),
                 lambda: lib.cudaStreamDestroy(bad), lambda: lib.cudaStreamWaitEvent(bad, e, 0),
                 lambda: lib.cudaStreamWaitEvent(s, bad, 0), lambda: lib.cudaEventRecord(bad, s),
                 lambda: lib.cudaEventRecord(e, bad), lambda: lib.cudaEventQuery(bad),
                 lambda: lib.cudaEventSynchronize(bad), lambda: lib.cudaEventDestroy(bad),
                 lambda: lib.cudaMemcpyAsync(a, host, 8, 1, bad),
                 lambda: lib.tshm_fake_cuda_kernel_write(bad, a, host, 8)):
        assert call() == fake_cuda.ERROR_INVALID_RESOURCE_HANDLE
    out = ctypes.c_void_p()
    assert lib.cudaStreamCreateWithFlags(ctypes.byref(out), 2) == fake_cuda.ERROR_INVALID_VALUE
    assert lib.cudaStreamCreateWithFlags(None, 0) == fake_cuda.ERROR_INVALID_VALUE
    assert lib.cudaEventCreateWithFlags(ctypes.byref(out), 8) == fake_cuda.ERROR_INVALID_VALUE
    assert lib.cudaStreamWaitEvent(s, e, 2) == fake_cuda.ERROR_INVALID_VALUE
    # a kernel writes device memory only
    assert lib.tshm_fake_cuda_kernel_write(s, host, host, 8) == fake_cuda.ERROR_INVALID_VALUE
    assert lib.tshm_fake_cuda_kernel_write(s, a + 4090, host, 8) == fake_cuda.ERROR_INVALID_VALUE
    # streams and events belong to the device current at creation
    monkeypatch.setenv(fake_cuda.ENV_DEVICES, "2")
    fake.set_device(1)
    try:
        e1, s1 = events(), streams()
        assert lib.cudaEventRecord(e1, s) == fake_cuda.ERROR_INVALID_RESOURCE_HANDLE  # s is device 0's
        assert lib.cudaEventRecord(e, s1) == fake_cuda.ERROR_INVALID_RESOURCE_HANDLE
        assert lib.tshm_fake_cuda_kernel_write(s, a, host, 8) == fake_cuda.ERROR_INVALID_RESOURCE_HANDLE
        fake.event_record(e1, s1)
        fake.memcpy_async(a, ctypes.addressof(host), 8, s, 1)  # a copy may use another device's stream
        fake.stream_wait_event(s, e1)  # and a wait may cross devices
        fake.event_synchronize(e1)  # so may a sync or a query
        assert fake.event_query(e1)
    finally:
        fake.set_device(0)
    fake.stream_synchronize(s)


def test_sync_mode_lands_everything_on_return(fake, dev_buffers, streams, events, monkeypatch):
    monkeypatch.setenv(fake_cuda.ENV_SYNC, "1")
    a, b = dev_buffers
    s, e = streams(), events()
    fake.kernel_write(s, a, b"at once")
    assert fake.read(a, 7) == b"at once" and fake.pending() == 0
    fake.memcpy(b, a, 7, 3)
    assert fake.read(b, 7) == b"at once"
    fake.event_record(e, s)
    assert fake.event_query(e)


@pytest.mark.parametrize("flags", [NB, fake_cuda.STREAM_DEFAULT], ids=["non-blocking", "blocking"])
def test_many_threads_with_their_own_streams(fake, flags):
    """Threads queue, poll, copy back and sync at once; with blocking streams every
    thread's legacy cudaMemcpy also lands the other threads' queued work."""
    n_threads, rounds = 8, 50
    ptrs = [fake.malloc(4096) for _ in range(n_threads)]
    errors = []

    def work(i):
        try:
            s = fake.stream_create(flags)
            e = fake.event_create()
            for r in range(rounds):
                data = f"thread {i} round {r}".encode()
                fake.kernel_write(s, ptrs[i], data)
                fake.event_record(e, s)
                while not fake.event_query(e):
                    pass
                out = ctypes.create_string_buffer(len(data))
                fake.memcpy_async(ctypes.addressof(out), ptrs[i], len(data), s, 2)
                fake.stream_synchronize(s)
                if out.raw != data:
                    errors.append((i, r, out.raw))
                if flags == fake_cuda.STREAM_DEFAULT:
                    fake.kernel_write(s, ptrs[i], data[::-1])
                    fake.memcpy(ctypes.addressof(out), ptrs[i], len(data), 2)  # legacy: after s's write
                    if out.raw != data[::-1]:
                        errors.append((i, r, "legacy", out.raw))
            fake.event_destroy(e)
            fake.stream_destroy(s)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in ptrs:
        fake.free(p)
    assert errors == []


# --- contexts ---------------------------------------------------------------------


def test_contexts_are_created_by_set_device_and_by_work_not_by_queries(fake, monkeypatch):
    monkeypatch.setenv(fake_cuda.ENV_DEVICES, "2")
    fake.reset_contexts()
    assert fake.contexts() == set()
    assert not fake.primary_ctx_active(0) and not fake.primary_ctx_active(1)
    seen = {}

    def fresh_thread():
        fake.device_count()
        fake.get_device()
        fake.device_attribute(75, 1)
        fake.lib.cudaGetDeviceProperties_v2(ctypes.create_string_buffer(4096), 0)
        seen["after queries"] = fake.contexts()
        fake.set_device(1)  # CUDA 12: initializes device 1's context, and only that one
        seen["after set 1"] = fake.contexts()
        fake.free(fake.malloc(16))
        seen["after malloc"] = fake.contexts()

    t = threading.Thread(target=fresh_thread)
    t.start()
    t.join()
    assert seen == {"after queries": set(), "after set 1": {1}, "after malloc": {1}}
    assert fake.primary_ctx_active(1) and not fake.primary_ctx_active(0)
    # a thread that never set a device works on device 0: that creates device 0's
    t = threading.Thread(target=lambda: fake.stream_destroy(fake.stream_create()))
    t.start()
    t.join()
    assert fake.contexts() == {0, 1}
    fn = fake_cuda._CU_DEVICE_PRIMARY_CTX_GET_STATE(fake.driver_entry_point("cuDevicePrimaryCtxGetState"))
    flags, active = ctypes.c_uint(), ctypes.c_int()
    assert fn(2, ctypes.byref(flags), ctypes.byref(active)) == fake_cuda.ERROR_INVALID_DEVICE
    assert fn(0, None, None) == fake_cuda.ERROR_INVALID_VALUE


CHILD_CONTEXTS = """
    import json, threading
    from fake_cuda import FakeCudart
    fake = FakeCudart(sys.argv[1])
    out = dict(start=sorted(fake.contexts()))
    def on_one():
        fake.set_device(1)
        p = fake.host_alloc(64)
        fake.free_host(p)
    t = threading.Thread(target=on_one)
    t.start(); t.join()
    out["after"] = sorted(fake.contexts())
    print(json.dumps(out))
"""


def test_a_fresh_process_that_uses_device_1_has_no_context_on_device_0(fake, monkeypatch):
    monkeypatch.setenv(fake_cuda.ENV_DEVICES, "2")  # the child inherits it
    assert run_child(CHILD_CONTEXTS, fake.path) == dict(start=[], after=[1])


# --- lifetimes: freeing what another process has open ----------------------------

CHILD_HOLDS_OPEN = """
    import json, os
    from fake_cuda import FakeCudart
    fake = FakeCudart(sys.argv[1])
    handle, n, mode = bytes.fromhex(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    p = fake.ipc_open(handle)
    if mode == "close":
        fake.ipc_close(p)
    print("ready", flush=True)
    if mode == "die":
        os._exit(0)          # no close: the process is gone, as a killed server
    sys.stdin.readline()     # the exporter has freed it
    seen = fake.read(p, n).hex() if mode == "hold" else ""
    if mode == "hold":
        fake.ipc_close(p)
    print(json.dumps(dict(seen=seen)))
"""


def _free_with_child(fake, mode):
    n = 64
    ptr = fake.malloc(n)
    fake.write(ptr, b"payload!" * 8)
    handle = fake.ipc_get_handle(ptr)
    code = f"import sys; sys.path.insert(0, {str(TESTS_DIR)!r})\n" + textwrap.dedent(CHILD_HOLDS_OPEN)
    before = fake.stats()
    with subprocess.Popen([sys.executable, "-c", code, fake.path, handle.hex(), str(n), mode],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child:
        try:
            assert child.stdout.readline().strip() == "ready", child.stderr.read()
            if mode == "die":
                child.wait(timeout=60)
            fake.free(ptr)
            out, err = child.communicate("go\n", timeout=60)
        finally:
            if child.poll() is None:
                child.kill()
    assert child.returncode == 0, err
    seen = json.loads(out.strip().splitlines()[-1])["seen"] if mode != "die" else ""
    return (fake.stats() - before).freed_while_open, bytes.fromhex(seen)


def test_free_while_another_process_has_it_open_is_counted_and_poisoned(fake):
    count, seen = _free_with_child(fake, "hold")
    assert count == 1
    assert seen == b"\xdb" * 64  # the opener reads garbage from now on


def test_free_after_the_opener_closed_or_died_is_fine(fake):
    assert _free_with_child(fake, "close") == (0, b"")
    assert _free_with_child(fake, "die") == (0, b"")


CHILD_STILL_MAPS = """
    import json
    from fake_cuda import FakeCudart, IpcHandle
    import ctypes
    fake = FakeCudart(sys.argv[1])
    old = fake.ipc_open(bytes.fromhex(sys.argv[2]))
    print("ready", flush=True)
    new = bytes.fromhex(sys.stdin.readline())   # a new allocation where the freed one was
    out = ctypes.c_void_p()
    refused = fake.lib.cudaIpcOpenMemHandle(ctypes.byref(out), IpcHandle.from_bytes(new), 1)
    fake.ipc_close(old)                         # (Triton: the old registration unregistered)
    p = fake.ipc_open(new)
    fake.ipc_close(p)
    print(json.dumps(dict(refused=refused)))
"""


def test_a_new_allocation_where_a_freed_one_is_still_mapped_is_refused_until_it_is_closed(fake):
    # Seen on an H200: memory freed while the server still mapped it (a registration Triton
    # refused but kept open) poisons its address there -- the server refuses the handle of the
    # next allocation at that address ("invalid args") until the old mapping is closed.
    n = 4096
    ptr = fake.malloc(n)
    code = f"import sys; sys.path.insert(0, {str(TESTS_DIR)!r})\n" + textwrap.dedent(CHILD_STILL_MAPS)
    with subprocess.Popen([sys.executable, "-c", code, fake.path, fake.ipc_get_handle(ptr).hex()],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child:
        try:
            assert child.stdout.readline().strip() == "ready", child.stderr.read()
            fake.free(ptr)
            again = fake.malloc(n)
            assert again == ptr  # the fake hands a freed base out again, as CUDA does
            out, err = child.communicate(fake.ipc_get_handle(again).hex() + "\n", timeout=60)
        finally:
            if child.poll() is None:
                child.kill()
    fake.free(again)
    assert child.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1]) == dict(refused=fake_cuda.ERROR_ALREADY_MAPPED)


# --- pinned host memory, attribute 113 --------------------------------------------


def test_host_alloc_and_free_host(fake):
    before = fake.stats()
    p = fake.host_alloc(10000)
    try:
        assert fake.pointer_kind(p) == fake.pointer_kind(p + 9999) == fake_cuda.KIND_HOST_ALLOC
        fake.write(p + 9990, b"0123456789")  # host memory to its last byte
        assert fake.lib.cudaHostRegister(p + PAGE, 10, 1) == fake_cuda.ERROR_HOST_MEMORY_ALREADY_REGISTERED
        assert fake.lib.cudaHostUnregister(p) == fake_cuda.ERROR_HOST_MEMORY_NOT_REGISTERED
        assert fake.lib.cudaFreeHost(p + 8) == fake_cuda.ERROR_INVALID_VALUE
        assert fake.lib.cudaFree(p) == fake_cuda.ERROR_INVALID_VALUE
        h = ctypes.c_void_p(1)
        assert fake.lib.cudaHostAlloc(ctypes.byref(h), 16, 8) == fake_cuda.ERROR_INVALID_VALUE
        assert fake.lib.cudaHostAlloc(ctypes.byref(h), 0, 0) == 0 and h.value is None
        d = fake.stats() - before
        assert (d.host_allocs, d.live_host_allocs) == (1, 1)
    finally:
        fake.free_host(p)
    assert fake.lib.cudaFreeHost(p) == fake_cuda.ERROR_INVALID_VALUE
    assert fake.lib.cudaFreeHost(None) == 0
    assert (fake.stats() - before).live_host_allocs == 0


def test_free_host_lands_the_copies_that_read_it(fake, dev_buffers, streams):
    a, _ = dev_buffers
    s = streams()
    p = fake.host_alloc(64)
    fake.write(p, b"staged")
    fake.memcpy_async(a, p, 6, s, 1)
    fake.free_host(p)  # synchronizes before the memory goes
    assert fake.read(a, 6) == b"staged" and fake.pending() == 0


def test_read_only_host_register_attribute(fake, monkeypatch):
    attr = fake_cuda.ATTR_HOST_REGISTER_READ_ONLY_SUPPORTED
    assert fake.device_attribute(attr) == 1
    ro = anon_map(1, mmap.PROT_READ)
    try:
        monkeypatch.setenv(fake_cuda.ENV_NO_READONLY_REGISTER, "1")
        assert fake.device_attribute(attr) == 0
        assert fake.lib.cudaHostRegister(ro, PAGE, 1 | 8) == fake_cuda.ERROR_NOT_SUPPORTED
        monkeypatch.delenv(fake_cuda.ENV_NO_READONLY_REGISTER)
        fake.host_register(ro, PAGE, 1 | 8)
        fake.host_unregister(ro)
    finally:
        unmap(ro, 1)


# --- server support: what a real tritonserver calls besides tritonshm's table ---


def test_server_support_entry_points(fake):
    for name in fake_cuda.SERVER_SYMBOLS:
        assert hasattr(fake.lib, name), name
    n = 3 * PAGE + 7
    ptr = fake.malloc(n)
    try:
        assert fake.mem_get_address_range(ptr) == (0, ptr, n)
        assert fake.mem_get_address_range(ptr + n - 1) == (0, ptr, n)
        assert fake.mem_get_address_range(ptr + n)[0] == fake_cuda.CU_ERROR_NOT_FOUND or \
            fake.pointer_kind(ptr + n) == fake_cuda.KIND_ALLOC  # another allocation may follow
        host = ctypes.create_string_buffer(16)
        assert fake.mem_get_address_range(ctypes.addressof(host))[0] == fake_cuda.CU_ERROR_NOT_FOUND
        # Triton passes a NULL base
        fn = fake_cuda._CU_MEM_GET_ADDRESS_RANGE(fake.driver_entry_point("cuMemGetAddressRange"))
        size = ctypes.c_size_t()
        assert fn(None, ctypes.byref(size), ptr + 5) == 0 and size.value == n
        assert fake.driver_entry_point("cuMemGetAddressRange_v2") == fake.driver_entry_point("cuMemGetAddressRange")
        assert fake.driver_entry_point("cuLaunchKernel") is None
        assert fake.cu_error_string(fake_cuda.CU_ERROR_NOT_FOUND) == "named symbol not found"
        assert fake.cu_error_string(1) == "invalid argument"
        f, status = ctypes.c_void_p(), ctypes.c_int(-1)
        assert fake.lib.cudaGetDriverEntryPointByVersion(b"cuGetErrorString", ctypes.byref(f), 12060, 0,
                                                         ctypes.byref(status)) == 0
        assert f.value == fake.driver_entry_point("cuGetErrorString") and status.value == 0
        # an asynchronous copy lands at the stream's sync (the server runs with TSHM_FAKE_CUDA_SYNC=1)
        fake.write(ptr, b"async!")
        assert fake.lib.cudaMemcpyAsync(host, ptr, 6, 2, None) == 0
        assert host.raw[:6] == bytes(6)
        fake.stream_synchronize(None)
        assert host.raw[:6] == b"async!"
        assert fake.lib.cudaMemcpyAsync(host, ptr + n - 2, 6, 2, None) == fake_cuda.ERROR_INVALID_VALUE
        assert fake.lib.cudaMemcpyAsync(host, ptr, 6, 2, 0x99) == fake_cuda.ERROR_INVALID_RESOURCE_HANDLE
    finally:
        fake.free(ptr)


def test_server_env(fake, tmp_path):
    env = fake_cuda.server_env(fake.path)
    assert env == {"LD_PRELOAD": fake.path, fake_cuda.ENV_SYNC: "1", fake_cuda.ENV_FAIL: "cudaHostAlloc=2"}
    env = fake_cuda.server_env(fake.path, tmp_path / "t", pinned_pool=True, **{fake_cuda.ENV_DEVICES: "2"})
    assert env == {"LD_PRELOAD": fake.path, fake_cuda.ENV_SYNC: "1", fake_cuda.ENV_DEVICES: "2",
                   fake_cuda.ENV_TRACE: str(tmp_path / "t")}


CHILD_TRITON_CLIENT = """
    import base64, json
    import numpy as np
    import tritonclient.grpc, tritonclient.http
    from fake_cuda import FakeCudart
    fake = FakeCudart(sys.argv[1])
    urls = {"grpc": sys.argv[2], "http": sys.argv[3]}
    n = 1000
    nbytes = 4 * n
    result = {}
    for proto, module in (("grpc", tritonclient.grpc), ("http", tritonclient.http)):
        client = module.InferenceServerClient(urls[proto])
        src, dst = fake.malloc(nbytes), fake.malloc(nbytes)
        x = np.arange(n, dtype=np.float32) * 1.5
        fake.write(src, x.tobytes())
        for name, ptr in (("in", src), ("out", dst)):
            handle = base64.b64encode(fake.ipc_get_handle(ptr)).decode()
            client.register_cuda_shared_memory(f"{proto}_{name}", handle, 0, nbytes)
        try:
            handle = base64.b64encode(fake.ipc_get_handle(src)).decode()
            client.register_cuda_shared_memory(f"{proto}_big", handle, 0, nbytes + 1)
            oversized = "accepted"
        except Exception as exc:
            oversized = str(exc)
        inp = module.InferInput("INPUT0", [n], "FP32")
        inp.set_shared_memory(f"{proto}_in", nbytes)
        out = module.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory(f"{proto}_out", nbytes)
        client.infer("identity_fp32", [inp], outputs=[out])
        y = np.frombuffer(fake.read(dst, nbytes), dtype=np.float32)
        client.unregister_cuda_shared_memory(f"{proto}_in")
        client.unregister_cuda_shared_memory(f"{proto}_out")
        # src stays allocated: the server still maps it (2.51 keeps the refused registration's
        # handle open), and a new allocation at a freed src's address would be refused there.
        fake.free(dst)
        client.close()
        result[proto] = dict(equal=bool(np.array_equal(x, y)), oversized=oversized)
    print(json.dumps(result))
"""


@pytest.mark.server
def test_real_triton_server_opens_fake_handles(fake, tmp_path):
    """A real tritonserver with the fake preloaded registers fake CUDA
    regions, refuses an oversized one and runs identity_fp32 through them
    (the client runs in a child process: its gRPC/HTTP machinery keeps
    descriptors open for the process's life)."""
    import inspect

    server_mod = pytest.importorskip("tritonshm.server")
    if "env" not in inspect.signature(server_mod.LocalServer).parameters:
        pytest.skip("this tritonshm's LocalServer takes no env=")
    from triton_fixtures import start_or_skip

    trace = tmp_path / "trace"
    server = start_or_skip(server_mod.LocalServer(env=fake_cuda.server_env(fake.path, trace)))
    try:
        got = run_child(CHILD_TRITON_CLIENT, fake.path, server.grpc_url, server.http_url)
        server_pid = server.pid
    finally:
        server.stop()
    for proto in ("grpc", "http"):
        assert got[proto]["equal"], proto
        assert f"failed to register shared memory region '{proto}_big': invalid args" in got[proto]["oversized"]
    calls = fake_cuda.read_trace(trace)[server_pid]
    # 3 registrations per protocol; 2.51 does not close the handle of the refused one
    assert calls.count("cudaIpcOpenMemHandle") == 6
    assert calls.count("cuMemGetAddressRange") == 6
    assert calls.count("cudaIpcCloseMemHandle") == 4
    assert "cudaMemcpyAsync" in calls


def test_an_interprocess_event_needs_disable_timing(fake):
    """CUDA takes cudaEventInterprocess only with cudaEventDisableTiming."""
    event = ctypes.c_void_p()
    assert fake.lib.cudaEventCreateWithFlags(ctypes.byref(event), 4) == fake_cuda.ERROR_INVALID_VALUE
    assert fake.lib.cudaEventCreateWithFlags(ctypes.byref(event), 4 | 1) == fake_cuda.ERROR_INVALID_VALUE
    fake.get_last_error()  # (the refusals' error is no later call's)
    fake.event_destroy(fake.event_create(4 | 2))
