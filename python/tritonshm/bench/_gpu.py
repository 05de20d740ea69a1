"""``tritonshm bench --gpu``: one identity request from a GPU tensor, every way, two models.

The input is a float32 torch tensor on the GPU and the result is wanted on
the GPU.  Each method runs against the GPU model (``identity_fp32_gpu``,
``python/tritonshm/models_gpu``: KIND_GPU, device tensors in and out) and
the CPU model (``identity_fp32``), all of them in every round, the order
drawn anew each round, so the two models are compared in the same
run under the same noise.  Every call ends with ``torch.cuda.synchronize()``:
a result counts once it is on the device.  Methods:

* peers: ``grpc`` (the tensor to the host, into the message, the reply back
  to the GPU), ``tc-shm`` (tritonclient's system shared-memory utilities),
  ``tc-cuda`` (tritonclient's CUDA shared-memory utilities: regions made and
  registered once, copy in from the tensor, the result copied to a fresh
  GPU tensor);
* tritonshm: ``Client.infer`` (``transport="cuda"``: the torch tensor sent
  by reference -- its allocation registered once -- a fresh torch tensor on
  the GPU out; a row whose pools are not ``cuda:N`` memory, or whose input
  fell back to a copy, is refused, never reported), ``Client.infer out=``
  (the same, the output written by the server into a tensor allocated once),
  ``Client.infer copies`` (``by_reference=False``: the input copied into a
  CUDA slot, as before lending) and ``zero-copy``
  (``Client.request(..., device="cuda:0")``: the input written into the
  device slot untimed, ``run()`` timed, the output a view of the slot);
* reference: ``floor`` (:class:`tritonshm.CudaRegion` registered once, the
  input already in place, the output left on the device: the server's share
  alone).

Results (what ``--json`` writes)::

    {"format": "tritonshm-bench-gpu/1",
     "meta": {sizes, reps, device, torch, server_version, ..., models {name: {where, status}},
              methods {name: {group, description, status}}, peers, ratios},
     "results": [{"nbytes", "elements", "reps", "seconds",
                  "models": {model: {"best_peer", "methods": {name: {"status", "samples_s", "median_s",
                                                                     ..., "vs_best_peer", "vs_floor"}}}}}],
     "targets": [{"name", "model", "nbytes", "value", "target", "met"}]}

Ratios are median time over the reference's median time (below 1 is
faster); the targets are speed ratios (above 1 is faster).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..demo import _size
from ..errors import Error
from ._harness import (DEFAULT_BUDGET, DEFAULT_MAX_REPS, DEFAULT_MIN_REPS, DEFAULT_WARMUP,
                       check_arguments, interleave, method_classes, run_meta, server_version, summarize)
from ._methods import (INPUT, OUTPUT, ClientInfer, Grpc, Method, Setting, TritonclientShm, TwoRegions,
                       _grpc_client)
from ._report import server_note, table_header, table_row
from ._where import Addresses, require_grpc, resolve

#: Identifies the layout of the results (and of ``--json``'s file) of ``bench --gpu``.
GPU_FORMAT = "tritonshm-bench-gpu/1"

#: 64 KiB, 1 MiB, 16 MiB, 64 MiB.
GPU_SIZES = (64 << 10, 1 << 20, 16 << 20, 64 << 20)

GPU_MODEL, CPU_MODEL = "identity_fp32_gpu", "identity_fp32"
#: Model -> where it computes; the order of the table.
GPU_MODELS = {GPU_MODEL: "GPU", CPU_MODEL: "CPU"}

DEVICE = "cuda:0"

#: The Python backend moves device tensors between the server and the model's
#: stub through Triton's CUDA memory pool (64 MiB by default): room for a
#: 64 MiB input and output at once.
CUDA_POOL_BYTES = 1 << 30


def gpu_model_repository() -> Path:
    """The model repository holding ``identity_fp32_gpu`` (not part of the default one)."""
    return Path(__file__).resolve().parent.parent / "models_gpu"


def server_arguments(device: int = 0) -> list[str]:
    """The ``tritonserver`` arguments, beside :class:`~tritonshm.server.LocalServer`'s, of the server
    ``bench --gpu`` starts: the GPU model's repository as a second one, models loaded explicitly
    (only ``identity_fp32`` at start, so that a GPU model that cannot load leaves the server up),
    and a CUDA memory pool large enough for the largest default size."""
    return [f"--model-repository={gpu_model_repository()}", "--model-control-mode=explicit",
            f"--load-model={CPU_MODEL}", f"--cuda-memory-pool-byte-size={device}:{CUDA_POOL_BYTES}"]


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def gpu_missing() -> str | None:
    """Why ``bench --gpu`` cannot run here, in one line (what is missing), or None."""
    from .. import cuda

    problems = []
    info = cuda.runtime_info()
    if not info["available"]:
        problems.append(f"no CUDA GPU is usable ({_one_line(info['error'] or 'no device found')})")
    if importlib.util.find_spec("torch") is None:
        problems.append("torch is not installed (pip install torch)")
    elif info["available"]:
        import torch

        if not torch.cuda.is_available():
            problems.append(f"torch {torch.__version__} has no CUDA (torch.cuda.is_available() is False)")
    if not problems:
        return None
    return "--gpu needs a CUDA GPU and torch with CUDA: " + "; ".join(problems)


def load_gpu_model(url: str) -> str | None:
    """Make sure the server at *url* serves the GPU model, loading it if it can; None when it is
    ready, else why not (one line)."""
    from tritonclient.utils import InferenceServerException

    client = _grpc_client(url)
    try:
        if client.is_model_ready(GPU_MODEL):
            return None
        try:
            client.load_model(GPU_MODEL)
        except InferenceServerException as exc:
            return (f"the server could not load {GPU_MODEL}: {_one_line(exc.message())} (it needs "
                    f"{gpu_model_repository()} among its model repositories, explicit model control or "
                    f"the model loaded at start, and torch with CUDA in the server's Python)")
        if not client.is_model_ready(GPU_MODEL):
            return f"{GPU_MODEL} was loaded but is not ready"
        return None
    finally:
        client.close()


# -- the methods --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GpuSetting(Setting):
    """A :class:`Setting` with the device the input tensor lives on."""

    device: str = DEVICE

    @classmethod
    def of(cls, url: str, model: str, count: int, device: str = DEVICE) -> "GpuSetting":
        return cls(url=url, model=model, datatype="FP32", dtype=np.dtype(np.float32), count=count, device=device)

    @property
    def device_index(self) -> int:
        return int(self.device.partition(":")[2] or 0)


class GpuMethod(Method):
    """A method whose input is a float32 torch tensor on the GPU and whose output is wanted there.

    Subclasses implement :meth:`send`; :meth:`call` (timed) is ``send`` and
    a ``torch.cuda.synchronize()``, so that work a method queued on the
    device counts.
    """

    setting: GpuSetting

    def __init__(self, setting: GpuSetting):
        super().__init__(setting)
        import torch

        self.torch = torch

    @property
    def key(self) -> str:
        return f"{self.setting.model}/{self.name}"

    def call(self, x: Any) -> Any:
        out = self.send(x)
        self.torch.cuda.synchronize(self.setting.device)
        return out

    def send(self, x: Any) -> Any:
        raise NotImplementedError

    def to_device(self, array: np.ndarray) -> Any:
        """A host array's copy on the GPU (a fresh tensor)."""
        with warnings.catch_warnings():  # tritonclient's arrays are read-only: torch warns, copying anyway
            warnings.simplefilter("ignore", UserWarning)
            host = self.torch.from_numpy(array)
        return host.to(self.setting.device)


