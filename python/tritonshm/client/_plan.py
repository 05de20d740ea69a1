"""What one request is: its checked inputs and outputs, and the route of its tensors.

:class:`Routing` is the client's choice of memory for a request's slots
(host, pinned or CUDA, by the transport and the inputs' device) and of where
its results land; :class:`Route` is that choice for one request, and
:class:`Plan` the whole request, made once and passed whole through the
runner's steps.  :class:`Planner` makes them: a call's checks (inputs,
outputs, options for the client's protocol), its chunks and its route --
functions of the call and of the client's settings, no I/O.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, NamedTuple, Sequence

from ..errors import DecoupledModel, DTypeMismatch, InvalidOption, InvalidOptionType, ShapeMismatch
from . import _devices, _intake
from ._devices import DeviceTensor, OutTensor, Placement
from ._fallback import Fallback
from ._model import ModelInfo, shape_fits
from ._options import RequestOptions, check_slot_timeout
from ._slots import SYSTEM, SlotKind

__all__ = ["Plan", "Planner", "Route", "Routing"]


class Route(NamedTuple):
    """Where one request's tensors go: *memory* is what its slots are made of,
    *results* where its outputs land, *device* the GPU whose copy stream
    carries its copies (None: no GPU involved), and whether its GPU tensors
    are *lent* (sent by reference where their memory can be: :mod:`._lent`)."""

    memory: SlotKind
    results: Placement
    device: int | None = None
    lent: bool = False


class Plan(NamedTuple):
    """One request, checked and routed once: what each chunk of its batch runs with."""

    info: ModelInfo
    chunks: list[dict[str, Any]]   # the checked inputs, in chunks of at most max_batch_size
    names: list[str]               # the outputs asked for
    route: Route
    copy: bool                     # results copied out (False: views of the slot)
    slot_timeout: float | None     # how long a chunk waits for a slot, in seconds
    options: RequestOptions | None = None  # what the server is told besides the tensors (None: nothing)
    out: Mapping[str, OutTensor] | None = None  # results the caller allocated, by output name

    @property
    def results_in_place(self) -> bool:
        """Whether results copied to the caller (*copy*) may be the slot the server wrote them in:
        tritonshm's own :class:`~tritonshm.CudaArray`\\ s on the GPU of the request's CUDA slots.  The
        result holds the slot (as a ``copy=False`` view does) and nothing is copied after the answer;
        torch and cupy results are the caller's library's memory, copied there (their streams order
        what runs on them, which a view of ours cannot follow)."""
        memory = self.route.memory
        return self.copy and memory.on_gpu and self.route.results == (memory.device, "tritonshm")


@dataclasses.dataclass(frozen=True)
class Routing:
    """How a client routes requests: its *transport*, the GPU whose CUDA slots carry host
    inputs on ``transport="cuda"`` (*default_device*), whether its host slots are
    *pinned* (then they also carry GPU inputs of models with BYTES tensors), and whether
    GPU tensors are sent *by_reference* where their memory can be."""

    transport: str
    default_device: int
    pinned: bool
    by_reference: bool = True

    def route(self, info: ModelInfo, arrays: Mapping[str, Any], output_device: Any) -> Route:
        """Which slots a request uses and where its results land.

        GPU inputs go through CUDA slots on their device (host slots for
        models with BYTES tensors, or once the server refused our CUDA
        memory); host inputs through host slots, unless the transport is
        "cuda".  Results land where the inputs were (``output_device="auto"``)
        or where asked, allocated by the inputs' library.
        """
        source, library = None, "tritonshm"
        for array in arrays.values():
            if isinstance(array, DeviceTensor):
                if source is None:
                    source, library = array.device, array.library
                elif array.device != source:
                    raise InvalidOption(f"the inputs of one request must be on one GPU, not on "
                                        f"cuda:{source} and cuda:{array.device}")
        if output_device == "auto":
            target = source
        elif output_device == "cuda" and source is not None:
            target = source
        else:
            target = _devices.parse_device(output_device, "output_device")
        results = Placement(target, library)
        home = source if source is not None else target  # whose copy stream carries the copies
        if self.transport == "cuda":
            if info.has_bytes:
                raise InvalidOption(f"model {info.name!r} has BYTES tensors, which transport='cuda' "
                                    f"cannot carry; use transport='auto'")
            device = home if home is not None else self.default_device
            return Route(SlotKind.cuda(device), results, device, self.by_reference)
        # Lent (by_reference) on every route: GPU inputs and out= results are named where they
        # are whatever the slots are made of (a request may name regions of both kinds).
        if source is None:
            return Route(SYSTEM, results, home, self.by_reference)
        if info.has_bytes:
            return Route(SYSTEM if self.pinned else SlotKind.pinned(source), results, home, self.by_reference)
        return Route(SlotKind.cuda(source), results, home, self.by_reference)

    def request_memory(self, info: ModelInfo, device: Any) -> SlotKind:
        """The slots of a zero-copy request whose views should be on *device*."""
        if device is None:
            kind = SlotKind.cuda(self.default_device) if self.transport == "cuda" else SYSTEM
        else:
            target = _devices.parse_device(device, "device")
            if target is None and self.transport == "cuda":
                raise InvalidOption("device='cpu' asks for host slots, which transport='cuda' never uses")
            kind = SYSTEM if target is None else SlotKind.cuda(target)
        if kind != SYSTEM and info.has_bytes:
            raise InvalidOption(f"model {info.name!r} has BYTES tensors, which travel in host slots only: "
                                f"request() it without device=")
        return kind


class Planner:
    """The plans of one client's calls (see the module): checked for its protocol (*wire*,
    *url*), routed by its *routing*, waiting *slot_timeout* seconds for a slot unless a call
    says otherwise, its *default_options* under every call's; *fallback* says whether the
    server took our memory at all."""

    def __init__(self, routing: Routing, wire: Any, url: str, fallback: Fallback, slot_timeout: float | None,
                 default_options: RequestOptions | None):
        self.routing = routing
        self.wire = wire
        self.url = url
        self.fallback = fallback
        self.slot_timeout = slot_timeout
        #: Every request's options start from these (a client-wide header for a gateway's auth;
        #: None: none).
        self.default_options = default_options

    def slot_wait(self, slot_timeout: float | None) -> float | None:
        """How long one call waits for a slot: its own *slot_timeout* (checked), else the client's."""
        return self.slot_timeout if slot_timeout is None else check_slot_timeout(slot_timeout)

    @staticmethod
    def refuse_lease_options(given: Mapping[str, Any]) -> None:
        """``request()`` leases a slot and sends nothing: request options (``timeout``, the
        server's, included) belong to its ``run()``."""
        if given:
            raise InvalidOptionType(
                f"request() takes no request options ({', '.join(sorted(given))}): give them to its run(), "
                f"which sends the request (timeout= there is the server's, in microseconds); request()'s "
                f"wait for a slot, in seconds, is slot_timeout=")

    def request_options(self, given: Mapping[str, Any]) -> RequestOptions | None:
        """The options of one call, checked for this client's protocol before anything is sent:
        its keyword arguments (tritonclient's names and meanings: ``timeout`` is the server's, in
        microseconds) and ``options=`` (a :class:`RequestOptions`), over the client's defaults.
        None when there are none."""
        defaults = self.default_options
        if not given:
            return defaults
        given = dict(given)
        base = given.pop("options", None)
        if "server_timeout" in given:
            raise InvalidOptionType(f"server_timeout is now timeout={given['server_timeout']!r} (the server's "
                                    f"timeout in microseconds, as in tritonclient); the wait for a slot, in "
                                    f"seconds, is slot_timeout")
        options = RequestOptions.of(base, **given)
        if not options.given:
            # Nothing asked (options=RequestOptions(), as tritonshm.grpc / .http pass every call):
            # the same as no options, so such a call keeps the quick path and the prepared message.
            return defaults
        if defaults is not None:
            options = defaults.merged(options)
        if self.wire.http:
            options.http_infer_kwargs()
            if options.client_timeout is not None:
                raise InvalidOption("client_timeout needs gRPC: tritonclient.http has no per-request client "
                                    "timeout (give the connection's network_timeout in connect_options)")
        else:
            options.grpc_infer_kwargs()
        return options

    def plan(self, info: ModelInfo, inputs: Mapping[str, Any], outputs: Sequence[str] | None,
             copy: bool, output_device: Any = "auto", slot_timeout: float | None = None,
             options: RequestOptions | None = None, streamed: bool = False,
             out: Mapping[str, Any] | None = None) -> Plan:
        """The request's :class:`Plan`: checked inputs split into chunks of at most
        ``max_batch_size``, the output names, the route of its tensors, the wait
        for a slot (*slot_timeout*, default the client's), and the results the caller
        allocated (*out*: output name -> GPU tensor, written in place)."""
        arrays, batch = _intake.check_inputs(info, inputs)
        names = _intake.output_names(info, outputs)
        if info.decoupled and not streamed:
            raise DecoupledModel(f"model {info.name!r} is decoupled (any number of responses per request): "
                                 f"Triton answers it over a gRPC stream only; use stream()")
        chunks = _intake.split_batch(info, arrays, batch)
        if len(chunks) > 1 and not copy:
            raise InvalidOption(
                f"copy=False needs one slot, but a batch of {batch} on model {info.name!r} "
                f"(max_batch_size {info.max_batch_size}) spans several; use copy=True or smaller batches"
            )
        route = self.routing.route(info, arrays, output_device)
        given = _devices.capture_out(out)
        if given:
            _intake.check_out(info, given, names, chunks, route.results, copy)
        return Plan(info, chunks, names, route, copy, self.slot_wait(slot_timeout), options,
                    given or None)

    def stream_plan(self, info: ModelInfo, inputs: Mapping[str, Any], outputs: Sequence[str] | None,
                    output_device: Any = "auto", slot_timeout: float | None = None,
                    options: RequestOptions | None = None) -> Plan:
        """The :class:`Plan` of a streamed request: one request (never split: a decoupled model's
        responses belong to the request that asked), outputs copied out of each response."""
        if self.wire.http:
            raise InvalidOption(f"streaming needs gRPC (Triton streams only over ModelStreamInfer), "
                                f"but this client's URL {self.url!r} is HTTP")
        plan = self.plan(info, inputs, outputs, True, output_device, slot_timeout, options, streamed=True)
        if len(plan.chunks) > 1:
            rows = sum(len(next(iter(chunk.values()))) for chunk in plan.chunks)
            raise ShapeMismatch(f"a streamed request is one request: model {info.name!r} takes at most "
                                f"max_batch_size={info.max_batch_size} rows, not {rows}")
        return plan

    def request_shapes(self, info: ModelInfo, batch_size: int | None,
                       shapes: Mapping[str, Sequence[int]] | None) -> dict[str, tuple[int, ...]]:
        """Checked full input shapes of a zero-copy request."""
        if info.decoupled:
            raise DecoupledModel(f"model {info.name!r} is decoupled: Triton answers it over a gRPC stream "
                                 f"only; use stream()")
        if self.fallback.wire:
            raise InvalidOption("request() needs shared memory, but this client is on the wire transport")
        given = {k: tuple(v) for k, v in (shapes or {}).items()}
        if info.batched:
            if isinstance(batch_size, bool) or not isinstance(batch_size, int) \
                    or not 1 <= batch_size <= info.max_batch_size:
                raise ShapeMismatch(
                    f"model {info.name!r} batches up to {info.max_batch_size}: "
                    f"give 1 <= batch_size <= {info.max_batch_size}, not {batch_size}"
                )
        elif batch_size is not None:
            raise ShapeMismatch(f"model {info.name!r} does not batch: leave batch_size out")
        full: dict[str, tuple[int, ...]] = {}
        for spec in info.inputs:
            if spec.is_bytes:
                raise DTypeMismatch(f"input {spec.name!r} is BYTES, which request() cannot view; use infer()")
            want = info.shape_of(spec, batch_size or 1)
            shape = given.get(spec.name) or want
            if not shape_fits(want, shape) or any(s < 0 for s in shape):
                raise ShapeMismatch(
                    f"input {spec.name!r} of model {info.name!r} needs a shape like {list(want)} "
                    f"(give variable dims with shapes=), got {list(shape)}"
                )
            full[spec.name] = tuple(shape)
        return full

