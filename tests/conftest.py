"""Shared fixtures of the tritonshm test suite.

Leak checking
-------------
``check_leaks`` wraps every test (autouse) and fails it in teardown when it
left behind, after ``gc.collect()``:

* an open file descriptor that was not open before the test (but the
  sanitizer's own log, which AddressSanitizer opens at its first report:
  ``log_path`` in ``$ASAN_OPTIONS``, see tools/asan.sh);
* a mapping of a ``/dev/shm/tritonshm-*`` segment in this process (an
  unclosed region, or a view of one, kept alive past the test);
* a new ``/dev/shm/tritonshm-<pid>-*`` entry whose creator is this process
  or a process that is no longer running (a child that forgot to close, a
  fork that exited without unlinking).  Entries of other live processes are
  ignored: other test sessions may share this machine's /dev/shm.

Leaked segments are unlinked after being reported, so one leak does not
cascade into the following tests.  Fixtures with a wider scope (a session
server, a module-wide pool) are set up before the first snapshot and torn
down after the last one, so what they hold is not counted.
"""

from __future__ import annotations

import gc
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import re
import time

import psutil
import pytest

# The Triton server fixtures (a real server for the session, fresh ones for
# restarts) live in triton_fixtures.py; importing them here registers them.
from triton_fixtures import fresh_server, protocol, server, session_server_survives, triton_client  # noqa: E402,F401
# The fake Triton for the engine's steps (tests/support/, test-only) and its `fake_triton` fixture.
pytest_plugins = ["support.fake_triton"]

# The CUDA fixtures (the fake runtime for CI, the real GPU) live in cuda_fixtures.py.
from cuda_fixtures import (  # noqa: E402,F401
    cupy, cupy_async_pool, cupy_like, fake_cuda, fake_cuda_server, fake_cudart_path, gpu,
    torch, torch_caching, torch_expandable, torch_like,
)

SHM_DIR = "/dev/shm"

# "tritonshm-<pid>-<hex>": the names this library gives its segments.
_SEGMENT_NAME = re.compile(r"^tritonshm-(\d+)-[0-9a-f]+$")


def open_fds() -> set[tuple[int, str]]:
    """(fd, what it points to) for every descriptor open in this process.

    Comparing pairs rather than numbers catches a descriptor number that was
    closed and reused for something else during the test.
    """
    fds = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            fds.add((int(name), os.readlink(f"/proc/self/fd/{name}")))
        except OSError:
            pass  # the descriptor listdir() itself used, closed by now
    return fds


def _long_lived_fds() -> set[int]:
    """Descriptors that multiprocessing opens once and keeps for the session.

    The first test that uses a spawn context or a multiprocessing lock starts
    the resource tracker (and possibly the forkserver); their pipes stay open
    by design and are not a leak of that test.
    """
    fds = set()
    tracker_fd = getattr(multiprocessing.resource_tracker._resource_tracker, "_fd", None)
    if tracker_fd is not None:
        fds.add(tracker_fd)
    server_fd = getattr(multiprocessing.forkserver._forkserver, "_forkserver_alive_fd", None)
    if server_fd is not None:
        fds.add(server_fd)
    return fds


def sanitizer_log_prefix(asan_options: str | None) -> str | None:
    """The absolute path that AddressSanitizer's log files start with, from *asan_options*.

    ASan writes to ``<log_path>.<pid>``, a file it opens at its first report
    and keeps open: a descriptor that a test did not leak.  As the sanitizers
    parse them, options are separated by ':', ',' or blanks, a value may be
    quoted and the last one given wins; "stderr" and "stdout" open no file.
    """
    path = None
    for match in re.finditer(r"""(?:^|[:,\s])log_path=('[^']*'|"[^"]*"|[^:,\s]*)""", asan_options or ""):
        path = match.group(1).strip("'\"")
    if not path or path in ("stderr", "stdout"):
        return None
    return os.path.abspath(path) + "."


_SANITIZER_LOG = sanitizer_log_prefix(os.environ.get("ASAN_OPTIONS"))


