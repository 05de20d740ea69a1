"""Tests of the memory layer: tritonshm.SystemRegion over POSIX shared memory.

Every test also runs under the leak check of conftest.py: descriptors,
mappings and /dev/shm segments must all be gone when it ends.
"""

from __future__ import annotations

import array
import ctypes
import errno
import gc
import json
import multiprocessing
import operator
import os
import pickle
import re
import secrets
import shutil
import stat
import subprocess
import sys
import threading
import warnings
import weakref

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tritonshm
from tritonshm import (
    DTypeMismatch,
    OutOfBounds,
    ReadOnlyRegion,
    RegionClosed,
    ShapeMismatch,
    SharedMemoryOSError,
    SystemRegion,
    UnsupportedBuffer,
    Window,
)

SHM_DIR = "/dev/shm"
PyBUF_WRITABLE = 0x0001


# -- helpers ------------------------------------------------------------------


def shm_path(key: str) -> str:
    return SHM_DIR + key


def mapping_count(key: str) -> int:
    """How many mappings of segment *key* this process has (from /proc/self/maps)."""
    path = shm_path(key)
    with open("/proc/self/maps") as maps:
        mapped = [fields[5].rstrip("\n") for fields in (line.split(maxsplit=5) for line in maps) if len(fields) == 6]
    # After an owner's close() the kernel shows the unlinked name with " (deleted)".
    return sum(1 for p in mapped if p.removesuffix(" (deleted)") == path)


def get_writable_buffer(obj) -> None:
    """Request a writable buffer of *obj* the way C consumers do, then release it.

    numpy and memoryview quietly fall back to a read-only export, so they
    cannot show whether the exporter refuses ``PyBUF_WRITABLE``; this can.
    """
    view = ctypes.create_string_buffer(256)  # room for a Py_buffer
    ctypes.pythonapi.PyObject_GetBuffer(ctypes.py_object(obj), view, ctypes.c_int(PyBUF_WRITABLE))
    ctypes.pythonapi.PyBuffer_Release(view)


