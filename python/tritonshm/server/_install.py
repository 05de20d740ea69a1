"""Where the local server's Triton comes from: our own virtual environment, or an existing install.

Our own install (:func:`_ensure_installed`) is a virtual environment under
:func:`default_home` with :data:`REQUIREMENTS` and nothing else (``--no-deps
--only-binary=:all:``), made once under a file lock with a Python 3.10-3.12
(:func:`_find_base_python`), from a package index or from a folder of wheels
(``--no-index --find-links``); a marker file, written last, says it is
complete. An existing install
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
import glob
import json
import os
import re
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Callable, Mapping, Sequence

from tritonshm.errors import ServerInstallError

#: What the server's virtual environment gets: the wheel that carries
#: tritonserver 2.51 and its Python backend, and the numpy the backend needs.
#: Installed with ``--no-deps`` (the server needs none of nvidia-pytriton's
#: Python dependencies) and ``--only-binary=:all:`` (never a numpy source build).
REQUIREMENTS = ("nvidia-pytriton==0.7.0", "numpy<2")
_PIP_OPTIONS = ("--no-deps", "--only-binary=:all:")

#: The Pythons the server's environment can be made with, preferred first:
#: numpy < 2 has wheels up to 3.12 (the wheel's backend stubs cover 3.8-3.13).
SERVER_PYTHON_VERSIONS = ("3.12", "3.11", "3.10")

#: Measured: nvidia_pytriton-0.7.0 is 55.4 MB, numpy-1.26.4 18.0-18.3 MB (cp310-cp312);
#: the venv (pip included) takes 248 MB on disk.
DOWNLOAD_MB = 74
DISK_MB = 250

#: A folder of the two wheels to install from, offline (``tritonshm server --install-from``).
WHEELS_ENV = "TRITONSHM_SERVER_WHEELS"

_MARKER = "tritonshm-installed.json"  # written inside the venv, last, on success
_LOG = "install.log"                  # pip's full output of the last install, beside the venv
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


class _Display:
    """The install's progress on stderr: a few lines, the download's updated in place on a terminal.

    *verbose* passes pip's own output through instead of the download lines.
    """

    def __init__(self, enabled: bool, verbose: bool = False) -> None:
        self.enabled = enabled or verbose
        self.verbose = verbose
        try:
            self.tty = self.enabled and not verbose and sys.stderr.isatty()
        except (AttributeError, ValueError):
            self.tty = False
        self._live = False  # a line is being updated in place

    def _write(self, text: str) -> None:
        sys.stderr.write(text)
        sys.stderr.flush()

    def say(self, text: str) -> None:
        if self.enabled:
            self.end_live()
            self._write(f"tritonshm: {text}\n")

    def step(self, text: str) -> None:
        self.say(f"  {text}")

    def live(self, text: str) -> None:
        """On a terminal, (re)write the current line; elsewhere nothing."""
        if self.tty:
            line = f"tritonshm:   {text}"
            width = shutil.get_terminal_size().columns - 1  # a wrapped line cannot be rewritten
            self._write("\r" + (line if len(line) <= width else line[:max(width - 3, 0)] + "...") + "\x1b[K")
            self._live = True

    def end_live(self) -> None:
        if self._live:
            self._write("\n")
            self._live = False

    def pip(self, line: str) -> None:
        if self.verbose:
            self._write(line + "\n")


def _dir_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


class _PipOutput:
    """Turns pip's output into the display's lines: what is fetched, from where, how big.

    pip downloads into a directory under $TMPDIR, which we set to *tmpdir*:
    its size is how far the current download got.
    """

    _FETCH = re.compile(r"^\s*(Downloading|Using cached|Processing) (\S+)(?: \((.+)\))?\s*$")
    _INSTALL = re.compile(r"^\s*Installing collected packages: (.+)$")

    def __init__(self, display: _Display, tmpdir: Path | None) -> None:
        self.display = display
        self.tmpdir = tmpdir
        self._download: tuple[str, float, int] | None = None  # (text, started, bytes already in tmpdir)

    def line(self, line: str) -> None:
        self.display.pip(line)
        if self.display.verbose:
            return
        fetch = self._FETCH.match(line)
        install = self._INSTALL.match(line)
        if not fetch and not install:
            return
        self.finish()
        if install:
            self.display.step(f"installing {install.group(1)}")
            return
        assert fetch is not None  # one of the two matched
        verb, where, size = fetch.groups()
        name = where.rstrip("/").rsplit("/", 1)[-1]
        if name.endswith(".whl"):
            name = "-".join(name.split("-")[:2])  # nvidia_pytriton-0.7.0: the tags say nothing here
        size = f" ({size})" if size else ""
        if verb == "Downloading":
            text = f"downloading {name}{size}"
            if self.display.tty:
                base = _dir_bytes(self.tmpdir) if self.tmpdir else 0
                self._download = (text, time.monotonic(), base)
                self.display.live(text)
            else:
                self.display.step(text)
        elif verb == "Using cached":
            self.display.step(f"{name}{size}: from pip's cache")
        elif where.endswith(".whl"):
            self.display.step(f"{name}: from {os.path.dirname(os.path.abspath(where))}")

    def tick(self) -> None:
        if self._download is not None and self.tmpdir is not None:
            text, started, base = self._download
            got = max(_dir_bytes(self.tmpdir) - base, 0)
            self.display.live(f"{text}: {got / 1e6:.1f} MB, {time.monotonic() - started:.0f} s")

    def finish(self) -> None:
        if self._download is not None:
            text, started, _ = self._download
            self.display.live(f"{text}: done in {time.monotonic() - started:.0f} s")
            self.display.end_live()
            self._download = None


def _log_tail(lines: Sequence[str]) -> str:
    """The end of a step's output for an error message, without pip's local-index noise."""
    kept = [line for line in lines if not _NOISE.match(line)]
    return "\n".join(kept[-_LOG_TAIL_LINES:])


# "Location 'file:///.../simple/<name>/' is ignored": a local index without that project.
_NOISE = re.compile(r"^WARNING: Location '.*' is ignored")


def _run_step(cmd: Sequence[str], what: str, display: _Display, lock_fd: int, log: IO[str],
              hint: Callable[[str], str] | str = "", tmpdir: Path | None = None) -> None:
    """Run an install step, its output parsed for *display* and kept in *log*; raise ServerInstallError if it fails.

    The step inherits the install lock, so that if we are killed, another
    installer still waits for our orphaned pip to finish before it starts over.
    """
    env = _clean_env()
    env["PYTHONUNBUFFERED"] = "1"  # pip's lines as they come, not at exit
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    try:
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, pass_fds=(lock_fd,))
    except OSError as exc:
        raise ServerInstallError(f"installing the local Triton server failed while {what}: "
                                 f"cannot run {cmd[0]}: {exc}") from exc
    output = _PipOutput(display, tmpdir)
    lines: list[str] = []

    def take(raw: bytes) -> None:
        line = raw.decode(errors="replace").rstrip("\r")
        lines.append(line)
        log.write(line + "\n")
        output.line(line)

    assert proc.stdout is not None  # started with stdout=PIPE
    fd = proc.stdout.fileno()
    pending = b""
    try:
        while True:
            if not select.select([fd], [], [], 0.25)[0]:
                output.tick()
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            *complete, pending = (pending + chunk).split(b"\n")
            for raw in complete:
                take(raw)
        if pending:
            take(pending)
        code = proc.wait()
    except BaseException:  # Ctrl-C: no pip left running behind our back
        proc.kill()
        proc.wait()
        raise
    finally:
        proc.stdout.close()
        output.finish()
        log.flush()
    if code != 0:
        text = "\n".join(lines)
        tail = _log_tail(lines)
        note = hint(text) if callable(hint) else hint
        raise ServerInstallError(
            f"installing the local Triton server failed while {what} "
            f"(exit code {code}): {' '.join(cmd)}" + (f"\n{tail}" if tail else "")
            + f"\n(full log: {log.name})" + (f"\n{note}" if note else ""))


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


# -- which Python the server's environment is made with ------------------------

_BASE_PROBE = (
    "import json, sys\n"
    "try:\n"
    "    import ensurepip, venv; missing = ''\n"
    "except ImportError as exc:\n"
    "    missing = exc.name or str(exc)\n"
    "print(json.dumps({'version': '%d.%d' % sys.version_info[:2], 'executable': sys.executable,\n"
    "                  'missing': missing}))\n"
)


def _probe_base_python(python: str) -> dict | str:
    """``{version, executable}`` of *python* if it can make a venv with pip in it, else why not."""
    try:
        proc = subprocess.run([python, "-I", "-c", _BASE_PROBE], env=_clean_env(), stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot be run ({exc})"
    if proc.returncode != 0:
        first = next((line for line in proc.stderr.splitlines() if line.strip()), f"exit code {proc.returncode}")
        return f"does not run ({first.strip()})"
    try:
        info = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return "does not say its version"
    if info.get("missing"):
        return (f"is Python {info['version']} without its {info['missing']} module "
                f"(on Debian/Ubuntu: apt install python{info['version']}-venv)")
    return info


def _version_key(path: str) -> tuple:
    """Sort key of an install directory like ``.../versions/3.12.10/bin``: newest release first."""
    release = os.path.basename(os.path.dirname(path))  # 3.12.10, cpython-3.12.3-linux-x86_64-gnu
    return tuple(-int(n) for n in re.findall(r"\d+", release)[:3])


def _search_dirs() -> list[str]:
    """Where to look for ``python3.X``: PATH, the system's directories, pyenv's and uv's installs."""
    dirs = os.environ.get("PATH", "").split(os.pathsep) + ["/usr/local/bin", "/usr/bin"]
    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    data = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
    uv = os.environ.get("UV_PYTHON_INSTALL_DIR") or os.path.join(data, "uv", "python")
    for pattern in (os.path.join(pyenv, "versions", "*", "bin"), os.path.join(uv, "*", "bin")):
        dirs += sorted(glob.glob(pattern), key=_version_key)
    return list(dict.fromkeys(d for d in dirs if d))  # each once, in order