def tritonshm_segments() -> dict[str, int]:
    """Segment names (without the leading '/') in /dev/shm -> creator pid."""
    segments = {}
    for name in os.listdir(SHM_DIR):
        match = _SEGMENT_NAME.match(name)
        if match:
            segments[name] = int(match.group(1))
    return segments


def tritonshm_mappings() -> set[str]:
    """Paths of tritonshm segments mapped into this process (from /proc/self/maps)."""
    paths = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith(f"{SHM_DIR}/tritonshm-"):
                paths.add(fields[5].rstrip("\n"))
    return paths


def _process_gone(pid: int) -> bool:
    """True when *pid* is not running: it does not exist or is a zombie."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _settled_new_fds(before_fds, settle_seconds: float = 2.0) -> list[tuple[int, str]]:
    """Descriptors opened since *before_fds* that stay open.

    gRPC closes a channel's sockets and pollers from its own threads a few
    milliseconds after ``close()`` returns, so a descriptor only counts as
    leaked if it is still open after a short grace period.
    """
    deadline = time.monotonic() + settle_seconds
    while True:
        ignored = _long_lived_fds()
        new_fds = sorted((fd, t) for fd, t in open_fds() - before_fds
                         if fd not in ignored and not (_SANITIZER_LOG and t.startswith(_SANITIZER_LOG)))
        if not new_fds or time.monotonic() > deadline:
            return new_fds
        time.sleep(0.02)
        gc.collect()


def leak_report(before_fds, before_segments, before_maps) -> list[str]:
    """What this process leaked since the snapshot; unlinks leaked segments."""
    problems = []

    new_fds = _settled_new_fds(before_fds)
    if new_fds:
        problems.append(f"file descriptors left open: {new_fds}")

    new_maps = sorted(tritonshm_mappings() - before_maps)
    if new_maps:
        problems.append(f"shared-memory segments still mapped (unclosed region or live view): {new_maps}")

    me = os.getpid()
    for name, pid in sorted(tritonshm_segments().items()):
        if name in before_segments or (pid != me and not _process_gone(pid)):
            continue
        who = "this process" if pid == me else f"process {pid}, no longer running"
        problems.append(f"segment /{name} left in {SHM_DIR} (created by {who}); unlinking it")
        try:
            os.unlink(os.path.join(SHM_DIR, name))
        except FileNotFoundError:
            pass
    return problems


_gc_frozen = False


@pytest.fixture(autouse=True)
def check_leaks(session_server_survives):
    """Fail the test if it leaks descriptors, mappings or /dev/shm segments.

    After ``session_server_survives`` sets up, so it checks before a dead session server is
    started again (the new server's log file is no test's leak)."""
    global _gc_frozen
    if not _gc_frozen:
        # Everything alive before the first test (modules, collected items)
        # is no test's garbage: keep it out of the per-test collections,
        # which otherwise cost ~25 ms each once numpy and hypothesis are in.
        gc.collect()
        gc.freeze()
        _gc_frozen = True
    before = (open_fds(), set(tritonshm_segments()), tritonshm_mappings())
    yield
    # Views and regions caught in reference cycles (tracebacks, frames kept
    # by pytest.raises) are only released by a collection.
    gc.collect()
    problems = leak_report(*before)
    if problems:
        pytest.fail("leak check:\n  " + "\n  ".join(problems), pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _warm_tritonclient():
    """tritonclient's long-lived descriptors (gevent's hub, gRPC's pollers) exist before the first
    leak check, also in a run that starts no server (``-m "not server"``)."""
    from triton_fixtures import _warm_up_tritonclient

    _warm_up_tritonclient("127.0.0.1:1", "127.0.0.1:1")


# Fixtures that start a real Triton server: a test using any of them (directly or through another
# fixture) carries the `server` mark, so `pytest -m "not server"` is the fast loop.  Tests that
# start one in their own body carry the mark explicitly.
_SERVER_FIXTURES = frozenset({"server", "fresh_server", "fake_cuda_server", "two_gpu_server"})


def pytest_collection_modifyitems(items):
    for item in items:
        if _SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.server)