def foreign_segment(data: bytes) -> str:
    """Make a segment without the library (as another program would) and return its key.

    The name follows the library's pattern so the leak check covers it.
    """
    key = f"/tritonshm-{os.getpid()}-{secrets.token_hex(8)}"
    fd = os.open(shm_path(key), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    return key


@pytest.fixture
def region():
    r = SystemRegion.create(4096)
    yield r
    r.close()


# -- lifecycle: exports and references -----------------------------------------


def test_fresh_regions():
    with SystemRegion.create(1000) as r:
        assert (r.nbytes, r.owner, r.closed, r.exports, r.readonly) == (1000, True, False, 0, False)
        a = SystemRegion.attach(r.key)
        ro = SystemRegion.attach(r.key, readonly=True)
        assert (a.key, a.nbytes, a.owner, a.readonly) == (r.key, 1000, False, False)
        assert (ro.key, ro.nbytes, ro.owner, ro.readonly) == (r.key, 1000, False, True)
        a.close()
        ro.close()
    assert r.closed
    assert r.key in repr(r) and "closed" in repr(r)


def test_direct_construction_is_refused():
    with pytest.raises(TypeError):
        SystemRegion()


def test_memoryview_export_and_slices(region):
    """A memoryview is one export; its slices share it and add nothing."""
    base = sys.getrefcount(region)
    mv = memoryview(region)
    assert (region.exports, sys.getrefcount(region)) == (1, base + 1)
    assert (mv.readonly, mv.nbytes, mv.format, mv.ndim, mv.shape, mv.strides) == (False, 4096, "B", 1, (4096,), (1,))

    head, tail = mv[:16], mv[16:]
    assert (region.exports, sys.getrefcount(region)) == (1, base + 1)

    # The slices keep the export alive after the parent memoryview goes.
    mv.release()
    assert region.exports == 1
    del head
    assert region.exports == 1
    del tail
    assert (region.exports, sys.getrefcount(region)) == (0, base)


def test_each_memoryview_is_its_own_export(region):
    base = sys.getrefcount(region)
    with memoryview(region) as one, memoryview(region) as two:
        assert (region.exports, sys.getrefcount(region)) == (2, base + 2)
        one.release()
        assert region.exports == 1
        assert two[0] == 0
    assert (region.exports, sys.getrefcount(region)) == (0, base)


def test_ndarray_view_is_one_export(region):
    """A numpy view is one export; arrays derived from it are numpy's business."""
    base = sys.getrefcount(region)
    a = region.ndarray(np.float32, (4, 8))
    assert (region.exports, sys.getrefcount(region)) == (1, base + 1)

    derived = [
        a[1:],
        a.T,
        a.reshape(-1),
        a.view(np.uint8),
        np.asarray(a),
        np.frombuffer(a, np.uint8),
        memoryview(a),
        a.ravel(),
    ]
    assert (region.exports, sys.getrefcount(region)) == (1, base + 1)
    assert all(np.shares_memory(d, a) for d in derived if isinstance(d, np.ndarray))

    del a
    assert region.exports == 1  # the derived arrays still hold it
    derived.clear()
    assert (region.exports, sys.getrefcount(region)) == (0, base)


def test_numpy_consumers_of_the_region(region):
    """np.asarray / np.frombuffer on the region itself each take one export."""
    base = sys.getrefcount(region)
    a = np.asarray(region)
    b = np.frombuffer(region, np.uint8)
    assert (region.exports, sys.getrefcount(region)) == (2, base + 2)
    assert a.flags.writeable and b.flags.writeable
    a[7] = 42
    assert b[7] == 42
    del a, b
    assert (region.exports, sys.getrefcount(region)) == (0, base)


def test_exports_are_counted_per_region_object(region):
    peer = SystemRegion.attach(region.key)
    try:
        v = peer.ndarray(np.uint8, 8)
        assert (region.exports, peer.exports) == (0, 1)
        del v
        assert peer.exports == 0
    finally:
        peer.close()


def test_writable_export_request_on_a_writable_region(region):
    base = sys.getrefcount(region)
    get_writable_buffer(region)
    assert (region.exports, sys.getrefcount(region)) == (0, base)


# -- views outliving close() ---------------------------------------------------


def test_view_outlives_close():
    r = SystemRegion.create(4096)
    key = r.key
    peer = SystemRegion.attach(key)
    a = r.ndarray(np.uint8, 4096)
    assert mapping_count(key) == 2  # r's mapping and peer's

    r.close()
    assert r.closed and r.exports == 1
    assert not os.path.exists(shm_path(key))  # the owner unlinks at once, views or not
    assert mapping_count(key) == 2  # ... but the view keeps r's mapping

    a[:] = 7  # writing through the view after close() is fine
    assert (a == 7).all()
    assert (peer.read(np.uint8, 4096) == 7).all()  # and it is the same memory

    peer.close()
    assert mapping_count(key) == 1
    del a
    gc.collect()
    assert mapping_count(key) == 0
    assert r.exports == 0


def test_memoryview_slice_outlives_close():
    r = SystemRegion.create(100)
    key = r.key
    with memoryview(r) as mv:
        tail = mv[90:]
    r.close()
    tail[:] = b"0123456789"
    assert bytes(tail) == b"0123456789"
    assert mapping_count(key) == 1
    del tail
    assert mapping_count(key) == 0


def test_close_without_views_unmaps_at_once():
    r = SystemRegion.create(100)
    key = r.key
    assert mapping_count(key) == 1
    r.close()
    assert mapping_count(key) == 0


# -- close() -------------------------------------------------------------------


def test_close_is_idempotent():
    r = SystemRegion.create(64)
    r.close()
    r.close()
    assert r.closed
    with SystemRegion.create(64) as s:
        s.close()  # closed inside the block: __exit__ closes again, quietly
    assert s.closed


def test_with_block_closes_even_on_error():
    with pytest.raises(KeyError):
        with SystemRegion.create(64) as r:
            raise KeyError("boom")
    assert r.closed
    assert not os.path.exists(shm_path(r.key))


def test_non_owner_close_never_unlinks(region):
    for readonly in (False, True):
        peer = SystemRegion.attach(region.key, readonly=readonly)
        v = peer.ndarray(np.uint8, 4)
        peer.close()
        peer.close()
        del v
        assert os.path.exists(shm_path(region.key))
    region.write(b"still usable")
    assert region.read("S12", ()) == b"still usable"


def test_owner_close_tolerates_a_name_already_removed():
    """Someone else (tritonshm gc, a peer) unlinked the name: close() stays quiet."""
    r = SystemRegion.create(64)
    os.unlink(shm_path(r.key))
    r.close()
    assert r.closed


def test_attach_after_owner_close_fails():
    r = SystemRegion.create(64)
    r.close()
    with pytest.raises(SharedMemoryOSError) as info:
        SystemRegion.attach(r.key)
    assert info.value.errno == errno.ENOENT


# -- garbage collection without close() ----------------------------------------


def test_gc_of_unclosed_owner_warns_and_unlinks():
    r = SystemRegion.create(64)
    key = r.key
    with pytest.warns(ResourceWarning, match="unclosed"):
        del r
        gc.collect()
    assert not os.path.exists(shm_path(key))
    assert mapping_count(key) == 0


def test_gc_of_unclosed_attached_region_is_silent(region):
    peer = SystemRegion.attach(region.key)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del peer
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
    assert os.path.exists(shm_path(region.key))
    assert mapping_count(region.key) == 1


def test_views_keep_an_unclosed_region_alive():
    """A view references its region: GC finalizes the region only with the last view."""
    r = SystemRegion.create(64)
    key = r.key
    a = r.ndarray(np.uint8, 64)
    del r
    gc.collect()
    assert os.path.exists(shm_path(key))
    with pytest.warns(ResourceWarning, match="unclosed"):
        del a
        gc.collect()
    assert not os.path.exists(shm_path(key))
    assert mapping_count(key) == 0


def test_unclosed_owner_is_reported_when_resource_warnings_are_errors(monkeypatch):
    """Under -W error::ResourceWarning the leak must reach sys.unraisablehook, like CPython's own classes."""
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: reported.append(u.exc_type))
    r = SystemRegion.create(64)
    key = r.key
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        del r
        gc.collect()
    assert not os.path.exists(shm_path(key))  # cleaned up either way
    assert reported == [ResourceWarning]


# -- keys, permissions, O_EXCL ------------------------------------------------


def test_key_format(region):
    assert re.fullmatch(rf"/tritonshm-{os.getpid()}-[0-9a-f]{{16}}", region.key)
    assert os.path.exists(shm_path(region.key))


def test_keys_are_unique():
    regions = [SystemRegion.create(1) for _ in range(200)]
    try:
        assert len({r.key for r in regions}) == 200
    finally:
        for r in regions:
            r.close()