def _wanted() -> str:
    return ", ".join(SERVER_PYTHON_VERSIONS[:-1]) + " or " + SERVER_PYTHON_VERSIONS[-1]


def _find_base_python(explicit: str | None = None, origin: str = "server_python=",
                      current: tuple[str, str] | None = None) -> tuple[str, str]:
    """``(interpreter, "X.Y")`` to make the server's virtual environment with.

    *explicit* (``server_python=``, ``$TRITONSHM_SERVER_PYTHON``) if given,
    which must be one of :data:`SERVER_PYTHON_VERSIONS`; else the running
    interpreter (*current*: its path and version) where it is one of those;
    else the first ``python3.12``, ``python3.11``, ``python3.10`` that runs
    and has the venv module, on PATH or in :func:`_search_dirs`. Raises
    ServerInstallError, in one line, naming what to install when there is none.
    """
    if explicit:
        path = str(_executable(explicit, origin, resolve=False))
        probe = _probe_base_python(path)
        if isinstance(probe, str):
            raise ServerInstallError(f"{origin}: {path} {probe}")
        if probe["version"] not in SERVER_PYTHON_VERSIONS:
            raise ServerInstallError(
                f"{origin}: {path} is Python {probe['version']}; the server's environment needs Python "
                f"{_wanted()} (numpy < 2, which the Triton Python backend needs, has no wheels for others)")
        return path, probe["version"]
    if current is None:
        current = (sys.executable, "%d.%d" % sys.version_info[:2])
    candidates = [current[0]] if current[0] and current[1] in SERVER_PYTHON_VERSIONS else []
    dirs = _search_dirs()
    candidates += [os.path.join(d, f"python{v}") for v in SERVER_PYTHON_VERSIONS for d in dirs]
    seen: set[str] = set()
    refused: list[str] = []
    for candidate in candidates:
        if not (os.path.isfile(candidate) and os.access(candidate, os.X_OK)):
            continue
        real = os.path.realpath(candidate)
        if real in seen:
            continue
        seen.add(real)
        probe = _probe_base_python(candidate)
        if isinstance(probe, dict) and probe["version"] in SERVER_PYTHON_VERSIONS:
            # The interpreter itself, not a launcher (a pyenv shim decides by the directory it runs in).
            return probe.get("executable") or candidate, probe["version"]
        if isinstance(probe, str) and "does not run" not in probe:
            refused.append(f"{candidate} {probe}")
    newest = SERVER_PYTHON_VERSIONS[0]
    raise ServerInstallError(
        f"the local Triton server needs a Python {_wanted()} for its own environment (numpy < 2 has no "
        f"wheels for Python {current[1]}), and none was found on PATH, in /usr/bin, pyenv's or uv's "
        f"installs: install one (e.g. `uv python install {newest}`, `pyenv install {newest}`, or "
        f"apt's python{newest}-venv) or name it with $TRITONSHM_SERVER_PYTHON"
        + (f" (unusable: {'; '.join(refused[:3])})" if refused else ""))


