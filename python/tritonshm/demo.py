"""``tritonshm demo``: the same inference over plain gRPC and over shared memory.

Starts a local Triton with the bundled models, sends float32 tensors of
several sizes through the ``identity_fp32`` model both ways, checks every
output, and prints the throughput of each and their ratio.
"""

from __future__ import annotations

import sys
from typing import Sequence

import numpy as np

from ._timing import median_seconds

MODEL = "identity_fp32"


def run_demo(sizes: Sequence[int], seconds: float = 0.5, grpc_url: str | None = None,
             **server_options) -> int:
    """Run the comparison and print the table; 0 when every output matched.

    Starts a :class:`LocalServer` (with *server_options*) unless *grpc_url* names a running one.
    """
    from .server import LocalServer

    if grpc_url is not None:
        return _compare(grpc_url, sizes, seconds)
    print("starting a local Triton server (the first run installs it: ~74 MB download, once) ...",
          file=sys.stderr)
    with LocalServer(**server_options) as server:
        return _compare(server.grpc_url, sizes, seconds)


def _compare(grpc_url: str, sizes: Sequence[int], seconds: float) -> int:
    import tritonclient.grpc as grpcclient

    from . import triton
    from ._memory import SystemRegion

    client = grpcclient.InferenceServerClient(grpc_url)
    rng = np.random.default_rng(0)
    print(f"identity model, float32, one request at a time, server at {grpc_url}")
    print(f"{'size':>10} {'gRPC MB/s':>12} {'shm MB/s':>12} {'speedup':>9}")
    failures = 0
    for nbytes in sizes:
        count = max(nbytes // 4, 1)
        data = rng.standard_normal(count, dtype=np.float32)
        nbytes = data.nbytes

        # Plain gRPC: the tensor travels inside the request and the reply.
        wire_in = grpcclient.InferInput("INPUT0", [count], "FP32")
        wire_in.set_data_from_numpy(data)
        wire_out = [grpcclient.InferRequestedOutput("OUTPUT0")]

        def over_wire() -> None:
            result = client.infer(MODEL, [wire_in], outputs=wire_out)
            if not np.array_equal(result.as_numpy("OUTPUT0"), data):
                raise AssertionError("gRPC output differs from input")

        # Shared memory: one region holds the input and the output; only
        # their names and offsets travel.
        in_offset, out_offset = 0, _page_round(nbytes)
        with SystemRegion.create(out_offset + nbytes) as region:
            name = triton.register(client, region)
            try:
                region.write(data, in_offset)
                shm_in = grpcclient.InferInput("INPUT0", [count], "FP32")
                triton.bind_input(shm_in, region, in_offset)
                shm_out = grpcclient.InferRequestedOutput("OUTPUT0")
                triton.bind_output(shm_out, region, out_offset, nbytes)
                result_view = region.ndarray(np.float32, count, out_offset)

                def over_shm() -> None:
                    result_view[:] = 0  # a stale result must not pass the check
                    client.infer(MODEL, [shm_in], outputs=[shm_out])
                    if not np.array_equal(result_view, data):
                        raise AssertionError("shared-memory output differs from input")

                try:
                    wire_s = median_seconds(over_wire, seconds)
                    shm_s = median_seconds(over_shm, seconds)
                except AssertionError as exc:
                    failures += 1
                    print(f"{_size(nbytes):>10}  FAILED: {exc}")
                    continue
                finally:
                    del result_view
            finally:
                triton.unregister(client, name)
        wire_mbs = nbytes / wire_s / 1e6
        shm_mbs = nbytes / shm_s / 1e6
        print(f"{_size(nbytes):>10} {wire_mbs:>12.1f} {shm_mbs:>12.1f} {wire_s / shm_s:>8.1f}x")
    client.close()
    print("every output checked against its input" if not failures else f"{failures} size(s) FAILED")
    return 1 if failures else 0


def _page_round(nbytes: int, page: int = 4096) -> int:
    return (nbytes + page - 1) // page * page


def _size(nbytes: int) -> str:
    if nbytes >= 1 << 20:
        return f"{nbytes / (1 << 20):g} MiB"
    return f"{nbytes / 1024:g} KiB"
