"""Where the local server's Triton comes from: our own virtual environment, or an existing install.

Our own install (:func:`_ensure_installed`) is a virtual environment under
:func:`default_home` with :data:`REQUIREMENTS`, made once under a file lock;
a marker file, written last, says it is complete. An existing install
(:func:`_existing_install`: ``$TRITONSHM_TRITONSERVER``,
``$TRITONSHM_SERVER_PYTHON``, or the arguments of the same names) is only
probed, never changed -- except for the Python backend's stub, which both
kinds may need copied next to ``libtriton_python.so``.

Either way the result is an *install record*: a dict with ``tritonserver``,
``backends``, ``python``, ``ld_library_path`` and ``allow_client_shm_flag``,
which is all a launch needs. Everything here that fails raises
:class:`ServerInstallError`.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping, Sequence

from tritonshm.errors import ServerInstallError

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


# --------------------------------------------------------------------------
# Our own install
# --------------------------------------------------------------------------


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
    """Run an install step; raise ServerInstallError with its output if it fails.

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
        raise ServerInstallError(
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
        raise ServerInstallError(f"cannot run the server's Python {python}: {exc}") from exc
    try:
        if proc.returncode == 0:
            return json.loads(proc.stdout)
    except ValueError:
        pass
    tail = "\n".join(proc.stderr.splitlines()[-_LOG_TAIL_LINES:])
    raise ServerInstallError(f"the server's Python {python} failed to report its version and paths "
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
            raise ServerInstallError(
                f"the Triton Python backend has no stub: {dst} is missing (it must sit next to "
                f"libtriton_python.so), and there is no {stubs} to take one for Python {version} from")
        have = sorted(p.name for p in stubs.iterdir())
        raise ServerInstallError(
            f"the Triton Python backend has no stub for Python {version} "
            f"({stubs} has {', '.join(have) or 'none'}); run the server with one of those Python versions")
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    try:
        shutil.copy2(src, tmp)
        os.chmod(tmp, 0o755)
        os.replace(tmp, dst)
    except OSError as exc:
        raise ServerInstallError(f"cannot install the Python backend stub {src} as {dst}: {exc}") from exc


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
            raise ServerInstallError(f"{REQUIREMENTS[0]} installed, but {tritonserver} or {libs} is missing")
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
            raise ServerInstallError(f"{origin}: {text!r} is not on PATH")
        text = found
    path = Path(text).resolve() if resolve else Path(os.path.abspath(text))
    if not path.is_file():
        raise ServerInstallError(f"{origin}: {path} does not exist" if not path.exists()
                                 else f"{origin}: {path} is not a file")
    if not os.access(path, os.X_OK):
        raise ServerInstallError(f"{origin}: {path} is not executable")
    return path


def _probe_server_python(python: Path, origin: str) -> dict:
    """_probe_venv() of the interpreter the Python backend will run for *python*, checked for numpy < 2.

    The stub's embedded interpreter takes its environment from the "python3"
    first on PATH, and the launch puts *python*'s directory first: so it is
    that directory's python3 that runs the models (the same one, unless
    *python* is some other interpreter that happens to sit there).
    """
    runs = python.parent / "python3"
    if not runs.is_file():
        raise ServerInstallError(
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
        raise ServerInstallError(f"{origin}: {runs}{which} cannot import numpy ({probe.get('numpy_error')}); "
                                 f"the Triton Python backend needs it: {fix}")
    major = re.match(r"\d+", numpy)
    if major is None or int(major.group()) >= 2:
        raise ServerInstallError(f"{origin}: {runs}{which} has numpy {numpy}; the Triton Python backend "
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
    Raises ServerInstallError naming what is missing. *origin* names where
    each setting came from, for the messages.
    """
    server = _executable(tritonserver, origin["tritonserver"], resolve=True)
    prefix = server.parent.parent
    if backend_directory is not None:
        backends = Path(os.path.abspath(os.path.expanduser(backend_directory)))
        if not backends.is_dir():
            raise ServerInstallError(f"{origin['backend_directory']}: no backends directory {backends}")
    else:
        backends = prefix / "backends"
        if not backends.is_dir():
            raise ServerInstallError(
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
                raise ServerInstallError(
                    f"{python_origin}: {python.parent / 'python3'} is Python {probe['version']}, but the "
                    f"Triton Python backend's stub {stub} is built for Python {built_for}: give the "
                    f"server a Python {built_for} with numpy < 2")
        info.update(probe, python=str(python), ld_library_path=[libs, *_python_libdirs(probe)])
    elif server_python is not None:  # no Python backend: only PATH
        info["python"] = str(_executable(server_python, python_origin, resolve=False))
    info["allow_client_shm_flag"] = _help_mentions(server, libs, "--allow-client-shm")
    return info


def describe_install(info: Mapping) -> str:
    """What an install record holds, in a few lines: the server, its backends, its Python, its libraries.

    *info* is what :meth:`LocalServer.install() <tritonshm.server.LocalServer.install>`
    returns; ``tritonshm server --install-only`` prints this for an existing install.
    """
    head = "existing Triton install (nothing installed)" if info.get("existing") \
        else f"Triton installed in {info['venv']}"
    lines = [head, f"tritonserver: {info['tritonserver']}", f"backends: {info['backends']}"]
    if info.get("python"):
        python = info["python"]
        if info.get("version"):
            python += f" (Python {info['version']}, numpy {info.get('numpy') or '?'})"
        lines.append(f"server Python: {python}")
    else:
        lines.append("server Python: none (no Python backend)")
    libs = [d for entry in info.get("ld_library_path", []) for d in entry.split(os.pathsep) if d]
    lines.append(f"libraries: {os.pathsep.join(libs) or 'none'}")
    lines.append("--allow-client-shm=true: " + ("passed (this server needs it)" if info.get("allow_client_shm_flag")
                                                  else "not needed"))
    return "\n".join(lines)