# -- the install itself ---------------------------------------------------------

_GLIBC_NEEDED = (2, 35)  # nvidia-pytriton 0.7.0 is a manylinux_2_35 wheel


def _check_glibc() -> None:
    """Refuse early, in words, where the server's wheel cannot run (pip would only say "no version")."""
    try:
        name, _, version = (os.confstr("CS_GNU_LIBC_VERSION") or "").partition(" ")
    except (AttributeError, ValueError, OSError):
        return  # not glibc, or cannot tell: let pip decide
    found = tuple(int(n) for n in re.findall(r"\d+", version)[:2])
    if name == "glibc" and len(found) == 2 and found < _GLIBC_NEEDED:
        raise ServerInstallError(
            f"{REQUIREMENTS[0]} (the Triton server) needs Linux with glibc >= "
            f"{'.'.join(map(str, _GLIBC_NEEDED))}, and this machine has glibc {version}: run an existing "
            f"Triton instead (e.g. in an NGC container, with $TRITONSHM_TRITONSERVER)")


def download_command(python_version: str, directory: str = "DIR") -> str:
    """The ``pip download`` command that fetches, on any machine with a package index, the two
    wheels an offline install (``tritonshm server --install-from DIR``) needs for a server Python
    *python_version* on a Linux of this machine's architecture."""
    machine = os.uname().machine
    requirements = " ".join(f'"{r}"' if "<" in r or ">" in r else r for r in REQUIREMENTS)
    return (f"pip download --no-deps {requirements} -d {directory} --python-version {python_version} "
            f"--only-binary=:all: --platform manylinux_2_35_{machine} --platform manylinux2014_{machine}")


