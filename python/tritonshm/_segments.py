"""Finding this library's segments in /dev/shm: ``tritonshm ls`` and ``gc``; and how much room
/dev/shm has for more (:func:`space`: the client sizes its slot pools by it).

Every segment we create is named ``/tritonshm-<creator pid>-<16 hex>``, and
its creator holds a shared ``flock`` on it for as long as it owns the name
(``tshm_segment_create`` in csrc/tshm.h).  The lock is what proves an owner
alive: the kernel drops it when the owner dies, and it is seen the same from
every PID namespace sharing /dev/shm -- unlike the pid in the name, which in
another container (``--ipc=host``) names nobody or somebody else.

The probe is Python (:mod:`fcntl`), not C: it runs only in ``ls``/``gc``,
which work on a directory (``shm_dir``, so tests can use their own) rather
than through ``shm_open``; ``fcntl.flock`` is the same system call and
raises :class:`OSError` with errno like the rest of this module.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import os
import re
import stat
from pathlib import Path
from typing import NamedTuple

SHM_DIR = Path("/dev/shm")
_NAME = re.compile(r"^tritonshm-(?P<pid>\d+)-(?P<token>[0-9a-f]{16})$")

# Opening a name in a world-writable directory: never follow a planted
# symlink, never block on a planted FIFO.
_PROBE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


@dataclasses.dataclass(frozen=True)
class Segment:
    """One of our segments as seen in /dev/shm."""

    key: str        #: POSIX name, with its leading slash
    pid: int        #: the process that created it (in its own PID namespace)
    nbytes: int     #: size in bytes
    uid: int        #: owning user
    alive: bool     #: whether its creator (or a child forked from it) still holds it


class Space(NamedTuple):
    """The size of the filesystem under /dev/shm and the bytes free there."""

    size: int   #: bytes in all (Docker gives a container 64 MiB unless told --shm-size)
    free: int   #: bytes free now, for an unprivileged process


def space(shm_dir: Path = SHM_DIR) -> Space | None:
    """How large *shm_dir*'s filesystem is and how much of it is free (``statvfs``); None where
    that cannot be read (no /dev/shm) or says nothing (no size limit).  A hint only: other
    processes take room and give it back at any moment."""
    try:
        fs = os.statvfs(shm_dir)
    except OSError:
        return None
    if fs.f_blocks == 0:  # a filesystem without a block count (no limit to read)
        return None
    return Space(fs.f_blocks * fs.f_frsize, fs.f_bavail * fs.f_frsize)


def pid_alive(pid: int) -> bool:
    """Whether a process with *pid* exists (of any user) in our PID namespace."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, but belongs to someone else
    return True


def _open(path: Path) -> int | None:
    """A descriptor on the regular file *path*, or None (gone, not ours to open, not a file)."""
    try:
        fd = os.open(path, _PROBE_FLAGS)
    except OSError:
        return None  # removed meanwhile, a symlink (ELOOP), another user's 0600 file
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def _lock_exclusive(fd: int) -> bool:
    """Take LOCK_EX on *fd* without waiting; False when someone holds a lock."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise
    return True


def owner_holds(path: Path) -> bool | None:
    """Whether some process holds the owner's lock on the segment at *path*.

    None when the segment cannot be probed (removed, or another user's).
    Probing takes LOCK_EX for an instant; a creator taking its lock at that
    moment waits that instant.
    """
    fd = _open(path)
    if fd is None:
        return None
    try:
        return not _lock_exclusive(fd)
    finally:
        os.close(fd)  # releases our LOCK_EX


def list_segments(shm_dir: Path = SHM_DIR) -> list[Segment]:
    """Every segment of this library in *shm_dir*, sorted by creator pid.

    A segment is alive when its owner's lock is held (from any PID
    namespace) or, for segments we cannot probe and those of tritonshm
    versions that took no lock, when its creator's pid runs here.
    """
    found = []
    try:
        entries = list(os.scandir(shm_dir))
    except FileNotFoundError:
        return []
    for entry in entries:
        match = _NAME.match(entry.name)
        if match is None:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue  # removed while we looked
        if not stat.S_ISREG(st.st_mode):
            continue  # not a segment: nothing shm_open would give us
        pid = int(match["pid"])
        alive = bool(owner_holds(Path(entry.path))) or pid_alive(pid)
        found.append(Segment("/" + entry.name, pid, st.st_size, st.st_uid, alive))
    return sorted(found, key=lambda s: (s.pid, s.key))


def collect(seg: Segment, shm_dir: Path = SHM_DIR, *, dry_run: bool = False) -> bool:
    """Remove *seg* if it is ours and nobody holds it; True when it was (or would be) removed.

    Decided afresh, not from ``seg.alive``: the segment is opened, its
    owner's lock taken exclusively (a live owner in any PID namespace holds
    it shared, so this fails), and it is unlinked only if that succeeds AND
    its creator's pid is not running here (segments of older versions,
    which took no lock, are kept while their creator visibly lives).  The
    unlink happens while holding the exclusive lock, so a creator between
    shm_open and flock waits for it and then sees the name gone (st_nlink
    0) and draws another one.
    """
    path = Path(shm_dir) / seg.key.lstrip("/")
    fd = _open(path)
    if fd is None:
        return False
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid():
            return False  # never another user's, whatever the listing said
        if not _lock_exclusive(fd) or pid_alive(seg.pid):
            return False
        if dry_run:
            return True
        try:
            now = os.stat(path, follow_symlinks=False)
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                return False  # the name now means another file than the one we locked
            os.unlink(path)
        except FileNotFoundError:
            return False  # its owner closed it, or another gc collected it first
        return True
    finally:
        os.close(fd)


def collect_garbage(shm_dir: Path = SHM_DIR, *, dry_run: bool = False) -> list[Segment]:
    """Remove our user's segments that no live process holds.

    Returns what was (or, with *dry_run*, would be) removed.  Segments whose
    owner's lock is held (from any PID namespace), whose creator's pid runs
    here, or that belong to other users are never touched.
    """
    removed = []
    for seg in list_segments(shm_dir):
        if seg.alive or seg.uid != os.getuid():
            continue
        if collect(seg, shm_dir, dry_run=dry_run):
            removed.append(seg)
    return removed