class GpuGrpc(GpuMethod, Grpc):
    description = ("plain gRPC (tritonclient.grpc): x.cpu().numpy() into the request, the reply's array "
                   "copied to a fresh GPU tensor")

    def send(self, x: Any) -> Any:
        return self.to_device(self.host_call(x.cpu().numpy()))


class GpuTritonclientShm(GpuMethod, TritonclientShm):
    description = ("tritonclient.utils.shared_memory, regions made and registered once: per request "
                   "set_shared_memory_region(x.cpu().numpy()) in, get_contents_as_numpy copied to a fresh "
                   "GPU tensor out")
    tag = "tc-gpu-bench"

    def send(self, x: Any) -> Any:
        # to_device copies: the host view needs no .copy() of its own.
        return self.to_device(self.host_call(x.cpu().numpy()))


class GpuTritonclientCuda(GpuMethod, TwoRegions):
    name = "tc-cuda"
    group = "peer"
    description = ("tritonclient.utils.cuda_shared_memory, regions made and registered once (their "
                   "examples' way): set_shared_memory_region_from_dlpack(x) in, "
                   "torch.from_dlpack(as_shared_memory_tensor(out)).clone() out")
    tag = "tc-cuda-bench"

    @classmethod
    def missing(cls) -> str | None:
        try:
            import tritonclient.utils.cuda_shared_memory  # noqa: F401  (needs cuda-python)
        except Exception as exc:
            return f"tritonclient's CUDA utilities cannot be imported: {_one_line(exc)}"
        return None

    def create_region(self, name: str) -> Any:
        import tritonclient.utils.cuda_shared_memory as cudashm

        return cudashm.create_shared_memory_region(name, self.setting.nbytes, self.setting.device_index)

    def register_region(self, client: Any, name: str, handle: Any) -> None:
        import tritonclient.utils.cuda_shared_memory as cudashm

        s = self.setting
        client.register_cuda_shared_memory(name, cudashm.get_raw_handle(handle), s.device_index, s.nbytes)

    def unregister_region(self, client: Any, name: str) -> None:
        client.unregister_cuda_shared_memory(name)

    def destroy_region(self, handle: Any) -> None:
        import tritonclient.utils.cuda_shared_memory as cudashm

        cudashm.destroy_shared_memory_region(handle)

    def send(self, x: Any) -> Any:
        import tritonclient.utils.cuda_shared_memory as cudashm

        s = self.setting
        cudashm.set_shared_memory_region_from_dlpack(self.handles["in"], [x])
        self.infer()
        out = cudashm.as_shared_memory_tensor(self.handles["out"], s.datatype, [s.count])
        return self.torch.from_dlpack(out).clone()