# What pip says when it cannot reach an index (with retries; with PIP_RETRIES=0 it says nothing).
_NETWORK_ERRORS = ("NewConnectionError", "Failed to establish a new connection", "name resolution",
                   "Network is unreachable", "ConnectTimeout", "ProxyError", "Max retries exceeded",
                   "Could not fetch URL", "connection broken")


def _pip_hint(output: str, python_version: str, wheels: Path | None) -> str:
    """What to do about a failed ``pip install``, from its output: mostly, how to install offline."""
    if wheels is not None:
        return (f"(--no-index --find-links {wheels}: that folder needs both wheels for Python {python_version} "
                f"on this platform; fill it on a machine with a package index with:\n"
                f"  {download_command(python_version, str(wheels))}\n)")
    if any(marker in output for marker in _NETWORK_ERRORS):
        why = "pip cannot reach a package index."
    elif "(from versions: none)" in output:
        why = "pip found no matching wheel: no package index reachable from here?"
    else:
        return ""
    return (f"{why} To install without one, run on a machine with an index\n"
            f"  {download_command(python_version)}\n"
            f"copy DIR here and run\n"
            f"  tritonshm server --install-only --install-from DIR\n"
            f"(or set {WHEELS_ENV}=DIR for LocalServer, tritonshm demo and the tests)")


def _wheels_dir(wheels: str | os.PathLike, origin: str) -> Path:
    path = Path(os.path.abspath(os.path.expanduser(os.fspath(wheels))))
    if not path.is_dir():
        raise ServerInstallError(f"{origin}: {path} is not a directory (of the server's wheels)")
    return path


def _tilde(path: Path) -> str:
    home = os.path.expanduser("~")
    text = str(path)
    return "~" + text[len(home):] if home != "/" and (text == home or text.startswith(home + os.sep)) else text


