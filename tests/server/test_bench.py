"""``tritonshm bench``: the harness against the session's server, tiny sizes, few repetitions."""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
import sys

import numpy as np
import pytest

import tritonshm
from tritonshm import bench
from tritonshm.bench import _gpu, _harness, _methods, _stream
from tritonshm.server import LocalServer, bundled_model_repository
from triton_fixtures import start_or_skip

TSC_INSTALLED = importlib.util.find_spec("triton_shm_client") is not None
STAT_KEYS = {"status", "samples_s", "median_s", "p10_s", "p25_s", "p75_s", "p90_s", "iqr_s", "min_s", "max_s",
             "vs_best_peer", "vs_limit"}


#: What bench.run and its twins say of 127.0.0.1:1, where nothing listens.
UNREACHABLE = (r"asking the server at 127\.0\.0\.1:1 \(gRPC\) for its version: cannot reach the Triton server\. .*"
               r"is a Triton server running at 127\.0\.0\.1:1\?")


def bench_cmd(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "tritonshm", "bench", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def results(server):
    """One run of every method, two sizes, three repetitions, through JSON and back."""
    out = bench.run(server.grpc_url, [4096, 64 << 10], reps=3, warmup=1, http_url=server.http_url)
    return json.loads(json.dumps(out))


def test_results_hold_the_metadata_of_the_run(results, server):
    assert results["format"] == bench.FORMAT
    meta = results["meta"]
    assert meta["sizes"] == [4096, 64 << 10] and meta["reps"] == [3, 3]
    assert meta["model"] == "identity_fp32" and meta["datatype"] == "FP32"
    assert meta["server_version"] and meta["url"] == server.grpc_url and meta["http_url"] == server.http_url
    assert meta["cpu_count"] >= 1
    assert meta["tritonshm_version"] == tritonshm.__version__
    assert list(meta["methods"]) == [m.name for m in bench.METHODS]
    assert meta["peers"] == ["grpc", "http", "tc-shm", "triton-shm-client"]
    assert meta["limits"] == {"limit": "floor + memcpy", "limit-http": "floor-http + memcpy"}
    assert meta["against_limit"] == {"Client.infer": "limit", "Client.infer-http": "limit-http",
                                     "tritonshm.grpc": "limit", "tritonshm.http": "limit-http",
                                     "zero-copy": "limit", "zero-copy-http": "limit-http"}


def test_every_method_has_samples_median_spread_and_ratios(results):
    for entry in results["results"]:
        assert entry["reps"] == 3 and entry["elements"] == entry["nbytes"] // 4
        methods = entry["methods"]
        assert list(methods) == [m.name for m in bench.METHODS] + ["limit", "limit-http"]
        for name, res in methods.items():
            if name == "triton-shm-client" and not TSC_INSTALLED:
                assert res == {"status": "not installed", "samples_s": []}
                continue
            assert set(res) >= STAT_KEYS, name
            assert res["status"] == "ok" and len(res["samples_s"]) == 3, name
            assert all(s > 0 for s in res["samples_s"]), name
            assert res["p10_s"] <= res["p25_s"] <= res["median_s"] <= res["p75_s"] <= res["p90_s"], name
            assert res["median_s"] == pytest.approx(float(np.median(res["samples_s"])))
            assert res["vs_best_peer"] > 0
            assert (res["vs_limit"] is not None) == (
                name in ("Client.infer", "Client.infer-http", "tritonshm.grpc", "tritonshm.http", "zero-copy",
                         "zero-copy-http")), name
        peers = {p: methods[p]["median_s"] for p in ("grpc", "http", "tc-shm", "triton-shm-client")
                 if methods[p]["status"] == "ok"}
        assert entry["best_peer"] == min(peers, key=peers.get)
        assert methods[entry["best_peer"]]["vs_best_peer"] == 1.0
        # each limit is its protocol's floor + memcpy, repetition by repetition
        for limit, floor in (("limit", "floor"), ("limit-http", "floor-http")):
            pairs = zip(methods[floor]["samples_s"], methods["memcpy"]["samples_s"])
            assert methods[limit]["samples_s"] == pytest.approx([f + m for f, m in pairs])
        # ... and each tritonshm row is held to its own protocol's
        for name, limit in (("zero-copy", "limit"), ("zero-copy-http", "limit-http"), ("tritonshm.http", "limit-http")):
            assert methods[name]["vs_limit"] == pytest.approx(methods[name]["median_s"] / methods[limit]["median_s"])


def test_the_table_shows_every_method_and_size(results):
    table = bench.format_table(results)
    for name in [m.name for m in bench.METHODS] + ["limit = floor+memcpy", "limit-http = floor-http+memcpy"]:
        assert name in table
    assert "4 KiB" in table and "64 KiB" in table
    if not TSC_INSTALLED:
        assert "not installed (pip install triton-shm-client)" in table


class Corrupting(_methods.ClientInfer):
    """Client.infer, but one element of the output is off."""

    name = "corrupting"

    def call(self, x):
        out = super().call(x)
        out[-1] += 1
        return out


class Stale(_methods.Memcpy):
    """Right the first time, then the same answer whatever the input."""

    name = "stale"

    def call(self, x):
        if not hasattr(self, "first"):
            self.first = super().call(x).copy()
        return self.first


class WrongShape(_methods.Memcpy):
    name = "wrong-shape"

    def call(self, x):
        return super().call(x)[:-1]


@pytest.mark.parametrize("broken, message", [
    (Corrupting, r"corrupting, 4 KiB: the identity model's output differs from its input at 1 of 1024 elements, "
                 r"first at \[1023\]"),
    (Stale, r"stale, 4 KiB: .* differs"),
    (WrongShape, r"wrong-shape, 4 KiB: the output is float32 \[1023\], not float32 \[1024\]"),
])
def test_a_method_that_returns_wrong_data_fails_the_run(server, broken, message):
    with pytest.raises(bench.WrongOutput, match=message):
        bench.run(server.grpc_url, [4096], reps=2, warmup=1,
                  methods=[_methods.Grpc, broken, _methods.ZeroCopy, _methods.Floor])
    # (the leak check of conftest.py sees that every method was closed)


def test_uint8_and_a_subset_of_methods(server):
    out = bench.run(server.grpc_url, [1000], dtype="uint8", reps=2, warmup=1,
                    methods=[_methods.TritonclientShm, _methods.ZeroCopy])
    entry = out["results"][0]
    assert out["meta"]["model"] == "identity_uint8" and entry["elements"] == 1000
    assert list(entry["methods"]) == ["tc-shm", "zero-copy"]  # no limit without floor and memcpy
    assert entry["best_peer"] == "tc-shm" and entry["methods"]["zero-copy"]["vs_limit"] is None


def test_arguments_are_checked_before_anything_runs():
    with pytest.raises(ValueError, match="multiple of FP32's 4 bytes"):
        bench.run("127.0.0.1:1", [4097])
    with pytest.raises(ValueError, match="warmup"):
        bench.run("127.0.0.1:1", [4096], warmup=0)
    with pytest.raises(ValueError, match="dtype"):
        bench.run("127.0.0.1:1", [4096], dtype="fp64")
    with pytest.raises(ValueError, match="budget"):
        bench.run("127.0.0.1:1", [4096], budget=-1)


def test_an_unreachable_server_is_one_clear_error():
    with pytest.raises(tritonshm.Error, match=UNREACHABLE):
        bench.run("127.0.0.1:1", [4096], reps=1)


@pytest.mark.parametrize("text, nbytes", [("4K", 4096), ("4KiB", 4096), ("64k", 65536), ("1M", 1 << 20),
                                          ("16MiB", 16 << 20), ("1G", 1 << 30), ("4096", 4096), ("100b", 100)])
def test_parse_size(text, nbytes):
    assert bench.parse_size(text) == nbytes


@pytest.mark.parametrize("text", ["", "4X", "-4K", "0", "1.5M", "K"])
def test_parse_size_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError):
        bench.parse_size(text)