class GpuClientInfer(GpuMethod, ClientInfer):
    name = "Client.infer"
    group = "tritonshm"
    description = ("tritonshm.Client(url, transport='cuda').infer(model, {name: x}): the torch tensor sent by "
                   "reference (its allocation registered once), a fresh torch tensor on the GPU out "
                   "(copy=True, output_device='auto')")
    #: Whether the client sends GPU tensors by reference (a row of a lending method that copied is refused).
    by_reference = True
    #: Whether a request always goes through a slot pool (an output copied out of one, say).
    uses_pools = True

    def open(self) -> None:
        from ..client import Client

        # transport="cuda": a server that refuses our CUDA memory is an error, never a silent
        # fallback to pinned system slots or the wire timed under this method's name.
        self.client = Client(self.setting.require_grpc(), transport="cuda", by_reference=self.by_reference)

    def send(self, x: Any) -> Any:
        return self.client.infer(self.setting.model, {INPUT: x})[OUTPUT]

    def memory_problem(self) -> str | None:
        """Why this method's timings must not be reported (its pools not in GPU memory, or inputs
        meant to be lent that were copied), or None."""
        memories = sorted({pool.memory for pool in self.client.pools()})
        if (self.uses_pools and not memories) or any(not m.startswith("cuda:") for m in memories):
            return (f"{self.name} ({self.setting.model}) ran through {memories or 'no pool'}, not CUDA "
                    f"slots (cuda:N): refusing to report it")
        stats = self.client.stats()
        if self.by_reference and (stats.copied or not stats.inputs_lent):
            return (f"{self.name} ({self.setting.model}) copied its input instead of sending it by reference "
                    f"({stats.copied or 'nothing lent'}): refusing to report it")
        return None


class GpuClientInferOut(GpuClientInfer):
    name = "Client.infer out="
    description = ("tritonshm.Client(url, transport='cuda').infer(model, {name: x}, out={output: y}): the torch "
                   "tensor sent by reference, the output written by the server into y (allocated once)")
    # Input and output both lent: no slot pool at all (refused as "ran through no pool" on an
    # H200); the lending itself is what its checks ask for, and any pool must still be CUDA slots.
    uses_pools = False

    def open(self) -> None:
        self.out: Any = None
        super().open()

    def send(self, x: Any) -> Any:
        if self.out is None or self.out.shape != x.shape:
            self.out = self.torch.empty_like(x)
        return self.client.infer(self.setting.model, {INPUT: x}, out={OUTPUT: self.out})[OUTPUT]

    def memory_problem(self) -> str | None:
        problem = super().memory_problem()
        if problem is None and not self.client.stats().outputs_lent:
            return f"{self.name} ({self.setting.model}) copied its output into out=: refusing to report it"
        return problem

    def close(self) -> None:
        self.out = None
        super().close()


