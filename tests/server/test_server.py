"""Tests of tritonshm.server.LocalServer: a real tritonserver, plain gRPC/HTTP, no shared memory.

The first run installs the server's virtual environment (see LocalServer.ensure_installed);
later runs start a server with all bundled models in about a second.
"""

from __future__ import annotations

import ast
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tritonshm.errors import InvalidOption, ServerUnavailable
from tritonshm.server import LocalServer, ServerInstallError, bundled_model_repository, group_members
from triton_fixtures import NUMERIC_IDENTITY_MODELS, start_or_skip

MODELS = sorted(p.name for p in bundled_model_repository().iterdir() if (p / "config.pbtxt").is_file())

IDENTITY = {
    **NUMERIC_IDENTITY_MODELS,
    "identity_bytes": np.object_,
    "identity_fp32_2inst": np.float32,
}


@pytest.fixture
def grpc(server):
    """A gRPC client of the session server, closed (and settled) after the test."""
    fds_before = _fd_count()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    _close_and_settle(client, fds_before)


def _fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def _close_and_settle(client, fds_before: int, timeout: float = 5.0) -> None:
    """Close a gRPC client and wait until its channel has closed its descriptors.

    gRPC closes them from its own threads, a little after close() returns.
    """
    client.close()
    deadline = time.monotonic() + timeout
    while _fd_count() > fds_before and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)


def _infer(client, model, inputs: dict, outputs: list[str]) -> dict:
    infer_inputs = []
    for name, array in inputs.items():
        dtype = "BYTES" if array.dtype == np.object_ else grpcclient.np_to_triton_dtype(array.dtype)
        i = grpcclient.InferInput(name, list(array.shape), dtype)
        i.set_data_from_numpy(array)
        infer_inputs.append(i)
    result = client.infer(model, infer_inputs,
                          outputs=[grpcclient.InferRequestedOutput(n) for n in outputs])
    return {n: result.as_numpy(n) for n in outputs}


def _assert_gone(pids: list[int], pgid: int) -> None:
    """No live (non-zombie) process left from *pids* or in process group *pgid*."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    assert alive == []
    assert group_members(pgid) == []


def _server_pids(srv: LocalServer) -> list[int]:
    proc = psutil.Process(srv.pid)
    return [proc.pid] + [c.pid for c in proc.children(recursive=True)]


def _stub_segments(srv: LocalServer) -> list[str]:
    """The /dev/shm segments of the server's Python backend stubs (argv[2] of each stub)."""
    return [c.cmdline()[2] for c in psutil.Process(srv.pid).children()
            if c.name().startswith("triton_python")]


def _our_tritonservers() -> set[int]:
    """Pids of the live tritonserver processes this test process started."""
    return {c.pid for c in psutil.Process().children(recursive=True)
            if c.name() == "tritonserver" and c.status() != psutil.STATUS_ZOMBIE}


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# -- the shared server ---------------------------------------------------------


def test_live_ready_and_shm_extensions(server, grpc):
    assert server.running
    assert server.grpc_url.startswith("127.0.0.1:") and server.http_url.startswith("127.0.0.1:")
    assert grpc.is_server_live() and grpc.is_server_ready()
    extensions = set(grpc.get_server_metadata().extensions)
    assert {"system_shared_memory", "cuda_shared_memory"} <= extensions
    assert server.log_path.is_file() and "Started GRPCInferenceService" in server.log_path.read_text()


def test_http_url_works(server):
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        assert client.is_server_ready()
        assert client.is_model_ready("add_sub")
    finally:
        client.close()


def test_every_bundled_model_is_ready(grpc):
    assert len(MODELS) == 24
    index = grpc.get_model_repository_index(as_json=True)["models"]
    assert sorted(m["name"] for m in index) == MODELS
    assert {m["name"]: m["state"] for m in index} == {name: "READY" for name in MODELS}
    for name in MODELS:
        assert grpc.is_model_ready(name), name


