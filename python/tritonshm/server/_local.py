"""A managed local Triton Inference Server for the demo, the tests and the benchmarks.

``LocalServer`` runs the real ``tritonserver`` that the PyPI wheel
``nvidia-pytriton`` carries, on the CPU, without Docker or a GPU::

    from tritonshm.server import LocalServer

    with LocalServer() as srv:            # the bundled demo models
        client = tritonclient.grpc.InferenceServerClient(srv.grpc_url)

On first use the server is installed into its own virtual environment under
a cache directory (``$TRITONSHM_SERVER_HOME``, else
``$XDG_CACHE_HOME/tritonshm/server``, else ``~/.cache/tritonshm/server``).
It needs an environment of its own because the Python backend runs models
with the ``python3`` first on the server's PATH and needs numpy < 2 there,
while the client is free to use numpy 2.

It can also run a Triton that is already installed -- an NGC container's
``/opt/tritonserver``, or one unpacked on a machine without a package index --
with ``LocalServer(tritonserver=..., server_python=...)`` or the environment
variables ``$TRITONSHM_TRITONSERVER`` and ``$TRITONSHM_SERVER_PYTHON``; then
nothing is installed.

This module needs only the standard library, so importing it is cheap.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from tritonshm.errors import ServerUnavailable

__all__ = ["LocalServer", "bundled_model_repository", "default_home", "group_members", "REQUIREMENTS"]

#: What the server's virtual environment gets: the wheel that carries
#: tritonserver 2.51 and its Python backend, and the numpy the backend needs.
REQUIREMENTS = ("nvidia-pytriton==0.7.0", "numpy<2")

_MARKER = "tritonshm-installed.json"  # written inside the venv, last, on success
_LOG_TAIL_LINES = 40


def default_home() -> Path:
    """The directory that holds the server's virtual environment.

    ``$TRITONSHM_SERVER_HOME`` if set, else ``$XDG_CACHE_HOME/tritonshm/server``,
    else ``~/.cache/tritonshm/server``.
    """
    env = os.environ.get("TRITONSHM_SERVER_HOME")
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "tritonshm" / "server"


def bundled_model_repository() -> Path:
    """The Triton model repository shipped inside the package (the demo models)."""
    return Path(__file__).resolve().parent / "models"


# --------------------------------------------------------------------------
# Installation
# --------------------------------------------------------------------------


def _clean_env() -> dict:
    """Our environment minus what would leak the client's Python into the server's.

    PYTHONPATH/PYTHONHOME would point the venv's interpreter and pip at the
    client's packages (numpy 2); PIP_USER breaks a venv install. (The
    backend's stubs run isolated and ignore PYTHON* variables anyway.)
    LD_PRELOAD belongs to the client too: a sanitizer or profiler preloaded
    to check the client must not be loaded into the server.
    """
    env = dict(os.environ)
    for name in ("PYTHONPATH", "PYTHONHOME", "PIP_USER", "VIRTUAL_ENV", "PYTHONSTARTUP",
                 "LD_PRELOAD"):
        env.pop(name, None)
    return env


def _read_marker(venv: Path) -> dict | None:
    """The install record of *venv*, or None when the install is missing or stale."""
    try:
        info = json.loads((venv / _MARKER).read_text())
    except (OSError, ValueError):
        return None
    if info.get("requirements") != list(REQUIREMENTS):
        return None
    # The base interpreter or the server may have been removed since.
    if not all(Path(info.get(key, "")).exists() for key in ("python", "tritonserver")):
        return None
    return info


def _run_checked(cmd: Sequence[str], what: str, quiet: bool, lock_fd: int, hint: str = "") -> str:
    """Run an install step; raise ServerUnavailable with its output if it fails.

    The step inherits the install lock, so that if we are killed, another
    installer still waits for our orphaned pip to finish before it starts over.
    """
    stderr_fd = None if quiet else _fileno(sys.stderr)
    if stderr_fd is None:
        proc = subprocess.run(cmd, env=_clean_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, pass_fds=(lock_fd,))
        if not quiet:  # a stderr without a descriptor (Jupyter): echo afterwards
            sys.stderr.write(proc.stdout)
    else:
        # Let pip's own progress through, on stderr so stdout stays clean for callers.
        proc = subprocess.run(cmd, env=_clean_env(), stdout=stderr_fd, stderr=stderr_fd,
                              text=True, pass_fds=(lock_fd,))
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout or "").splitlines()[-_LOG_TAIL_LINES:])
        raise ServerUnavailable(
            f"installing the local Triton server failed while {what} "
            f"(exit code {proc.returncode}): {' '.join(cmd)}" + (f"\n{tail}" if tail else "")
            + (f"\n{hint}" if hint else ""))
    return proc.stdout or ""


def _fileno(stream) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return None


def _probe_venv(python: Path) -> dict:
    """Ask the server's interpreter where things are, and which numpy it has.

    Run once: at install time, or when a LocalServer first uses an existing
    install. ``numpy`` is its version, or None with the reason in ``numpy_error``.
    """
    code = (
        "import json, sys, sysconfig\n"
        "try:\n"
        "    import numpy; nv, ne = numpy.__version__, ''\n"
        "except Exception as exc:\n"
        "    nv, ne = None, '%s: %s' % (type(exc).__name__, exc)\n"
        "print(json.dumps({'version': '%d.%d' % sys.version_info[:2],\n"
        "  'site': sysconfig.get_paths()['purelib'],\n"
        "  'libdir': sysconfig.get_config_var('LIBDIR') or '',\n"
        "  'soname': sysconfig.get_config_var('INSTSONAME') or '',\n"
        "  'numpy': nv, 'numpy_error': ne}))\n"
    )
    try:
        proc = subprocess.run([str(python), "-c", code], env=_clean_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    except OSError as exc:
        raise ServerUnavailable(f"cannot run the server's Python {python}: {exc}") from exc
    try:
        if proc.returncode == 0:
            return json.loads(proc.stdout)
    except ValueError:
        pass
    tail = "\n".join(proc.stderr.splitlines()[-_LOG_TAIL_LINES:])
    raise ServerUnavailable(f"the server's Python {python} failed to report its version and paths "
                            f"(exit code {proc.returncode})" + (f":\n{tail}" if tail else ""))


def _python_libdirs(probe: dict) -> list[str]:
    """[the directory of the interpreter's libpython3.X.so], which the stub links, or [] if none."""
    libdir = Path(probe["libdir"]) if probe.get("libdir") else None
    return [str(libdir)] if libdir and (libdir / probe.get("soname", "")).is_file() else []


def _wheel_prefix(site: str | os.PathLike) -> Path:
    """Where the nvidia-pytriton wheel in *site* keeps tritonserver (bin/, backends/, ...)."""
    return Path(site) / "pytriton" / "tritonserver"


def _install_stub(prefix: Path, version: str, backends: Path | None = None) -> None:
    """Put the Python backend stub for *version* next to libtriton_python.so.

    *prefix* is the server's directory (bin/, backends/) in the wheel's layout,
    which ships one stub per Python version under python_backend_stubs/<X.Y>/;
    the backend only looks next to itself. Copy to a temporary name and
    rename, so that a concurrent start never sees a half-written executable.
    *backends* defaults to ``prefix/backends``.
    """
    src = prefix / "python_backend_stubs" / version / "triton_python_backend_stub"
    dst = (backends or prefix / "backends") / "python" / "triton_python_backend_stub"
    if dst.exists():
        return
    if not src.exists():
        stubs = src.parent.parent
        if not stubs.is_dir():
            raise ServerUnavailable(
                f"the Triton Python backend has no stub: {dst} is missing (it must sit next to "
                f"libtriton_python.so), and there is no {stubs} to take one for Python {version} from")
        have = sorted(p.name for p in stubs.iterdir())
        raise ServerUnavailable(
            f"the Triton Python backend has no stub for Python {version} "
            f"({stubs} has {', '.join(have) or 'none'}); run the server with one of those Python versions")
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    try:
        shutil.copy2(src, tmp)
        os.chmod(tmp, 0o755)
        os.replace(tmp, dst)
    except OSError as exc:
        raise ServerUnavailable(f"cannot install the Python backend stub {src} as {dst}: {exc}") from exc


def _say(progress: bool, message: str) -> None:
    if progress:
        print(f"tritonshm: {message}", file=sys.stderr, flush=True)


def _ensure_installed(home: Path, progress: bool) -> dict:
    """Install the server venv under *home* if needed; return its install record."""
    venv = home / "venv"
    info = _read_marker(venv)
    if info is not None:
        _install_stub(_wheel_prefix(info["site"]), info["version"])
        return info

    home.mkdir(parents=True, exist_ok=True)
    with open(home / "install.lock", "w") as lock:
        # Two processes may start a server at once: one installs, the other waits.
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(progress, f"waiting for another process installing the Triton server into {venv} ...")
            fcntl.flock(lock, fcntl.LOCK_EX)
        info = _read_marker(venv)  # the other process may have finished it
        if info is not None:
            _install_stub(_wheel_prefix(info["site"]), info["version"])
            return info

        # No marker: nothing, a half-finished install, or an outdated one. Start over.
        if venv.exists():
            shutil.rmtree(venv)
        started = time.monotonic()
        _say(progress, f"installing a local Triton server ({', '.join(REQUIREMENTS)}; "
                       f"~95 MB download, ~370 MB on disk) into {venv} (once) ...")
        _run_checked([sys.executable, "-m", "venv", str(venv)], "creating the virtual environment",
                     quiet=not progress, lock_fd=lock.fileno(),
                     hint="(on Debian/Ubuntu the venv module is in the python3-venv package)")
        python = venv / "bin" / "python"
        _run_checked([str(python), "-m", "pip", "install", "--disable-pip-version-check",
                      "--no-input", *REQUIREMENTS], "running pip install",
                     quiet=not progress, lock_fd=lock.fileno(),
                     hint=f"({REQUIREMENTS[0]} needs a package index and Linux with glibc >= 2.35)")

        info = _probe_venv(python)
        site = Path(info["site"])
        _install_stub(_wheel_prefix(site), info["version"])
        tritonserver = _wheel_prefix(site) / "bin" / "tritonserver"
        libs = site / "nvidia_pytriton.libs"
        if not tritonserver.exists() or not libs.is_dir():
            raise ServerUnavailable(f"{REQUIREMENTS[0]} installed, but {tritonserver} or {libs} is missing")
        info.update(
            requirements=list(REQUIREMENTS),
            venv=str(venv),
            python=str(python),
            tritonserver=str(tritonserver),
            backends=str(_wheel_prefix(site) / "backends"),
            # [server libs, libdir of the venv's interpreter]: the stub links libpython3.X.so.
            ld_library_path=[str(libs), *_python_libdirs(info)],
            allow_client_shm_flag=_help_mentions(tritonserver, libs, "--allow-client-shm"),
            installed_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        )
        tmp = venv / (_MARKER + ".tmp")
        tmp.write_text(json.dumps(info, indent=2))
        os.replace(tmp, venv / _MARKER)  # the marker appears only once all the above worked
        _say(progress, f"Triton server installed in {time.monotonic() - started:.0f} s")
        return info


def _help_mentions(tritonserver: Path, libs: str | os.PathLike, flag: str) -> bool:
    """Whether ``tritonserver --help`` lists *flag* (2.69+ needs --allow-client-shm=true).

    *libs*: the server's library directories (one, or several joined by os.pathsep).
    """
    env = _clean_env()
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(libs), env.get("LD_LIBRARY_PATH")]))
    proc = subprocess.run([str(tritonserver), "--help"], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    return flag in proc.stdout


# --------------------------------------------------------------------------
# An existing install
# --------------------------------------------------------------------------

# (path, inode, size, mtime) of a server_python -> its _probe_venv(), kept once it passed the checks.
_PROBED: dict[tuple, dict] = {}


def _executable(name: str, origin: str, resolve: bool) -> Path:
    """*name* as an absolute path (looked up on PATH if it has no slash), checked to be executable.

    *resolve*: follow symbolic links (not for a Python, whose link may be its venv).
    """
    text = os.path.expanduser(name)
    if os.sep not in text:
        found = shutil.which(text)
        if found is None:
            raise ServerUnavailable(f"{origin}: {text!r} is not on PATH")
        text = found
    path = Path(text).resolve() if resolve else Path(os.path.abspath(text))
    if not path.is_file():
        raise ServerUnavailable(f"{origin}: {path} does not exist" if not path.exists()
                                else f"{origin}: {path} is not a file")
    if not os.access(path, os.X_OK):
        raise ServerUnavailable(f"{origin}: {path} is not executable")
    return path


def _probe_server_python(python: Path, origin: str) -> dict:
    """_probe_venv() of the interpreter the Python backend will run for *python*, checked for numpy < 2.

    The stub's embedded interpreter takes its environment from the "python3"
    first on PATH, and _launch puts *python*'s directory first: so it is that
    directory's python3 that runs the models (the same one, unless *python*
    is some other interpreter that happens to sit there).
    """
    runs = python.parent / "python3"
    if not runs.is_file():
        raise ServerUnavailable(
            f"{origin}: the Triton Python backend runs the python3 first on the server's PATH, and "
            f"there is no {runs} beside {python}; name the python3 of a virtual environment or of "
            f"an installation")
    st = os.stat(runs)
    key = (str(runs), st.st_ino, st.st_size, st.st_mtime_ns)
    probe = _PROBED.get(key)
    if probe is not None:
        return probe
    probe = _probe_venv(runs)
    try:
        same = os.path.samefile(runs, python)
    except OSError:
        same = True
    which = "" if same else f" (the python3 beside {python}, which the backend runs)"
    numpy = probe.get("numpy")
    fix = f"give the server a Python with numpy < 2 (e.g. {runs} -m pip install 'numpy<2')"
    if numpy is None:
        raise ServerUnavailable(f"{origin}: {runs}{which} cannot import numpy ({probe.get('numpy_error')}); "
                                f"the Triton Python backend needs it: {fix}")
    major = re.match(r"\d+", numpy)
    if major is None or int(major.group()) >= 2:
        raise ServerUnavailable(f"{origin}: {runs}{which} has numpy {numpy}; the Triton Python backend "
                                f"needs numpy < 2 (with numpy 2 it returns empty outputs): {fix}")
    _PROBED[key] = probe
    return probe


def _stub_python_version(stub: Path) -> str | None:
    """The X.Y of the libpython3.X.so the Python backend stub links, or None if unknown."""
    try:
        found = re.search(rb"libpython(3\.\d+)\.so", stub.read_bytes())
    except OSError:
        return None
    return found.group(1).decode() if found else None


def _existing_install(tritonserver: str, server_python: str | None, backend_directory: str | None,
                      origin: Mapping[str, str]) -> dict:
    """The install record (what _ensure_installed returns) of a Triton installed elsewhere.

    *tritonserver* is ``<prefix>/bin/tritonserver``: an NGC container's
    /opt/tritonserver, or the wheel's ``<site>/pytriton/tritonserver``. The
    backends are ``<prefix>/backends`` unless *backend_directory* says
    otherwise; the libraries are in ``<prefix>/lib`` and, in the wheel's
    layout, ``<site>/nvidia_pytriton.libs``. *server_python* (default: the
    python3 on PATH) runs the Python backend's models: it needs numpy < 2.
    Nothing is installed, except the Python backend's stub for that Python
    where the server lacks it and has the wheel's python_backend_stubs/.
    Raises ServerUnavailable naming what is missing. *origin* names where
    each setting came from, for the messages.
    """
    server = _executable(tritonserver, origin["tritonserver"], resolve=True)
    prefix = server.parent.parent
    if backend_directory is not None:
        backends = Path(os.path.abspath(os.path.expanduser(backend_directory)))
        if not backends.is_dir():
            raise ServerUnavailable(f"{origin['backend_directory']}: no backends directory {backends}")
    else:
        backends = prefix / "backends"
        if not backends.is_dir():
            raise ServerUnavailable(
                f"{origin['tritonserver']}: {server} has no backends directory {backends} beside its "
                f"bin/ (name one with backend_directory=)")
    libs = os.pathsep.join(str(d) for d in (prefix / "lib", prefix.parent.parent / "nvidia_pytriton.libs")
                           if d.is_dir())
    # ld_library_path: [the server's library dirs (joined by os.pathsep), the interpreter's libdir].
    info: dict = {"tritonserver": str(server), "backends": str(backends), "python": "",
                  "ld_library_path": [libs], "existing": True}
    python_origin = origin.get("server_python", "the python3 on PATH")
    if (backends / "python" / "libtriton_python.so").is_file():
        python = _executable(server_python or "python3", python_origin, resolve=False)
        probe = _probe_server_python(python, python_origin)
        stub = backends / "python" / "triton_python_backend_stub"
        if not stub.exists():
            _install_stub(prefix, probe["version"], backends)
        else:
            built_for = _stub_python_version(stub)
            if built_for is not None and built_for != probe["version"]:
                raise ServerUnavailable(
                    f"{python_origin}: {python.parent / 'python3'} is Python {probe['version']}, but the "
                    f"Triton Python backend's stub {stub} is built for Python {built_for}: give the "
                    f"server a Python {built_for} with numpy < 2")
        info.update(probe, python=str(python), ld_library_path=[libs, *_python_libdirs(probe)])
    elif server_python is not None:  # no Python backend: only PATH
        info["python"] = str(_executable(server_python, python_origin, resolve=False))
    info["allow_client_shm_flag"] = _help_mentions(server, libs, "--allow-client-shm")
    return info


# --------------------------------------------------------------------------
# Process handling
# --------------------------------------------------------------------------


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _make_pdeathsig():
    """A preexec_fn that makes the kernel SIGKILL the server if we die (Linux only).

    Returns None where unsupported. libc and prctl are resolved here, before
    fork, so the child does as little as possible between fork and exec.
    """
    if not sys.platform.startswith("linux"):
        return None
    # PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, so
    # a server started from a short-lived worker thread would die with it.
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    PR_SET_PDEATHSIG = 1
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # we died between fork and prctl: no signal will come
            os._exit(1)

    return preexec


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


# --------------------------------------------------------------------------
# LocalServer
# --------------------------------------------------------------------------


class LocalServer:
    """A real tritonserver on 127.0.0.1, started and stopped by this process.

    Args:
        model_repository: a Triton model repository; None for the bundled demo
            models (``tritonshm/models``). Models should have complete
            ``config.pbtxt`` files: auto-completion is disabled.
        startup_timeout: seconds to wait for the server and all its models to
            be ready before raising :class:`~tritonshm.errors.ServerUnavailable`.
        extra_args: more ``tritonserver`` command-line arguments, appended last.
        home: where the server's virtual environment lives (default:
            :func:`default_home`). Unused with an existing install.
        quiet: do not print install progress.
        private_shm: run the server with a /dev/shm of its own (a private
            mount namespace via ``unshare``, which needs root or user
            namespaces). It then cannot open client segments -- as a server
            on another machine, or in a container without ``--ipc=host``.
            Tests use it to exercise the fallback to the wire.
        tritonserver: run this existing ``<prefix>/bin/tritonserver`` instead
            of installing one (default: ``$TRITONSHM_TRITONSERVER``): an NGC
            container's ``/opt/tritonserver/bin/tritonserver``, or the one in
            an unpacked ``nvidia-pytriton`` wheel. Its backends are
            ``<prefix>/backends``, its libraries ``<prefix>/lib`` (and the
            wheel's ``nvidia_pytriton.libs``). Nothing is installed then,
            except the Python backend's stub where a wheel layout lacks the
            one for *server_python*.
        server_python: with *tritonserver*, the Python whose directory goes
            first on the server's PATH, which runs the Python backend's models
            (default: ``$TRITONSHM_SERVER_PYTHON``, else the ``python3`` on
            PATH). It must have numpy < 2 and the Python version the
            backend's stub is built for; the start checks both.
        backend_directory: with *tritonserver*, the backends directory if it
            is not ``<prefix>/backends``.
        env: extra environment variables for the server process, set after
            the client's environment is cleaned of what must not reach the
            server (PYTHONPATH, PYTHONHOME, VIRTUAL_ENV, LD_PRELOAD, ...):
            ``env={"LD_PRELOAD": ...}`` deliberately preloads a library into
            the server and its stubs. A PATH or LD_LIBRARY_PATH given here
            is kept, behind the server's own directories.

    Use it as a context manager, or call :meth:`start` and :meth:`stop`. The
    server also stops when this object is garbage-collected, when the
    interpreter exits and, on Linux, when this process is killed.
    """

    def __init__(self, model_repository: str | os.PathLike | None = None, *,
                 startup_timeout: float = 120.0, extra_args: Iterable[str] = (),
                 home: str | os.PathLike | None = None, quiet: bool = False,
                 private_shm: bool = False, tritonserver: str | os.PathLike | None = None,
                 server_python: str | os.PathLike | None = None,
                 backend_directory: str | os.PathLike | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        self.model_repository = Path(model_repository) if model_repository is not None \
            else bundled_model_repository()
        self.startup_timeout = float(startup_timeout)
        self.extra_args = list(extra_args)
        self.home = Path(home).expanduser() if home is not None else None
        self.quiet = quiet
        self.private_shm = private_shm
        self.env = dict(env or {})
        # An existing install (tritonserver set) or our own venv: never parts of both.
        self._origin: dict[str, str] = {}
        self.tritonserver = self._setting("tritonserver", tritonserver, "TRITONSHM_TRITONSERVER")
        self.server_python = self._setting("server_python", server_python, "TRITONSHM_SERVER_PYTHON")
        self.backend_directory = self._setting("backend_directory", backend_directory, None)
        if self.tritonserver is None and (self.server_python is not None
                                          or self.backend_directory is not None):
            extra = self._origin["server_python" if self.server_python is not None else "backend_directory"]
            raise ValueError(f"{extra} goes with an existing Triton install, but neither tritonserver= "
                             f"nor $TRITONSHM_TRITONSERVER names one")
        self._grpc_port: int | None = None
        self._http_port: int | None = None
        self._log_offset = 0  # where the current run's output starts in the log
        self._proc = _Process()
        # weakref.finalize also runs at interpreter exit (atexit=True), so one
        # hook covers both "collected" and "the program ends".
        self._finalizer = weakref.finalize(self, self._proc.cleanup)

    def _setting(self, name: str, value, variable: str | None) -> str | None:
        """An existing-install setting: the argument, else the environment variable; its origin noted."""
        if value is not None:
            self._origin[name] = f"{name}="
            return os.fspath(value)
        if variable and os.environ.get(variable):
            self._origin[name] = f"${variable}"
            return os.environ[variable]
        return None

    # -- installation ------------------------------------------------------

    @staticmethod
    def ensure_installed(progress: bool = True, home: str | os.PathLike | None = None) -> Path:
        """Install the server's virtual environment if it is not there yet.

        Safe to call from several processes at once, and after an interrupted
        install (it starts over). Returns the path of the virtual environment.
        """
        home = Path(home).expanduser() if home is not None else default_home()
        return Path(_ensure_installed(home, progress)["venv"])

    # -- addresses ---------------------------------------------------------

    @property
    def grpc_url(self) -> str:
        """``"127.0.0.1:<port>"`` for ``tritonclient.grpc.InferenceServerClient``."""
        return f"127.0.0.1:{self._port('_grpc_port')}"

    @property
    def http_url(self) -> str:
        """``"127.0.0.1:<port>"`` for ``tritonclient.http.InferenceServerClient``."""
        return f"127.0.0.1:{self._port('_http_port')}"

    @property
    def log_path(self) -> Path:
        """The server's log (stdout and stderr of tritonserver and its stubs).

        Kept across stop() and restart(); removed when this object is collected.
        """
        if self._proc.tmpdir is None:
            self._proc.tmpdir = tempfile.mkdtemp(prefix="tritonshm-server-")
        return Path(self._proc.tmpdir) / "tritonserver.log"

    @property
    def pid(self) -> int | None:
        """The tritonserver process id (also its process-group id), or None when stopped."""
        popen = self._proc.popen
        return popen.pid if popen is not None else None

    @property
    def running(self) -> bool:
        """Whether the tritonserver process is alive."""
        popen = self._proc.popen
        return popen is not None and popen.poll() is None

    def _port(self, attr: str) -> int:
        port = getattr(self, attr)
        if port is None:
            raise ServerUnavailable("the local server has not been started")
        return port

    # -- life cycle --------------------------------------------------------

    def start(self) -> "LocalServer":
        """Install if needed, start tritonserver and wait until it and every model are ready.

        Raises :class:`~tritonshm.errors.ServerUnavailable` with the end of the
        server log if it exits or is not ready within ``startup_timeout``.
        """
        if self.running:
            return self
        self._proc.terminate(grace=2.0)  # a server that died by itself may have left stubs
        if self.tritonserver is not None:
            info = _existing_install(self.tritonserver, self.server_python, self.backend_directory,
                                     self._origin)
        else:
            info = _ensure_installed(self.home or default_home(), progress=not self.quiet)
        fixed_ports = self._grpc_port is not None
        # A port picked free can be taken before the server binds it: retry a
        # few times, with new ports on first start, with the same ones on restart.
        for _ in range(5):
            if not fixed_ports:
                self._grpc_port, self._http_port = _free_port(), _free_port()
                while self._http_port == self._grpc_port:
                    self._http_port = _free_port()
            try:
                self._launch(info)
                self._wait_ready()
                return self
            except _PortInUse:
                self._proc.terminate(grace=2.0)
                time.sleep(0.5 if fixed_ports else 0.0)
            except BaseException:  # includes KeyboardInterrupt: never leave a server behind
                self._proc.terminate(grace=2.0)
                raise
        raise ServerUnavailable(
            f"ports {self._grpc_port}/{self._http_port} stayed in use (log: {self.log_path}):\n{self._log_tail()}")

    def stop(self, grace: float = 10.0) -> None:
        """Stop the server and its Python backend stubs; idempotent.

        SIGTERM first (an orderly shutdown takes about 3 s), SIGKILL to the
        whole process group after *grace* seconds. The ports and the log are
        kept for a later :meth:`start`.
        """
        self._proc.terminate(grace)

    def restart(self) -> "LocalServer":
        """Stop, then start again on the same ports (e.g. to test client recovery)."""
        self.stop()
        return self.start()

    def __enter__(self) -> "LocalServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"grpc={self.grpc_url} http={self.http_url}" if self.running else "stopped"
        return f"<LocalServer {state} models={str(self.model_repository)!r}>"

    # -- internals ---------------------------------------------------------

    def _command(self, info: dict) -> list[str]:
        args = [
            info["tritonserver"],
            f"--model-repository={self.model_repository}",
            f"--backend-directory={info['backends']}",
            "--grpc-address=127.0.0.1", f"--grpc-port={self._grpc_port}",
            "--http-address=127.0.0.1", f"--http-port={self._http_port}",
            "--allow-metrics=false",          # one port less to pick, nothing polls it
            "--disable-auto-complete-config",  # configs are complete; skips a stub round-trip per model
            "--strict-readiness=true",
            "--exit-on-error=true",           # a model that fails to load ends startup at once
            "--exit-timeout-secs=5",          # stop() waits 10 s before SIGKILL
            # The Python backend names its /dev/shm segments from this prefix; the
            # default is fixed, so two servers on one machine would collide.
            f"--backend-config=python,shm-region-prefix-name={self._proc.shm_prefix}",
        ]
        if info.get("allow_client_shm_flag"):
            args.append("--allow-client-shm=true")  # Triton 2.69+ refuses client shm without it
        if self.private_shm:
            # unshare and sh both exec, so the server keeps the pid we signal.
            args = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                    'mount -t tmpfs -o size=256m tmpfs /dev/shm && exec "$@"', "sh", *args]
        return args + self.extra_args

    def _launch(self, info: dict) -> None:
        self._proc.shm_prefix = f"triton_pybe_{os.getpid()}_{secrets.token_hex(6)}_"
        env = _clean_env()
        env.update(self.env)  # after the cleaning: an LD_PRELOAD given here is meant for the server
        # The server's own libraries first; the interpreter's libdir (for the
        # stub's libpython) last, so that a system libdir shadows nothing of the user's.
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [
            info["ld_library_path"][0], env.get("LD_LIBRARY_PATH"), *info["ld_library_path"][1:]]))
        # The stub's embedded (isolated) interpreter takes its sys.prefix from
        # the "python3" first on PATH: make that the venv's, with numpy < 2.
        if info["python"]:
            env["PATH"] = os.pathsep.join(filter(None, [str(Path(info["python"]).parent), env.get("PATH")]))
        command = self._command(info)
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== tritonshm: {' '.join(command)}\n".encode())
            log.flush()
            self._log_offset = log.tell()
            try:
                popen = subprocess.Popen(
                    command, env=env, stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                    preexec_fn=_make_pdeathsig())
            except OSError as exc:
                raise ServerUnavailable(f"cannot run {command[0]}: {exc}") from exc
        self._proc.popen = popen

    def _wait_ready(self) -> None:
        base = f"http://127.0.0.1:{self._http_port}"
        deadline = time.monotonic() + self.startup_timeout
        popen = self._proc.popen
        assert popen is not None, "_launch() comes first"
        while True:
            code = popen.poll()
            if code is not None:
                tail = self._log_tail()
                if "already in use" in tail or "Address in use" in tail:
                    raise _PortInUse()
                raise ServerUnavailable(
                    f"tritonserver exited with code {code} during startup "
                    f"(log: {self.log_path}):\n{tail}")
            pending = None
            if _http_ok(base + "/v2/health/ready"):
                pending = _models_not_ready(base)
                if pending == []:
                    return
            if time.monotonic() > deadline:
                self._proc.terminate(grace=2.0)
                waiting = f" (models not ready: {', '.join(pending)})" if pending else ""
                raise ServerUnavailable(
                    f"tritonserver was not ready after {self.startup_timeout:g} s{waiting} "
                    f"(log: {self.log_path}):\n{self._log_tail()}")
            time.sleep(0.1)

    def _log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """What this run logged, for an exception message: its error lines, then its last *lines* lines.

        Triton prints wide status tables just before it exits, so the error
        that matters (a model that failed to load) is often above the tail.
        """
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                text = f.read().decode(errors="replace")
        except OSError as exc:
            return f"(cannot read {self.log_path}: {exc})"
        kept = [line for line in text.splitlines() if line.strip() and not line.startswith("+-")]
        errors = [line for line in kept
                  if line[:1] == "E" and line[1:5].isdigit() and not any(n in line for n in _HARMLESS_ERRORS)]
        tail = "\n".join(kept[-lines:])
        if errors:
            return "errors:\n" + "\n".join(errors[:10]) + "\nlast lines:\n" + tail
        return tail