def _ensure_installed(home: Path, progress: bool, *, verbose: bool = False,
                      wheels: str | os.PathLike | None = None, python: str | None = None,
                      origin: Mapping[str, str] | None = None) -> dict:
    """Install the server venv under *home* if needed; return its install record.

    *progress*: a few lines on stderr (*verbose*: pip's own output too).
    *wheels*: install from that folder only (``--no-index --find-links``).
    *python*: the interpreter to make the venv with (default: see
    :func:`_find_base_python`). Neither matters once the install is there.
    *origin* names where *wheels* and *python* came from, for the messages.
    """
    venv = home / "venv"
    info = _read_marker(venv)
    if info is not None:
        _install_stub(_wheel_prefix(info["site"]), info["version"])
        return info
    origin = origin or {}
    display = _Display(progress, verbose)
    wheels_dir = _wheels_dir(wheels, origin.get("wheels", "wheels=")) if wheels else None

    home.mkdir(parents=True, exist_ok=True)
    with open(home / "install.lock", "w") as lock:
        # Two processes may start a server at once: one installs, the other waits.
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            display.say(f"waiting for another process installing the Triton server into {_tilde(venv)} ...")
            fcntl.flock(lock, fcntl.LOCK_EX)
        info = _read_marker(venv)  # the other process may have finished it
        if info is not None:
            _install_stub(_wheel_prefix(info["site"]), info["version"])
            return info

        _check_glibc()
        base, version = _find_base_python(python, origin.get("server_python", "server_python="))
        # No marker: nothing, a half-finished install, or an outdated one. Start over.
        if venv.exists():
            shutil.rmtree(venv)
        started = time.monotonic()
        what = " + ".join(r.replace("==", " ") for r in REQUIREMENTS)
        source = f"from {wheels_dir}, no download" if wheels_dir else f"~{DOWNLOAD_MB} MB download"
        display.say(f"installing the Triton server ({what}; {source}, ~{DISK_MB} MB on disk) "
                    f"into {_tilde(home)} (once) ...")
        python_bin = venv / "bin" / "python"
        tmp = home / "tmp"  # pip's $TMPDIR: its size is the download's progress
        with open(home / _LOG, "w") as log:
            display.step(f"creating its virtual environment with Python {version} ({base})")
            _run_step([base, "-m", "venv", str(venv)], "creating the virtual environment", display,
                      lock.fileno(), log,
                      hint=f"(on Debian/Ubuntu the venv module is in the python{version}-venv package)")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            index = ["--no-index", "--find-links", str(wheels_dir)] if wheels_dir else []
            try:
                _run_step([str(python_bin), "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
                           "--progress-bar", "off", *_PIP_OPTIONS, *index, *REQUIREMENTS],
                          "running pip install", display, lock.fileno(), log,
                          hint=lambda output: _pip_hint(output, version, wheels_dir), tmpdir=tmp)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)

        info = _probe_venv(python_bin)
        site = Path(info["site"])
        _install_stub(_wheel_prefix(site), info["version"])
        tritonserver = _wheel_prefix(site) / "bin" / "tritonserver"
        libs = site / "nvidia_pytriton.libs"
        if not tritonserver.exists() or not libs.is_dir():
            raise ServerInstallError(f"{REQUIREMENTS[0]} installed, but {tritonserver} or {libs} is missing")
        info.update(
            requirements=list(REQUIREMENTS),
            pip_options=list(_PIP_OPTIONS),
            wheels=str(wheels_dir) if wheels_dir else None,
            base_python=base,
            venv=str(venv),
            python=str(python_bin),
            tritonserver=str(tritonserver),
            backends=str(_wheel_prefix(site) / "backends"),
            # [server libs, libdir of the venv's interpreter]: the stub links libpython3.X.so.
            ld_library_path=[str(libs), *_python_libdirs(info)],
            allow_client_shm_flag=_help_mentions(tritonserver, libs, "--allow-client-shm"),
            installed_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        )
        marker = venv / (_MARKER + ".tmp")
        marker.write_text(json.dumps(info, indent=2))
        os.replace(marker, venv / _MARKER)  # the marker appears only once all the above worked
        display.say(f"Triton server installed in {time.monotonic() - started:.0f} s "
                    f"(Python {info['version']}, numpy {info.get('numpy') or '?'})")
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