def test_identity_fp32(grpc):
    x = np.arange(1000, dtype=np.float32) / 7
    out = _infer(grpc, "identity_fp32", {"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"]
    assert out.dtype == np.float32 and out.shape == x.shape
    np.testing.assert_array_equal(out, x)


@pytest.mark.parametrize("model", sorted(IDENTITY))
def test_identity_keeps_dtype_and_values(grpc, model):
    dtype = IDENTITY[model]
    if dtype is np.object_:
        x = np.array([b"", b"a", b"\x00\xffbytes", "héllo".encode()], dtype=np.object_)
    elif dtype is np.bool_:
        x = np.array([True, False, True])
    else:
        x = (np.arange(37) % 100).astype(dtype)
    out = _infer(grpc, model, {"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"]
    assert out.dtype == x.dtype and out.shape == x.shape
    assert out.tolist() == x.tolist()


def test_add_sub(grpc):
    a = np.random.default_rng(0).random(16, dtype=np.float32)
    b = np.arange(16, dtype=np.float32)
    out = _infer(grpc, "add_sub", {"INPUT0": a, "INPUT1": b}, ["OUTPUT0", "OUTPUT1"])
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT1"], a - b)
    assert out["OUTPUT0"].dtype == np.float32


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_batched_fp32(grpc, batch):
    x = np.arange(batch * 4, dtype=np.float32).reshape(batch, 4)
    out = _infer(grpc, "batched_fp32", {"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"]
    np.testing.assert_array_equal(out, x * 2)
    assert grpc.get_model_config("batched_fp32").config.max_batch_size == 8


def test_batched_fp32_rejects_too_large_batch(grpc):
    x = np.zeros((9, 4), dtype=np.float32)
    with pytest.raises(Exception, match="batch"):
        _infer(grpc, "batched_fp32", {"INPUT0": x}, ["OUTPUT0"])


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (64, 2)])
def test_variable_fp32(grpc, shape):
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    out = _infer(grpc, "variable_fp32", {"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"]
    assert out.shape == shape
    np.testing.assert_array_equal(out, x + 1)


def test_two_instances_serve_concurrently(grpc):
    config = grpc.get_model_config("identity_fp32_2inst").config
    assert sum(g.count for g in config.instance_group) == 2
    errors = []

    def worker(seed):
        for i in range(20):
            x = np.full(256, seed * 100 + i, dtype=np.float32)
            out = _infer(grpc, "identity_fp32_2inst", {"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"]
            if not np.array_equal(out, x):
                errors.append((seed, i))

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# -- life cycle: servers of their own -------------------------------------------
# They use the session server too, only to be skipped (with its reason) where
# no server can be installed or started.


@pytest.mark.server
@pytest.mark.usefixtures("server")
def test_restart_keeps_ports_and_comes_back():
    with LocalServer(quiet=True) as srv:
        grpc_url, http_url, first_pid = srv.grpc_url, srv.http_url, srv.pid
        fds_before = _fd_count()
        client = grpcclient.InferenceServerClient(grpc_url)
        try:
            x = np.arange(8, dtype=np.float32)
            np.testing.assert_array_equal(_infer(client, "identity_fp32", {"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"], x)
            srv.restart()
            assert (srv.grpc_url, srv.http_url) == (grpc_url, http_url)
            assert srv.pid != first_pid and srv.running
            # The same client object reconnects once the channel's backoff expires.
            deadline = time.monotonic() + 15
            while True:
                try:
                    out = _infer(client, "identity_fp32", {"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"]
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            np.testing.assert_array_equal(out, x)
        finally:
            _close_and_settle(client, fds_before)


@pytest.mark.server
@pytest.mark.usefixtures("server")
def test_stop_leaves_no_process_and_no_segment():
    srv = LocalServer(quiet=True).start()
    try:
        pgid = srv.pid
        pids = _server_pids(srv)
        instances = len(MODELS) + 1  # one per model, two for identity_fp32_2inst
        assert len(pids) == 1 + instances  # tritonserver + one Python stub per model instance
        segments = _stub_segments(srv)
        assert len(segments) == instances and set(segments) <= set(os.listdir("/dev/shm"))
        grpc_port = int(srv.grpc_url.rsplit(":", 1)[1])
    finally:
        srv.stop()
    _assert_gone(pids, pgid)
    assert not srv.running and srv.pid is None
    assert set(segments) & set(os.listdir("/dev/shm")) == set()
    assert _port_free(grpc_port)
    srv.stop()  # idempotent
    assert srv.grpc_url.endswith(f":{grpc_port}")  # the ports are kept for a later start()


@pytest.mark.server
@pytest.mark.usefixtures("server")
def test_hard_stop_kills_stubs_and_removes_their_segments():
    srv = LocalServer(quiet=True).start()
    try:
        pgid, pids, segments = srv.pid, _server_pids(srv), _stub_segments(srv)
    finally:
        srv.stop(grace=0)  # straight to SIGKILL: the stubs cannot clean up themselves
    _assert_gone(pids, pgid)
    assert set(segments) & set(os.listdir("/dev/shm")) == set()


def _bad_repository(root: Path) -> Path:
    model = root / "broken"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(textwrap.dedent("""\
        name: "broken"
        backend: "python"
        max_batch_size: 0
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
        instance_group [ { kind: KIND_CPU count: 1 } ]
        """))
    (model / "1" / "model.py").write_text(textwrap.dedent("""\
        class TritonPythonModel:
            def initialize(self, args):
                raise RuntimeError("deliberately broken model xyzzy")
        """))
    return root


def test_a_port_given_that_is_taken_is_named_before_anything_starts():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for option, flag in (("grpc_port", "--grpc-port"), ("http_port", "--http-port")):
            srv = LocalServer(quiet=True, **{option: port})
            with pytest.raises(ServerUnavailable, match=f"port {port} on 127.0.0.1 .*already in use.*{flag}"):
                srv.start()
            assert srv.pid is None and not srv.running


@pytest.mark.parametrize("ports, match", [
    ({"grpc_port": 0}, "grpc_port must be"),
    ({"http_port": 65536}, "http_port must be"),
    ({"grpc_port": "8001"}, "grpc_port must be"),
    ({"http_port": True}, "http_port must be"),
    ({"grpc_port": 18001, "http_port": 18001}, "must differ"),
])
def test_port_arguments_are_checked(ports, match):
    with pytest.raises(InvalidOption, match=match):
        LocalServer(**ports)


@pytest.mark.server
@pytest.mark.usefixtures("server")
def test_bad_model_repository_raises_with_log(tmp_path):
    before = _our_tritonservers()
    srv = LocalServer(_bad_repository(tmp_path), quiet=True, startup_timeout=60)
    t0 = time.monotonic()
    with pytest.raises(ServerUnavailable) as info:
        srv.start()
    assert time.monotonic() - t0 < 30  # --exit-on-error: no waiting for the timeout
    message = str(info.value)
    assert "exited" in message
    assert "deliberately broken model xyzzy" in message  # the log's error lines are in the message
    assert not srv.running and _our_tritonservers() == before


@pytest.mark.usefixtures("server")
def test_missing_model_repository_raises(tmp_path):
    with pytest.raises(ServerUnavailable, match="model repository|failed to stat|no such"):
        LocalServer(tmp_path / "does-not-exist", quiet=True).start()


@pytest.mark.usefixtures("server")
def test_startup_timeout_stops_the_server():
    before = _our_tritonservers()
    srv = LocalServer(quiet=True, startup_timeout=0.01)
    with pytest.raises(ServerUnavailable, match="not ready after"):
        srv.start()
    assert not srv.running and _our_tritonservers() == before


def _child(code: str):
    """Run *code* in a new interpreter that imports tritonshm the way this one does.

    Returns the Popen and the pids of the server it started (tritonserver first).
    """
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    child = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    with child.stdout:
        pids = json.loads(child.stdout.readline())
    return child, pids


CHILD_PRELUDE = (
    "import json, time\n"
    "from tritonshm.server import LocalServer\n"
    "srv = LocalServer(quiet=True).start()\n"
    "import psutil\n"
    "p = psutil.Process(srv.pid)\n"
    "print(json.dumps([srv.pid] + [c.pid for c in p.children(recursive=True)]), flush=True)\n"
)


def _wait_gone(pids, pgid, timeout=15.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            _assert_gone(pids, pgid)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.mark.usefixtures("server")
def test_server_stops_when_python_exits_without_stop():
    child, pids = _child(CHILD_PRELUDE + "# no stop(): the finalizer runs at exit\n")
    assert child.wait(timeout=60) == 0
    _assert_gone(pids, pids[0])  # at exit, not some time later


@pytest.mark.usefixtures("server")
def test_server_dies_with_a_sigkilled_parent():
    child, pids = _child(CHILD_PRELUDE + "time.sleep(600)\n")
    child.send_signal(signal.SIGKILL)
    child.wait()
    # PR_SET_PDEATHSIG kills tritonserver at once; its stubs notice and exit by themselves.
    _wait_gone(pids, pids[0])


@pytest.mark.server
@pytest.mark.usefixtures("server")
def test_ctrl_c_in_with_block_stops_the_server():
    child, pids = _child(
        "import json, time, psutil\n"
        "from tritonshm.server import LocalServer\n"
        "with LocalServer(quiet=True) as srv:\n"
        "    p = psutil.Process(srv.pid)\n"
        "    print(json.dumps([srv.pid] + [c.pid for c in p.children(recursive=True)]), flush=True)\n"
        "    time.sleep(600)\n")
    child.send_signal(signal.SIGINT)  # KeyboardInterrupt inside the with block
    assert child.wait(timeout=60) != 0
    _assert_gone(pids, pids[0])  # stopped by __exit__ before the child exited


# -- no server needed ------------------------------------------------------------


def test_ensure_installed_is_idempotent_and_fast(server):
    t0 = time.monotonic()
    venv = LocalServer.ensure_installed(progress=False)
    assert time.monotonic() - t0 < 1.0
    assert LocalServer.ensure_installed(progress=False) == venv
    assert (venv / "bin" / "python").exists()
    stubs = list(venv.glob("lib/python3.*/site-packages/pytriton/tritonserver/backends/python/"
                           "triton_python_backend_stub"))
    assert len(stubs) == 1 and os.access(stubs[0], os.X_OK)


def test_models_share_one_implementation():
    sources = {(bundled_model_repository() / m / "1" / "model.py").read_bytes() for m in MODELS}
    assert len(sources) == 1


def _imports(module: Path) -> tuple[set[str], set[str]]:
    """(the absolute imports of *module*, top-level names but "tritonshm.errors" whole; its relative ones)."""
    absolute, relative = set(), set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.Import):
            absolute |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            absolute.add(node.module.split(".")[0] if node.module != "tritonshm.errors" else "tritonshm.errors")
        elif isinstance(node, ast.ImportFrom):
            relative.add(node.module or "")
    return absolute, relative


def test_server_package_needs_only_the_stdlib():
    package = Path(sys.modules[LocalServer.__module__].__file__).parent
    modules = sorted(package.glob("*.py"))
    assert {m.stem for m in modules} == {"__init__", "_install", "_process", "_health", "_local"}
    for module in modules:
        absolute, _ = _imports(module)
        assert absolute - set(sys.stdlib_module_names) <= {"tritonshm.errors"}, module.name


def test_server_modules_import_one_way():
    """_local puts _install, _process and _health together; none of those imports a sibling."""
    package = Path(sys.modules[LocalServer.__module__].__file__).parent
    assert _imports(package / "_local.py")[1] == {"_install", "_process", "_health"}
    for name in ("_install", "_process", "_health"):
        assert _imports(package / f"{name}.py")[1] == set(), name


# -- an existing install (tritonserver=, server_python=) --------------------------


@pytest.fixture(scope="module")
def existing_install(server) -> tuple[str, str]:
    """(tritonserver, the server's Python) of a server that is already installed.

    $TRITONSHM_TRITONSERVER and $TRITONSHM_SERVER_PYTHON where set (a machine
    without a package index), else the virtual environment the normal install made.
    """
    if os.environ.get("TRITONSHM_TRITONSERVER") and os.environ.get("TRITONSHM_SERVER_PYTHON"):
        return os.environ["TRITONSHM_TRITONSERVER"], os.environ["TRITONSHM_SERVER_PYTHON"]
    venv = LocalServer.ensure_installed(progress=False)
    marker = json.loads((venv / "tritonshm-installed.json").read_text())
    return marker["tritonserver"], marker["python"]


@pytest.fixture
def no_install_env(monkeypatch):
    """No TRITONSHM_* settings from the environment that runs the tests."""
    for name in ("TRITONSHM_TRITONSERVER", "TRITONSHM_SERVER_PYTHON", "TRITONSHM_SERVER_HOME"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _identity_roundtrip(srv: LocalServer) -> None:
    fds_before = _fd_count()
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        x = np.arange(100, dtype=np.float32) / 3
        np.testing.assert_array_equal(_infer(client, "identity_fp32", {"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"], x)
    finally:
        _close_and_settle(client, fds_before)


def _python_version(python: str) -> str:
    return subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                          check=True, stdout=subprocess.PIPE, text=True).stdout.strip()


@pytest.mark.server
def test_existing_install_runs_and_installs_nothing(no_install_env, tmp_path, existing_install):
    tritonserver, python = existing_install
    home = tmp_path / "home"
    home.mkdir()
    libm = next(p for p in ("/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib64/libm.so.6", "/lib64/libm.so.6")
                if os.path.exists(p))
    srv = LocalServer(tritonserver=tritonserver, server_python=python, home=home, quiet=True,
                      env={"LD_PRELOAD": libm, "TRITONSHM_TEST_MARK": "xyzzy"})
    with srv:
        _identity_roundtrip(srv)
        proc = psutil.Process(srv.pid)
        assert proc.exe() == str(Path(tritonserver).resolve())
        environ = proc.environ()
        assert environ["TRITONSHM_TEST_MARK"] == "xyzzy"
        assert environ["LD_PRELOAD"] == libm  # env= is applied after the client's LD_PRELOAD is dropped
        assert environ["PATH"].split(os.pathsep)[0] == str(Path(python).parent)
    assert list(home.iterdir()) == []  # nothing installed, not even a lock file


@pytest.mark.server
def test_existing_install_from_the_environment(no_install_env, tmp_path, existing_install):
    tritonserver, python = existing_install
    no_install_env.setenv("TRITONSHM_TRITONSERVER", tritonserver)
    no_install_env.setenv("TRITONSHM_SERVER_PYTHON", python)
    no_install_env.setenv("TRITONSHM_SERVER_HOME", str(tmp_path))
    with LocalServer(quiet=True) as srv:
        assert (srv.tritonserver, srv.server_python) == (tritonserver, python)
        _identity_roundtrip(srv)
    assert list(tmp_path.iterdir()) == []


def _fake_server(root: Path, *, backends: bool = True, python_backend: bool = True) -> Path:
    """A wheel-layout install whose tritonserver is a script that logs its environment and fails."""
    prefix = root / "site" / "pytriton" / "tritonserver"
    (prefix / "bin").mkdir(parents=True)
    (root / "site" / "nvidia_pytriton.libs").mkdir()
    server = prefix / "bin" / "tritonserver"
    server.write_text('#!/bin/sh\necho "fake: LD_LIBRARY_PATH=$LD_LIBRARY_PATH"\necho "fake: $*"\nexit 3\n')
    server.chmod(0o755)
    if backends:
        (prefix / "backends").mkdir()
        if python_backend:
            (prefix / "backends" / "python").mkdir()
            (prefix / "backends" / "python" / "libtriton_python.so").write_bytes(b"")
    return server


def test_existing_install_missing_tritonserver(no_install_env, tmp_path, existing_install):
    missing = tmp_path / "bin" / "tritonserver"
    with pytest.raises(ServerUnavailable, match=r"tritonserver=: .*/bin/tritonserver does not exist"):
        LocalServer(tritonserver=missing, server_python=existing_install[1], quiet=True).start()
    no_install_env.setenv("TRITONSHM_TRITONSERVER", str(missing))
    with pytest.raises(ServerUnavailable, match=r"\$TRITONSHM_TRITONSERVER: .* does not exist"):
        LocalServer(server_python=existing_install[1], quiet=True).start()
    server = _fake_server(tmp_path / "x")
    server.chmod(0o644)
    with pytest.raises(ServerUnavailable, match="is not executable"):
        LocalServer(tritonserver=server, server_python=existing_install[1], quiet=True).start()


def test_existing_install_missing_backends(no_install_env, tmp_path, existing_install):
    server = _fake_server(tmp_path, backends=False)
    with pytest.raises(ServerUnavailable, match=r"no backends directory .*/pytriton/tritonserver/backends"):
        LocalServer(tritonserver=server, server_python=existing_install[1], quiet=True).start()
    with pytest.raises(ServerUnavailable, match=r"backend_directory=: no backends directory .*/nowhere"):
        LocalServer(tritonserver=server, server_python=existing_install[1], quiet=True,
                    backend_directory=tmp_path / "nowhere").start()


def test_existing_install_server_python_needs_numpy_below_2(no_install_env, tmp_path, existing_install):
    server = existing_install[0]
    if int(np.__version__.split(".")[0]) < 2:
        pytest.skip("this interpreter has numpy < 2")
    with pytest.raises(ServerUnavailable, match=r"server_python=: .* has numpy 2\..*numpy < 2"):
        LocalServer(tritonserver=server, server_python=sys.executable, quiet=True).start()
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    with pytest.raises(ServerUnavailable, match=r"cannot import numpy .*numpy < 2"):
        LocalServer(tritonserver=server, server_python=bare / "bin" / "python3", quiet=True).start()
    with pytest.raises(ServerUnavailable, match="does not exist"):
        LocalServer(tritonserver=server, server_python=tmp_path / "python3", quiet=True).start()
    # The Python backend runs the python3 of server_python's directory, whatever it is called.
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "mypython").symlink_to(existing_install[1])
    with pytest.raises(ServerUnavailable, match=r"python3 first on the server's PATH"):
        LocalServer(tritonserver=server, server_python=tmp_path / "bin" / "mypython", quiet=True).start()


def test_existing_install_wheel_layout_gets_its_stub(no_install_env, tmp_path, existing_install):
    python = existing_install[1]
    version = _python_version(python)
    server = _fake_server(tmp_path)
    prefix = server.parent.parent
    stub = prefix / "backends" / "python" / "triton_python_backend_stub"
    srv = LocalServer(tritonserver=server, server_python=python, quiet=True)
    with pytest.raises(ServerUnavailable, match=r"no stub: .*triton_python_backend_stub is missing .*"
                                                 r"there is no .*/python_backend_stubs"):
        srv.start()  # an NGC-like layout: nothing to take a stub from
    (prefix / "python_backend_stubs" / "3.99").mkdir(parents=True)
    with pytest.raises(ServerUnavailable, match=rf"no stub for Python {version} \(.*stubs has 3\.99\)"):
        srv.start()
    (prefix / "python_backend_stubs" / version).mkdir()
    fake_stub = b"\x7fELF libpython%s.so.1.0" % version.encode()  # what _stub_python_version reads
    (prefix / "python_backend_stubs" / version / stub.name).write_bytes(fake_stub)
    with pytest.raises(ServerUnavailable, match="exited with code 3") as info:
        srv.start()  # installs the stub, then runs the fake server
    assert os.access(stub, os.X_OK)
    libs = [str(prefix.parent.parent / "nvidia_pytriton.libs")]
    assert f"fake: LD_LIBRARY_PATH={libs[0]}" in str(info.value)
    assert f"--backend-directory={prefix / 'backends'}" in str(info.value)
    # A stub built for another Python is not replaced: that Python is refused.
    stub.write_bytes(b"\x7fELF libpython3.99.so.1.0")
    with pytest.raises(ServerUnavailable, match=rf"is Python {version}, but .* built for Python 3\.99"):
        srv.start()


def test_existing_install_without_a_python_backend_needs_no_python(no_install_env, tmp_path):
    server = _fake_server(tmp_path, python_backend=False)
    no_install_env.setenv("PATH", "/nonexistent")  # no python3 to find: none is needed
    with pytest.raises(ServerUnavailable, match="exited with code 3"):
        LocalServer(tritonserver=server, quiet=True).start()


def test_backend_directory_alone_is_an_error(no_install_env, tmp_path):
    with pytest.raises(ValueError, match="backend_directory= goes with an existing Triton install"):
        LocalServer(backend_directory=tmp_path)


def test_server_python_alone_is_the_python_of_our_install(no_install_env, existing_install):
    """Without tritonserver=, server_python= makes our own environment (see test_install.py)."""
    assert LocalServer(server_python=existing_install[1]).server_python == existing_install[1]
    no_install_env.setenv("TRITONSHM_SERVER_PYTHON", existing_install[1])
    srv = LocalServer()
    assert (srv.tritonserver, srv.server_python) == (None, existing_install[1])


# -- no server here: skip with the reason, or fail where one is required ------------


@pytest.fixture
def server_optional(no_install_env):
    """As where a server is not required (TRITONSHM_REQUIRE_SERVER unset)."""
    no_install_env.delenv("TRITONSHM_REQUIRE_SERVER", raising=False)
    return no_install_env


@pytest.mark.server
def test_no_package_index_skips_with_the_reason(server_optional, tmp_path):
    server_optional.setenv("TRITONSHM_SERVER_HOME", str(tmp_path / "home"))
    # No index, no find-links, no pip configuration: pip cannot find the wheel.
    server_optional.setenv("PIP_CONFIG_FILE", os.devnull)
    server_optional.setenv("PIP_NO_INDEX", "1")
    server_optional.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(ServerInstallError, match=r"(?s)while running pip install .*found no matching wheel.*"
                                                 r"\n  pip download --no-deps nvidia-pytriton==0\.7\.0 .*"
                                                 r"--install-from DIR"):
        LocalServer(quiet=True).start()
    with pytest.raises(pytest.skip.Exception) as info:
        start_or_skip(LocalServer(quiet=True))
    reason = str(info.value)
    assert "\n" not in reason  # one line: the first of the error's message
    assert reason.startswith("no local Triton server (installing the local Triton server failed "
                             "while running pip install (exit code 1)")
    assert "TRITONSHM_REQUIRE_SERVER=1" in reason
    assert not (tmp_path / "home" / "venv" / "tritonshm-installed.json").exists()


def test_unusable_existing_install_skips_unless_a_server_is_required(server_optional, tmp_path):
    missing = tmp_path / "bin" / "tritonserver"
    server_optional.setenv("TRITONSHM_TRITONSERVER", str(missing))
    with pytest.raises(pytest.skip.Exception, match=r"\$TRITONSHM_TRITONSERVER: .*/bin/tritonserver does not exist"):
        start_or_skip(LocalServer(quiet=True))
    server_optional.setenv("TRITONSHM_REQUIRE_SERVER", "1")
    with pytest.raises(ServerInstallError, match="does not exist"):
        start_or_skip(LocalServer(quiet=True))


def test_a_server_that_ran_and_failed_is_not_skipped(server_optional, tmp_path):
    # The executable ran (and exited 3): not an install problem, so a test must fail, not skip.
    server = _fake_server(tmp_path, python_backend=False)
    with pytest.raises(ServerUnavailable, match="exited with code 3") as info:
        start_or_skip(LocalServer(tritonserver=server, quiet=True))
    assert not isinstance(info.value, ServerInstallError)


def test_an_executable_the_loader_refuses_is_an_install_error(server_optional, tmp_path):
    server = _fake_server(tmp_path, python_backend=False)
    server.write_text("#!/bin/sh\n"
                      "echo \"$0: error while loading shared libraries: libfoo.so.1: cannot open shared "
                      "object file: No such file or directory\" >&2\n"
                      "exit 127\n")
    with pytest.raises(pytest.skip.Exception, match="exited with code 127"):
        start_or_skip(LocalServer(tritonserver=server, quiet=True))
