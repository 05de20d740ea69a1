"""``tritonshm bench``: one identity request, four ways, measured in one run.

For each size, the same float32 tensor goes through ``identity_fp32``:

* ``grpc``        -- plain gRPC, the tensor inside the messages (the baseline);
* ``tc-shm``      -- tritonclient's own shm utilities, used the way their
                     examples do (regions made and registered once, data
                     copied in with ``set_shared_memory_region``, read back
                     with ``get_contents_as_numpy``);
* ``Client``      -- ``tritonshm.Client.infer`` (copies in and out);
* ``zero-copy``   -- ``Client.request``: inputs written in place, outputs
                     read as views.

Every figure is a median over repeated runs and is printed next to its
ratio against the gRPC baseline of the same run: the machine is shared and
noisy, so ratios travel better than absolute numbers.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from ._timing import median_seconds

MODEL = "identity_fp32"


def measure(grpc_url: str, nbytes: int, seconds: float) -> dict[str, float]:
    """Median seconds per request of each way, for one tensor of *nbytes*."""
    import tritonclient.grpc as grpcclient
    import tritonclient.utils.shared_memory as tcshm

    from .client import Client

    count = max(nbytes // 4, 1)
    data = np.random.default_rng(0).standard_normal(count, dtype=np.float32)
    raw = grpcclient.InferenceServerClient(grpc_url)
    results: dict[str, float] = {}

    def check(out: np.ndarray) -> None:
        if not np.array_equal(out, data):
            raise AssertionError("output differs from input")

    # 1. plain gRPC
    def grpc_run() -> None:
        infer_input = grpcclient.InferInput("INPUT0", [count], "FP32")
        infer_input.set_data_from_numpy(data)
        result = raw.infer(MODEL, [infer_input], outputs=[grpcclient.InferRequestedOutput("OUTPUT0")])
        check(result.as_numpy("OUTPUT0"))

    results["grpc"] = median_seconds(grpc_run, seconds)

    # 2. tritonclient's shm utilities
    tag = f"bench-{time.monotonic_ns()}"
    in_handle = tcshm.create_shared_memory_region(f"{tag}-in", f"/{tag}-in", data.nbytes)
    out_handle = tcshm.create_shared_memory_region(f"{tag}-out", f"/{tag}-out", data.nbytes)
    try:
        raw.register_system_shared_memory(f"{tag}-in", f"/{tag}-in", data.nbytes)
        raw.register_system_shared_memory(f"{tag}-out", f"/{tag}-out", data.nbytes)

        def tc_shm_run() -> None:
            tcshm.set_shared_memory_region(in_handle, [data])
            infer_input = grpcclient.InferInput("INPUT0", [count], "FP32")
            infer_input.set_shared_memory(f"{tag}-in", data.nbytes)
            out = grpcclient.InferRequestedOutput("OUTPUT0")
            out.set_shared_memory(f"{tag}-out", data.nbytes)
            raw.infer(MODEL, [infer_input], outputs=[out])
            check(tcshm.get_contents_as_numpy(out_handle, np.float32, [count]))

        results["tc-shm"] = median_seconds(tc_shm_run, seconds)
    finally:
        raw.unregister_system_shared_memory(f"{tag}-in")
        raw.unregister_system_shared_memory(f"{tag}-out")
        tcshm.destroy_shared_memory_region(in_handle)
        tcshm.destroy_shared_memory_region(out_handle)
        raw.close()

    # 3. and 4. tritonshm
    with Client(grpc_url, transport="shm") as client:
        results["Client"] = median_seconds(
            lambda: check(client.infer(MODEL, {"INPUT0": data})["OUTPUT0"]), seconds)

        def zero_copy_run() -> None:
            with client.request(MODEL, shapes={"INPUT0": (count,)}) as request:
                request.inputs["INPUT0"][:] = data
                check(request.run()["OUTPUT0"])

        results["zero-copy"] = median_seconds(zero_copy_run, seconds)
    return results


def run_bench(args: argparse.Namespace) -> int:
    """Start a local server (unless ``--url``) and print the comparison table."""
    from .server import LocalServer

    sizes = [kib * 1024 for kib in args.sizes_kib]
    if getattr(args, "url", None):
        return _table(args.url, sizes, args.seconds)
    print("starting a local Triton server ...", file=sys.stderr)
    with LocalServer() as server:
        return _table(server.grpc_url, sizes, args.seconds)


def _table(url: str, sizes: list[int], seconds: float) -> int:
    ways = ("grpc", "tc-shm", "Client", "zero-copy")
    print(f"identity_fp32, one request at a time; median ms per request (x = speedup over grpc)")
    print(f"{'size':>10}" + "".join(f"{w:>20}" for w in ways))
    for nbytes in sizes:
        res = measure(url, nbytes, seconds)
        base = res["grpc"]
        cells = "".join(f"{res[w] * 1e3:>11.3f} ({base / res[w]:>5.2f}x)" for w in ways)
        print(f"{nbytes / 1024:>8g}Ki{cells}")
    return 0