class GpuClientInferCopies(GpuClientInfer):
    name = "Client.infer copies"
    description = ("tritonshm.Client(url, transport='cuda', by_reference=False).infer(...): the torch tensor "
                   "copied into a CUDA slot, a fresh torch tensor out (the path before lending)")
    by_reference = False


class GpuClientInferViews(GpuClientInfer):
    name = "Client.infer copy=False"
    description = ("tritonshm.Client(url, transport='cuda').infer(model, {name: x}, copy=False): the torch tensor "
                   "sent by reference, the output a view of the CUDA slot the server wrote (holding the slot "
                   "until dropped), taken by torch.from_dlpack: a result with no copy after the answer")

    def send(self, x: Any) -> Any:
        view = self.client.infer(self.setting.model, {INPUT: x}, copy=False)[OUTPUT]
        return self.torch.from_dlpack(view)


class GpuZeroCopy(GpuClientInfer):
    name = "zero-copy"
    group = "tritonshm"
    description = ("tritonshm.Client.request(model, device='cuda:0'): the input written into the device "
                   "slot untimed, req.run() timed, the output a view of the slot (no copy)")
    # Its input is written into the request's own CUDA slot: nothing is lent, by design, so the
    # row's check is only that its pools are CUDA slots (the lending rows keep theirs).
    by_reference = False

    def open(self) -> None:
        self.request = None
        super().open()

    def _release(self) -> None:
        request, self.request = getattr(self, "request", None), None
        if request is not None:
            request.close()

    def stage(self, x: Any) -> None:
        s = self.setting
        self._release()
        self.request = self.client.request(s.model, shapes={INPUT: (s.count,)}, device=s.device)
        self.torch.from_dlpack(self.request.inputs[INPUT]).copy_(x)
        self.torch.cuda.synchronize(s.device)

    def send(self, x: Any) -> Any:
        return self.request.run()[OUTPUT]  # a view of the slot; it holds the slot until dropped

    def close(self) -> None:
        self._release()
        super().close()


class GpuFloor(GpuMethod):
    name = "floor"
    group = "reference"
    description = ("tritonshm.CudaRegion in and out, registered once and bound by hand, the input "
                   "already in place, the output left on the device: the tritonclient infer call alone")

    def open(self) -> None:
        import tritonclient.grpc as grpcclient

        from .. import triton
        from ..cuda import CudaRegion

        s = self.setting
        self.client = _grpc_client(s.require_grpc())
        self.regions: list[Any] = []
        self.registered: list[str] = []
        for _ in range(2):
            self.regions.append(CudaRegion.create(s.nbytes, device=s.device_index))
            self.registered.append(triton.register(self.client, self.regions[-1]))
        self.input = grpcclient.InferInput(INPUT, [s.count], s.datatype)
        triton.bind_input(self.input, self.regions[0])
        self.output = grpcclient.InferRequestedOutput(OUTPUT)
        triton.bind_output(self.output, self.regions[1])
        self.out_view = self.regions[1].view(s.dtype, (s.count,))
        self.staged: Any = None

    def stage(self, x: Any) -> None:
        if x is not self.staged:
            self.regions[0].write(x)
            self.torch.cuda.synchronize(self.setting.device)
            self.staged = x

    def send(self, x: Any) -> Any:
        self.client.infer(self.setting.model, [self.input], outputs=[self.output])
        return self.out_view

    def close(self) -> None:
        from .. import triton

        self.out_view = self.staged = None
        client = getattr(self, "client", None)
        try:
            for name in getattr(self, "registered", ()):
                triton.unregister(client, name)
        finally:
            for region in getattr(self, "regions", ()):
                region.close()
            if client is not None:
                client.close()


