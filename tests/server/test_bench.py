"""``tritonshm bench``: the harness against the session's server, tiny sizes, few repetitions."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

import tritonshm
from tritonshm import bench
from tritonshm.bench import _methods

TSC_INSTALLED = importlib.util.find_spec("triton_shm_client") is not None
STAT_KEYS = {"status", "samples_s", "median_s", "p10_s", "p25_s", "p75_s", "p90_s", "iqr_s", "min_s", "max_s",
             "vs_best_peer", "vs_limit"}


def bench_cmd(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "tritonshm", "bench", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def results(server):
    """One run of every method, two sizes, three repetitions, through JSON and back."""
    out = bench.run(server.grpc_url, [4096, 64 << 10], reps=3, warmup=1)
    return json.loads(json.dumps(out))


def test_results_hold_the_metadata_of_the_run(results, server):
    assert results["format"] == bench.FORMAT
    meta = results["meta"]
    assert meta["sizes"] == [4096, 64 << 10] and meta["reps"] == [3, 3]
    assert meta["model"] == "identity_fp32" and meta["datatype"] == "FP32"
    assert meta["server_version"] and meta["url"] == server.grpc_url
    assert meta["cpu_count"] >= 1
    assert meta["tritonshm_version"] == tritonshm.__version__
    assert list(meta["methods"]) == [m.name for m in bench.METHODS]
    assert meta["peers"] == ["grpc", "tc-shm", "triton-shm-client"]


def test_every_method_has_samples_median_spread_and_ratios(results):
    for entry in results["results"]:
        assert entry["reps"] == 3 and entry["elements"] == entry["nbytes"] // 4
        methods = entry["methods"]
        assert list(methods) == [m.name for m in bench.METHODS] + ["limit"]
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
            assert (res["vs_limit"] is not None) == (name in ("Client.infer", "zero-copy")), name
        peers = {p: methods[p]["median_s"] for p in ("grpc", "tc-shm", "triton-shm-client")
                 if methods[p]["status"] == "ok"}
        assert entry["best_peer"] == min(peers, key=peers.get)
        assert methods[entry["best_peer"]]["vs_best_peer"] == 1.0
        # the limit is floor + memcpy, repetition by repetition
        pairs = zip(methods["floor"]["samples_s"], methods["memcpy"]["samples_s"])
        assert methods["limit"]["samples_s"] == pytest.approx([f + m for f, m in pairs])
        assert methods["zero-copy"]["vs_limit"] == pytest.approx(
            methods["zero-copy"]["median_s"] / methods["limit"]["median_s"])


def test_the_table_shows_every_method_and_size(results):
    table = bench.format_table(results)
    for name in [m.name for m in bench.METHODS] + ["limit"]:
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
    with pytest.raises(tritonshm.Error, match="cannot reach a Triton server at 127.0.0.1:1"):
        bench.run("127.0.0.1:1", [4096], reps=1)


@pytest.mark.parametrize("text, nbytes", [("4K", 4096), ("4KiB", 4096), ("64k", 65536), ("1M", 1 << 20),
                                          ("16MiB", 16 << 20), ("1G", 1 << 30), ("4096", 4096), ("100b", 100)])
def test_parse_size(text, nbytes):
    assert bench.parse_size(text) == nbytes


@pytest.mark.parametrize("text", ["", "4X", "-4K", "0", "1.5M", "K"])
def test_parse_size_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError):
        bench.parse_size(text)


def test_help_documents_every_flag_and_method():
    done = bench_cmd("--help")
    assert done.returncode == 0
    for flag in ("--url", "--sizes", "--dtype", "--reps", "--budget", "--min-reps", "--max-reps", "--warmup",
                 "--methods", "--json", "--plot"):
        assert flag in done.stdout
    for method in [m.name for m in bench.METHODS] + ["limit"]:
        assert method in done.stdout


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
