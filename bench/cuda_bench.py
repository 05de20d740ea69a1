"""CUDA-layer benchmark: one identity request from a GPU tensor, and pinned copies.

Run on a CUDA machine (needs torch with CUDA, tritonclient, a Triton server
that LocalServer can start -- see ``TRITONSHM_TRITONSERVER``)::

    python bench/cuda_bench.py [--mib 16] [--reps 30] [--json out.json]

Part 1 -- identity_fp32, a GPU tensor in, the result wanted as a GPU tensor:

* ``grpc``       plain gRPC: tensor to host, into the message, back to the GPU;
* ``tc-cuda``    tritonclient's ``cuda_shared_memory`` utilities, regions made
                 and registered once (their examples' way), copy in from the
                 tensor, result copied to a fresh GPU tensor;
* ``tritonshm``  :class:`tritonshm.CudaRegion`, registered once: ``write(t)``
                 (device to device), infer, ``torch.from_dlpack(view).clone()``;
* ``floor``      inputs already in place, outputs left on the device: the
                 server's share alone.

Part 2 -- a device-to-host copy of 64 MiB into pageable memory, torch's pinned
memory, and a :class:`tritonshm.PinnedRegion`.

Repetitions are interleaved (one of each way per round) and medians reported
with ratios against baselines of the same run: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np


def interleaved(ways: dict, reps: int) -> dict[str, float]:
    """Median seconds of each callable, one call of each per round, after one warm-up round."""
    for run in ways.values():
        run()
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(reps):
        for name, run in ways.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def request_bench(torch, url: str, nbytes: int, reps: int) -> dict[str, float]:
    import tritonclient.grpc as grpcclient

    import tritonshm

    count = nbytes // 4
    x = torch.randn(count, device="cuda")
    expected = x.clone()
    client = grpcclient.InferenceServerClient(url)
    ways = {}

    def check(y) -> None:
        if not torch.equal(y, expected):
            raise AssertionError("output differs from input")

    def grpc_run() -> None:
        inp = grpcclient.InferInput("INPUT0", [count], "FP32")
        inp.set_data_from_numpy(x.cpu().numpy())
        res = client.infer("identity_fp32", [inp], outputs=[grpcclient.InferRequestedOutput("OUTPUT0")])
        check(torch.from_numpy(res.as_numpy("OUTPUT0")).cuda())

    ways["grpc"] = grpc_run

    # tritonclient's CUDA utilities, the way their examples use them.
    cleanup = []
    try:
        import tritonclient.utils.cuda_shared_memory as cudashm

        tag = f"bench-{time.monotonic_ns()}"
        h_in = cudashm.create_shared_memory_region(f"{tag}-in", nbytes, 0)
        h_out = cudashm.create_shared_memory_region(f"{tag}-out", nbytes, 0)
        cleanup += [lambda: cudashm.destroy_shared_memory_region(h_in),
                    lambda: cudashm.destroy_shared_memory_region(h_out)]
        client.register_cuda_shared_memory(f"{tag}-in", cudashm.get_raw_handle(h_in), 0, nbytes)
        client.register_cuda_shared_memory(f"{tag}-out", cudashm.get_raw_handle(h_out), 0, nbytes)
        cleanup.insert(0, lambda: client.unregister_cuda_shared_memory(f"{tag}-out"))
        cleanup.insert(0, lambda: client.unregister_cuda_shared_memory(f"{tag}-in"))

        def tc_run() -> None:
            cudashm.set_shared_memory_region_from_dlpack(h_in, [x])
            inp = grpcclient.InferInput("INPUT0", [count], "FP32")
            inp.set_shared_memory(f"{tag}-in", nbytes)
            out = grpcclient.InferRequestedOutput("OUTPUT0")
            out.set_shared_memory(f"{tag}-out", nbytes)
            client.infer("identity_fp32", [inp], outputs=[out])
            check(torch.from_dlpack(cudashm.as_shared_memory_tensor(h_out, "FP32", [count])).clone())

        ways["tc-cuda"] = tc_run
    except Exception as exc:  # an older tritonclient, or no cuda-python: say so, go on
        print(f"tritonclient's CUDA utilities unavailable: {exc}", file=sys.stderr)

    c_in = tritonshm.CudaRegion.create(nbytes)
    c_out = tritonshm.CudaRegion.create(nbytes)
    tritonshm.register(client, c_in)
    tritonshm.register(client, c_out)
    inp = grpcclient.InferInput("INPUT0", [count], "FP32")
    tritonshm.bind_input(inp, c_in)
    out = grpcclient.InferRequestedOutput("OUTPUT0")
    tritonshm.bind_output(out, c_out)
    out_view = c_out.view(np.float32, count)

    def tritonshm_run() -> None:
        c_in.write(x)
        client.infer("identity_fp32", [inp], outputs=[out])
        check(torch.from_dlpack(out_view).clone())

    def floor_run() -> None:
        client.infer("identity_fp32", [inp], outputs=[out])

    ways["tritonshm"] = tritonshm_run
    ways["floor"] = floor_run
    c_in.write(x)
    try:
        return interleaved(ways, reps)
    finally:
        del out_view
        tritonshm.unregister(client, c_in)
        tritonshm.unregister(client, c_out)
        c_in.close()
        c_out.close()
        for undo in cleanup:
            undo()
        client.close()


def pinned_bench(torch, nbytes: int, reps: int) -> dict[str, float]:
    import tritonshm

    count = nbytes // 4
    gpu = torch.randn(count, device="cuda")
    pageable = torch.empty(count)
    pinned = torch.empty(count, pin_memory=True)
    region = tritonshm.PinnedRegion.create(nbytes)
    ours = torch.from_dlpack(region.ndarray(np.float32, count))

    def copy_into(dst):
        def run() -> None:
            dst.copy_(gpu)
            torch.cuda.synchronize()
        return run

    try:
        result = interleaved({"pageable": copy_into(pageable), "torch-pinned": copy_into(pinned),
                              "PinnedRegion": copy_into(ours)}, reps)
        if not torch.equal(ours, gpu.cpu()):
            raise AssertionError("pinned copy differs")
        return result
    finally:
        del ours
        region.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=float, nargs="+", default=[16], help="request sizes in MiB")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--pinned-mib", type=int, default=64)
    parser.add_argument("--url", help="a running server's gRPC address (default: start a LocalServer)")
    parser.add_argument("--json", help="write the raw medians here")
    args = parser.parse_args(argv)

    import torch

    from tritonshm import cuda
    from tritonshm.server import LocalServer

    info = cuda.runtime_info()
    print(f"device: {info['devices'][0].get('name')}; runtime {info['runtime_version']}, "
          f"driver {info['driver_version']}; torch {torch.__version__}")
    report = {"device": info["devices"][0], "requests": {}, "pinned": {}}

    def requests(url: str) -> None:
        for mib in args.mib:
            res = request_bench(torch, url, int(mib * (1 << 20)), args.reps)
            report["requests"][mib] = res
            print(f"\nidentity_fp32, {mib:g} MiB from a GPU tensor; median ms per request, "
                  f"{args.reps} interleaved rounds")
            for name, sec in res.items():
                vs = "".join(f"  {sec / res[base]:5.2f}x {base}" for base in ("floor", "tc-cuda") if base in res)
                print(f"  {name:>10} {sec * 1e3:9.3f} ms {vs}")

    if args.url:
        requests(args.url)
    else:
        with LocalServer(quiet=True) as server:
            requests(server.grpc_url)

    nbytes = args.pinned_mib << 20
    res = pinned_bench(torch, nbytes, args.reps)
    report["pinned"] = res
    print(f"\ndevice-to-host copy of {args.pinned_mib} MiB; GB/s (median of {args.reps} interleaved rounds)")
    for name, sec in res.items():
        print(f"  {name:>12} {nbytes / sec / 1e9:7.1f} GB/s  {res['torch-pinned'] / sec:5.2f}x torch-pinned")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
