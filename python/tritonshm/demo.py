"""``tritonshm demo``: the same inference over plain gRPC and through ``tritonshm.Client``.

Starts a local Triton with the bundled models, sends float32 tensors of
several sizes through the ``identity_fp32`` model -- with tritonclient over
plain gRPC (the tensor inside the messages), and with ``tritonshm.Client``
made on the server's gRPC and on its HTTP address (the tensor through a
shared-memory slot, copied in and out) -- checks every output, and prints
the throughput of each and their ratios to plain gRPC.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, Sequence

import numpy as np

from ._timing import interleaved_medians

MODEL = "identity_fp32"


def _ours_call(client: Any, data: np.ndarray) -> np.ndarray:
    """One inference of *data* on a tritonshm client; its output."""
    return client.infer(MODEL, {"INPUT0": data})["OUTPUT0"]


def run_demo(sizes: Sequence[int], seconds: float = 0.5, grpc_url: str | None = None,
             http_url: str | None = None, **server_options: Any) -> int:
    """Run the comparison and print the table; 0 when every output matched.

    Starts a :class:`LocalServer` (with *server_options*) unless *grpc_url* names a running one
    (then the HTTP column needs its *http_url*).
    """
    from .server import LocalServer

    if grpc_url is not None:
        return _compare(grpc_url, http_url, sizes, seconds)
    print("starting a local Triton server (the first run installs it: ~74 MB download, once) ...",
          file=sys.stderr)
    with LocalServer(**server_options) as server:
        return _compare(server.grpc_url, server.http_url, sizes, seconds)


def _compare(grpc_url: str, http_url: str | None, sizes: Sequence[int], seconds: float) -> int:
    import tritonclient.grpc as grpcclient

    from .client import Client

    tc = grpcclient.InferenceServerClient(grpc_url)
    ours = {"Client": Client(grpc_url, transport="shm")}
    if http_url is not None:
        ours["Client http"] = Client("http://" + http_url, transport="shm")
    rng = np.random.default_rng(0)
    where = f"gRPC {grpc_url}" + (f", HTTP {http_url}" if http_url else "")
    print(f"identity model, float32, one request at a time; Triton at {where}")
    print(f"{'size':>10} {'gRPC MB/s':>12}" + "".join(f" {name + ' MB/s':>17} {'vs gRPC':>8}" for name in ours))
    failures = 0
    try:
        for nbytes in sizes:
            data = rng.standard_normal(max(nbytes // 4, 1), dtype=np.float32)
            nbytes = data.nbytes
            wire_in = grpcclient.InferInput("INPUT0", [data.size], "FP32")
            wire_in.set_data_from_numpy(data)
            wire_out = [grpcclient.InferRequestedOutput("OUTPUT0")]
            calls: dict[str, Callable[[], np.ndarray]] = {
                "gRPC": lambda: tc.infer(MODEL, [wire_in], outputs=wire_out).as_numpy("OUTPUT0")}
            for name, client in ours.items():
                calls[name] = functools.partial(_ours_call, client, data)
            try:
                medians = interleaved_medians({name: _checked(name, call, data) for name, call in calls.items()},
                                              seconds * len(calls))
            except AssertionError as exc:
                failures += 1
                print(f"{_size(nbytes):>10}  FAILED: {exc}")
                continue
            wire_s = medians.pop("gRPC")
            row = f"{_size(nbytes):>10} {nbytes / wire_s / 1e6:>12.1f}"
            for name, s in medians.items():
                row += f" {nbytes / s / 1e6:>17.1f} {wire_s / s:>7.1f}x"
            print(row)
    finally:
        for client in ours.values():
            client.close()
        tc.close()
    print("every output checked against its input" if not failures else f"{failures} size(s) FAILED")
    print("gRPC: tritonclient over plain gRPC, the tensor inside the messages. Client / Client http:\n"
          "tritonshm.Client(url).infer(model, {name: x}) made on the server's gRPC / HTTP address, the\n"
          "tensor copied into a registered shared-memory slot and the result copied out.\n"
          "vs gRPC: the MB/s to its left over plain gRPC's (higher is faster), in the same rounds")
    return 1 if failures else 0


def _checked(name: str, call: Callable[[], np.ndarray], data: np.ndarray) -> Callable[[], None]:
    def run() -> None:
        if not np.array_equal(call(), data):
            raise AssertionError(f"{name}: the output differs from the input")
    return run


def _page_round(nbytes: int, page: int = 4096) -> int:
    return (nbytes + page - 1) // page * page


def _size(nbytes: int) -> str:
    if nbytes >= 1 << 20:
        return f"{nbytes / (1 << 20):g} MiB"
    return f"{nbytes / 1024:g} KiB"
