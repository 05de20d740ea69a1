#!/usr/bin/env python3
"""Where a warm GPU request's time goes, on a real GPU (issue 40): per phase, per method.

Each row of ``tritonshm bench --gpu`` is timed again here, interleaved, with the
request's wall time split where the gRPC call is made and where it returns:

* ``before``: from the call into the method until the gRPC call is made (the
  client's checks, planning, lending, its ordering point and any copy in);
* ``server``: the gRPC call itself (the wire both ways and the server's work);
* ``after``: from the answer until the method returns, ``torch.cuda.synchronize()``
  included (reading the answer, copies out);
* ``cpu``: the calling thread's CPU over the whole call (``time.thread_time``).

Beside the rows, three variants of the floor (a by-reference request built by
hand, no CUDA call per request) separate the client's GPU submissions from its
Python: ``floor+event`` records an event on the caller's stream and waits for it
before sending (what one ordering point costs), ``floor+spin`` spins the CPU for
``--spin-us`` before sending (what that much client Python costs, with no GPU
work), and ``floor 1 region`` puts input and output in one region, input first
and the output after it at a 256-byte boundary, as a slot lays them out (does
that layout cost the server anything?).

    bash .gpu-kit/setup.sh && TSHM_SKIP_BUILD=1 bash bench/gpu.sh --server-torch-only
    PYTHONPATH=/tmp/tshm-site:/tmp/tshm-kit/site python3 bench/gpu_phases.py --sizes 64K 16M

(the environment of ``tests/gpu/run.sh``: ``TRITONSHM_TRITONSERVER`` and
``TRITONSHM_SERVER_PYTHON`` naming the kit's server). Figures, never asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from typing import Any

_stamps = threading.local()


def _stamp_grpc_calls() -> None:
    """Record, per thread, when each unary gRPC call is made and when it returns."""
    import grpc._channel as channel

    for name in ("__call__", "with_call"):
        real = getattr(channel._UnaryUnaryMultiCallable, name)

        def stamped(self: Any, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            sent = time.perf_counter()
            try:
                return _real(self, *args, **kwargs)
            finally:
                calls = getattr(_stamps, "calls", None)
                if calls is not None:
                    calls.append((sent, time.perf_counter()))

        setattr(channel._UnaryUnaryMultiCallable, name, stamped)


def _floor_variants(torch: Any, spin_s: float) -> list[type]:
    from tritonshm import triton
    from tritonshm.bench._gpu import GpuFloor
    from tritonshm.cuda import CudaRegion

    class FloorEvent(GpuFloor):
        name = "floor+event"

        def send(self, x: Any) -> Any:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.setting.device))
            event.synchronize()
            return super().send(x)

    class FloorSpin(GpuFloor):
        name = "floor+spin"

        def send(self, x: Any) -> Any:
            end = time.perf_counter() + spin_s
            while time.perf_counter() < end:
                pass
            return super().send(x)

    class FloorOneRegion(GpuFloor):
        name = "floor 1 region"

        def open(self) -> None:
            import tritonclient.grpc as grpcclient

            from tritonshm.bench._gpu import _grpc_client

            s = self.setting
            self.client = _grpc_client(s.require_grpc())
            out_offset = (s.nbytes + 255) // 256 * 256
            region = CudaRegion.create(out_offset + s.nbytes, device=s.device_index)
            self.regions = [region]
            self.registered = [triton.register(self.client, region)]
            self.input = grpcclient.InferInput("INPUT0", [s.count], s.datatype)
            triton.bind_input(self.input, region, 0, s.nbytes)
            self.output = grpcclient.InferRequestedOutput("OUTPUT0")
            triton.bind_output(self.output, region, out_offset, s.nbytes)
            self.out_view = region.view(s.dtype, (s.count,), out_offset)
            self.staged = None

    return [FloorEvent, FloorSpin, FloorOneRegion]


def _median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1e3 if values else float("nan")


def measure(url: str, nbytes: int, reps: int, warmup: int, spin_s: float) -> dict[str, dict[str, Any]]:
    import torch

    from tritonshm.bench._harness import round_order
    from tritonshm.bench._gpu import (GpuClientInfer, GpuClientInferCopies, GpuClientInferOut, GpuClientInferViews,
                                      GpuFloor, GpuSetting, GpuTritonclientCuda, GpuZeroCopy, GPU_MODEL, sample_tensor)

    count = nbytes // 4
    classes = [GpuFloor, *_floor_variants(torch, spin_s), GpuZeroCopy, GpuClientInfer, GpuClientInferOut,
               GpuClientInferCopies, GpuClientInferViews, GpuTritonclientCuda]
    methods = [cls(GpuSetting.of(url, GPU_MODEL, count)) for cls in classes]
    x = sample_tensor(torch, count, 7)
    rows: dict[str, dict[str, Any]] = {m.name: {"before": [], "server": [], "after": [], "total": [], "cpu": [],
                                                "grpc_calls": []} for m in methods}
    opened = []
    try:
        for m in methods:
            opened.append(m)
            m.open()
        for index in range(warmup + reps):
            for m in round_order(methods, index):
                m.stage(x)
                _stamps.calls = []
                c0, t0 = time.thread_time(), time.perf_counter()
                out = m.call(x)
                t1, c1 = time.perf_counter(), time.thread_time()
                calls = _stamps.calls
                if index == 0:
                    got = out if isinstance(out, torch.Tensor) else torch.from_dlpack(out)
                    if not torch.equal(got.reshape(-1), x.reshape(-1)):
                        raise SystemExit(f"{m.name}: the output differs from the input")
                del out
                if index < warmup or not calls:
                    continue
                row = rows[m.name]
                sent, answered = calls[-1]
                row["before"].append(sent - t0)
                row["server"].append(answered - sent)
                row["after"].append(t1 - answered)
                row["total"].append(t1 - t0)
                row["cpu"].append(c1 - c0)
                row["grpc_calls"].append(len(calls))
    finally:
        for m in opened:
            m.close()
    return {name: {**{k: _median_ms(v) for k, v in row.items() if k != "grpc_calls"},
                   "grpc_calls": max(row["grpc_calls"], default=0)} for name, row in rows.items()}


def profile(url: str, nbytes: int, name: str, calls: int) -> None:
    """Print where *calls* warm calls of method *name* spend their time, by cProfile (its own
    overhead inflates every Python call alike: read the shares, not the times)."""
    import cProfile
    import pstats

    import torch

    from tritonshm.bench._gpu import GPU_METHODS, GPU_MODEL, GpuSetting, sample_tensor

    cls = next(c for c in GPU_METHODS if c.name == name)
    method = cls(GpuSetting.of(url, GPU_MODEL, nbytes // 4))
    x = sample_tensor(torch, nbytes // 4, 7)
    method.open()
    try:
        for _ in range(5):
            method.stage(x)
            method.call(x)
        profiler = cProfile.Profile()
        for _ in range(calls):
            method.stage(x)
            profiler.enable()
            method.call(x)
            profiler.disable()
    finally:
        method.close()
    print(f"\n== {name}, {calls} warm calls of {nbytes} bytes under cProfile")
    stats = pstats.Stats(profiler).strip_dirs()
    stats.sort_stats("tottime").print_stats(28)
    stats.sort_stats("cumulative").print_stats(40)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["64K", "16M"])
    parser.add_argument("--reps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--spin-us", type=float, default=300.0, help="floor+spin's CPU spin (default 300)")
    parser.add_argument("--json", help="write the medians here")
    parser.add_argument("--profile", nargs="*", default=[], metavar="METHOD",
                        help="then these methods' warm calls under cProfile, at the first size "
                             "(e.g. 'Client.infer' 'Client.infer out=')")
    parser.add_argument("--profile-calls", type=int, default=300)
    args = parser.parse_args()

    from tritonshm.bench import parse_size
    from tritonshm.bench._gpu import load_gpu_model, server_arguments
    from tritonshm.server import LocalServer

    _stamp_grpc_calls()
    results = {}
    with LocalServer(extra_args=server_arguments()) as server:
        why = load_gpu_model(server.grpc_url)
        if why is not None:
            print(why, file=sys.stderr)
            return 2
        for size in args.sizes:
            nbytes = parse_size(size)
            rows = measure(server.grpc_url, nbytes, args.reps, args.warmup, args.spin_us * 1e-6)
            results[size] = rows
            floor = rows["floor"]["total"]
            print(f"\n{size}, {args.reps} interleaved repetitions, medians in ms (floor+spin: {args.spin_us:g} us)")
            print(f"  {'method':<22}{'total':>8}{'/floor':>8}{'before':>8}{'server':>8}{'after':>8}{'cpu':>8}")
            for name, r in rows.items():
                print(f"  {name:<22}{r['total']:8.3f}{r['total'] / floor:8.2f}{r['before']:8.3f}"
                      f"{r['server']:8.3f}{r['after']:8.3f}{r['cpu']:8.3f}"
                      + ("" if r["grpc_calls"] == 1 else f"  ({r['grpc_calls']} gRPC calls)"))
        for name in args.profile:
            profile(server.grpc_url, parse_size(args.sizes[0]), name, args.profile_calls)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
