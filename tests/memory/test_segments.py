"""Segment liveness for ``tritonshm ls`` / ``gc``: the owner's flock, across PID namespaces.

A creator holds ``flock(LOCK_SH)`` on its segment for as long as it owns the
name; gc removes a segment only when it can take ``LOCK_EX`` and the pid in
the name does not run here.  These tests never run a global gc in another
namespace: other sessions on this machine may hold segments of older builds
(no lock) that would look dead there.  They probe their own segments only.
"""

from __future__ import annotations

import errno
import fcntl
import gc
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tritonshm import SystemRegion, _segments

SHM = Path("/dev/shm")


def path_of(key: str) -> Path:
    return SHM / key.lstrip("/")


def segment(key: str) -> _segments.Segment:
    return next(s for s in _segments.list_segments() if s.key == key)


def lock_is_held(key: str) -> bool:
    """Whether some process holds a lock on *key*'s segment (probed from a new descriptor)."""
    fd = os.open(path_of(key), os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def dead_pid() -> int:
    """A pid that ran a moment ago and has been reaped: nobody has it now (barring reuse)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def old_style_segment(pid: int) -> str:
    """A segment as tritonshm versions before the owner lock left it: named, sized, unlocked."""
    key = f"/tritonshm-{pid}-{os.urandom(8).hex()}"
    fd = os.open(path_of(key), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, 4096)
    finally:
        os.close(fd)
    return key


_CREATOR = textwrap.dedent("""
    import sys, tritonshm
    r = tritonshm.SystemRegion.create(4096)
    print(r.key, flush=True)
    sys.stdin.read()  # until the test closes our stdin (or kills us)
""")


class Creator:
    """A child process that created a segment and holds it."""

    def __init__(self, argv_prefix=()):
        self.proc = subprocess.Popen([*argv_prefix, sys.executable, "-c", _CREATOR],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.key = self.proc.stdout.readline().strip()
        assert self.key.startswith("/tritonshm-"), "the creator did not start"

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()

    def cleanup(self):
        self.proc.stdin.close()  # lets the creator close its region and exit
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        self.kill()
        try:
            os.unlink(path_of(self.key))  # a killed creator leaves its segment
        except FileNotFoundError:
            pass


@pytest.fixture
def creator():
    c = Creator()
    yield c
    c.cleanup()


# -- the owner's lock ------------------------------------------------------------


def test_an_owner_holds_the_lock_until_close_and_closes_its_descriptor():
    before = set(os.listdir("/proc/self/fd"))
    r = SystemRegion.create(4096)
    assert lock_is_held(r.key)
    assert len(set(os.listdir("/proc/self/fd")) - before) == 1  # the lock descriptor
    fd = os.open(path_of(r.key), os.O_RDONLY | os.O_CLOEXEC)
    try:
        r.close()
        assert not path_of(r.key).exists()
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: the owner let go
    finally:
        os.close(fd)
    assert set(os.listdir("/proc/self/fd")) == before


def test_a_view_outliving_close_holds_no_lock_descriptor():
    before = set(os.listdir("/proc/self/fd"))
    r = SystemRegion.create(4096)
    view = memoryview(r)
    r.close()
    assert set(os.listdir("/proc/self/fd")) == before
    view.release()


def test_a_region_dropped_without_close_closes_its_lock_descriptor():
    before = set(os.listdir("/proc/self/fd"))
    r = SystemRegion.create(4096)
    key = r.key
    with pytest.warns(ResourceWarning):
        del r
        gc.collect()
    assert not path_of(key).exists()
    assert set(os.listdir("/proc/self/fd")) == before


def test_attached_and_unpickled_regions_take_no_lock_and_no_descriptor():
    key = old_style_segment(os.getpid())  # nobody holds its lock
    try:
        before = set(os.listdir("/proc/self/fd"))
        a = SystemRegion.attach(key)
        b = pickle.loads(pickle.dumps(a))
        assert not lock_is_held(key)
        assert set(os.listdir("/proc/self/fd")) == before
        a.close()
        b.close()
        assert path_of(key).exists()  # not owners: nothing unlinked
    finally:
        os.unlink(path_of(key))


def test_a_forked_child_closing_its_copy_keeps_the_parents_lock():
    with SystemRegion.create(4096) as r:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            code = 1
            try:
                r.close()  # closes the child's copy of the descriptor, unlinks nothing
                code = 0 if path_of(r.key).exists() else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert lock_is_held(r.key)  # a LOCK_UN in the child would have released it here


# -- ls and gc in our namespace ---------------------------------------------------


def test_a_live_creator_is_alive_and_kept(creator):
    seg = segment(creator.key)
    assert seg.alive and seg.pid == creator.proc.pid
    assert not _segments.collect(seg)
    assert path_of(creator.key).exists()


def test_a_live_creator_whose_pid_looks_dead_is_kept(creator, monkeypatch):
    """What a gc in another PID namespace sees: the pid names nobody; the lock decides."""
    monkeypatch.setattr(_segments, "pid_alive", lambda pid: False)
    seg = segment(creator.key)
    assert seg.alive
    assert not _segments.collect(seg)
    assert creator.key not in [s.key for s in _segments.collect_garbage(dry_run=True)]
    assert path_of(creator.key).exists()
    creator.kill()
    assert _segments.collect(seg)  # the lock was all that kept it
    assert not path_of(creator.key).exists()


def test_a_creator_killed_with_sigkill_is_collected(creator):
    creator.kill()
    seg = segment(creator.key)
    assert not seg.alive
    assert _segments.collect(seg, dry_run=True) and path_of(creator.key).exists()
    assert _segments.collect(seg)
    assert not path_of(creator.key).exists()
    assert not _segments.collect(seg)  # already gone


def test_unlocked_segments_of_older_versions_are_kept_while_their_creator_runs():
    key = old_style_segment(os.getpid())
    try:
        seg = segment(key)
        assert seg.alive and not _segments.collect(seg)
        assert path_of(key).exists()
    finally:
        os.unlink(path_of(key))


def test_unlocked_segments_of_a_dead_pid_are_collected():
    key = old_style_segment(dead_pid())
    try:
        seg = segment(key)
        assert not seg.alive
        assert _segments.collect(seg)
        assert not path_of(key).exists()
    finally:
        if path_of(key).exists():
            os.unlink(path_of(key))


def test_gc_skips_what_is_not_a_regular_file(tmp_path):
    pid = dead_pid()
    token = os.urandom(8).hex()
    os.mkfifo(tmp_path / f"tritonshm-{pid}-{token}")
    (tmp_path / "target").write_bytes(b"x")
    os.symlink(tmp_path / "target", tmp_path / f"tritonshm-{pid}-{'0' * 16}")
    assert _segments.list_segments(tmp_path) == []
    assert _segments.collect_garbage(tmp_path) == []
    assert (tmp_path / "target").exists()


def test_gc_works_on_any_directory(tmp_path):
    pid = dead_pid()
    name = f"tritonshm-{pid}-{os.urandom(8).hex()}"
    (tmp_path / name).write_bytes(b"\0" * 10)
    fd = os.open(tmp_path / name, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        assert _segments.collect_garbage(tmp_path) == []  # locked: kept
    finally:
        os.close(fd)
    removed = _segments.collect_garbage(tmp_path)
    assert [(s.key, s.pid, s.nbytes, s.alive) for s in removed] == [("/" + name, pid, 10, False)]
    assert not (tmp_path / name).exists()


# -- another PID namespace, for real ------------------------------------------------

_UNSHARE = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"]


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    try:
        done = subprocess.run([*_UNSHARE, "sh", "-c", "echo $$"], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and done.stdout.strip() == "1"


needs_unshare = pytest.mark.skipif(not _unshare_works(),
                                   reason="unprivileged user+PID namespaces unavailable (unshare -Urpf)")

# gc's own logic, run in a fresh PID namespace on one key only (never a global
# gc there: other sessions' unlocked segments would look dead).
_PROBE_IN_NAMESPACE = textwrap.dedent("""
    import json, sys
    from tritonshm import _segments
    key = sys.argv[1]
    seg = next(s for s in _segments.list_segments() if s.key == key)
    print(json.dumps({"pid_visible": _segments.pid_alive(seg.pid), "alive": seg.alive,
                      "removed": _segments.collect(seg)}))
""")


def probe_from_another_namespace(key: str) -> dict:
    done = subprocess.run([*_UNSHARE, sys.executable, "-c", _PROBE_IN_NAMESPACE, key],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@needs_unshare
def test_gc_in_another_pid_namespace_keeps_a_live_creator_and_collects_a_dead_one(creator):
    seen = probe_from_another_namespace(creator.key)
    assert seen == {"pid_visible": False, "alive": True, "removed": False}
    assert path_of(creator.key).exists()
    creator.kill()
    seen = probe_from_another_namespace(creator.key)
    assert seen == {"pid_visible": False, "alive": False, "removed": True}
    assert not path_of(creator.key).exists()


@needs_unshare
def test_a_creator_in_another_pid_namespace_is_live_there_and_kept():
    # The creator runs as pid ~200 of its namespace (sh spends the pids
    # below), a pid that names nobody in the fresh namespaces the probes run
    # in: there the probe is pid 1 and its threads (kill() takes a thread
    # id too) the next few.
    burn = 'i=0; while [ $i -lt 200 ]; do /bin/true; i=$((i+1)); done; "$@"; exit $?'
    c = Creator(argv_prefix=[*_UNSHARE, "--kill-child", "sh", "-c", burn, "sh"])
    try:
        pid = segment(c.key).pid
        assert pid > 200
        assert probe_from_another_namespace(c.key) == {"pid_visible": False, "alive": True, "removed": False}
        done = subprocess.run([*_UNSHARE, sys.executable, "-m", "tritonshm", "ls"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        line = next(l for l in done.stdout.splitlines() if c.key in l)
        assert line.split()[1:3] == [str(pid), "live"]
        assert path_of(c.key).exists()
    finally:
        c.cleanup()


# -- the creation race: gc takes the free lock between shm_open and flock -------------

# Interposes flock(): the first LOCK_SH on a tritonshm segment first unlinks it,
# as a gc in another namespace that grabbed the lock before the creator would
# (TSHM_RACE_ALWAYS: every time).  The names it removed go to $TSHM_RACE_LOG.
_RACING_FLOCK = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

static int raced;

int flock(int fd, int op)
{
    int (*real)(int, int) = (int (*)(int, int))dlsym(RTLD_NEXT, "flock");
    if ((op & LOCK_SH) && (!raced || getenv("TSHM_RACE_ALWAYS") != NULL)) {
        char link[64], path[4096];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, path, sizeof path - 1);
        if (n > 0) {
            path[n] = '\0';
            if (strncmp(path, "/dev/shm/tritonshm-", 19) == 0 && unlink(path) == 0) {
                raced = 1;
                FILE *log = fopen(getenv("TSHM_RACE_LOG"), "a");
                if (log != NULL) {
                    fprintf(log, "%s\n", path + 8);
                    fclose(log);
                }
            }
        }
    }
    return real(fd, op);
}
"""

_RACE_CHILD = textwrap.dedent("""
    import json, os
    from tritonshm import SystemRegion, SharedMemoryOSError
    try:
        with SystemRegion.create(4096) as r:
            r.write(b"ok")
            with SystemRegion.attach(r.key) as again:
                seen = again.read("S2", ())
            print(json.dumps({"key": r.key, "exists": os.path.exists("/dev/shm" + r.key),
                              "seen": bytes(seen[()]).decode()}))
    except SharedMemoryOSError as e:
        print(json.dumps({"errno": e.errno, "message": str(e)}))
""")


def run_raced_create(tmp_path, always=False) -> tuple[dict, list[str]]:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler to build the flock() interposer")
    (tmp_path / "race.c").write_text(_RACING_FLOCK)
    lib = tmp_path / "race.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "race.c"), "-ldl"], check=True)
    log = tmp_path / "raced.log"
    env = dict(os.environ, TSHM_RACE_LOG=str(log))
    env["LD_PRELOAD"] = " ".join(filter(None, [env.get("LD_PRELOAD"), str(lib)]))
    if always:
        env["TSHM_RACE_ALWAYS"] = "1"
    out = subprocess.run([sys.executable, "-c", _RACE_CHILD], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    raced = log.read_text().split() if log.exists() else []
    return json.loads(out.stdout.splitlines()[-1]), raced


def test_create_draws_a_new_name_when_its_first_was_removed_before_the_lock(tmp_path):
    result, raced = run_raced_create(tmp_path)
    assert len(raced) == 1, "the interposer did not run"
    assert result["key"] != raced[0]  # not the name that is gone
    assert result == {"key": result["key"], "exists": True, "seen": "ok"}
    assert not path_of(raced[0]).exists()


def test_create_gives_up_after_bounded_retries_when_every_name_is_removed(tmp_path):
    result, raced = run_raced_create(tmp_path, always=True)
    assert result["errno"] == errno.EAGAIN, result
    assert len(raced) == 16  # TSHM_CREATE_TRIES, then a clear error
    assert not any(path_of(k).exists() for k in raced)


def test_owner_lock_probe_reports_what_it_cannot_open(tmp_path):
    assert _segments.owner_holds(tmp_path / "missing") is None
    with SystemRegion.create(64) as r:
        assert _segments.owner_holds(path_of(r.key)) is True
        key = r.key
    assert _segments.owner_holds(path_of(key)) is None  # unlinked by close()