@pytest.mark.parametrize("umask", [0, 0o077, 0o277, 0o377])
def test_segment_mode_is_0600_whatever_the_umask(umask):
    """Never wider than 0600, and never narrower either: a umask that takes the owner's write bit
    would leave a segment that the server, as the same user, cannot open to write outputs."""
    old = os.umask(umask)
    try:
        r = SystemRegion.create(64)
    finally:
        os.umask(old)
    try:
        st_ = os.stat(shm_path(r.key))
        assert stat.S_IMODE(st_.st_mode) == 0o600
        assert st_.st_uid == os.getuid()
        assert st_.st_size == 64
    finally:
        r.close()


def test_attach_maps_a_segment_made_by_another_program():
    key = foreign_segment(b"made elsewhere")
    try:
        with SystemRegion.attach(key) as r:
            assert r.nbytes == 14 and not r.owner
            assert r.read("S14", ()) == b"made elsewhere"
        assert os.path.exists(shm_path(key))
    finally:
        os.unlink(shm_path(key))


def test_attach_to_an_empty_segment_is_refused():
    key = foreign_segment(b"")
    try:
        with pytest.raises(SharedMemoryOSError) as info:
            SystemRegion.attach(key)
        assert info.value.errno == errno.ENODATA
    finally:
        os.unlink(shm_path(key))


_FIXED_GETRANDOM = r"""
#include <string.h>
#include <sys/types.h>
/* Every "random" name is the same: tritonshm-<pid>-abababababababab. */
ssize_t getrandom(void *buf, size_t len, unsigned int flags)
{
    (void)flags;
    memset(buf, 0xab, len);
    return (ssize_t)len;
}
"""

_EXCL_CHILD = r"""
import json, os
from tritonshm import SystemRegion, SharedMemoryOSError

def try_create():
    try:
        SystemRegion.create(4096).close()
    except SharedMemoryOSError as e:
        return e.errno
    return None

path = f"/dev/shm/tritonshm-{os.getpid()}-abababababababab"
result = {}
# 1. A squatter (another user, an attacker) made the name first.
fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
os.write(fd, b"squatter")
os.close(fd)
mode = os.stat(path).st_mode
result["squatted"] = try_create()
result["squatter_intact"] = open(path, "rb").read() == b"squatter" and os.stat(path).st_mode == mode
os.unlink(path)
# 2. One of our own live segments holds the name.
with SystemRegion.create(64) as first:
    first.write(b"first")
    result["own"] = try_create()
    result["own_intact"] = first.read("S5", ()) == b"first" and first.nbytes == 64
print(json.dumps(result))
"""


