#!/usr/bin/env python3
"""The native microbenchmarks side by side with multiprocessing.shared_memory.

Runs bench/tshm_bench (the C core: segments, checked copies, reference
counts) and, in the same run and for the same sizes, times Python's
``multiprocessing.shared_memory.SharedMemory`` and tritonshm's own
``SystemRegion`` doing the same work; prints one table with the ratios.

    cmake -S . -B build/bench -DTRITONSHM_BUILD_BENCH=ON
    cmake --build build/bench --target tshm_bench
    python bench/native_bench.py                    # about 10 s
    python bench/native_bench.py --seconds 1        # a smoke run

What is compared with what:

* Segment lifecycle: create + map + unlink + unmap of one segment. tritonshm
  reserves the pages at create (posix_fallocate, so a full /dev/shm fails
  there with ENOSPC rather than with SIGBUS at some later write);
  SharedMemory only sizes a sparse file (ftruncate), so it is ahead here by
  construction from ~1 MiB up. Hence the second table, *ready to use*: the
  same plus a first write of every byte, where SharedMemory pays for its
  pages instead. "C core" is the C library alone; "SystemRegion" the Python
  object users get (plus its flock and its Python object).
* Copies: tshm_copy_in / tshm_copy_out (bounds-checked, holding a reference
  to the mapping) against memcpy between two malloc'ed buffers.
* Reference counting: one atomic incref + decref pair, as every buffer
  export and DLPack tensor takes; with two threads on one mapping too.

Ratios of times are tritonshm / SharedMemory (below 1.00: tritonshm is
faster); ratios of throughputs are tritonshm / memcpy (1.00: memcpy's speed).
Only the standard library is needed; the SystemRegion column is left out
where tritonshm cannot be imported.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import statistics
import subprocess
import sys
import time
from multiprocessing import shared_memory
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BINARY = ROOT / "build" / "bench" / "bench" / "tshm_bench"
BUILD_HINT = (
    "cmake -S . -B build/bench -DTRITONSHM_BUILD_BENCH=ON && "
    "cmake --build build/bench --target tshm_bench"
)
C_SHARE = 0.6  # of --seconds, for the C binary; the rest for the Python timings
MIN_SAMPLES = 3

try:
    from tritonshm import SystemRegion
except ImportError:  # the comparison with SharedMemory works without it
    SystemRegion = None


def size_str(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def run_c_bench(binary: Path, seconds: float) -> dict:
    """Run tshm_bench --tsv and parse its figures."""
    out = subprocess.run(
        [str(binary), "--tsv", "--seconds", f"{seconds:g}"], check=True, capture_output=True, text=True
    ).stdout
    figures: dict = {"meta": {}, "lifecycle": {}, "skipped": {}, "copy": {}, "refcount": {}}
    for line in out.splitlines():
        kind, *fields = line.split("\t")
        if kind == "meta":
            figures["meta"][fields[0]] = fields[1]
        elif kind == "lifecycle":
            n = int(fields[0])
            total, create, rest, first_write, ready = map(float, fields[1:6])
            figures["lifecycle"][n] = {"total": total, "ready": ready}
        elif kind == "skipped":
            figures["skipped"][int(fields[0])] = float(fields[1])
        elif kind == "copy":
            figures["copy"][int(fields[0])] = tuple(map(float, fields[1:4]))
        elif kind == "refcount":
            figures["refcount"][int(fields[0])] = float(fields[1])
        else:
            raise ValueError(f"tshm_bench printed an unexpected line: {line!r}")
    return figures


def _fill(buffer, n: int) -> None:
    """Write every byte of a writable buffer once (memset through ctypes)."""
    view = (ctypes.c_char * n).from_buffer(buffer)
    ctypes.memset(ctypes.addressof(view), 0x5A, n)
    del view  # release the export before the buffer is closed


def shared_memory_cycle(n: int, touch: bool) -> None:
    shm = shared_memory.SharedMemory(create=True, size=n)
    if touch:
        _fill(shm.buf, n)
    shm.close()
    shm.unlink()


def system_region_cycle(n: int, touch: bool) -> None:
    region = SystemRegion.create(n)
    if touch:
        _fill(region, n)
    region.close()


def time_python(sizes: list[int], seconds: float) -> dict:
    """Median seconds per cycle: {(method, touch): {size: s}}, methods interleaved."""
    methods = {"SharedMemory": shared_memory_cycle}
    if SystemRegion is not None:
        methods["SystemRegion"] = system_region_cycle
    cases = [(name, touch) for touch in (False, True) for name in methods]
    results: dict = {case: {} for case in cases}
    shared_memory_cycle(4096, True)  # start the resource tracker outside the timings
    per_size = seconds / max(1, len(sizes))
    for n in sizes:
        samples: dict = {case: [] for case in cases}
        deadline = time.perf_counter() + per_size
        rounds = 0
        while rounds < MIN_SAMPLES or (time.perf_counter() < deadline and rounds < 5000):
            # A rotating order, so drifts and cache effects hit every method alike.
            for k in range(len(cases)):
                name, touch = cases[(rounds + k) % len(cases)]
                t0 = time.perf_counter()
                methods[name](n, touch)
                samples[(name, touch)].append(time.perf_counter() - t0)
            rounds += 1
        for case in cases:
            results[case][n] = statistics.median(samples[case])
    return results


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "-"


def _us(t: float | None) -> str:
    return f"{t * 1e6:.1f}" if t else "-"


def report(c: dict, py: dict) -> str:
    meta = c["meta"]
    lines = []
    version = ""
    if SystemRegion is not None:
        import tritonshm

        version = f"tritonshm {tritonshm.__version__}, "
    lines.append("tritonshm native microbenchmarks: the C core (tshm_bench) and multiprocessing.shared_memory, one run")
    lines.append(
        f"{version}CPython {platform.python_version()}, {meta.get('cpus', '?')} online CPUs, "
        f"page size {meta.get('page_size', '?')}; every figure a median"
    )
    sizes = sorted(c["lifecycle"])
    for touch, title in (
        (False, "Segment lifecycle, us: create + map + unlink + unmap"),
        (True, "Ready to use, us: create + map + first write of every byte + unlink + unmap"),
    ):
        lines += ["", f"{title}   (time ratio: below 1.00 = faster than SharedMemory)"]
        lines.append(
            f"  {'size':>8} {'SharedMemory':>13} {'SystemRegion':>13} {'C core':>10} {'SystemRegion/SM':>16} {'C core/SM':>10}"
        )
        for n in sizes:
            sm = py[("SharedMemory", touch)].get(n)
            sr = py.get(("SystemRegion", touch), {}).get(n)
            core = c["lifecycle"][n]["ready" if touch else "total"]
            lines.append(
                f"  {size_str(n):>8} {_us(sm):>13} {_us(sr):>13} {_us(core):>10} {_ratio(sr, sm):>16} {_ratio(core, sm):>10}"
            )
    for n, avail in sorted(c["skipped"].items()):
        lines.append(f"  {size_str(n):>8}  skipped: /dev/shm has {avail / (1 << 20):.0f} MiB available")
    lines += ["", "Copies, GB/s: checked tshm_copy_in / tshm_copy_out vs memcpy   (ratio: 1.00 = memcpy's speed)"]
    lines.append(f"  {'size':>8} {'memcpy':>10} {'copy_in':>10} {'ratio':>8} {'copy_out':>10} {'ratio':>8}")
    for n, (base, cin, cout) in sorted(c["copy"].items()):
        lines.append(
            f"  {size_str(n):>8} {base:>10.2f} {cin:>10.2f} {cin / base:>8.2f} {cout:>10.2f} {cout / base:>8.2f}"
        )
    lines += ["", "Reference counting: one incref + decref pair (atomic), as every export and DLPack tensor takes"]
    one, two = c["refcount"].get(1), c["refcount"].get(2)
    if one:
        lines.append(f"  1 thread:                    {one:6.1f} ns/pair")
    if two:
        contended = f"  ({two / one:.2f}x one thread)" if one else ""
        lines.append(f"  2 threads on one mapping:    {two:6.1f} ns/pair per thread{contended}")
    if SystemRegion is None:
        lines += ["", "(SystemRegion: tritonshm is not importable from this Python)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="The C core's microbenchmarks beside multiprocessing.shared_memory, in one run.",
        epilog=f"Build the binary first: {BUILD_HINT}",
    )
    parser.add_argument("--binary", type=Path, default=DEFAULT_BINARY,
                        help="the tshm_bench executable (default: build/bench/bench/tshm_bench)")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="about how long the whole run takes (default 10; 1 for a smoke run)")
    args = parser.parse_args(argv)
    if not args.seconds > 0:
        parser.error("--seconds must be positive")
    if not os.access(args.binary, os.X_OK):
        print(f"native_bench: no tshm_bench at {args.binary}; build it with:\n  {BUILD_HINT}", file=sys.stderr)
        return 2
    c = run_c_bench(args.binary, args.seconds * C_SHARE)
    py = time_python(sorted(c["lifecycle"]), args.seconds * (1 - C_SHARE))
    print(report(c, py))
    return 0


if __name__ == "__main__":
    sys.exit(main())
