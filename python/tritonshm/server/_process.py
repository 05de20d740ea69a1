"""The server process: launched in a process group of its own, and reaped with everything it started.

tritonserver starts one Python backend stub per model instance; they share
its process group (``start_new_session=True`` makes the server the leader),
so the whole tree is ended with one ``killpg``. On Linux the kernel also
SIGKILLs the server if the process that started it dies (PR_SET_PDEATHSIG).

:class:`_Process` holds the running server apart from the LocalServer, so
that ``weakref.finalize`` can stop it at collection or interpreter exit
without keeping the LocalServer alive.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Mapping, Sequence


# Run in a fresh interpreter between us and tritonserver: asks the kernel to SIGKILL it when we
# die, then becomes tritonserver (exec keeps the request).  Not a preexec_fn: that runs Python in
# the forked child of a process with threads (gRPC's, the client's), which may deadlock before
# exec (CPython's documentation warns of it; a test run hung so once); without one, subprocess
# starts the child with vfork/posix_spawn, running no Python and no at-fork handlers.
_PDEATHSIG_LAUNCHER = """\
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):  # we died before the request: no signal will come
    os._exit(1)
os.execv(sys.argv[2], sys.argv[2:])
"""


def _with_pdeathsig(command: Sequence[str]) -> list[str]:
    """*command*, run so that the kernel SIGKILLs it if this process dies (Linux only; as it is
    elsewhere, and from a thread other than the main one)."""
    if not sys.platform.startswith("linux"):
        return list(command)
    # PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, so a server started
    # from a short-lived worker thread would die with it.
    if threading.current_thread() is not threading.main_thread():
        return list(command)
    executable = shutil.which(command[0]) or command[0]
    return [sys.executable, "-I", "-c", _PDEATHSIG_LAUNCHER, str(os.getpid()), executable, *command[1:]]


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def group_members(pgid: int) -> list[int]:
    """Pids of the live (not zombie) processes in process group *pgid*.

    Zombies do not count: they hold no resources, and an init that does not
    reap orphans (some sandboxes) would otherwise make them look alive forever.
    Falls back to ``killpg(pgid, 0)`` where there is no /proc.
    """
    try:
        entries = os.listdir("/proc")
    except OSError:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    members = []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # exited meanwhile
        # Fields after the command name, which may itself contain ") ".
        fields = stat[stat.rindex(b")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            members.append(int(entry))
    return members


class _Process:
    """The running tritonserver of one LocalServer, and how to end it.

    Kept apart from LocalServer so that weakref.finalize can hold it
    without keeping the LocalServer alive.
    """

    def __init__(self) -> None:
        self.popen: subprocess.Popen | None = None
        self.shm_prefix: str | None = None
        self.tmpdir: str | None = None
        self.lock = threading.Lock()

    def launch(self, command: Sequence[str], env: Mapping[str, str], log: IO[bytes]) -> None:
        """Start *command* as the leader of a new process group, its output into *log*.

        On Linux it is SIGKILLed if this process dies. Raises OSError when
        *command* cannot be run at all.
        """
        self.popen = subprocess.Popen(
            _with_pdeathsig(command), env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)

    def terminate(self, grace: float) -> None:
        """End the server and every process of its group (Python backend stubs too)."""
        with self.lock:
            popen, self.popen = self.popen, None
        if popen is None:
            return
        pgid = popen.pid  # start_new_session=True: the server leads its own group
        # SIGTERM only the server: it then unloads its models and the stubs
        # finish cleanly, removing their shared-memory segments. A SIGTERM to
        # the whole group would kill the stubs under the server's feet.
        try:
            popen.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + grace
        while _exited_unreaped(popen.pid) is False and time.monotonic() < deadline:
            time.sleep(0.02)
        # Kill whatever is left while the (maybe zombie) leader still holds the
        # group id, so that the id cannot belong to an unrelated group yet.
        _killpg(pgid)
        popen.wait()
        # Orphaned stubs get SIGKILL too; wait until they are gone.
        deadline = time.monotonic() + max(grace, 1.0)
        while group_members(pgid) and time.monotonic() < deadline:
            _killpg(pgid)
            time.sleep(0.02)
        self._unlink_stub_segments()

    def _unlink_stub_segments(self) -> None:
        """Remove the Python backend's /dev/shm segments a killed stub left behind.

        The prefix is unique to this server run, so nothing else matches it.
        """
        if not self.shm_prefix or not os.path.isdir("/dev/shm"):
            return
        for name in os.listdir("/dev/shm"):
            if name.startswith(self.shm_prefix):
                try:
                    os.unlink(os.path.join("/dev/shm", name))
                except OSError:
                    pass

    def cleanup(self) -> None:
        """Stop the server (if running) and remove the temporary directory with its log."""
        self.terminate(grace=10.0)
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None


def _exited_unreaped(pid: int) -> bool | None:
    """True if *pid* has exited (left as a zombie, not reaped), False if running, None if gone."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    return info is not None
