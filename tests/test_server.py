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

from tritonshm.errors import ServerUnavailable
from tritonshm.server import LocalServer, bundled_model_repository, group_members
from triton_fixtures import NUMERIC_IDENTITY_MODELS

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
    assert len(MODELS) == 13
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


def test_missing_model_repository_raises(tmp_path):
    with pytest.raises(ServerUnavailable, match="model repository|failed to stat|no such"):
        LocalServer(tmp_path / "does-not-exist", quiet=True).start()


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


def test_server_stops_when_python_exits_without_stop():
    child, pids = _child(CHILD_PRELUDE + "# no stop(): the finalizer runs at exit\n")
    assert child.wait(timeout=60) == 0
    _assert_gone(pids, pids[0])  # at exit, not some time later


def test_server_dies_with_a_sigkilled_parent():
    child, pids = _child(CHILD_PRELUDE + "time.sleep(600)\n")
    child.send_signal(signal.SIGKILL)
    child.wait()
    # PR_SET_PDEATHSIG kills tritonserver at once; its stubs notice and exit by themselves.
    _wait_gone(pids, pids[0])


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


def test_server_module_needs_only_the_stdlib():
    tree = ast.parse(Path(sys.modules[LocalServer.__module__].__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            imported.add(node.module.split(".")[0] if node.module != "tritonshm.errors" else "tritonshm.errors")
    assert imported - set(sys.stdlib_module_names) == {"tritonshm.errors"}
