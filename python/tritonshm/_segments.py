"""Finding this library's segments in /dev/shm: ``tritonshm ls`` and ``gc``.

Every segment we create is named ``/tritonshm-<creator pid>-<16 hex>``, so
a segment whose creator is dead can be recognised and removed without any
registry or daemon.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

SHM_DIR = Path("/dev/shm")
_NAME = re.compile(r"^tritonshm-(?P<pid>\d+)-(?P<token>[0-9a-f]{16})$")


@dataclasses.dataclass(frozen=True)
class Segment:
    """One of our segments as seen in /dev/shm."""

    key: str        #: POSIX name, with its leading slash
    pid: int        #: the process that created it
    nbytes: int     #: size in bytes
    uid: int        #: owning user
    alive: bool     #: whether the creating process still runs


def pid_alive(pid: int) -> bool:
    """Whether a process with *pid* exists (of any user)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, but belongs to someone else
    return True


def list_segments(shm_dir: Path = SHM_DIR) -> list[Segment]:
    """Every segment of this library in *shm_dir*, sorted by creator pid."""
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
        pid = int(match["pid"])
        found.append(Segment("/" + entry.name, pid, st.st_size, st.st_uid, pid_alive(pid)))
    return sorted(found, key=lambda s: (s.pid, s.key))


def collect_garbage(shm_dir: Path = SHM_DIR, *, dry_run: bool = False) -> list[Segment]:
    """Remove our user's segments whose creating process is dead.

    Returns what was (or, with *dry_run*, would be) removed.  Segments of
    live processes and of other users are never touched.
    """
    removed = []
    for seg in list_segments(shm_dir):
        if seg.alive or seg.uid != os.getuid():
            continue
        if not dry_run:
            try:
                os.unlink(shm_dir / seg.key.lstrip("/"))
            except FileNotFoundError:
                continue  # someone else collected it first
        removed.append(seg)
    return removed