def test_create_never_reuses_an_existing_name(tmp_path):
    """O_EXCL: with getrandom() forced to repeat, create() refuses rather than open the existing segment."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler to build the getrandom() stub")
    (tmp_path / "fixed.c").write_text(_FIXED_GETRANDOM)
    lib = tmp_path / "fixed.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "fixed.c")], check=True)
    env = dict(os.environ)
    # Keep any preloaded sanitizer runtime first in the list.
    env["LD_PRELOAD"] = " ".join(filter(None, [env.get("LD_PRELOAD"), str(lib)]))
    out = subprocess.run(
        [sys.executable, "-c", _EXCL_CHILD], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == {
        "squatted": errno.EEXIST,
        "squatter_intact": True,
        "own": errno.EEXIST,
        "own_intact": True,
    }


# -- other processes: spawn, pickle, fork --------------------------------------


def _child_swap(key: str, n: int):
    """In a spawned process: attach by key, return what is there, write it back reversed."""
    r = SystemRegion.attach(key)
    try:
        seen = r.read(np.uint8, n).tobytes()
        r.write(seen[::-1])
        return seen, r.owner
    finally:
        r.close()


def _child_use_region(r: SystemRegion, marker: bytes):
    """In a spawned process: *r* arrived by pickle; write *marker* to its start if it allows."""
    try:
        info = {"key": r.key, "owner": r.owner, "readonly": r.readonly, "nbytes": r.nbytes}
        try:
            r.write(marker)
            info["wrote"] = True
        except ReadOnlyRegion:
            info["wrote"] = False
        info["head"] = r.read(np.uint8, len(marker)).tobytes()
        return info
    finally:
        r.close()


def _child_from_queue(inbox, outbox):
    r = inbox.get()
    try:
        r.write(b"via queue", offset=10)
        outbox.put((r.key, r.owner))
    finally:
        r.close()


def spawn_pool():
    """A one-worker pool of spawned (not forked) processes.

    Made inside each test rather than by a fixture: pytest holds fixture
    values until after the leak check, and a pool's pipes close only when
    it is collected.  Nor may a pool's handler threads outlive the test:
    another test forks.
    """
    return multiprocessing.get_context("spawn").Pool(1)


def test_spawned_process_sees_writes_both_ways():
    payload = bytes(range(256)) * 16
    with spawn_pool() as pool, SystemRegion.create(len(payload)) as r:
        r.write(payload)
        seen, child_owner = pool.apply(_child_swap, (r.key, len(payload)))
        assert seen == payload
        assert child_owner is False
        assert r.read(np.uint8, len(payload)).tobytes() == payload[::-1]
        assert os.path.exists(shm_path(r.key))  # the child's close() did not unlink


def test_pickle_through_a_pool_attaches_by_key():
    with spawn_pool() as pool, SystemRegion.create(4096) as r, SystemRegion.attach(r.key, readonly=True) as ro:
        r.write(b"parent")
        ro_info = pool.apply(_child_use_region, (ro, b"child!"))
        rw_info = pool.apply(_child_use_region, (r, b"child!"))
        common = {"key": r.key, "owner": False, "nbytes": 4096}
        assert ro_info == {**common, "readonly": True, "wrote": False, "head": b"parent"}
        assert rw_info == {**common, "readonly": False, "wrote": True, "head": b"child!"}
        assert r.read("S6", ()) == b"child!"
        assert os.path.exists(shm_path(r.key))


def test_pickle_through_a_queue():
    ctx = multiprocessing.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_child_from_queue, args=(inbox, outbox))
    proc.start()
    try:
        with SystemRegion.create(64) as r:
            inbox.put(r)
            # The region stays open until the child answers: the queue
            # pickles in a background thread, and the child attaches by name.
            assert outbox.get(timeout=120) == (r.key, False)
            assert r.read("S9", (), offset=10) == b"via queue"
    finally:
        proc.join(timeout=120)
        for q in (inbox, outbox):
            q.close()
            q.join_thread()
    assert proc.exitcode == 0
    proc.close()


def test_pickle_in_process(region):
    region.write(b"abc")
    copy = pickle.loads(pickle.dumps(region))
    try:
        assert (copy.key, copy.owner, copy.readonly, copy.nbytes) == (region.key, False, False, 4096)
        copy.write(b"xyz")
        assert region.read("S3", ()) == b"xyz"
    finally:
        copy.close()
    assert os.path.exists(shm_path(region.key))

    ro = SystemRegion.attach(region.key, readonly=True)
    ro_copy = pickle.loads(pickle.dumps(ro))
    assert ro_copy.readonly
    ro.close()
    ro_copy.close()


def test_fork_child_never_unlinks_the_parents_segments():
    """A forked child inherits owner regions; closing or dropping them there must not unlink."""
    closed_in_child = SystemRegion.create(64)
    dropped_in_child = SystemRegion.create(64)
    keys = closed_in_child.key, dropped_in_child.key
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        status = 1
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                closed_in_child.write(b"child was here")
                closed_in_child.close()
                del dropped_in_child
                gc.collect()
            if any(issubclass(w.category, ResourceWarning) for w in caught):
                status = 2  # the warning is the parent's business
            elif not all(os.path.exists(shm_path(k)) for k in keys):
                status = 3
            else:
                status = 0
        finally:
            os._exit(status)
    _, wait_status = os.waitpid(pid, 0)
    try:
        assert os.waitstatus_to_exitcode(wait_status) == 0
        assert all(os.path.exists(shm_path(k)) for k in keys)
        assert closed_in_child.read("S14", ()) == b"child was here"
        assert not closed_in_child.closed and not dropped_in_child.closed
    finally:
        closed_in_child.close()
        dropped_in_child.close()
    assert not any(os.path.exists(shm_path(k)) for k in keys)


# -- read-only attach ----------------------------------------------------------


def test_readonly_attach(region):
    region.write(b"hello")
    ro = SystemRegion.attach(region.key, readonly=True)
    try:
        base = sys.getrefcount(ro)
        with memoryview(ro) as mv:
            assert mv.readonly
            assert mv[:5] == b"hello"
            with pytest.raises(TypeError):
                mv[0] = 1
        assert not np.frombuffer(ro, np.uint8).flags.writeable

        a = ro.ndarray(np.uint8, 5)
        assert not a.flags.writeable
        with pytest.raises(ValueError):
            a[0] = 1
        with pytest.raises(ValueError):
            a.setflags(write=True)  # would let a write fault on PROT_READ pages
        del a

        # A C consumer asking for a writable buffer is refused, and the
        # failed request leaves no export or reference behind.
        with pytest.raises(ReadOnlyRegion):
            get_writable_buffer(ro)
        assert (ro.exports, sys.getrefcount(ro)) == (0, base)

        with pytest.raises(ReadOnlyRegion) as info:
            ro.write(b"x")
        assert isinstance(info.value, BufferError) and isinstance(info.value, tritonshm.Error)

        assert ro.read("S5", ()) == b"hello"  # copies out still work
        region.write(b"HELLO")
        assert ro.read("S5", ()) == b"HELLO"  # and see the writer's updates
    finally:
        ro.close()


# -- bounds and argument checking ----------------------------------------------

BIG = [2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**100]


@pytest.mark.parametrize(
    ("offset", "nbytes", "expected"),
    [
        (0, None, (0, 4096)),
        (4096, None, (4096, 0)),
        (4096, 0, (4096, 0)),
        (10, 5, (10, 5)),
        (0, 4096, (0, 4096)),
        (True, None, (1, 4095)),
        (np.int64(10), np.uint8(5), (10, 5)),
    ],
)
def test_span_accepts(region, offset, nbytes, expected):
    got = region.span(offset, nbytes)
    assert got == expected and all(type(x) is int for x in got)


@pytest.mark.parametrize(
    ("offset", "nbytes"),
    [
        (-1, None),
        (-1, 1),
        (4097, None),
        (4096, 1),
        (0, 4097),
        (1, 4096),
        (0, -1),
        (2**63, 2**63),  # sums to 2**64: wraps to 0 in 64 bits
        (1, 2**64 - 1),  # wraps to 0 too
        (2**63 - 1, 2**63 + 1),
        (-(2**63), 2**63),
        (-(2**64), None),
    ]
    + [(b, None) for b in BIG]
    + [(0, b) for b in BIG],
)
def test_span_rejects_out_of_range(region, offset, nbytes):
    with pytest.raises(OutOfBounds):
        region.span(offset, nbytes)


@pytest.mark.parametrize("bad", [1.0, "1", None, 1j, np.float64(1), b"\x01"])
def test_non_integer_offsets_and_sizes(region, bad):
    with pytest.raises(OutOfBounds, match="must be an integer"):
        region.span(bad)
    if bad is not None:  # nbytes=None means "the rest"
        with pytest.raises(OutOfBounds, match="must be an integer"):
            region.span(0, bad)
    with pytest.raises(OutOfBounds):
        region.ndarray(np.uint8, 1, offset=bad)
    with pytest.raises(OutOfBounds):
        region.read(np.uint8, 1, offset=bad)
    with pytest.raises(OutOfBounds):
        region.write(b"x", offset=bad)


@pytest.mark.parametrize("offset", [-1, 4096 - 3, 4097, 2**63, 2**64, 2**64 - 2, -(2**64)])
def test_out_of_range_copies_and_views(region, offset):
    """Four bytes at *offset* never fit; nothing is written, nothing is viewed."""
    region.write(b"\xaa" * 4096)
    with pytest.raises(OutOfBounds):
        region.write(b"abcd", offset=offset)
    with pytest.raises(OutOfBounds):
        region.read(np.uint32, 1, offset=offset)
    with pytest.raises(OutOfBounds):
        region.ndarray(np.uint32, 1, offset=offset)
    assert region.read(np.uint8, 4096).tobytes() == b"\xaa" * 4096
    assert region.exports == 0


@pytest.mark.parametrize(
    ("dtype", "shape", "offset"),
    [
        (np.uint8, 2**63, 2**63),  # offset + size wraps to 0
        (np.uint8, 2**64 - 1, 1),
        (np.float64, 2**61, 0),  # 2**61 * 8 = 2**64: the byte count wraps to 0
        (np.float64, (2**31, 2**30), 0),
        (np.complex128, (2**40, 2**40, 2**40), 0),
        (np.uint8, 4097, 0),
        (np.uint8, (64, 65), 0),
    ],
)
def test_oversized_shapes(region, dtype, shape, offset):
    with pytest.raises(OutOfBounds):
        region.ndarray(dtype, shape, offset=offset)
    with pytest.raises(OutOfBounds):
        region.read(dtype, shape, offset=offset)
    assert region.exports == 0


@pytest.mark.parametrize("shape", [-1, (-1,), (2, -1), (0, -5), ("a",), 1.5, [1.5], None, "3"])
def test_bad_shapes(region, shape):
    with pytest.raises(ShapeMismatch):
        region.ndarray(np.uint8, shape)
    with pytest.raises(ShapeMismatch):
        region.read(np.uint8, shape)


@pytest.mark.parametrize("shape", [0, (0,), (0, 7), (), (2, 0, 3), [4, 4], np.int64(8), (np.uint16(2), 3)])
def test_good_shapes(region, shape):
    expected = np.empty(shape, np.uint8).shape
    assert region.ndarray(np.uint8, shape).shape == expected
    assert region.read(np.uint8, shape).shape == expected


@pytest.mark.parametrize("dtype", [object, "O", [("a", "i4"), ("b", "O")], "V0", np.dtype("V0"), "notadtype", 3.5])
def test_bad_dtypes(region, dtype):
    with pytest.raises(DTypeMismatch):
        region.ndarray(dtype, 1)
    with pytest.raises(DTypeMismatch):
        region.read(dtype, 1)


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda r: r.ndarray(("f4", (2,)), 3), id="ndarray-subarray-dtype"),
        pytest.param(lambda r: r.read(("f4", (2,)), 3), id="read-subarray-dtype"),
        pytest.param(lambda r: r.read(("f4", -1), 1), id="dtype-that-numpy-rejects-with-ValueError"),
        pytest.param(lambda r: r.ndarray(np.uint8, (0, 2**63)), id="empty-shape-with-huge-dim"),
        pytest.param(lambda r: r.read(np.uint8, (1,) * 65), id="more-than-64-dims"),
        pytest.param(lambda r: SystemRegion.attach(b"/x"), id="attach-bytes-key"),
        pytest.param(lambda r: SystemRegion.attach("/\udc80"), id="attach-unencodable-key"),
    ],
)
def test_argument_errors_are_library_errors(region, call):
    """DESIGN.md: everything the library raises derives from tritonshm.Error."""
    with pytest.raises(tritonshm.Error):
        call(region)


@pytest.mark.parametrize("nbytes", [0, -1, -(2**70), 2**63, 2**64, 2**70, 1.5, "16", None])
def test_create_refuses_bad_sizes(nbytes):
    with pytest.raises(OutOfBounds):
        SystemRegion.create(nbytes)


def test_create_larger_than_dev_shm_fails_cleanly():
    vfs = os.statvfs(SHM_DIR)
    if vfs.f_blocks == 0:
        pytest.skip("/dev/shm has no size limit: a huge request would try to allocate it")
    mine = re.compile(rf"^tritonshm-{os.getpid()}-")
    before = {n for n in os.listdir(SHM_DIR) if mine.match(n)}
    with pytest.raises(SharedMemoryOSError) as info:
        SystemRegion.create(2**62)
    assert info.value.errno in (errno.ENOSPC, errno.EFBIG, errno.ENOMEM)
    assert "/dev/shm" in str(info.value)  # the hint points at the usual cause
    assert {n for n in os.listdir(SHM_DIR) if mine.match(n)} == before


@pytest.mark.parametrize("key", ["noslash", "/a/b", "", "/", "//", "/x\0y", "/" + "a" * 255])
def test_attach_refuses_malformed_keys(key):
    with pytest.raises(tritonshm.InvalidKey):
        SystemRegion.attach(key)


def test_attach_to_a_missing_segment():
    key = f"/tritonshm-{os.getpid()}-{secrets.token_hex(8)}"
    with pytest.raises(SharedMemoryOSError) as info:
        SystemRegion.attach(key)
    e = info.value
    assert isinstance(e, OSError) and isinstance(e, tritonshm.Error)
    assert e.errno == errno.ENOENT and e.filename == key
    assert "no such segment" in str(e)


def _enter(r):
    with r:
        pass


CLOSED_OPS = {
    "ndarray": lambda r: r.ndarray(np.uint8, 1),
    "write": lambda r: r.write(b"x"),
    "read": lambda r: r.read(np.uint8, 1),
    "span": lambda r: r.span(),
    "memoryview": memoryview,
    "np.frombuffer": lambda r: np.frombuffer(r, np.uint8),
    "pickle": pickle.dumps,
    "with": _enter,
}


@pytest.mark.parametrize("kind", ["owner", "attached", "readonly"])
@pytest.mark.parametrize("op", CLOSED_OPS.values(), ids=CLOSED_OPS.keys())
def test_operations_on_a_closed_region(region, kind, op):
    r = region if kind == "owner" else SystemRegion.attach(region.key, readonly=kind == "readonly")
    r.close()
    with pytest.raises(RegionClosed) as info:
        op(r)
    assert isinstance(info.value, ValueError) and isinstance(info.value, tritonshm.Error)
    # What describes the region stays readable.
    assert (r.key, r.nbytes, r.closed, r.exports) == (region.key, 4096, True, 0)


class _ClosesOnIndex:
    """An int-like whose conversion closes *region*: argument parsing can run user code."""

    def __init__(self, region):
        self.region = region

    def __index__(self):
        self.region.close()
        return 0


@pytest.mark.parametrize("nbytes", [4096, 1 << 20])  # below and above the GIL-free copy size
@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda r, i: r.write(bytes(r.nbytes), offset=i), id="write-offset"),
        pytest.param(lambda r, i: r.read(np.uint8, r.nbytes, offset=i), id="read-offset"),
        pytest.param(lambda r, i: r.read(np.uint8, (i,)), id="read-shape"),
        pytest.param(lambda r, i: r.ndarray(np.uint8, r.nbytes, offset=i), id="ndarray-offset"),
        pytest.param(lambda r, i: r.window(offset=i), id="window-offset"),
    ],
)
def test_close_during_argument_conversion(nbytes, call):
    """Regression: write()/read()/window() used a mapping freed by a close() run from __index__."""
    r = SystemRegion.create(nbytes)
    with pytest.raises(RegionClosed):
        call(r, _ClosesOnIndex(r))
    assert r.closed


# -- windows -------------------------------------------------------------------


def test_window_is_a_byte_range_of_the_region(region):
    w = region.window(16, 32)
    assert (w.key, w.offset, w.nbytes, w.readonly, w.exports) == (region.key, 16, 32, False, 0)
    base = sys.getrefcount(w)
    with memoryview(w) as mv:
        assert (mv.nbytes, mv.readonly, w.exports, region.exports) == (32, False, 1, 0)
        assert sys.getrefcount(w) == base + 1
        mv[:5] = b"hello"
    assert (w.exports, sys.getrefcount(w)) == (0, base)
    assert region.read("S5", (), offset=16) == b"hello"

    a = w.ndarray(np.uint32, 8)
    a[:] = np.arange(8)
    assert region.read(np.uint32, 8, offset=16).tolist() == list(range(8))
    assert region.window(4000).nbytes == 96  # the rest of the region by default
    del a


def test_window_of_a_readonly_region(region):
    with SystemRegion.attach(region.key, readonly=True) as ro:
        w = ro.window()
        assert w.readonly
        assert not w.ndarray(np.uint8, 4).flags.writeable
        with pytest.raises(ReadOnlyRegion):
            get_writable_buffer(w)
        assert w.exports == 0


def test_window_outlives_its_region():
    """A window holds the mapping itself: closing the region leaves it (and its views) valid."""
    r = SystemRegion.create(4096)
    key = r.key
    w = r.window(100, 8)
    r.close()
    assert not os.path.exists(shm_path(key))
    view = w.ndarray(np.uint8, 8)
    view[:] = 3
    assert w.ndarray(np.uint8, 8).tolist() == [3] * 8
    del w
    gc.collect()
    assert mapping_count(key) == 1  # the view still holds the window, and so the mapping
    del view
    assert mapping_count(key) == 0


def test_window_is_a_lease():
    """weakref.finalize on a window fires only once the window and all its views are gone."""
    with SystemRegion.create(64) as r:
        released = []
        w = r.window(0, 16)
        weakref.finalize(w, released.append, "released")
        view = w.ndarray(np.uint8, 16)
        del w
        gc.collect()
        assert released == []
        del view
        gc.collect()
        assert released == ["released"]


@pytest.mark.parametrize(("offset", "nbytes"), [(-1, None), (4097, None), (0, 4097), (2**63, 2**63), (1.0, None)])
def test_window_bounds(region, offset, nbytes):
    with pytest.raises(OutOfBounds):
        region.window(offset, nbytes)


@pytest.mark.parametrize(
    ("dtype", "shape", "offset"),
    [(np.uint8, 33, 0), (np.uint8, 1, 32), (np.uint8, 1, -1), (np.uint8, 2**64 - 1, 1), (np.float64, 2**61, 0), (np.uint8, 1, "0")],
)
def test_window_ndarray_bounds(region, dtype, shape, offset):
    w = region.window(8, 32)
    with pytest.raises(OutOfBounds):
        w.ndarray(dtype, shape, offset=offset)
    assert w.exports == 0


def test_window_of_a_closed_region(region):
    region.close()
    with pytest.raises(RegionClosed):
        region.window()


def test_window_cannot_be_made_or_pickled_directly(region):
    with pytest.raises(TypeError):
        Window()
    with pytest.raises(TypeError):
        pickle.dumps(region.window())
    # Window.__new__ skips SystemRegion.window(): no memory, but no crash either.
    bare = Window.__new__(Window)
    assert (bare.nbytes, bare.exports, bare.readonly) == (0, 0, False)
    with pytest.raises(RegionClosed):
        memoryview(bare)
    with pytest.raises(RegionClosed):
        bare.ndarray(np.uint8, 0)


# -- copies in and out ---------------------------------------------------------

ROUNDTRIP_DTYPES = [
    "?", "i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8",
    "f2", "f4", "f8", "g", "c8", "c16", "G",
    ">i4", ">f8", "<u2",
    "M8[ns]", "M8[D]", "m8[us]",
    "S7", "U3",
    [("a", "<i4"), ("b", "f8", (2,)), ("c", "S3")],
]  # fmt: skip


@pytest.mark.parametrize("dtype", ROUNDTRIP_DTYPES, ids=str)
@pytest.mark.parametrize("offset", [0, 3])  # 3: views and copies need not be aligned
def test_write_read_roundtrip(region, dtype, offset):
    dt = np.dtype(dtype)
    shape = (3, 5)
    # Arbitrary bytes: every bit pattern (NaN, NaT, odd bools) must survive.
    raw = np.random.default_rng(sum(map(ord, dt.str)) + offset).bytes(15 * dt.itemsize)
    src = np.frombuffer(raw, dt).reshape(shape)
    assert region.write(src, offset=offset) == src.nbytes

    out = region.read(dt, shape, offset=offset)
    assert (out.dtype, out.shape, out.tobytes()) == (dt, shape, raw)
    assert out.flags.writeable and out.flags.c_contiguous

    view = region.ndarray(dt, shape, offset=offset)
    assert (view.dtype, view.shape, view.tobytes()) == (dt, shape, raw)
    if dt.kind in "biufc":
        assert np.array_equal(out, src, equal_nan=dt.kind in "fc")
    del view


def test_read_is_a_copy_and_ndarray_is_not(region):
    region.write(np.arange(4, dtype=np.int32), offset=8)
    out = region.read(np.int32, 4, offset=8)
    view = region.ndarray(np.int32, 4, offset=8)
    assert not np.shares_memory(out, view)
    region.write(np.full(4, 9, np.int32), offset=8)
    assert out.tolist() == [0, 1, 2, 3]
    assert view.tolist() == [9, 9, 9, 9]
    view[0] = -1
    assert region.read(np.int32, (), offset=8) == -1
    del view


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (b"bytes", b"bytes"),
        (bytearray(b"bytearray"), b"bytearray"),
        (memoryview(b"..memoryview..")[2:-2], b"memoryview"),
        (array.array("i", [1, 2]), np.array([1, 2], "i").tobytes()),
        ((ctypes.c_uint16 * 2)(1, 2), np.array([1, 2], "u2").tobytes()),
        (np.float64(1.5), np.float64(1.5).tobytes()),
        (np.array(7, np.int16), np.int16(7).tobytes()),
        (np.arange(6, dtype=np.uint8).reshape(2, 3)[1:], bytes([3, 4, 5])),  # C-contiguous slice
        (np.frombuffer(b"readonly source", np.uint8), b"readonly source"),
        (b"", b""),
        (np.zeros((0, 3)), b""),
    ],
    ids=lambda v: type(v).__name__,
)
def test_write_accepts_contiguous_buffers(region, obj, expected):
    region.write(b"\xff" * 32)
    assert region.write(obj, offset=4) == len(expected)
    assert region.read(np.uint8, 32).tobytes() == b"\xff" * 4 + expected + b"\xff" * (28 - len(expected))


@pytest.mark.parametrize(
    ("obj", "error"),
    [
        (np.arange(10.0)[::2], UnsupportedBuffer),
        (np.asfortranarray(np.ones((3, 4))), UnsupportedBuffer),
        (np.ones((4, 3)).T, UnsupportedBuffer),
        (memoryview(b"abcdef")[::2], UnsupportedBuffer),
        ([1, 2, 3], UnsupportedBuffer),
        ("text", UnsupportedBuffer),
        (5, UnsupportedBuffer),
        (None, UnsupportedBuffer),
        (np.array([1, "a"], dtype=object), DTypeMismatch),
        (np.zeros(2, [("a", "i4"), ("b", "O")]), DTypeMismatch),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, type) else v.__name__,
)
def test_write_refuses(region, obj, error):
    region.write(b"\xaa" * 4096)
    with pytest.raises(error) as info:
        region.write(obj)
    assert isinstance(info.value, TypeError) and isinstance(info.value, tritonshm.Error)
    assert region.read(np.uint8, 4096).tobytes() == b"\xaa" * 4096


def test_write_does_nothing_unless_it_all_fits(region):
    region.write(b"\xaa" * 4096)
    for data, offset in [(b"x" * 4097, 0), (b"x" * 10, 4090), (b"x", 4096), (np.ones(513), 0)]:
        with pytest.raises(OutOfBounds):
            region.write(data, offset=offset)
    assert region.read(np.uint8, 4096).tobytes() == b"\xaa" * 4096
    assert region.write(b"end", offset=4093) == 3
    assert region.write(b"", offset=4096) == 0


@pytest.mark.parametrize(("src", "dst"), [(0, 50), (50, 0)])
def test_write_from_an_overlapping_view_of_itself(region, src, dst):
    """The source may be a view of the same memory: overlap is handled (memmove)."""
    original = bytes(range(200))
    region.write(original)
    with memoryview(region) as mv:
        assert region.write(mv[src : src + 100], offset=dst) == 100
    expected = bytearray(original)
    expected[dst : dst + 100] = original[src : src + 100]
    assert region.read(np.uint8, 200).tobytes() == bytes(expected)


# -- threads -------------------------------------------------------------------


def _close_while_copying(n: int, payload: np.ndarray) -> None:
    """Close a region while one thread writes and another reads it in a loop."""
    r = SystemRegion.create(n)
    peer = SystemRegion.attach(r.key)  # to inspect the memory after r is closed
    r.write(payload)
    unexpected, torn = [], []

    def loop(copy, started):
        try:
            while True:
                copy()
                started.set()
        except RegionClosed:
            pass
        except BaseException as e:  # reported by the main thread
            unexpected.append(e)
        finally:
            started.set()

    def write():
        r.write(payload)

    def read():
        if not np.array_equal(r.read(np.uint8, n), payload):
            torn.append(True)

    started = [threading.Event(), threading.Event()]
    threads = [threading.Thread(target=loop, args=(f, e)) for f, e in zip((write, read), started)]
    for t in threads:
        t.start()
    try:
        for e in started:  # both have finished one copy and are looping
            assert e.wait(timeout=60)
        r.close()
    finally:
        r.close()
        for t in threads:
            t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert unexpected == [] and torn == []
    assert np.array_equal(peer.read(np.uint8, n), payload)
    peer.close()


def test_close_during_large_copies_in_other_threads():
    """close() while other threads copy megabytes with the GIL released: no crash, no torn data."""
    n = 4 << 20
    payload = np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8)
    for _ in range(8):  # the race is in where close() lands: try it a few times
        _close_while_copying(n, payload)


# -- properties -----------------------------------------------------------------

# Integers a caller might pass: small, around the region, and at the edges of
# 32/64-bit arithmetic where C code would wrap.
EDGES = [2**31 - 1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**64 + 1, 2**100]
INTS = st.one_of(
    st.integers(-8, 4200),
    st.sampled_from(EDGES),
    st.sampled_from(EDGES).map(operator.neg),
    st.integers(),
)


def span_model(size, offset, nbytes):
    """What span() must return, or None where it must raise OutOfBounds."""
    if not 0 <= offset <= size:
        return None
    if nbytes is None:
        return offset, size - offset
    if not 0 <= nbytes <= size - offset:
        return None
    return offset, nbytes


@settings(max_examples=300, deadline=None)
@given(size=st.integers(1, 4096), offset=INTS, nbytes=st.none() | INTS)
def test_span_matches_model(size, offset, nbytes):
    with SystemRegion.create(size) as r:
        expected = span_model(size, offset, nbytes)
        if expected is None:
            with pytest.raises(OutOfBounds):
                r.span(offset, nbytes)
        else:
            assert r.span(offset, nbytes) == expected


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(1, 4096),
    dtype=st.sampled_from(["u1", "i2", "f4", "f8", "c16", "M8[ns]", "S3"]),
    # Dims stay small enough that numpy accepts every shape, even one with a
    # zero among them (larger ones: test_argument_errors_are_library_errors).
    shape=st.lists(st.one_of(st.integers(-2, 70), st.integers(2**16 - 2, 2**16 + 2)), max_size=3),
    offset=INTS,
)
def test_views_and_reads_match_model(size, dtype, shape, offset):
    """ndarray() and read() give exactly the modelled bytes, or the modelled error."""
    dt = np.dtype(dtype)
    with SystemRegion.create(size) as r:
        raw = np.random.default_rng(size).bytes(size)
        r.write(raw)
        if any(d < 0 for d in shape):
            expected_error = ShapeMismatch
        else:
            count = 1
            for d in shape:
                count *= d
            expected_error = OutOfBounds if span_model(size, offset, count * dt.itemsize) is None else None

        for method in (r.ndarray, r.read):
            if expected_error is not None:
                with pytest.raises(expected_error):
                    method(dt, shape, offset=offset)
                continue
            got = method(dt, shape, offset=offset)
            assert (got.dtype, got.shape) == (dt, tuple(shape))
            assert got.tobytes() == raw[offset : offset + got.nbytes]
            del got
        assert r.exports == 0


def test_dtype_checks_remember_only_numpys_own_dtypes():
    """Every view of every request validates its dtype: the answer is kept, by id, for numpy's
    builtin dtype instances only -- objects never freed, so an id kept never names another object.
    A string, a byte-swapped or a structured dtype is checked every time, and keeping one dtype
    changes no answer about another."""
    from tritonshm._memory import _args, _dlpack

    native = np.dtype("f4")
    assert _args.dtype_of(native) is native and _args._DTYPES_SEEN[id(native)] is native
    assert _dlpack.dl_dtype(native) == (2, 32) == _dlpack.dl_dtype(native)  # (kDLFloat)
    for other in ("f4", np.float32, np.dtype(">f4"), np.dtype([("a", "<f4")])):
        assert _args.dtype_of(other) == np.dtype(other)
        assert id(other) not in _args._DTYPES_SEEN
    with pytest.raises(DTypeMismatch):
        _args.dtype_of(np.dtype(object))
    with pytest.raises(DTypeMismatch):
        _dlpack.dl_dtype(np.dtype(">f4"))
    with pytest.raises(DTypeMismatch):
        _dlpack.dl_dtype(np.dtype(">f4"))  # (a refusal is never kept as an answer)
