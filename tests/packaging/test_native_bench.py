"""The native microbenchmarks build and run, so they never rot.

Configures and builds bench/tshm_bench with CMake into a temporary directory
(the C core and the benchmark only, not the Cython modules), runs it with a
budget of about one second and checks what it prints; then runs
bench/native_bench.py, which puts it beside multiprocessing.shared_memory.
Skips where there is no source tree (tests copied next to an installed
wheel), no cmake or no C compiler.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from toolchain import c_compiler

ROOT = Path(__file__).resolve().parents[2]
SIZES = ["4 KiB", "64 KiB", "1 MiB", "16 MiB", "64 MiB"]
NUMBER = r"\d+\.\d+"




@pytest.fixture(scope="module")
def bench_binary(tmp_path_factory) -> Path:
    if not (ROOT / "CMakeLists.txt").is_file() or not (ROOT / "bench" / "tshm_bench.c").is_file():
        pytest.skip(f"no source tree at {ROOT} (tests run from a copy next to an installed wheel)")
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("cmake is not installed: cannot build the native microbenchmarks")
    cc = c_compiler()
    if cc is None:
        pytest.skip("no working C compiler: cannot build the native microbenchmarks")
    build = tmp_path_factory.mktemp("bench-build")
    env = {**os.environ, "CC": cc}
    for step in (
        [cmake, "-S", str(ROOT), "-B", str(build), "-DTRITONSHM_BUILD_BENCH=ON",
         "-DCMAKE_BUILD_TYPE=Release", f"-DPython_EXECUTABLE={sys.executable}"],
        [cmake, "--build", str(build), "--target", "tshm_bench", "--parallel", "2"],
    ):
        done = subprocess.run(step, capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, f"{' '.join(step)}\n{done.stdout}\n{done.stderr}"
    binary = build / "bench" / "tshm_bench"
    assert os.access(binary, os.X_OK)
    return binary


def _skipped(line: str) -> bool:
    """Whether *line* says that /dev/shm had no room for that size."""
    return "skipped: /dev/shm has" in line


def test_tables(bench_binary):
    done = subprocess.run([str(bench_binary), "--seconds", "1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert re.match(r"tshm_bench: tritonshm C core, \d+ online CPUs, page size \d+\n", out)
    sections = out.split("\n\n")
    lifecycle = next(s for s in sections if s.startswith("Segment lifecycle"))
    copies = next(s for s in sections if s.startswith("Copies, GB/s"))
    refs = next(s for s in sections if s.startswith("Reference counting"))
    for size in SIZES:
        row = next(line for line in lifecycle.splitlines() if line.strip().startswith(size + " "))
        assert _skipped(row) or re.fullmatch(rf"\s+{size}" + rf"\s+{NUMBER}" * 4, row), row
    rows = 0
    for line in copies.splitlines()[2:]:
        if _skipped(line):
            continue
        # size, memcpy, copy_in, ratio, copy_out, ratio
        match = re.fullmatch(rf"\s+(\d+ [KM]iB)" + rf"\s+({NUMBER})" * 5, line)
        assert match, line
        memcpy, copy_in, ratio_in, copy_out, ratio_out = map(float, match.groups()[1:])
        assert memcpy > 0 and copy_in > 0 and copy_out > 0
        assert ratio_in == pytest.approx(copy_in / memcpy, abs=0.011)
        assert ratio_out == pytest.approx(copy_out / memcpy, abs=0.011)
        rows += 1
    assert rows >= 1
    assert re.search(rf"incref\+decref, 1 thread:\s+{NUMBER} ns/pair", refs)
    assert re.search(rf"incref\+decref, 2 threads on one mapping:\s+{NUMBER} ns/pair", refs)


def test_tsv(bench_binary):
    done = subprocess.run([str(bench_binary), "--tsv", "--seconds", "0.5"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    kinds: dict[str, list[list[str]]] = {}
    for line in done.stdout.splitlines():
        kind, *fields = line.split("\t")
        kinds.setdefault(kind, []).append(fields)
    assert set(kinds) <= {"meta", "lifecycle", "skipped", "copy", "refcount"}
    assert {f[0] for f in kinds["meta"]} == {"cpus", "page_size", "seconds"}
    for fields in kinds.get("lifecycle", []):
        assert len(fields) == 6 and int(fields[0]) >= 4096
        total, create, rest, first_write, ready = map(float, fields[1:])
        assert 0 < create <= total and rest > 0 and first_write > 0 and ready > 0
    for fields in kinds.get("copy", []):
        assert len(fields) == 4 and all(float(x) > 0 for x in fields[1:])
    assert sorted(int(f[0]) for f in kinds["refcount"]) == [1, 2]
    assert len(kinds.get("lifecycle", [])) + len(kinds.get("skipped", [])) == len(SIZES)


def test_bad_arguments(bench_binary):
    for args in (["--seconds", "0"], ["--seconds", "soon"], ["--frobnicate"]):
        done = subprocess.run([str(bench_binary), *args], capture_output=True, text=True, timeout=30)
        assert done.returncode == 2, (args, done.stdout, done.stderr)


def test_side_by_side_with_shared_memory(bench_binary):
    """bench/native_bench.py: one table, ratios against SharedMemory and memcpy."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "native_bench.py"), "--binary", str(bench_binary), "--seconds", "1"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    for heading in ("Segment lifecycle, us:", "Ready to use, us:", "Copies, GB/s:", "Reference counting:"):
        assert heading in out, out
    sections = {s.split(":")[0]: s for s in out.split("\n\n")}
    row = re.compile(r"^\s+\d+ [KM]iB" + rf"\s+{NUMBER}" * 5 + "$", re.MULTILINE)
    header = re.compile(r"^\s+size\s+SharedMemory\s+SystemRegion\s+C core\s+SystemRegion/SM\s+C core/SM$",
                        re.MULTILINE)
    for name in ("Segment lifecycle, us", "Ready to use, us"):
        # Per size: SharedMemory, SystemRegion and C core times, then two ratios.
        assert header.search(sections[name]), sections[name]
        assert row.findall(sections[name]), sections[name]
    assert row.findall(sections["Copies, GB/s"]), out  # memcpy, copy_in, ratio, copy_out, ratio
    assert re.search(rf"1 thread:\s+{NUMBER} ns/pair", out)
    assert re.search(rf"2 threads on one mapping:\s+{NUMBER} ns/pair per thread", out)