#: Every method of ``bench --gpu``, in the order of the table.
GPU_METHODS: tuple[type[GpuMethod], ...] = (GpuGrpc, GpuTritonclientShm, GpuTritonclientCuda, GpuClientInfer,
                                            GpuClientInferOut, GpuClientInferCopies, GpuClientInferViews,
                                            GpuZeroCopy, GpuFloor)
GPU_PEERS = tuple(m.name for m in GPU_METHODS if m.group == "peer")
FLOOR = "floor"

#: (name, model, size, numerator method, denominator method, target): speed of the first
#: over the second's, i.e. the second's median time over the first's, must reach the target.
TARGETS = (
    ("Client.infer >= 1.5x tc-cuda", GPU_MODEL, 16 << 20, "tc-cuda", "Client.infer", 1.5),
    ("Client.infer within 1.2x the floor's time at 64 KiB", GPU_MODEL, 64 << 10, "floor", "Client.infer", 1 / 1.2),
    ("Client.infer within 1.2x the floor's time at 16 MiB", GPU_MODEL, 16 << 20, "floor", "Client.infer", 1 / 1.2),
    ("Client.infer never slower than grpc", GPU_MODEL, 64 << 10, "grpc", "Client.infer", 1.0),
    ("zero-copy within 1.1x the floor's time at 64 KiB", GPU_MODEL, 64 << 10, "floor", "zero-copy", 1 / 1.1),
    ("zero-copy within 1.1x the floor's time at 16 MiB", GPU_MODEL, 16 << 20, "floor", "zero-copy", 1 / 1.1),
    ("zero-copy never slower than grpc", GPU_MODEL, 64 << 10, "grpc", "zero-copy", 1.0),
)


# -- checks and statistics ----------------------------------------------------------------------------


def sample_tensor(torch: Any, count: int, seed: int, device: str = DEVICE) -> Any:
    """*count* reproducible float32 values on *device* (no NaN, so equality is exact)."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    x = torch.randn(count, device=device, dtype=torch.float32, generator=generator)
    torch.cuda.synchronize(device)
    return x


def device_output_problem(label: str, nbytes: int, out: Any, expected: Any) -> str | None:
    """What is wrong with *out* (a torch tensor, or any DLPack device array), the identity model's
    answer to the GPU tensor *expected*; None if it is *expected* bit for bit, on the same device."""
    import torch

    where = f"{label}, {_size(nbytes)}"
    if not isinstance(out, torch.Tensor):
        try:
            out = torch.from_dlpack(out)
        except Exception as exc:
            return f"{where}: the output, a {type(out).__name__}, is not an array torch can take ({_one_line(exc)})"
    if out.device != expected.device:
        return f"{where}: the output is on {out.device}, not on {expected.device} like the input"
    if out.dtype != expected.dtype or tuple(out.shape) != tuple(expected.shape):
        return (f"{where}: the output is {out.dtype} {list(out.shape)}, not {expected.dtype} "
                f"{list(expected.shape)} like the input")
    got, sent = out.reshape(-1).view(torch.int32), expected.reshape(-1).view(torch.int32)
    if torch.equal(got, sent):
        return None
    wrong = (got != sent).nonzero().flatten()
    first = int(wrong[0])
    return (f"{where}: the identity model's output differs from its input at {wrong.numel()} of "
            f"{out.numel()} elements, first at [{first}]: got {out.reshape(-1)[first].item()!r}, "
            f"sent {expected.reshape(-1)[first].item()!r}")


def _model_ratios(methods: dict[str, dict[str, Any]]) -> str | None:
    """Add each method's ratios to one model's results at one size; return the best peer."""
    peers = {p: methods[p]["median_s"] for p in GPU_PEERS if methods.get(p, {}).get("status") == "ok"}
    best = min(peers, key=peers.__getitem__) if peers else None
    floor = methods.get(FLOOR, {}).get("median_s") if methods.get(FLOOR, {}).get("status") == "ok" else None
    for result in methods.values():
        if result.get("status") == "ok":
            result["vs_best_peer"] = result["median_s"] / peers[best] if best else None
            result["vs_floor"] = result["median_s"] / floor if floor else None
    return best


def targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The targets of the GPU path against this run's results; ``met`` is None where the run
    lacks what a target needs (that size, model or method)."""
    out = []
    for name, model, nbytes, reference, method, target in TARGETS:
        value = None
        for entry in results:
            if entry["nbytes"] != nbytes or model not in entry["models"]:
                continue
            methods = entry["models"][model]["methods"]
            if all(methods.get(m, {}).get("status") == "ok" for m in (reference, method)):
                value = methods[reference]["median_s"] / methods[method]["median_s"]
        out.append({"name": name, "model": model, "nbytes": nbytes, "value": value, "target": target,
                    "met": None if value is None else value >= target})
    return out


