"""The engine each client holds: state, pools and every request's steps.

:class:`Engine` holds what a client knows (models, pools, the transport)
and writes each operation as sans-I/O steps (:mod:`._steps`).  It never
talks to the server itself: :class:`~tritonshm.Client` holds one and
drives its steps with blocking calls and threads, :class:`tritonshm.aio.Client`
holds one and drives them with asyncio.  So discovery, slot pools, routing
(host or CUDA slots, where results land), BYTES serialisation, output
growth, re-registration and the fallbacks exist once.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import threading
import time
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

from .. import _http1, _transport
from ..errors import (
    ClientClosed,
    DTypeMismatch,
    InvalidOption,
    InvalidOptionType,
    OutputTooSmall,
    RegionNotRegistered,
    ServerError,
    ShapeMismatch,
    SharedMemoryRefused,
    TensorInUse,
    UNKNOWN_MODEL,
    unknown_model,
)
from . import _bytes, _devices, _intake, _messages
from ._claim import Claim, Claims, Span, server_answered
from ._devices import DeviceTensor, OutTensor, Placement
from ._fallback import Fallback
from ._lent import LentAllocations, LentInfo, LentStats
from ._model import ModelInfo, shape_fits
from ._options import RequestOptions, check_slot_timeout
from ._plan import Plan, Routing
from ._pool import ByteBudget, Lease, PoolInfo, SlotPool, register_again_steps
from ._disposal import Disposals
from ._pools import PoolTable, host_memory
from ._slots import SYSTEM, SlotKind, SlotMemory
from ._steps import Emit, FetchModel, FetchModelNames, NextResponse, Pause, Send, Steps, StreamSend, WaitForDevice

__all__ = ["Engine", "InferRun", "TRANSPORTS", "engine_setting"]

TRANSPORTS = ("auto", "shm", "wire", "cuda")
_GROW_ATTEMPTS = 3  # runs of one request while growing undersized outputs
_CLASH_POLL = 0.005  # how often a request waiting for clashing memory to be let go of looks again
_QUICK_BYTES = 1 << 20  # requests up to this many input bytes may take the quick path
_QUICK_PLANS = 256      # quick plans kept (one per model, outputs and input shapes and dtypes)
_NAMES: Any = object()  # a streamed request asks for its plan's outputs by name (not for objects given)


class QuickPlan(NamedTuple):
    """A small request seen before, checked then: the same model, outputs and input dtypes
    and shapes need no checking, planning or routing again (see :meth:`Engine.quick_steps`)."""

    plan: Plan                       # the plan made when it was first seen (its chunk: those inputs)
    key: tuple[str, str, SlotKind]   # its pool's key
    needs: dict[str, int]            # what a slot of that pool must hold


class InferRun(NamedTuple):
    """An ``infer`` call's steps (:meth:`Engine.infer_steps`): one :class:`Steps` per chunk, to be
    driven at once where there are several, and *join*, which makes the call's result of
    theirs (None: one chunk, whose result is the call's)."""

    steps: list[Steps]
    join: Callable[[list[dict[str, Any]]], dict[str, Any]] | None = None


class _InFlight:
    """``with engine._flight():`` -- one request in flight for the block.  A plain context
    manager (a request enters several times: a contextlib generator costs microseconds);
    close() is woken only once the client is closing."""

    __slots__ = ("_engine",)

    def __init__(self, engine: "Engine"):
        self._engine = engine

    def __enter__(self) -> None:
        engine = self._engine
        with engine._lock:
            engine._in_flight += 1

    def __exit__(self, *exc_info: Any) -> None:
        engine = self._engine
        with engine._lock:
            engine._in_flight -= 1
            if engine._in_flight == 0 and engine._closed:
                engine._idle.notify_all()


class _QuickSlot(NamedTuple):
    """One slot made ready for quick requests of some input shapes: views of its inputs
    and of its outputs' bytes."""

    inputs: list[tuple[str, np.ndarray]]
    outputs: list[tuple[str, Any, np.ndarray]]


def engine_setting(name: str, doc: str) -> property:
    """A read-only property of a client that reads its engine's setting *name*."""
    return property(lambda client: getattr(client._engine, name), doc=doc)


class Engine:
    """What a client knows and the steps of everything it does, held by a driver.

    The blocking :class:`~tritonshm.Client` and :class:`tritonshm.aio.Client`
    each hold one engine and carry out its steps their own way; the engine
    holds no reference to either (a forgotten client's finalizer holds the
    engine, to release what it registered).  Its methods without a leading
    underscore are what the drivers and requests use.
    """

    def __init__(self, url: str = "localhost:8001", *, aio: bool = False, transport: str = "auto",
                 slots: int = 4, max_pool_bytes: int = 1 << 30, slot_timeout: float | None = 60.0,
                 verbose: bool = False, connect_options: Mapping[str, Any] | None = None,
                 pinned: bool | int = False, headers: Mapping[str, str] | None = None,
                 by_reference: bool = True, max_lent_bytes: int = 2 << 30):
        if transport not in TRANSPORTS:
            raise InvalidOption(f"transport must be one of {TRANSPORTS}, not {transport!r}")
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise InvalidOption(f"slots must be an int >= 1, not {slots!r}")
        slot_timeout = check_slot_timeout(slot_timeout)
        if not isinstance(by_reference, bool):
            raise InvalidOption(f"by_reference must be True or False, not {by_reference!r}")
        if isinstance(max_lent_bytes, bool) or not isinstance(max_lent_bytes, int) or max_lent_bytes < 0:
            raise InvalidOption(f"max_lent_bytes must be an int >= 0, not {max_lent_bytes!r}")
        # Every request's options start from these (a client-wide header for a gateway's auth).
        self._default_options = None if headers is None else RequestOptions.of(headers=headers)
        make_host_memory = host_memory(pinned)
        if transport == "cuda":
            _devices.require_cuda("transport='cuda'")
        self.routing = Routing(transport, 0 if isinstance(pinned, bool) else pinned, pinned is not False, by_reference)
        self.aio = aio
        self.url = url
        self.transport = transport
        self.slot_timeout = slot_timeout
        self.wire, self._address, self._ssl = _transport.parse_url(url, aio=aio)
        # What the server has shown it cannot open, and so how requests travel (its only writer).
        self.fallback = Fallback(transport, "HTTP" if self.wire.http else "gRPC")
        self._verbose = verbose
        self._connect_options = dict(connect_options or {})
        self._lock = threading.RLock()
        self._models: dict[tuple[str, str], ModelInfo] = {}
        # Letting go of memory, the one way (a forked child must not unregister our names).
        self.disposals = Disposals(os.getpid())
        # The slot pools, by model, version and memory, and the budget they share.
        self.pool_table = PoolTable(slots, max_pool_bytes, make_host_memory, self.routing.pinned, self.fallback,
                                    self.disposals, self._lock, self.check_open)
        # The caller's GPU allocations registered to send its tensors by reference (beside the pools).
        self._lent = LentAllocations(max_lent_bytes, self.disposals, self.fallback)
        # The caller's memory that unfinished requests name (a request that would clash waits).
        self._claims = Claims()
        # Requests between their first step and their last: close() lets them finish first.
        self._in_flight = 0
        self._idle = threading.Condition(self._lock)
        self._in_flight_counter = _InFlight(self)
        self._quick_plans: dict[tuple, QuickPlan] = {}  # small requests seen before, by signature
        self._closed = False

    @property
    def connect(self) -> Callable[[], Any]:
        """Makes a new tritonclient client of this engine's flavour, TLS and
        verbosity included; it holds no reference to the engine."""
        return functools.partial(self.wire.connect, self._address, ssl=self._ssl,
                                 verbose=self._verbose, options=self._connect_options)

    @property
    def endpoint(self) -> _http1.Endpoint | None:
        """Where inference requests go straight on a socket of the sending thread's
        (see :mod:`tritonshm._http1`): plain HTTP only; None over gRPC, TLS or with *verbose*
        (which prints tritonclient's requests), which all go through tritonclient."""
        if not self.wire.http or self._ssl or self._verbose:
            return None
        return _http1.Endpoint.parse(self._address, self._connect_options)

    @property
    def by_reference(self) -> bool:
        """Whether GPU tensors are sent where they are (the routing's choice)."""
        return self.routing.by_reference

    @property
    def max_lent_bytes(self) -> int:
        """The bound on the caller's GPU allocations registered (the lent table's)."""
        return self._lent.max_bytes

    @property
    def lock(self) -> threading.RLock:
        """Guards the engine's tables; a driver takes it to keep its own state in step."""
        return self._lock

    @property
    def closed(self) -> bool:
        """Whether the client stopped taking requests (see :meth:`stop_accepting`)."""
        return self._closed

    def stop_accepting(self) -> bool:
        """Refuse new requests from now on; False if that was already so (close is idempotent)."""
        with self._lock:
            was_open, self._closed = not self._closed, True
        return was_open

    def check_open(self) -> None:
        """Raise :class:`ClientClosed` once the client stopped taking requests."""
        if self._closed:
            raise ClientClosed(f"{self.describe()} is closed")

    def describe(self) -> str:
        """The client's repr: its flavour, URL and state."""
        state = "closed" if self._closed else self.fallback.describe()
        kind = "aio.Client" if self.aio else "Client"
        return f"<tritonshm.{kind} {self.url!r} {state}>"

    # -- discovery --------------------------------------------------------

    def cached_model(self, model: str, version: str) -> ModelInfo | None:
        """What the server said about *model* before, if it was asked (no I/O)."""
        return self._models.get((model, version))

    def model_steps(self, model: str, version: str) -> Steps:
        """What the server says about *model* (cached per model and version)."""
        key = (model, version)
        info = self._models.get(key)
        if info is None:
            if not isinstance(model, str) or not model:
                raise InvalidOption(f"a model name must be a non-empty str, not {model!r}")
            try:
                metadata, config = yield FetchModel(model, version)
            except ServerError as exc:
                if not UNKNOWN_MODEL.search(str(exc)):
                    raise
                try:  # say which models the server has
                    names = yield FetchModelNames()
                except ServerError:
                    raise exc from None
                raise unknown_model(exc, model, names) from exc
            info = ModelInfo.from_server(metadata, config, version)
            with self._lock:
                self._models[key] = info
        return info

    # -- pools ------------------------------------------------------------

    @property
    def slots(self) -> int:
        """The slots a pool starts with."""
        return self.pool_table.slots

    @property
    def max_pool_bytes(self) -> int:
        """The most slot memory the client holds at any instant."""
        return self.pool_table.max_pool_bytes

    @property
    def budget(self) -> ByteBudget:
        """The bytes every pool's extents take together (never over max_pool_bytes)."""
        return self.pool_table.budget

    def pools(self) -> list[PoolInfo]:
        """What this client holds now: one snapshot per slot pool in service
        (model, version, the memory its slots are in, slots running and held,
        registered bytes and region names).  No I/O."""
        return self.pool_table.snapshot()

    def _has_disposals(self) -> bool:
        """Whether the pools or the lent table have something to let go of, or parked memory
        is due to be asked about again."""
        return self.pool_table.has_disposals() or self._lent.has_disposals()

    def _dispose_steps(self) -> Steps:
        """Unregister and close what the lent table let go of, the pools' idle surplus and
        drained retired pools, and parked extents when due."""
        yield from self._lent.drop_steps(self._lent.take_disposals())
        yield from self.pool_table.dispose_steps()

    def release_steps(self, settle: float) -> Steps:
        """The client is closing: every pool is out of service now; the steps unregister and
        close all they held, then ask again for up to *settle* seconds to unregister what the
        server refused (it answers a request before it lets go of the request's regions).
        What it still refuses then is for :meth:`hold_refused`."""
        drop = self.pool_table.close_steps()  # every pool out of service now
        # Every lent allocation, those of requests still in flight (close() stopped waiting for
        # them) too: unregistering is refused while they run, so they are parked, held, meanwhile.
        lent = self._lent.forget(in_use_too=True)

        def steps() -> Steps:
            yield from self.disposals.retry_steps()
            yield from drop
            yield from self._lent.drop_steps(lent)
            yield from self.disposals.settle_steps(settle)

        return steps()

    def forget_steps(self) -> Steps:
        """Unregister and let go of every lent allocation no request names now (the others as
        their requests finish): their owners (torch's, cupy's allocators) may free them then."""
        return self._lent.drop_steps(self._lent.forget())

    def lent(self) -> list[LentInfo]:
        """The caller's allocations registered now, to send its GPU tensors by reference. No I/O."""
        return self._lent.snapshot()

    def lent_stats(self) -> LentStats:
        """How GPU tensors travelled: by reference or copied (and why), and the requests given up
        on whose memory is still held for the server. No I/O."""
        return dataclasses.replace(self._lent.stats(), awaiting_server=self._claims.awaiting())

    def hold_refused(self) -> None:
        """After :meth:`release_steps`: close parked host memory, and hold device memory the
        server still refuses to let go of for the life of the process (never freed under it)."""
        self.disposals.give_up()

    # -- requests in flight -----------------------------------------------

    def _flight(self) -> "_InFlight":
        """Count one request in flight for its duration (generator steps: until they end or close)."""
        return self._in_flight_counter

    @property
    def in_flight(self) -> int:
        """Requests between their first step and their last."""
        return self._in_flight

    def wait_idle(self, timeout: float | None) -> bool:
        """Block until no request is in flight (True), or *timeout* seconds passed (False)."""
        with self._lock:
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout)

    # -- requests ---------------------------------------------------------

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
        defaults = self._default_options
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
            raise InvalidOption(f"model {info.name!r} is decoupled (any number of responses per request): "
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

    def chunk_steps(self, plan: Plan, arrays: Mapping[str, Any], rows: _intake.Rows | None = None) -> Steps:
        """Steps of one chunk of *plan* (its *arrays* fit a slot): lease, copy in, run,
        collect (fixed-size outputs into *rows* of a chunked batch's results, when given).

        What the server may touch -- the slot, the tensors lent -- is held by the chunk's
        :class:`~._claim.Claim`, which lets go of it when the chunk ends: at once if the
        server answered, else once the server lets go of it."""
        with self._flight():
            claim = Claim(self._claims, self._lent)
            try:
                outputs = yield from self._chunk_attempts(plan, arrays, rows, claim)
            except GeneratorExit:  # closed (a cancelled aio call): no more steps may be taken
                self._end_claim(claim)
                raise
            except BaseException:
                self._end_claim(claim)
                if self._closed:  # nobody else will: what the request left, unregistered now
                    yield from self._dispose_steps()
                raise
            self._end_claim(claim)
            if self._has_disposals():
                yield from self._dispose_steps()  # what the finished request left idle
            return outputs

    def _end_claim(self, claim: Claim) -> None:
        """The one place a request's claim ends (see :mod:`._claim`)."""
        if claim.unanswered:
            self._lent.count_abandoned()
        claim.end()

    def _chunk_attempts(self, plan: Plan, arrays: Mapping[str, Any], rows: _intake.Rows | None,
                        claim: Claim) -> Steps:
        info, names, route = plan.info, plan.names, plan.route
        shapes = {name: array.shape for name, array in arrays.items()}
        bytes_sizes = _intake.bytes_sizes(info, arrays)
        yield from self._wait_for_clashes(plan, arrays, claim)
        if route.lent and not self.fallback.wire:  # (a server that refused CUDA memory: the table says so)
            yield from self._lend_steps(plan, arrays, claim)
        needs = self.pool_table.needs(info, shapes, bytes_sizes)
        if claim:  # lent tensors take no room in a slot
            needs = {name: size for name, size in needs.items()
                     if name not in claim.inputs and name not in claim.outputs}
        for attempt in range(_GROW_ATTEMPTS):
            lease = None
            if needs or self.fallback.wire:
                lease = None if self.fallback.wire else (
                    yield from self.pool_table.lease_steps(info, needs, plan.slot_timeout, not plan.copy, route.memory))
                if lease is None:
                    inputs, requested = _messages.wire_request(self.wire, info, arrays, names)
                    result = yield Send(info.name, info.version, inputs, requested, plan.options)
                    outputs = _messages.wire_results(info, result, names, route.results, rows)
                    return _intake.into_out(info, outputs, plan.out)
            claim.lease = lease
            try:
                stream = yield from self._fill_steps(info, lease, arrays, bytes_sizes, route.device, claim)
                outputs = yield from self.slot_steps(info, lease, shapes, names, plan.copy, bytes_sizes,
                                                     route.results, rows, stream, options=plan.options,
                                                     claim=claim, out=plan.out)
            except OutputTooSmall as exc:
                # A variable-size output outgrew its guess: grow to what the server asked for
                # and run again on a slot of a larger pool -- unless running it again would do
                # harm (Triton says so after the model ran; a sequence's state would advance
                # twice) or cannot help (the caller's out= tensor is the room it had).
                given = None if plan.out is None or exc.output is None else plan.out.get(exc.output)
                if given is not None:
                    raise _intake.out_too_small(info, exc, given) from None
                if exc.output not in needs or exc.needed is None or attempt + 1 == _GROW_ATTEMPTS \
                        or not (plan.options is None or plan.options.may_run_twice):
                    raise
                needs = {**needs, exc.output: exc.needed}
                claim.end_lease()
                continue
            finally:
                del lease  # now, not when a traceback holding this frame dies
            self._lent.count(len(claim.inputs), len(claim.outputs))
            return outputs
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _wait_for_clashes(self, plan: Plan, arrays: Mapping[str, Any], claim: Claim) -> Steps:
        """Wait until no unfinished request names the caller's GPU memory this one writes, or
        writes what this one reads (a request the client gave up on, still running on the
        server); :class:`TensorInUse` after the request's slot_timeout."""
        if not self._claims.busy:
            return
        named = [(f"input {name!r}", Span.of(array, False)) for name, array in arrays.items()
                 if isinstance(array, DeviceTensor) and array.nbytes]
        named += [(f"out[{name!r}]", Span.of(given.tensor, True)) for name, given in (plan.out or {}).items()
                  if given.tensor.nbytes]
        deadline = None if plan.slot_timeout is None else time.monotonic() + plan.slot_timeout
        for what, span in named:
            while self._claims.conflict(span, claim):
                if deadline is not None and time.monotonic() >= deadline:
                    raise TensorInUse(
                        f"{what} of this request on model {plan.info.name!r} is memory an earlier request "
                        f"still uses: one the client gave up on (client_timeout, cancelled, closed), which "
                        f"the server may still be running; waited slot_timeout={plan.slot_timeout} s for the "
                        f"server to be done with it. Wait longer (slot_timeout=), or give other tensors")
                if self._has_disposals():  # among them, asking the server again to let go of it
                    yield from self._dispose_steps()
                yield Pause(_CLASH_POLL)

    def _lend_steps(self, plan: Plan, arrays: Mapping[str, Any], claim: Claim) -> Steps:
        """Lend the server the GPU inputs of one chunk, and the results the caller allocated,
        where their memory can be (:mod:`._lent`); the rest is copied as before."""
        for name, array in arrays.items():
            if isinstance(array, DeviceTensor) and array.nbytes:  # (Triton refuses 0-byte bindings)
                where = self.pool_table.own_slot(array)
                if where is None:
                    where = yield from self._lent.lend_steps(array)
                if where is not None:
                    claim.lend(name, where, array, writes=False)
        for name, given in (plan.out or {}).items():
            if not given.tensor.nbytes:
                continue
            where = yield from self._lent.lend_steps(given.tensor)
            if where is not None:
                claim.lend(name, where, given.tensor, writes=True)

    def _fill_steps(self, info: ModelInfo, lease: Lease | None, arrays: Mapping[str, Any],
                    bytes_sizes: Mapping[str, int], device: int | None, claim: Claim | None = None) -> Steps:
        """Copy *arrays* into the leased slot (BYTES serialized straight in) but those the
        *claim* lends; returns this thread's copy stream of the slot's (or *device*'s) GPU, None
        without one.  No lease: everything is lent.

        The copies run on that copy stream, after the event each captured input
        carries; the server reads the slot only once they have landed (one wait,
        never a device-wide sync).  Lent tensors are read (inputs) or written
        (results the caller allocated) by the server in place: the same wait
        covers the work the caller had queued on them when it called.
        """
        memory = None if lease is None else lease.extent.memory
        stream = _devices.copy_stream(device) if memory is None else self._copy_stream(memory, device)
        queued = False
        waits = claim.waits if claim else []
        try:
            for spec in info.inputs:
                if claim and spec.name in claim.inputs:
                    continue
                assert lease is not None and memory is not None, "an input not lent has room in a slot"
                offset = lease.offset(spec.name)
                array = arrays[spec.name]
                if spec.is_bytes:
                    _bytes.encode_into(array, memory.bytes_at(offset, bytes_sizes[spec.name]))
                else:
                    queued |= stream is not None and (memory.kind == "cuda" or isinstance(array, DeviceTensor))
                    memory.write(offset, array, stream)
            if queued:  # one wait for the copies and the lent tensors' events alike
                for event in waits:
                    stream.wait(event)
                yield WaitForDevice(stream.record())
            else:  # nothing copied: wait for the lent tensors' events themselves (no GPU work queued)
                for event in waits:
                    yield WaitForDevice(event)
        except BaseException:
            if queued:
                stream.synchronize()  # nothing of ours may still land in the slot once it is back
            raise
        return stream

    # -- a whole infer call -------------------------------------------------

    def infer_steps(self, info: ModelInfo, inputs: Mapping[str, Any], outputs: Sequence[str] | None, copy: bool,
                    output_device: Any, slot_timeout: float | None, options: RequestOptions | None,
                    out: Mapping[str, Any] | None) -> InferRun:
        """An ``infer`` call's steps, for either client: by the quick path when the request was
        seen before, else planned (and remembered for the quick path), one :class:`Steps` per
        chunk of a large batch -- to be driven at once -- and how their results join."""
        signature, quick = (None, None) if out is not None else \
            self.quick_plan(info, inputs, outputs, copy, output_device, slot_timeout, options)
        if quick is not None:  # seen before: checked then, planned then
            return InferRun([self.quick_steps(quick, inputs)])
        plan = self.plan(info, inputs, outputs, copy, output_device, slot_timeout, options, out=out)
        if signature is not None:
            self.remember_quick(signature, plan)
        if len(plan.chunks) == 1:
            return InferRun([self.chunk_steps(plan, plan.chunks[0])])
        rows = _intake.result_rows(info, plan.names, plan.chunks, plan.route.results)
        return InferRun([self.chunk_steps(plan, chunk, into) for chunk, into in zip(plan.chunks, rows)],
                        functools.partial(_intake.join_chunks, names=plan.names, placement=plan.route.results,
                                          rows=rows[0]))

    # -- the quick path -----------------------------------------------------

    def quick_plan(self, info: ModelInfo, inputs: Mapping[str, Any], outputs: Sequence[str] | None,
                   copy: bool, output_device: Any, slot_timeout: float | None,
                   options: RequestOptions | None) -> tuple[Any, QuickPlan | None]:
        """A request seen before, when it may take :meth:`quick_steps`: ``(signature,
        QuickPlan)``; ``(signature, None)`` when it may but was not seen (then
        :meth:`remember_quick` it once planned); ``(None, None)`` when it may not.

        Quick requests are small ones of plain numpy arrays on host slots, copied
        results where they were, no options: the common case, where checking and
        planning again cost as much as the rest of the call.
        """
        if options is not None or not copy or output_device != "auto" or slot_timeout is not None \
                or self.fallback.wire or self.routing.transport == "cuda" or len(inputs) > 8:
            return None, None
        signature: list[Any] = [info.name, info.version, None if outputs is None else tuple(outputs)]
        total = 0
        for name, array in inputs.items():
            if type(array) is not np.ndarray or not array.flags.c_contiguous:
                return None, None
            total += array.nbytes
            signature += (name, array.dtype, array.shape)
        if total > _QUICK_BYTES:
            return None, None
        key = tuple(signature)
        return key, self._quick_plans.get(key)

    def remember_quick(self, signature: Any, plan: Plan) -> None:
        """Keep *plan* for the requests of *signature* (from :meth:`quick_plan`), if it is one
        the quick path can run: one chunk, host slots, results on the host, no BYTES."""
        info = plan.info
        if len(plan.chunks) != 1 or plan.route.memory != SYSTEM or plan.route.results.device is not None \
                or info.has_bytes or info.decoupled:
            return
        (arrays,) = plan.chunks
        shapes = {name: array.shape for name, array in arrays.items()}
        needs = self.pool_table.needs(info, shapes, {})
        if len(self._quick_plans) >= _QUICK_PLANS:
            self._quick_plans.clear()
        self._quick_plans[signature] = QuickPlan(plan._replace(chunks=[]), (info.name, info.version, SYSTEM), needs)

    def quick_steps(self, quick: QuickPlan, arrays: Mapping[str, Any]) -> Steps:
        """A request of a :class:`QuickPlan`: lease, copy in, send the slot's ready message,
        copy out -- as straight-line code.  What is not the common case (no free slot, a pool
        to make or grow, a server that forgot our regions, an output larger than its slot)
        goes the full way (:meth:`chunk_steps`), which handles it."""
        pool = self.pool_table.get(quick.key)
        lease = None
        if pool is not None and pool.layout.fits(quick.needs):
            lease = pool.try_acquire(False)
        if lease is None:
            return (yield from self.chunk_steps(quick.plan._replace(chunks=[dict(arrays)]), arrays))
        info, names = quick.plan.info, quick.plan.names
        outputs: dict[str, Any] = {}
        claim = Claim(self._claims, self._lent)  # its slot: kept out of the pool if given up on
        claim.lease = lease
        with self._flight():
            try:
                self.check_open()
                memory = lease.extent.memory
                shapes = {name: array.shape for name, array in arrays.items()}
                slot = self._quick_slot(info, lease, shapes, names)
                for name, view in slot.inputs:
                    np.copyto(view, arrays[name])
                # The request objects are bound again here if the slot served other shapes
                # meanwhile; the gRPC message kept for these shapes is sent as it is.
                inputs, requested, message = _messages.slot_request(self.wire, info, lease, shapes, names, {},
                                                                    prepare=True)
                try:
                    result = yield from self._send_claimed(
                        Send(info.name, info.version, inputs, requested, None, message, claim), claim)
                except OutputTooSmall:
                    result = None  # the full way grows
                if isinstance(result, RegionNotRegistered):
                    result = None  # the full way registers again; the server ran nothing
                if result is not None:
                    if memory.closed:  # close() gave up waiting for us and closed it
                        raise ClientClosed(f"the client was closed while this request on model "
                                           f"{info.name!r} ran: its results are lost")
                    for name, spec, view in slot.outputs:
                        shape = _messages.output_shape(result, name)
                        size = math.prod(shape) * spec.dtype.itemsize
                        outputs[name] = view[:size].view(spec.dtype).reshape(shape).copy()
            finally:
                del lease
                self._end_claim(claim)
        if result is None:  # refused before it ran: the full way heals and runs it
            return (yield from self.chunk_steps(quick.plan._replace(chunks=[dict(arrays)]), arrays))
        if self._has_disposals():
            yield from self._dispose_steps()
        return outputs

    def _quick_slot(self, info: ModelInfo, lease: Lease, shapes: Mapping[str, tuple[int, ...]],
                    names: Sequence[str]) -> "_QuickSlot":
        """The slot's views for these input shapes and outputs (made once per slot)."""
        cache = lease.extent.requests.get(lease.index)
        if cache is None:
            cache = lease.extent.requests[lease.index] = {}
        key = ("quick", tuple(shapes.items()), tuple(names))
        slot = cache.get(key)
        if slot is None:
            _messages.make_room(cache)
            memory, capacities = lease.extent.memory, lease.pool.layout.capacities
            slot = cache[key] = _QuickSlot(
                [(spec.name, memory.array_at(lease.offset(spec.name), spec.dtype, shapes[spec.name]))
                 for spec in info.inputs],
                [(name, info.output(name), memory.array_at(lease.offset(name), np.dtype(np.uint8),
                                                           (capacities[name],)))
                 for name in names])
        return slot

    # -- streamed requests ------------------------------------------------

    def stream_steps(self, plan: Plan) -> Steps:
        """One request on the client's inference stream: :class:`Emit` of each response's
        outputs, in order, until the server's final response.

        Inputs travel in a slot, held until the server is done with the
        request -- its final response, or the stream's end -- whether or not
        the caller reads every response (a caller that stops early leaves the
        rest to be dropped, and the slot comes back at the end).  Outputs
        travel in the responses, never in the slot: Triton writes every
        response of one request into the same output region and waits for
        no reader, so a later response would overwrite one not yet read.
        A server that forgot our regions (it restarted) gets them again and
        the request once more, if it had not answered yet.
        """
        info, names, route = plan.info, plan.names, plan.route
        (arrays,) = plan.chunks
        wait = None if plan.options is None else plan.options.client_timeout
        for attempt in range(2):
            entry, pool = yield from self._stream_send_steps(plan, arrays)
            answered = False
            while True:
                response = yield NextResponse(entry, wait)
                if response.error is not None:
                    if isinstance(response.error, RegionNotRegistered) and pool is not None \
                            and not answered and attempt == 0:
                        yield from self._register_again_steps(pool)
                        break
                    raise response.error
                if response.result is not None:
                    answered = True
                    yield Emit(_messages.wire_results(info, response.result, names, route.results))
                if response.final:
                    return
        raise AssertionError("unreachable: the second attempt returns or raises")

    def stream_send_steps(self, plan: Plan, stream: Any, requested: list | None) -> Steps:
        """Send *plan*'s one request on *stream*, a stream of the caller's (tritonshm.grpc's
        facade, which hands each response to its user's callback), its inputs in a slot (or
        lent) as :meth:`stream_steps` sends them, its outputs asked for as *requested* says
        (tritonclient's request objects, sent as they are; None: every output): outcome its
        :class:`~._stream.Streamed` entry.  The slot comes back when the server is done
        with the request, as for :meth:`stream_steps`."""
        entry, _ = yield from self._stream_send_steps(plan, plan.chunks[0], stream, requested)
        return entry

    def _stream_send_steps(self, plan: Plan, arrays: Mapping[str, Any], stream: Any = None,
                           requested: Any = _NAMES) -> Steps:
        """Lease a slot, fill it and send the request on the stream (the client's own, or
        *stream*): ``(entry, pool)`` (pool None on the wire).  Its :class:`~._claim.Claim`
        (slot, lent inputs) ends when the server is done with the request: its final
        response -- or, the stream ended first, once the server lets go of what it may
        still read.  The outputs asked for are the plan's names, or *requested* as it is."""
        info = plan.info
        shapes = {name: array.shape for name, array in arrays.items()}
        bytes_sizes = _intake.bytes_sizes(info, arrays)
        claim = Claim(self._claims, self._lent)
        with self._flight():
            try:
                yield from self._wait_for_clashes(plan, arrays, claim)
                if plan.route.lent and not self.fallback.wire:
                    yield from self._lend_steps(plan, arrays, claim)
                needs = {name: size for name, size in self.pool_table.needs(info, shapes, bytes_sizes).items()
                         if name not in claim.inputs}  # lent inputs take no room in a slot
                lease = None if self.fallback.wire or not needs else (
                    yield from self.pool_table.lease_steps(info, needs, plan.slot_timeout, False, plan.route.memory))
                claim.lease = lease
                if self.fallback.wire or lease is None and not claim:
                    inputs = _messages.wire_request(self.wire, info, arrays, [])[0]
                else:
                    yield from self._fill_steps(info, lease, arrays, bytes_sizes, plan.route.device, claim)
                    inputs = _messages.slot_request(self.wire, info, lease, shapes, (), bytes_sizes, lent=claim)[0]
                outputs = ([self.wire.requested_output(name) for name in plan.names] if requested is _NAMES
                           else requested)
                # (the driver marks the claim unanswered as it sends, until the final response)
                entry = yield StreamSend(info.name, info.version, inputs, outputs, plan.options, claim, stream)
            except GeneratorExit:  # whether the request went out is unknown: the claim waits for the server
                self._end_claim(claim)
                raise
            except BaseException:
                claim.unanswered = False  # not sent: the stream refused it
                self._end_claim(claim)
                raise
        self._lent.count(len(claim.inputs))
        pool = None if claim.lease is None else claim.lease.pool
        entry.when_final(functools.partial(self._stream_request_done, claim))
        return entry, pool

    def _stream_request_done(self, claim: Claim, answered: bool) -> None:
        """A streamed request's final response came (*answered*), or its stream ended first
        (the server may still run it): its claim ends."""
        claim.unanswered = not answered
        self._end_claim(claim)

    def _register_again_steps(self, pool: SlotPool | None) -> Steps:
        """Register every extent of *pool*, and every lent allocation, again under its name
        (the server restarted and forgot them all)."""
        return register_again_steps([*(pool.extents if pool is not None else ()), *self._lent.extents()])

    def slot_steps(self, info: ModelInfo, lease: Lease | None, shapes: Mapping[str, tuple[int, ...]],
                   names: Sequence[str], copy: bool, bytes_sizes: Mapping[str, int],
                   results: Placement, rows: _intake.Rows | None = None, stream: Any = None,
                   ready: Any = None, options: RequestOptions | None = None, claim: Claim | None = None,
                   out: Mapping[str, OutTensor] | None = None) -> Steps:
        """Steps of running the inputs already in a slot (after the event *ready*, when given);
        outputs (checked *names*) land there too, and are delivered where *results* says,
        copied on *stream* (this thread's copy stream of the slot's or the results' GPU) and
        landed before they are returned.  Tensors the *claim* lends are named where they are
        instead of in the slot (no lease: all of them); results the caller allocated (*out*)
        are returned, filled.  The claim knows whether the server answered."""
        with self._flight():
            if ready is not None:
                yield WaitForDevice(ready)
            inputs, requested, message = _messages.slot_request(self.wire, info, lease, shapes, names, bytes_sizes,
                                                                prepare=options is None, lent=claim)
            send = Send(info.name, info.version, inputs, requested, options, message, claim)
            result = yield from self._send_claimed(send, claim)
            if isinstance(result, RegionNotRegistered):
                # The server restarted and forgot our regions: register every extent of the
                # pool (and every lent allocation) again under its name, then retry once.
                yield from self._register_again_steps(None if lease is None else lease.pool)
                result = yield from self._send_claimed(send, claim, again=True)
            if lease is not None and lease.extent.memory.closed:  # close() gave up waiting for us and closed it
                raise ClientClosed(f"the client was closed while this request on model {info.name!r} "
                                   f"ran: its results are lost")
            if stream is None:
                stream = self._copy_stream(lease.extent.memory, results.device) if lease is not None \
                    else _devices.copy_stream(results.device)
            try:
                outputs, queued = _messages.collect(info, lease, result, names, copy, results, rows, stream,
                                                    claim, out)
                if queued:
                    yield WaitForDevice(stream.record())
            except BaseException:
                # The slot goes back, and results already made are dropped (a caching allocator
                # hands their blocks out again at once): no copy out of the one into the other
                # may still be queued.
                if stream is not None:
                    stream.synchronize()
                raise
            return outputs

    @staticmethod
    def _send_claimed(send: Send, claim: Claim | None, again: bool = False) -> Steps:
        """Send *send*; the result -- or, the first time, a :class:`RegionNotRegistered` to
        heal -- with *claim* unanswered from the driver's sending (it marks it) until the
        server's answer (a result, or an error the server sent; not a timeout, a cancellation or
        a lost connection, after which it may still run the request: see :mod:`._claim`)."""
        try:
            result = yield send
        except RegionNotRegistered as exc:
            if claim is not None:
                claim.unanswered = False  # refused before it ran
            if again:
                raise
            return exc
        except ServerError as exc:
            if claim is not None and server_answered(exc):
                claim.unanswered = False  # the server's own answer
            raise
        if claim is not None:
            claim.unanswered = False
        return result

    @staticmethod
    def _copy_stream(memory: SlotMemory, device: int | None) -> Any:
        """This thread's copy stream of the GPU of *memory*, else of *device*; None: no GPU."""
        return _devices.copy_stream(memory.device if memory.device is not None else device)

    # -- the zero-copy path -----------------------------------------------

    def request_shapes(self, info: ModelInfo, batch_size: int | None,
                       shapes: Mapping[str, Sequence[int]] | None) -> dict[str, tuple[int, ...]]:
        """Checked full input shapes of a zero-copy request."""
        if info.decoupled:
            raise InvalidOption(f"model {info.name!r} is decoupled: Triton answers it over a gRPC stream "
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

    def request_steps(self, info: ModelInfo, shapes: Mapping[str, tuple[int, ...]],
                      timeout: float | None, kind: SlotKind = SYSTEM) -> Steps:
        """A leased slot of *kind* for a zero-copy request (never a fallback: its views
        must be where they were asked for)."""
        lease = yield from self.pool_table.lease_steps(info, self.pool_table.needs(info, shapes, {}), timeout, True, kind,
                                             strict=kind != SYSTEM)
        if lease is None:
            raise SharedMemoryRefused("request() needs shared memory, but the server cannot open ours")
        return lease
