"""LocalServer: a real tritonserver on 127.0.0.1, started and stopped by this process.

It puts the package's other modules together: :mod:`._install` says which
tritonserver to run (our own install, made on first use, or an existing
one), :mod:`._process` runs it in a process group of its own and ends it
with everything it started, and :mod:`._health` tells when it and its
models are ready, or why it is not.
"""

from __future__ import annotations

import os
import secrets
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any, Iterable, Mapping

from tritonshm.errors import InvalidOption, ServerInstallError, ServerUnavailable

from ._health import (_free_port, _http_ok, _listening, _loader_failed, _log_summary, _models_not_ready,
                      _port_in_use, _PortInUse)
from ._install import _LOG_TAIL_LINES, WHEELS_ENV, _clean_env, _ensure_installed, _existing_install, default_home
from ._process import _Process


def bundled_model_repository() -> Path:
    """The Triton model repository shipped inside the package (the demo models)."""
    return Path(__file__).resolve().parent.parent / "models"


def _port_setting(name: str, port: int | None) -> int | None:
    """A port argument of LocalServer, checked: None, or an int in 1..65535."""
    if port is None:
        return None
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise InvalidOption(f"{name} must be None (pick a free port) or a TCP port 1-65535, not {port!r}")
    return port


def _check_ports_free(ports: Mapping[str, int]) -> None:
    """Raise :class:`ServerUnavailable` naming the first of *ports* (argument name -> port) taken on 127.0.0.1."""
    for name, port in ports.items():
        if _listening(port):
            option = "--" + name.replace("_", "-")
            raise ServerUnavailable(
                f"port {port} on 127.0.0.1 ({name}={port}) is already in use: another Triton "
                f"(a `tritonshm server` still running?) or another program listens there; stop it, "
                f"or choose another port ({option} on the command line, {name}= in Python)")


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
        verbose: print pip's own output while installing, not only the
            progress lines (``tritonshm server --verbose``).
        wheels: install the server from this folder of wheels only, without
            a package index (default: ``$TRITONSHM_SERVER_WHEELS``); it needs
            the two wheels that :func:`~tritonshm.server.download_command`
            fetches on a connected machine. Unused once installed.
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
            backend's stub is built for; the start checks both. Without
            *tritonserver*: the Python 3.10-3.12 that our own install makes
            its virtual environment with (default: this interpreter where it
            is 3.10-3.12, else the newest of those found on the machine);
            unused once installed.
        backend_directory: with *tritonserver*, the backends directory if it
            is not ``<prefix>/backends``.
        grpc_port, http_port: the ports to serve gRPC and HTTP on (127.0.0.1);
            None (the default) picks free ones. A port given here that
            something already listens on raises
            :class:`~tritonshm.errors.ServerUnavailable` naming it, before
            anything starts (``tritonshm server --grpc-port 8001 --http-port 8000``
            serves the README's addresses).
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
                 env: Mapping[str, str] | None = None, verbose: bool = False,
                 wheels: str | os.PathLike | None = None, grpc_port: int | None = None,
                 http_port: int | None = None) -> None:
        self.model_repository = Path(model_repository) if model_repository is not None \
            else bundled_model_repository()
        self.startup_timeout = float(startup_timeout)
        self.extra_args = list(extra_args)
        self.home = Path(home).expanduser() if home is not None else None
        self.quiet = quiet
        self.verbose = verbose
        self.private_shm = private_shm
        self.env = dict(env or {})
        # An existing install (tritonserver set) or our own venv: never parts of both.
        self._origin: dict[str, str] = {}
        self.tritonserver = self._setting("tritonserver", tritonserver, "TRITONSHM_TRITONSERVER")
        self.server_python = self._setting("server_python", server_python, "TRITONSHM_SERVER_PYTHON")
        self.backend_directory = self._setting("backend_directory", backend_directory, None)
        self.wheels = self._setting("wheels", wheels, WHEELS_ENV)
        if self.tritonserver is None and self.backend_directory is not None:
            raise ValueError("backend_directory= goes with an existing Triton install, but neither "
                             "tritonserver= nor $TRITONSHM_TRITONSERVER names one")
        self._fixed_ports = {"grpc_port": _port_setting("grpc_port", grpc_port),
                             "http_port": _port_setting("http_port", http_port)}
        if grpc_port is not None and grpc_port == http_port:
            raise InvalidOption(f"grpc_port and http_port must differ, not both {grpc_port}")
        self._grpc_port: int | None = None
        self._http_port: int | None = None
        self._log_offset = 0  # where the current run's output starts in the log
        self._proc = _Process()
        # weakref.finalize also runs at interpreter exit (atexit=True), so one
        # hook covers both "collected" and "the program ends".
        self._finalizer = weakref.finalize(self, self._proc.cleanup)

    def _setting(self, name: str, value: Any, variable: str | None) -> str | None:
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
    def ensure_installed(progress: bool = True, home: str | os.PathLike | None = None, *,
                         verbose: bool = False, wheels: str | os.PathLike | None = None,
                         python: str | os.PathLike | None = None) -> Path:
        """Install the server's virtual environment if it is not there yet.

        Safe to call from several processes at once, and after an interrupted
        install (it starts over). Returns the path of the virtual environment.
        *wheels* (default ``$TRITONSHM_SERVER_WHEELS``): a folder to install
        from without a package index. *python*: the Python 3.10-3.12 to make
        the environment with (default: see ``server_python`` of the class).
        """
        home = Path(home).expanduser() if home is not None else default_home()
        origin = {"wheels": "wheels=" if wheels is not None else f"${WHEELS_ENV}",
                  "server_python": "python=" if python is not None else "$TRITONSHM_SERVER_PYTHON"}
        if wheels is None:
            wheels = os.environ.get(WHEELS_ENV) or None
        python = os.fspath(python) if python is not None else os.environ.get("TRITONSHM_SERVER_PYTHON") or None
        return Path(_ensure_installed(home, progress, verbose=verbose, wheels=wheels, python=python,
                                      origin=origin)["venv"])

    def install(self) -> dict:
        """Make sure the Triton this server runs is there, without starting it; return its install record.

        With an existing install (*tritonserver*, or ``$TRITONSHM_TRITONSERVER``)
        that install is checked and nothing is installed; otherwise our own
        is installed under *home* if it is not there yet (as
        :meth:`ensure_installed`). The record is a dict with at least
        ``tritonserver``, ``backends``, ``python`` (the server's Python, or
        ``""``) and ``existing`` (true for an existing install) or ``venv``
        (our own); :func:`~tritonshm.server.describe_install` puts it in words.
        Raises :class:`~tritonshm.server.ServerInstallError` saying what is
        missing or wrong.
        """
        if self.tritonserver is not None:
            return _existing_install(self.tritonserver, self.server_python, self.backend_directory,
                                     self._origin)
        return _ensure_installed(self.home or default_home(), progress=not self.quiet, verbose=self.verbose,
                                 wheels=self.wheels, python=self.server_python, origin=self._origin)

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
        server log if it exits or is not ready within ``startup_timeout``; its
        subclass :class:`~tritonshm.server.ServerInstallError` if the server
        cannot be installed, its existing install cannot be used, or its
        executable cannot be run.
        """
        if self.running:
            return self
        self._proc.terminate(grace=2.0)  # a server that died by itself may have left stubs
        given = {name: port for name, port in self._fixed_ports.items() if port is not None}
        _check_ports_free(given)  # before installing anything: the caller chose them
        info = self.install()
        fixed_ports = self._grpc_port is not None
        # A port picked free can be taken before the server binds it: retry a
        # few times, with new ports on first start, with the same ones on restart.
        for _ in range(5):
            if not fixed_ports:
                self._grpc_port = given.get("grpc_port") or _free_port()
                self._http_port = given.get("http_port") or _free_port()
                while self._http_port == self._grpc_port:  # two picked (or one picked as the other given)
                    if "http_port" in given:
                        self._grpc_port = _free_port()
                    else:
                        self._http_port = _free_port()
            try:
                self._launch(info)
                self._wait_ready()
                return self
            except _PortInUse:
                self._proc.terminate(grace=2.0)
                _check_ports_free(given)  # a port we were given was taken meanwhile: say so now
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

    def __exit__(self, *exc: Any) -> None:
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
                self._proc.launch(command, env, log)
            except OSError as exc:
                raise ServerInstallError(f"cannot run {command[0]}: {exc}") from exc

    def _wait_ready(self) -> None:
        base = f"http://127.0.0.1:{self._http_port}"
        deadline = time.monotonic() + self.startup_timeout
        popen = self._proc.popen
        assert popen is not None, "_launch() comes first"
        while True:
            code = popen.poll()
            if code is not None:
                tail = self._log_tail()
                if _port_in_use(tail):
                    raise _PortInUse()
                # The dynamic loader refused the executable (a glibc too old, a library missing).
                error = ServerInstallError if _loader_failed(tail) else ServerUnavailable
                raise error(
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
        return _log_summary(text, lines)