def run_gpu(url: str | None, sizes: Sequence[int] = GPU_SIZES, *, reps: int | None = None,
            min_reps: int = DEFAULT_MIN_REPS, max_reps: int = DEFAULT_MAX_REPS, budget: float = DEFAULT_BUDGET,
            warmup: int = DEFAULT_WARMUP, methods: Sequence[type[GpuMethod]] | None = None,
            models: Sequence[str] = tuple(GPU_MODELS), seed: int = 0,
            progress: Callable[[str], None] | None = None, server: str = "given") -> dict[str, Any]:
    """Measure every GPU method against every model of *models* at every size (server at *url*).

    The GPU model is loaded if the server does not serve it yet; if it
    cannot be, that half is skipped (the reason is in
    ``meta["models"]``) and the CPU model's half still runs.  Raises
    :class:`~tritonshm.errors.Error` (one line) if CUDA or torch is missing,
    the server cannot be reached or serves no ``identity_fp32``;
    :class:`~tritonshm.bench.WrongOutput` if an output differs from its input.
    """
    from .. import cuda

    check_arguments(sizes, dtype="fp32", reps=reps, min_reps=min_reps, max_reps=max_reps, budget=budget,
                    warmup=warmup)
    unknown = [m for m in models if m not in GPU_MODELS]
    if unknown or not models:
        raise ValueError(f"models must be some of {', '.join(GPU_MODELS)}, not {list(models)}")
    problem = gpu_missing()
    if problem:
        raise Error(problem)
    import torch

    url = require_grpc(resolve(url, None), "--gpu")
    classes, missing, runnable = method_classes(GPU_METHODS if methods is None else methods)
    version = server_version(Addresses(url, None), CPU_MODEL if CPU_MODEL in models else None)
    model_status = {m: "ok" for m in models}
    if GPU_MODEL in models:
        why = load_gpu_model(url)
        if why is not None:
            model_status[GPU_MODEL] = f"skipped: {why}"
            if progress is not None:
                progress(f"{GPU_MODEL} skipped: {why}")
    active = [m for m in models if model_status[m] == "ok"]

    results = []
    for index, nbytes in enumerate(sizes):
        count = nbytes // 4
        started = time.perf_counter()
        instances = [cls(GpuSetting.of(url, model, count)) for model in active for cls in runnable]

        def check(method: Method, out: Any, x: Any) -> str | None:
            if isinstance(method, GpuClientInfer):
                problem = method.memory_problem()
                if problem is not None:
                    return problem
            return device_output_problem(f"{method.name} ({method.setting.model})", nbytes, out, x)

        measured = interleave(instances, sample_tensor(torch, count, seed + index),
                              sample_tensor(torch, count, seed + index + 1_000_003), check, reps=reps,
                              min_reps=min_reps, max_reps=max_reps, budget=budget, warmup=warmup)
        entry: dict[str, Any] = {"nbytes": nbytes, "elements": count, "reps": measured["reps"],
                                 "seconds": time.perf_counter() - started, "models": {}}
        for model in active:
            per_method = {}
            for c in classes:
                key = f"{model}/{c.name}"
                why = missing[c.name] or measured["unavailable"].get(key)
                per_method[c.name] = ({"status": why, "samples_s": []} if why is not None
                                      else summarize(measured["times"][key]))
            entry["models"][model] = {"best_peer": _model_ratios(per_method), "methods": per_method}
        results.append(entry)
        if progress is not None:
            progress(f"{_size(nbytes)}: {entry['reps']} repetitions in {entry['seconds']:.1f} s, outputs checked")

    info = cuda.runtime_info()
    statuses: dict[str, str] = {c.name: missing[c.name] or "ok" for c in classes}
    for entry in results[:1]:
        for model_results in entry["models"].values():
            for name, res in model_results["methods"].items():
                if res["status"] != "ok":
                    statuses[name] = res["status"]
    meta = {
        "datatype": "FP32",
        "device": DEVICE,
        "gpu": (info["devices"][0].get("name") if info["devices"] else None),
        "cuda_runtime": info["runtime_version"], "cuda_driver": info["driver_version"],
        "torch": torch.__version__,
        **run_meta(sizes, results, reps=reps, min_reps=min_reps, max_reps=max_reps, budget=budget,
                   warmup=warmup, url=url, server=server, server_version=version),
        "models": {m: {"where": GPU_MODELS[m], "status": model_status[m]} for m in models},
        "methods": {c.name: {"group": c.group, "description": c.description, "status": statuses[c.name]}
                    for c in classes},
        "peers": [p for p in GPU_PEERS if p in statuses],
        "ratios": "median time / the reference's median time (below 1: faster than the reference); "
                  "targets: speed ratios (above 1: faster)",
    }
    return {"format": GPU_FORMAT, "meta": meta, "results": results, "targets": targets(results)}