def test_help_documents_every_flag_and_list_methods_every_method():
    done = bench_cmd("--help")
    assert done.returncode == 0
    for flag in ("--url", "--http-url", "--sizes", "--dtype", "--reps", "--budget", "--min-reps", "--max-reps",
                 "--warmup", "--methods", "--list-methods", "--json", "--plot"):
        assert flag in done.stdout
    listed = bench_cmd("--list-methods")
    assert listed.returncode == 0 and not listed.stderr
    for method in [m.name for m in bench.METHODS] + ["limit", "limit-http"]:
        assert f"\n  {method} " in listed.stdout, method


def test_command_prints_the_table_and_writes_json(server, tmp_path):
    path = tmp_path / "bench.json"
    done = bench_cmd("--url", server.grpc_url, "--sizes", "4K,8K", "--reps", "2", "--warmup", "1",
                     "--json", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 KiB (1024 x FP32), 2 repetitions" in done.stdout
    assert "zero-copy" in done.stdout and "limit = floor+memcpy" in done.stdout
    written = json.loads(path.read_text())
    assert written["meta"]["sizes"] == [4096, 8192] and written["meta"]["server"] == "given"


def test_json_to_stdout_moves_the_table_to_stderr(server):
    done = bench_cmd("--url", server.grpc_url, "--sizes", "4K", "--reps", "1", "--warmup", "1",
                     "--methods", "grpc", "floor", "memcpy", "--json", "-")
    assert done.returncode == 0, done.stderr
    assert list(json.loads(done.stdout)["results"][0]["methods"]) == ["grpc", "floor", "memcpy", "limit"]
    assert "limit = floor+memcpy" in done.stderr


def test_plot_needs_matplotlib(server, tmp_path):
    path = tmp_path / "bench.png"
    done = bench_cmd("--url", server.grpc_url, "--sizes", "4K", "--reps", "1", "--warmup", "1",
                     "--methods", "grpc", "zero-copy", "--plot", str(path))
    if importlib.util.find_spec("matplotlib") is None:
        # refused at once, in one line, before measuring anything
        assert done.returncode == 2 and not done.stdout
        assert done.stderr.strip().splitlines() == [
            "tritonshm bench: --plot needs matplotlib, which is not installed: pip install matplotlib"]
    else:
        assert done.returncode == 0, done.stderr
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_command_refuses_bad_arguments_without_starting_a_server():
    done = bench_cmd("--sizes", "4097", "--dtype", "fp32")
    assert done.returncode == 2 and "multiple of FP32's 4 bytes" in done.stderr
    assert "starting" not in done.stderr
    done = bench_cmd("--sizes", "4X")
    assert done.returncode == 2 and "not a size" in done.stderr


# -- a method that cannot run here ------------------------------------------------------------------


class Missing(_methods.Memcpy):
    """A method whose open() finds an API missing."""

    name = "missing-api"

    def open(self):
        self.opened = True
        raise bench.Unavailable("needs an API this tritonshm lacks")


def test_without_an_http_address_the_http_methods_sit_out_and_say_why(server):
    http_methods = [m for m in bench.METHODS if m.name in ("http", "Client.infer-http", "tritonshm.http",
                                                           "zero-copy-http")]
    out = bench.run(server.grpc_url, [4096], reps=2, warmup=1, methods=[_methods.Grpc, *http_methods])
    methods = out["results"][0]["methods"]
    assert methods["grpc"]["status"] == "ok"
    for m in http_methods:
        assert "--http-url" in methods[m.name]["status"] and methods[m.name]["samples_s"] == []


def test_the_tritonclient_api_rows_are_the_plain_rows_code_through_the_facade_slots(server):
    """tritonshm.grpc / tritonshm.http: tritonclient's calls, the facade's clients, and the tensors
    in its slot pools (a call that fell back to the wire would measure plain tritonclient)."""
    rows = {m.name: m for m in bench.METHODS}
    assert rows["tritonshm.grpc"].group == rows["tritonshm.http"].group == "tritonshm"
    assert "tritonclient API via tritonshm" in rows["tritonshm.grpc"].description
    # 256 KiB: over gRPC the facade sends inputs under 128 KiB inline, as tritonclient does (no slots)
    count = 256 << 10 >> 2
    setting = _methods.Setting(url=server.grpc_url, model="identity_fp32", datatype="FP32",
                               dtype=np.dtype(np.float32), count=count, http_url=server.http_url)
    for name, module in (("tritonshm.grpc", "tritonshm.grpc"), ("tritonshm.http", "tritonshm.http")):
        method = rows[name](setting)
        method.open()
        try:
            assert type(method.client).__module__ == module
            x = np.arange(count, dtype=np.float32)
            np.testing.assert_array_equal(method.call(x), x)
            assert [pool.model for pool in method.client.tritonshm.pools()] == ["identity_fp32"], name
        finally:
            method.close()
        assert method.client.tritonshm is None  # closed: the slots are released


def test_a_method_unavailable_at_open_is_reported_and_the_others_run(server):
    out = bench.run(server.grpc_url, [4096], reps=2, warmup=1, methods=[_methods.Grpc, Missing, _methods.Floor])
    methods = out["results"][0]["methods"]
    assert methods["missing-api"] == {"status": "needs an API this tritonshm lacks", "samples_s": []}
    assert methods["grpc"]["status"] == "ok" and methods["floor"]["status"] == "ok"
    assert len(methods["grpc"]["samples_s"]) == 2


# -- bench --gpu, what can be checked without a GPU -----------------------------------------------

GPU_NAMES = ["grpc", "tc-shm", "tc-cuda", "Client.infer", "Client.infer out=", "Client.infer copies",
             "Client.infer copy=False", "zero-copy", "floor"]


def test_gpu_methods_and_models():
    assert [m.name for m in bench.GPU_METHODS] == GPU_NAMES
    assert {m.name: m.group for m in bench.GPU_METHODS} == {
        "grpc": "peer", "tc-shm": "peer", "tc-cuda": "peer", "Client.infer": "tritonshm",
        "Client.infer out=": "tritonshm", "Client.infer copies": "tritonshm",
        "Client.infer copy=False": "tritonshm", "zero-copy": "tritonshm",
        "floor": "reference"}
    assert bench.GPU_SIZES == (64 << 10, 1 << 20, 16 << 20, 64 << 20)
    repo = bench.gpu_model_repository()
    config = (repo / "identity_fp32_gpu" / "config.pbtxt").read_text()
    for line in ('name: "identity_fp32_gpu"', "kind: KIND_GPU", "gpus: [ 0 ]", '"FORCE_CPU_ONLY_INPUT_TENSORS"',
                 'string_value: "no"', "max_batch_size: 0", "TYPE_FP32", "dims: [ -1 ]"):
        assert line in config
    assert (repo / "identity_fp32_gpu" / "1" / "model.py").is_file()
    # not in the default repository: a server without a GPU (or torch) would not start with it
    assert not (bundled_model_repository() / "identity_fp32_gpu").exists()


@pytest.mark.skipif(_gpu.gpu_missing() is None, reason="CUDA and torch are here")
def test_gpu_without_cuda_is_one_clear_line():
    done = bench_cmd("--gpu", "--sizes", "64K", "--reps", "1")
    assert done.returncode == 2 and not done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("tritonshm bench: --gpu needs a CUDA GPU and torch with CUDA: ")
    if importlib.util.find_spec("torch") is None:
        assert "torch is not installed (pip install torch)" in lines[0]
    assert "starting" not in done.stderr
    with pytest.raises(tritonshm.Error, match="--gpu needs a CUDA GPU"):
        bench.run_gpu("127.0.0.1:1", [64 << 10], reps=1)


@pytest.mark.parametrize("args, message", [
    (["--gpu", "--dtype", "uint8"], "--gpu measures FP32 only"),
    (["--gpu", "--methods", "memcpy"], "--methods memcpy: not a --gpu method"),
    (["--gpu", "--methods", "triton-shm-client", "floor"], "--methods triton-shm-client: not a --gpu method"),
    (["--methods", "tc-cuda"], "--methods tc-cuda: only with --gpu"),
    (["--gpu", "--plot", "x.png"], "--plot is not available with --gpu"),
    (["--gpu", "--sizes", "6"], "multiple of FP32's 4 bytes"),
    (["--gpu", "--warmup", "0"], "warmup must be at least 1"),
])
def test_gpu_arguments_are_checked_first(args, message):
    done = bench_cmd(*args)
    assert done.returncode == 2 and not done.stdout
    assert done.stderr.strip().splitlines() == [f"tritonshm bench: {done.stderr.strip().split(': ', 1)[1]}"]
    assert message in done.stderr and "starting" not in done.stderr


def test_help_documents_gpu():
    done = bench_cmd("--help")
    assert done.returncode == 0
    assert "--gpu" in done.stdout and "identity_fp32_gpu" in done.stdout
    listed = bench_cmd("--list-methods").stdout
    gpu_part = listed[listed.index("With --gpu"):listed.index("With --stream")]
    for method in GPU_NAMES:
        assert f"\n  {method} " in gpu_part, method


@pytest.mark.server
def test_gpu_model_fails_to_load_without_taking_the_server_down(tmp_path):
    """The server bench --gpu starts: the GPU model is loaded after the start; where it cannot be
    (no GPU, no torch in the server's Python), the load fails with Triton's reason, the server stays up."""
    import tritonclient.grpc as grpcclient

    with start_or_skip(LocalServer(extra_args=bench.server_arguments(), quiet=True)) as srv:
        why = _gpu.load_gpu_model(srv.grpc_url)
        client = grpcclient.InferenceServerClient(srv.grpc_url)
        try:
            # (live, not "ready": with --strict-readiness a model that failed to load makes the server unready)
            assert client.is_server_live() and client.is_model_ready("identity_fp32")
            if why is None:  # a GPU, and torch in the server's Python
                assert client.is_model_ready("identity_fp32_gpu")
            else:
                assert why.startswith("the server could not load identity_fp32_gpu: ") and "\n" not in why
                assert not client.is_model_ready("identity_fp32_gpu")
                if not tritonshm.cuda.available():
                    assert "unsupported gpu id 0" in why
        finally:
            client.close()


def _fake_gpu_results(medians_ms: dict, sizes=(64 << 10, 16 << 20)) -> dict:
    """bench --gpu's results with the given median per (model, method), every size alike."""
    results = []
    for nbytes in sizes:
        models = {}
        for model, per in medians_ms.items():
            methods = {name: (_harness.summarize([ms / 1e3] * 3) if ms is not None
                              else {"status": "not there", "samples_s": []}) for name, ms in per.items()}
            models[model] = {"best_peer": _gpu._model_ratios(methods), "methods": methods}
        results.append({"nbytes": nbytes, "elements": nbytes // 4, "reps": 3, "seconds": 1.0, "models": models})
    meta = {"datatype": "FP32", "device": "cuda:0", "gpu": "Fake GPU", "server": "given", "server_version": "2.51.0",
            "url": "127.0.0.1:1", "tritonshm_version": tritonshm.__version__, "torch": "x", "cuda_runtime": "12.6",
            "cuda_driver": "13.0", "peers": ["grpc", "tc-shm", "tc-cuda"],
            "models": {"identity_fp32_gpu": {"where": "GPU", "status": "ok"},
                       "identity_fp32": {"where": "CPU", "status": "ok"}}}
    return {"format": bench.GPU_FORMAT, "meta": meta, "results": results, "targets": _gpu.targets(results)}


def test_gpu_ratios_targets_and_table():
    gpu = {"grpc": 10.0, "tc-shm": 4.0, "tc-cuda": 3.0, "Client.infer": 1.15, "Client.infer out=": 1.1,
           "Client.infer copies": 2.0, "Client.infer copy=False": 1.08, "zero-copy": 1.05, "floor": 1.0}
    cpu = {"grpc": 12.0, "tc-shm": 5.0, "tc-cuda": 6.0, "Client.infer": None, "Client.infer out=": 3.5,
           "Client.infer copies": 7.0, "Client.infer copy=False": 3.4, "zero-copy": 4.0, "floor": 3.0}
    out = json.loads(json.dumps(_fake_gpu_results({"identity_fp32_gpu": gpu, "identity_fp32": cpu})))
    block = out["results"][1]["models"]["identity_fp32_gpu"]
    assert block["best_peer"] == "tc-cuda"
    assert block["methods"]["Client.infer"]["vs_best_peer"] == pytest.approx(1.15 / 3.0)
    assert block["methods"]["zero-copy"]["vs_floor"] == pytest.approx(1.05)
    assert out["results"][1]["models"]["identity_fp32"]["best_peer"] == "tc-shm"
    targets = {t["name"]: t for t in out["targets"]}
    assert len(targets) == len(_gpu.TARGETS)  # one name each
    assert targets["zero-copy within 1.1x the floor's time at 16 MiB"]["value"] == pytest.approx(1 / 1.05)
    assert targets["zero-copy within 1.1x the floor's time at 16 MiB"]["met"] is True
    assert targets["Client.infer >= 1.5x tc-cuda"]["value"] == pytest.approx(3.0 / 1.15)
    assert targets["Client.infer within 1.2x the floor's time at 64 KiB"]["met"] is True
    assert targets["Client.infer never slower than grpc"]["met"] is True
    table = bench.format_gpu_table(out)
    for name in GPU_NAMES:
        assert name in table
    assert "identity_fp32_gpu (GPU), best peer: tc-cuda" in table
    assert "identity_fp32 (CPU), best peer: tc-shm" in table
    assert "Client.infer   not there" in table
    assert "64 KiB (16384 x FP32), 3 repetitions" in table and "16 MiB" in table
    assert "MISSED" not in table and len(re.findall(r" met$", table, re.MULTILINE)) == len(_gpu.TARGETS)

    slow = dict(gpu, **{"Client.infer": 2.5, "zero-copy": 20.0})
    missed = {t["name"]: t for t in _fake_gpu_results({"identity_fp32_gpu": slow})["targets"]}
    assert [t["met"] for t in missed.values()] == [False, False, False, True, False, False, False]
    partial = _fake_gpu_results({"identity_fp32": cpu}, sizes=(1 << 20,))
    assert all(t["met"] is None for t in partial["targets"])
    assert "not measured in this run" in bench.format_gpu_table(partial)


# -- bench --gpu on a GPU -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpu_server():
    """A server as bench --gpu starts it: the GPU model's repository too, models loaded explicitly."""
    with start_or_skip(LocalServer(extra_args=bench.server_arguments(), quiet=True)) as srv:
        yield srv


@pytest.mark.gpu
def test_gpu_bench_runs_every_method_on_both_models(gpu, gpu_server):
    if _gpu.gpu_missing():
        pytest.skip(_gpu.gpu_missing())
    out = json.loads(json.dumps(bench.run_gpu(gpu_server.grpc_url, [64 << 10], reps=2, warmup=1)))
    assert out["format"] == bench.GPU_FORMAT
    assert list(out["meta"]["methods"]) == GPU_NAMES
    entry = out["results"][0]
    assert entry["reps"] == 2 and entry["elements"] == (64 << 10) // 4
    models = out["meta"]["models"]
    assert models["identity_fp32"]["status"] == "ok"
    ran = [m for m in ("identity_fp32_gpu", "identity_fp32") if models[m]["status"] == "ok"]
    assert list(entry["models"]) == ran
    for model in ran:
        methods = entry["models"][model]["methods"]
        assert list(methods) == GPU_NAMES
        for name, res in methods.items():
            # every method ran and its outputs were checked (a wrong one raises WrongOutput)
            assert res["status"] == "ok", (model, name, res["status"])
            assert len(res["samples_s"]) == 2 and res["vs_floor"] > 0 and res["vs_best_peer"] > 0
    table = bench.format_gpu_table(out)
    for name in GPU_NAMES:
        assert name in table
    if models["identity_fp32_gpu"]["status"] != "ok":
        pytest.skip(f"only the CPU model's half ran: {models['identity_fp32_gpu']['status']}")
    # only 64 KiB ran: the targets of that size are judged, the others not
    assert [t["met"] is not None for t in out["targets"]] == [size == 64 << 10 for _, _, size, *_ in _gpu.TARGETS]


@pytest.mark.gpu
def test_gpu_bench_command(gpu, tmp_path):
    if _gpu.gpu_missing():
        pytest.skip(_gpu.gpu_missing())
    path = tmp_path / "gpu.json"
    done = bench_cmd("--gpu", "--sizes", "64K", "--reps", "2", "--warmup", "1", "--json", str(path), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "64 KiB (16384 x FP32), 2 repetitions" in done.stdout
    assert "identity_fp32 (CPU)" in done.stdout and "targets" in done.stdout
    written = json.loads(path.read_text())
    assert written["format"] == bench.GPU_FORMAT and written["meta"]["server"] == "started"


def test_gpu_client_infer_runs_on_cuda_slots_only(monkeypatch):
    """bench --gpu's Client.infer asks for transport='cuda' (a refused registration raises, never a
    silent fallback) and its rows are refused unless every pool it used is cuda:N memory (and, for
    the lending rows, unless they lent)."""
    from types import SimpleNamespace

    from tritonshm.client import PoolInfo
    from tritonshm.client._lent import LentStats

    made = {}

    class Recorder:
        def __init__(self, url, **kwargs):
            made.update(kwargs, url=url)

    monkeypatch.setattr("tritonshm.client.Client", Recorder)
    method = object.__new__(_gpu.GpuClientInfer)
    method.setting = _gpu.GpuSetting.of("127.0.0.1:1", _gpu.GPU_MODEL, 16)
    method.open()
    assert made == {"url": "127.0.0.1:1", "transport": "cuda", "by_reference": True}

    def pool(memory):
        return PoolInfo("m", "", memory, 4, 0, 0, 4096, 16384, ("r",))

    def check_rows(row, cases):
        """*row*'s verdict for each (pools' memories, stats, refused) case."""
        row.setting = method.setting
        for memories, stats, refused in cases:
            row.client = SimpleNamespace(pools=lambda memories=memories: [pool(m) for m in memories],
                                         stats=lambda stats=stats: stats)
            problem = row.memory_problem()
            assert (problem is not None) == refused, (type(row).__name__, memories, stats)
            if refused:
                assert "refusing to report" in problem

    lent = LentStats(inputs_lent=3)
    check_rows(method, [(["cuda:0"], lent, False), (["pinned:0"], lent, True), (["system"], lent, True),
                        (["cuda:0", "pinned:0"], lent, True), ([], lent, True),
                        (["cuda:0"], LentStats(inputs_lent=2, copied={"not shareable": 1}), True),
                        (["cuda:0"], LentStats(), True)])
    copies = object.__new__(_gpu.GpuClientInferCopies)  # copies are its point: only the pools count
    copies.client = SimpleNamespace(pools=lambda: [pool("cuda:0")], stats=LentStats)
    assert copies.memory_problem() is None
    # zero-copy writes its input into the request's own device slot: nothing is lent by design,
    # so only its pools count (it refused its own row on an H200: "nothing lent")
    zero = object.__new__(_gpu.GpuZeroCopy)
    check_rows(zero, [(["cuda:0"], LentStats(), False), (["pinned:0"], LentStats(), True),
                      (["system"], LentStats(), True), ([], LentStats(), True)])
    made.clear()
    zero.open()
    assert made["transport"] == "cuda"  # still CUDA slots only, never a silent fallback
    # out= lends both ends: no pool at all (refused as "ran through no pool" on an H200); what it
    # must show is the lending, in and out, and any pool it made must still be CUDA slots
    both = LentStats(inputs_lent=3, outputs_lent=3)
    check_rows(object.__new__(_gpu.GpuClientInferOut),
               [([], both, False), (["cuda:0"], both, False), (["pinned:0"], both, True),
                ([], LentStats(inputs_lent=3), True), ([], LentStats(outputs_lent=3), True), ([], LentStats(), True)])


# -- bench --stream: the decoupled stream_fp32, tritonclient's streaming against Client.stream ----------

STREAM_NAMES = ["grpc-stream", "Client.stream"]
STREAM_RATIOS = ("ttft_vs_baseline", "total_vs_baseline", "responses_per_s_vs_baseline")


@pytest.fixture(scope="module")
def stream_results(server):
    """One --stream run, two sizes, four responses per request, three repetitions, through JSON and back."""
    out = bench.run_stream(server.grpc_url, [4096, 64 << 10], responses=4, reps=3, warmup=1)
    return json.loads(json.dumps(out))


def test_stream_results_hold_the_metadata_of_the_run(stream_results, server):
    assert stream_results["format"] == bench.STREAM_FORMAT == "tritonshm-bench-stream/1"
    meta = stream_results["meta"]
    assert meta["model"] == "stream_fp32" and meta["datatype"] == "FP32" and meta["responses"] == 4
    assert meta["sizes"] == [4096, 64 << 10] and meta["reps"] == [3, 3] and meta["warmup"] == 1
    assert meta["server_version"] and meta["url"] == server.grpc_url and meta["server"] == "given"
    assert meta["tritonshm_version"] == tritonshm.__version__
    assert meta["baseline"] == "grpc-stream"
    assert list(meta["methods"]) == STREAM_NAMES == [m.name for m in bench.STREAM_METHODS]
    assert {name: m["group"] for name, m in meta["methods"].items()} == {"grpc-stream": "peer",
                                                                         "Client.stream": "tritonshm"}
    assert all(m["status"] == "ok" for m in meta["methods"].values())


def test_stream_every_method_has_ttft_total_responses_per_s_and_ratios(stream_results):
    for entry in stream_results["results"]:
        assert entry["reps"] == 3 and entry["responses"] == 4 and entry["elements"] == entry["nbytes"] // 4
        methods = entry["methods"]
        assert list(methods) == STREAM_NAMES
        for name, res in methods.items():
            assert res["status"] == "ok", name
            for which in ("ttft", "total"):
                stats = res[which]
                assert set(stats) == STAT_KEYS - {"status", "vs_best_peer", "vs_limit"}, (name, which)
                assert len(stats["samples_s"]) == 3 and all(s > 0 for s in stats["samples_s"])
                assert stats["median_s"] == pytest.approx(float(np.median(stats["samples_s"])))
                assert stats["p25_s"] <= stats["median_s"] <= stats["p75_s"]
            # the first response comes before the final one, repetition by repetition
            assert all(f < t for f, t in zip(res["ttft"]["samples_s"], res["total"]["samples_s"])), name
            assert res["responses_per_s"] == pytest.approx(4 / res["total"]["median_s"])
        base = methods["grpc-stream"]
        assert [base[r] for r in STREAM_RATIOS] == [1.0, 1.0, 1.0]
        ours = methods["Client.stream"]
        assert ours["ttft_vs_baseline"] == pytest.approx(ours["ttft"]["median_s"] / base["ttft"]["median_s"])
        assert ours["total_vs_baseline"] == pytest.approx(ours["total"]["median_s"] / base["total"]["median_s"])
        assert ours["responses_per_s_vs_baseline"] == pytest.approx(1 / ours["total_vs_baseline"])


def test_stream_table_shows_every_method_and_size(stream_results):
    table = bench.format_stream_table(stream_results)
    assert table.startswith("stream_fp32 (FP32, decoupled), 4 responses per request; one request at a time")
    assert "4 KiB (1024 x FP32) in, 4 responses of 4 KiB out, 3 repetitions" in table
    assert "64 KiB (16384 x FP32) in, 4 responses of 64 KiB out, 3 repetitions" in table
    assert "ratios over grpc-stream" in table
    rows = [line.split() for line in table.splitlines() if line.startswith("  ") and "method" not in line]
    assert [row[0] for row in rows] == STREAM_NAMES * 2
    assert all(row[-3:] == ["1.00", "1.00", "1.00"] for row in rows[::2])  # the baseline over itself


class StreamCorrupting(_stream.ClientStream):
    """Client.stream, but one element of the third response's OUTPUT0 is off."""

    name = "stream-corrupting"

    def call(self, x):
        out = super().call(x)
        out[2] = dict(out[2], OUTPUT0=out[2]["OUTPUT0"].copy())  # (the arrays of a response are read-only)
        out[2]["OUTPUT0"][7] += 1
        return out


class StreamLosing(_stream.ClientStream):
    """Client.stream, but the last response goes missing."""

    name = "stream-losing"

    def call(self, x):
        out = super().call(x)
        del out[-1]
        return out


class StreamReordering(_stream.TritonclientStream):
    """tritonclient's stream, but the first two responses swapped."""

    name = "stream-reordering"

    def call(self, x):
        out = super().call(x)
        out[0], out[1] = out[1], out[0]
        return out


class StreamStale(_stream.ClientStream):
    """Right the first time, then the same responses whatever the input."""

    name = "stream-stale"

    def call(self, x):
        out = super().call(x)
        if not hasattr(self, "first"):
            self.first = out
        return self.first


@pytest.mark.parametrize("broken, message", [
    (StreamCorrupting, r"stream-corrupting, 4 KiB: response 2's OUTPUT0 differs from INPUT0 \+ 2 at 1 of 1024 "
                       r"elements, first at \[7\]: got .*, expected "),
    (StreamLosing, r"stream-losing, 4 KiB: 3 responses to one request, not 4 \(its COUNT\)"),
    (StreamReordering, r"stream-reordering, 4 KiB: response 0's INDEX is array\(\[1\], dtype=int32\), not \[0\]"),
    (StreamStale, r"stream-stale, 4 KiB: response 0's OUTPUT0 differs from INPUT0 \+ 0"),
])
def test_a_stream_method_with_a_wrong_response_fails_the_run(server, broken, message):
    with pytest.raises(bench.WrongOutput, match=message):
        bench.run_stream(server.grpc_url, [4096], responses=4, reps=2, warmup=1,
                         methods=[_stream.TritonclientStream, broken])
    # (the leak check of conftest.py sees that every method was closed, the slots unlinked)


class LateCorrupting(_stream.ClientStream):
    """Right in the warm-up, wrong from the third timed repetition on: the timed rounds are checked too."""

    name = "late-corrupting"
    calls = 0

    def call(self, x):
        out = super().call(x)
        self.calls += 1
        if self.calls >= 4:
            out[-1] = dict(out[-1], OUTPUT0=out[-1]["OUTPUT0"][:-1])
        return out


def test_stream_checks_every_repetition_not_only_warmup_and_probe(server):
    with pytest.raises(bench.WrongOutput, match=r"late-corrupting, 4 KiB: response 3's OUTPUT0 is float32 \[1023\], "
                                                r"not float32 \[1024\] like INPUT0 \+ 3"):
        bench.run_stream(server.grpc_url, [4096], responses=4, reps=5, warmup=1, methods=[LateCorrupting])


class PoolsRecording(_stream.ClientStream):
    """Client.stream, noting the client's pools before it closes."""

    seen: list = []

    def close(self):
        if getattr(self, "client", None) is not None:
            PoolsRecording.seen.append(self.client.pools())
        super().close()


def test_stream_inputs_go_through_a_slot_and_each_stream_stays_open(server, monkeypatch):
    """Client.stream's inputs travel in shared memory; tritonclient's stream is started once per size."""
    import tritonclient.grpc as grpcclient

    started = []
    original = grpcclient.InferenceServerClient.start_stream

    def start_stream(self, *args, **kwargs):
        started.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(grpcclient.InferenceServerClient, "start_stream", start_stream)
    PoolsRecording.seen = []
    out = bench.run_stream(server.grpc_url, [4096, 8192], responses=2, reps=4, warmup=1,
                           methods=[_stream.TritonclientStream, PoolsRecording])
    assert len(started) == 2  # one stream per size, for 1 warm-up + 4 timed + 1 probe requests each
    assert [[(p.model, p.memory, p.running) for p in pools] for pools in PoolsRecording.seen] == [
        [("stream_fp32", "system", 0)]] * 2
    assert [e["methods"]["Client.stream"]["status"] for e in out["results"]] == ["ok", "ok"]


def test_stream_baseline_left_out_gives_no_ratios(server):
    out = bench.run_stream(server.grpc_url, [4096], responses=1, reps=2, warmup=1, methods=[_stream.ClientStream])
    (entry,) = out["results"]
    res = entry["methods"]["Client.stream"]
    assert list(entry["methods"]) == ["Client.stream"] and res["status"] == "ok"
    assert [res[r] for r in STREAM_RATIOS] == [None, None, None]
    assert res["responses_per_s"] == pytest.approx(1 / res["total"]["median_s"])
    assert "Client.stream" in bench.format_stream_table(out)


def test_stream_arguments_are_checked_before_anything_runs():
    for responses in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="responses must be at least 1"):
            bench.run_stream("127.0.0.1:1", [4096], responses=responses)
    with pytest.raises(ValueError, match="multiple of FP32's 4 bytes"):
        bench.run_stream("127.0.0.1:1", [4098])
    with pytest.raises(tritonshm.Error, match=UNREACHABLE):
        bench.run_stream("127.0.0.1:1", [4096], reps=1)


def test_stream_command_prints_the_table_and_writes_json(server, tmp_path):
    path = tmp_path / "stream.json"
    done = bench_cmd("--stream", "--url", server.grpc_url, "--sizes", "4K,8K", "--responses", "3", "--reps", "2",
                     "--warmup", "1", "--json", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 KiB (1024 x FP32) in, 3 responses of 4 KiB out, 2 repetitions" in done.stdout
    assert "grpc-stream" in done.stdout and "Client.stream" in done.stdout
    assert "4 KiB: 2 repetitions in" in done.stderr and "every response checked" in done.stderr
    written = json.loads(path.read_text())
    assert written["format"] == bench.STREAM_FORMAT and written["meta"]["server"] == "given"
    assert written["meta"]["sizes"] == [4096, 8192] and written["meta"]["responses"] == 3


def test_stream_json_to_stdout_and_a_subset_of_methods(server):
    done = bench_cmd("--stream", "--url", server.grpc_url, "--sizes", "4K", "--responses", "2", "--reps", "1",
                     "--warmup", "1", "--methods", "Client.stream", "--json", "-")
    assert done.returncode == 0, done.stderr
    assert list(json.loads(done.stdout)["results"][0]["methods"]) == ["Client.stream"]
    assert "Client.stream" in done.stderr


@pytest.mark.parametrize("args, message", [
    (["--stream", "--gpu"], "--gpu and --stream do not go together"),
    (["--responses", "4"], "--responses: only with --stream"),
    (["--stream", "--dtype", "uint8"], "--stream measures FP32 only"),
    (["--stream", "--plot", "x.png"], "--plot is not available with --stream"),
    (["--stream", "--methods", "grpc", "Client.stream"], "--methods grpc: not a --stream method"),
    (["--methods", "Client.stream"], "--methods Client.stream: only with --stream"),
    (["--methods", "grpc-stream", "tc-cuda"], "--methods grpc-stream tc-cuda: only with --gpu or --stream"),
    (["--stream", "--responses", "0"], "responses must be at least 1"),
    (["--stream", "--sizes", "6"], "multiple of FP32's 4 bytes"),
    (["--stream", "--json", "/no/such/dir/x.json"], "--json /no/such/dir/x.json: no such directory"),
])
def test_stream_arguments_are_checked_first(args, message):
    done = bench_cmd(*args)
    assert done.returncode == 2 and not done.stdout
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert message in done.stderr and "starting" not in done.stderr


def test_help_documents_stream():
    done = bench_cmd("--help")
    assert done.returncode == 0
    assert "--stream" in done.stdout and "--responses" in done.stdout and "stream_fp32" in done.stdout
    listed = bench_cmd("--list-methods").stdout
    stream_part = listed[listed.index("With --stream"):listed.index("With --concurrency")]
    for method in STREAM_NAMES:
        assert f"\n  {method} " in stream_part, method


# -- bench --concurrency: N callers sharing one client ------------------------------------------------

from tritonshm.bench import _concurrency  # noqa: E402

CONC_NAMES = ["tc-grpc-threads", "tc-shm-threads", "Client-threads", "Client-http-threads", "tc-grpc-aio",
              "tc-http-aio", "Client-aio", "Client-http-aio"]


@pytest.fixture(scope="module")
def concurrency_results(server):
    """One --concurrency run, 3 callers, two sizes (one above the check-all limit), two short rounds."""
    out = bench.run_concurrency(server.grpc_url, [4096, 128 << 10], concurrency=3, duration=0.05, rounds=2,
                                warmup=1, http_url=server.http_url)
    return json.loads(json.dumps(out))


def test_concurrency_results_hold_the_metadata_and_every_method(concurrency_results, server):
    out = concurrency_results
    assert out["format"] == bench.CONCURRENCY_FORMAT == "tritonshm-bench-concurrency/1"
    meta = out["meta"]
    assert meta["model"] == "identity_fp32" and meta["concurrency"] == 3 and meta["rounds"] == 2
    assert meta["duration_s"] == 0.05 and meta["sizes"] == [4096, 128 << 10] and meta["url"] == server.grpc_url
    assert list(meta["methods"]) == CONC_NAMES == [m.name for m in bench.CONCURRENCY_METHODS]
    assert {n: (m["group"], m["mode"]) for n, m in meta["methods"].items()} == {
        "tc-grpc-threads": ("peer", "threads"), "tc-shm-threads": ("peer", "threads"),
        "Client-threads": ("tritonshm", "threads"), "Client-http-threads": ("tritonshm", "threads"),
        "tc-grpc-aio": ("peer", "asyncio"), "tc-http-aio": ("peer", "asyncio"), "Client-aio": ("tritonshm", "asyncio"),
        "Client-http-aio": ("tritonshm", "asyncio")}
    assert meta["pairs"] == {"threads": {"tritonshm": "Client-threads",
                                         "tritonclient": ["tc-grpc-threads", "tc-shm-threads"],
                                         "ours": ["Client-threads", "Client-http-threads"]},
                             "asyncio": {"tritonshm": "Client-aio", "tritonclient": ["tc-grpc-aio", "tc-http-aio"],
                                         "ours": ["Client-aio", "Client-http-aio"]}}
    for entry, stride in zip(out["results"], (1, _concurrency.CHECK_STRIDE)):
        assert entry["rounds"] == 2 and entry["checked_every"] == stride
        assert list(entry["methods"]) == CONC_NAMES
        for name, res in entry["methods"].items():
            assert res["status"] == "ok", name
            assert len(res["requests_per_s"]) == 2 and all(r > 0 for r in res["requests_per_s"])
            assert all(n >= 3 for n in res["requests"])  # every caller at least once
            assert res["median_requests_per_s"] == pytest.approx(float(np.median(res["requests_per_s"])))
            assert res["requests_per_s"] == pytest.approx([n / s for n, s in zip(res["requests"], res["seconds"])])
            if stride == 1:
                assert res["checked"] == res["requests"]
            else:
                assert all(0 < c < n for c, n in zip(res["checked"], res["requests"]))
        m = entry["methods"]
        threads, aio = entry["ratios"]["threads"], entry["ratios"]["asyncio"]
        best = max(("tc-grpc-threads", "tc-shm-threads"), key=lambda p: m[p]["median_requests_per_s"])
        assert threads["tritonclient"] == best and threads["tritonshm"] == "Client-threads"
        assert threads["ratio"] == pytest.approx(m["Client-threads"]["median_requests_per_s"]
                                                 / m[best]["median_requests_per_s"])
        best_aio = max(("tc-grpc-aio", "tc-http-aio"), key=lambda p: m[p]["median_requests_per_s"])
        assert aio["tritonclient"] == best_aio
        assert aio["ratio"] == pytest.approx(m["Client-aio"]["median_requests_per_s"]
                                             / m[best_aio]["median_requests_per_s"])
        assert threads["each"]["Client-threads"] == threads["ratio"]
        assert threads["each"]["Client-http-threads"] == pytest.approx(
            m["Client-http-threads"]["median_requests_per_s"] / m[best]["median_requests_per_s"])
        assert aio["each"]["Client-http-aio"] == pytest.approx(
            m["Client-http-aio"]["median_requests_per_s"] / m[best_aio]["median_requests_per_s"])


def test_concurrency_without_an_http_address_leaves_the_http_methods_out(server):
    out = bench.run_concurrency(server.grpc_url, [4096], concurrency=2, duration=0.05, rounds=1, warmup=1,
                                methods=[_concurrency.TcGrpcThreads, _concurrency.ClientHttpThreads])
    methods = out["results"][0]["methods"]
    assert methods["tc-grpc-threads"]["status"] == "ok"
    assert "--http-url" in methods["Client-http-threads"]["status"]


def test_concurrency_table_shows_every_method_and_size(concurrency_results):
    table = bench.format_concurrency_table(concurrency_results)
    assert table.startswith("identity_fp32 (FP32), 3 concurrent callers on one client")
    assert "4 KiB (1024 x FP32), 2 rounds; every output checked" in table
    assert "128 KiB (32768 x FP32), 2 rounds; contents of 1 output in 7 per caller checked" in table
    rows = [line.split() for line in table.splitlines() if line.startswith("  ") and "method" not in line]
    assert [row[0] for row in rows] == CONC_NAMES * 2


class ConcCrossing(_concurrency.ClientThreads):
    """Client-threads, but every answer to caller 1 is off (as an answer meant for another caller would be)."""

    name = "conc-crossing"

    def call(self, caller, x):
        out = super().call(caller, x)
        if caller == 1:
            return out + 1  # any answer other than its own input
        return out


class ConcCorruptingAio(_concurrency.ClientAio):
    """Client-aio, but one element off from the fifth call on (past the warm-up's first calls)."""

    name = "conc-corrupting-aio"
    calls = 0

    async def acall(self, caller, x):
        out = await super().acall(caller, x)
        self.calls += 1
        if self.calls >= 5:
            out = out.copy()
            out[9] += 1
        return out


class ConcWrongShape(_concurrency.TcGrpcThreads):
    name = "conc-wrong-shape"

    def call(self, caller, x):
        return super().call(caller, x)[:-1]


@pytest.mark.parametrize("broken, message", [
    (ConcCrossing, r"conc-crossing, 4 KiB: the identity model's output differs from its input at 1024 of 1024"),
    (ConcCorruptingAio, r"conc-corrupting-aio, 4 KiB: .* differs from its input at 1 of 1024 elements, first at \[9\]"),
    (ConcWrongShape, r"conc-wrong-shape, 4 KiB: the output is float32 \[1023\], not float32 \[1024\]"),
])
def test_a_concurrency_method_with_a_wrong_output_fails_the_run(server, broken, message):
    with pytest.raises(bench.WrongOutput, match=message):
        bench.run_concurrency(server.grpc_url, [4096], concurrency=2, duration=0.05, rounds=2, warmup=1,
                              methods=[_concurrency.TcGrpcThreads, broken])
    # (the leak check of conftest.py sees that every method was closed, the regions unlinked)


def test_concurrency_arguments_are_checked_before_anything_runs():
    for concurrency in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="concurrency must be at least 1"):
            bench.run_concurrency("127.0.0.1:1", [4096], concurrency=concurrency)
    with pytest.raises(ValueError, match="duration must be"):
        bench.run_concurrency("127.0.0.1:1", [4096], concurrency=2, duration=0)
    with pytest.raises(ValueError, match="rounds must be"):
        bench.run_concurrency("127.0.0.1:1", [4096], concurrency=2, rounds=0)
    with pytest.raises(ValueError, match="multiple of FP32's 4 bytes"):
        bench.run_concurrency("127.0.0.1:1", [4098], concurrency=2)
    with pytest.raises(tritonshm.Error, match=UNREACHABLE):
        bench.run_concurrency("127.0.0.1:1", [4096], concurrency=2)


def test_concurrency_command_prints_the_table_and_writes_json(server, tmp_path):
    path = tmp_path / "conc.json"
    done = bench_cmd("--concurrency", "2", "--url", server.grpc_url, "--sizes", "4K", "--duration", "0.05",
                     "--reps", "1", "--warmup", "1", "--methods", "tc-grpc-aio", "Client-aio", "--json", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 concurrent callers on one client" in done.stdout and "Client-aio" in done.stdout
    assert "4 KiB: 1 rounds in" in done.stderr
    written = json.loads(path.read_text())
    assert written["format"] == bench.CONCURRENCY_FORMAT and written["meta"]["server"] == "given"
    assert list(written["results"][0]["methods"]) == ["tc-grpc-aio", "Client-aio"]
    assert written["results"][0]["ratios"]["threads"]["ratio"] is None


@pytest.mark.parametrize("args, message", [
    (["--concurrency", "2", "--stream"], "--concurrency and --stream do not go together"),
    (["--concurrency", "2", "--gpu"], "--concurrency and --gpu do not go together"),
    (["--duration", "1"], "--duration: only with --concurrency"),
    (["--concurrency", "0"], "concurrency must be at least 1"),
    (["--concurrency", "2", "--duration", "0"], "duration must be a number of seconds > 0"),
    (["--concurrency", "2", "--dtype", "uint8"], "--concurrency measures FP32 only"),
    (["--concurrency", "2", "--plot", "x.png"], "--plot is not available with --concurrency"),
    (["--concurrency", "2", "--responses", "3"], "--responses: only with --stream"),
    (["--concurrency", "2", "--budget", "3"], "--budget: not with --concurrency"),
    (["--concurrency", "2", "--max-reps", "3"], "--max-reps: not with --concurrency"),
    (["--concurrency", "2", "--methods", "grpc"], "--methods grpc: not a --concurrency method"),
    (["--methods", "Client-aio"], "--methods Client-aio: only with --concurrency"),
    (["--concurrency", "2", "--sizes", "6"], "multiple of FP32's 4 bytes"),
    (["--concurrency", "2", "--json", "/no/such/dir/x.json"], "--json /no/such/dir/x.json: no such directory"),
])
def test_concurrency_arguments_are_checked_first(args, message):
    done = bench_cmd(*args)
    assert done.returncode == 2 and not done.stdout
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert message in done.stderr and "starting" not in done.stderr


def test_help_documents_concurrency():
    done = bench_cmd("--help")
    assert done.returncode == 0
    assert "--concurrency" in done.stdout and "--duration" in done.stdout
    listed = bench_cmd("--list-methods").stdout
    concurrency_part = listed[listed.index("With --concurrency"):]
    for method in CONC_NAMES:
        assert f"\n  {method} " in concurrency_part, method


def test_rounds_run_every_method_after_every_other_and_at_every_place():
    """round_order: a permutation per round, reproducible, with no method always after the same
    one (a rotation keeps each after one neighbour: what that one leaves behind -- on an H200,
    0.1-0.2 ms of the server's answer -- would fall on it every round)."""
    methods = [f"m{i}" for i in range(8)]
    rounds = [_harness.round_order(methods, index) for index in range(400)]
    assert all(sorted(order) == methods for order in rounds)
    assert _harness.round_order(methods, 7) == rounds[7]  # the same each run
    followed = {(a, b) for order in rounds for a, b in zip(order, order[1:])}
    assert followed == {(a, b) for a in methods for b in methods if a != b}
    places = {(order.index(m), m) for order in rounds for m in methods}
    assert len(places) == len(methods) ** 2