# Logged by every CPU-only start; not the reason anything failed.
_HARMLESS_ERRORS = ("CudaDriverHelper has not been initialized",)


class _PortInUse(Exception):
    """tritonserver could not bind a port we picked (someone else took it)."""


def _open(request, timeout: float = 2.0):
    """urlopen for our loopback server; urllib is imported here, not at import time (~15 ms)."""
    import urllib.request

    # Loopback only: ignore http_proxy and friends, which would route 127.0.0.1 elsewhere.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    return opener.open(request, timeout=timeout)


def _http_ok(url: str) -> bool:
    import http.client
    import urllib.error

    try:
        with _open(url) as resp:
            return resp.status == 200
    except urllib.error.HTTPError as exc:  # 400 while not ready
        exc.close()  # it holds the connection: no ResourceWarning later
        return False
    # URLError is an OSError; a server that is just coming up may also send a
    # broken status line.
    except (OSError, http.client.HTTPException):
        return False


def _models_not_ready(base: str) -> list[str] | None:
    """Names of the loaded or loading models that are not READY; None if the server did not answer.

    Models without a state were never asked to load (``--model-control-mode=explicit``).
    """
    import http.client
    import urllib.request

    req = urllib.request.Request(base + "/v2/repository/index", data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with _open(req) as resp:
            index = json.loads(resp.read())
    except (OSError, ValueError, http.client.HTTPException):
        return None
    return [m.get("name", "?") for m in index if m.get("state") not in (None, "", "READY")]