# -- the table ----------------------------------------------------------------------------------------


def format_gpu_table(results: dict[str, Any]) -> str:
    """``bench --gpu``'s results as a readable table: per size, one block per model."""
    meta = results["meta"]
    lines = [
        f"identity from a GPU tensor ({meta['datatype']}, {meta['device']}: {meta['gpu']}), result wanted on "
        f"the GPU; {server_note(meta)}",
        f"tritonshm {meta['tritonshm_version']}, torch {meta['torch']}, CUDA runtime {meta['cuda_runtime']}, "
        f"driver {meta['cuda_driver']}; repetitions interleaved: every method and model once per round, "
        f"in an order drawn anew each round",
        "ms per request: median and p25-p75; '/best peer' and '/floor': median time divided by that "
        "reference's, same model and size (below 1 = faster)",
        f"peers: {', '.join(meta['peers'])}; models: "
        + ", ".join(f"{m} ({v['where']})" for m, v in meta["models"].items()),
    ]
    for model, v in meta["models"].items():
        if v["status"] != "ok":
            lines.append(f"{model}: {v['status']}")
    header = table_header("    ", 14, "floor")
    for entry in results["results"]:
        nbytes = entry["nbytes"]
        lines += ["", f"{_size(nbytes)} ({entry['elements']} x {meta['datatype']}), {entry['reps']} repetitions"]
        for model, block in entry["models"].items():
            lines += [f"  {model} ({meta['models'][model]['where']}), best peer: {block['best_peer'] or '-'}",
                      header]
            for name, res in block["methods"].items():
                if res["status"] != "ok":
                    lines.append(f"    {name:<14} {res['status']}")
                    continue
                lines.append(table_row("    ", 14, name, res, nbytes, "vs_floor"))
    lines += ["", "targets (speed ratios, GPU model):"]
    for t in results["targets"]:
        if t["met"] is None:
            verdict, value = "not measured in this run", ""
        else:
            verdict, value = ("met" if t["met"] else "MISSED"), f"{t['value']:.2f}x"
        lines.append(f"  {t['name']:<40} at {_size(t['nbytes']):>7}: {value:>7} {verdict}")
    return "\n".join(lines)


def gpu_description() -> str:
    """The ``--help`` text about ``--gpu``'s methods."""
    import textwrap

    lines = ["With --gpu: the input is a float32 torch tensor on the GPU and the result is wanted there; "
             "each method", f"runs against {GPU_MODEL} (KIND_GPU) and {CPU_MODEL}, side by side. Methods:", ""]
    for m in GPU_METHODS:
        lines += textwrap.wrap(m.description, 100, initial_indent=f"  {m.name:<18} ", subsequent_indent=" " * 21)
    return "\n".join(lines) + "\n"


__all__ = ["GPU_FORMAT", "GPU_SIZES", "GPU_METHODS", "GPU_MODEL", "CPU_MODEL", "run_gpu", "format_gpu_table",
           "gpu_missing", "gpu_model_repository", "server_arguments", "load_gpu_model", "targets",
           "device_output_problem"]
