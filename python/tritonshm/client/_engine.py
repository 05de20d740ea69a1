"""The engine each client holds: what a client knows and decides, before any request runs.

:class:`Engine` holds the client's settings and state -- discovery (models), the pool table
(:mod:`._pools`), the lent table (:mod:`._lent`), the fallback (:mod:`._fallback`), letting
go of memory (:mod:`._disposal`), the requests in flight -- and plans requests (checks,
routing, chunks, the quick path's cache).  A request's steps are :mod:`._run`'s; it never
talks to the server itself: :class:`~tritonshm.Client` drives the steps with blocking calls
and threads, :class:`tritonshm.aio.Client` with asyncio.  So all of it exists once.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
from typing import Any, Callable, Mapping, Sequence

from .. import _http1, _transport
from ..errors import (
    ClientClosed,
    DTypeMismatch,
    InvalidOption,
    InvalidOptionType,
    ServerError,
    ShapeMismatch,
    UNKNOWN_MODEL,
    unknown_model,
)
from . import _devices, _intake
from ._claim import Claims
from ._fallback import Fallback
from ._lent import LentAllocations, LentInfo, LentStats
from ._model import ModelInfo, shape_fits
from ._options import RequestOptions, check_slot_timeout
from ._plan import Plan, Routing
from ._pool import ByteBudget, PoolInfo
from ._disposal import Disposals
from ._pools import PoolTable, host_memory
from ._steps import FetchModel, FetchModelNames, Steps

__all__ = ["Engine", "TRANSPORTS", "engine_setting"]

TRANSPORTS = ("auto", "shm", "wire", "cuda")


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
            if engine._in_flight == 0 and engine.closed:
                engine._idle.notify_all()


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
        #: Every request's options start from these (a client-wide header for a gateway's auth;
        #: None: none).
        self.default_options = None if headers is None else RequestOptions.of(headers=headers)
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
        self.lent_table = LentAllocations(max_lent_bytes, self.disposals, self.fallback)
        # The caller's memory that unfinished requests name (a request that would clash waits).
        self.claims = Claims()
        # Requests between their first step and their last: close() lets them finish first.
        self._in_flight = 0
        self._idle = threading.Condition(self._lock)
        self._in_flight_counter = _InFlight(self)
        #: Whether the client stopped taking requests (see :meth:`stop_accepting`): a plain
        #: attribute, read on every request.
        self.closed = False

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
        return self.lent_table.max_bytes

    @property
    def lock(self) -> threading.RLock:
        """Guards the engine's tables; a driver takes it to keep its own state in step."""
        return self._lock

    def stop_accepting(self) -> bool:
        """Refuse new requests from now on; False if that was already so (close is idempotent)."""
        with self._lock:
            was_open, self.closed = not self.closed, True
        return was_open

    def check_open(self) -> None:
        """Raise :class:`ClientClosed` once the client stopped taking requests."""
        if self.closed:
            raise ClientClosed(f"{self.describe()} is closed")

    def describe(self) -> str:
        """The client's repr: its flavour, URL and state."""
        state = "closed" if self.closed else self.fallback.describe()
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

    def has_disposals(self) -> bool:
        """Whether the pools or the lent table have something to let go of, or parked memory
        is due to be asked about again."""
        return self.pool_table.has_disposals() or self.lent_table.has_disposals()

    def settle_steps(self) -> Steps:
        """The end of a request, when :attr:`Disposals.maybe_due` says something may wait to be
        let go of (the caller reads the flag: a request that left nothing behind costs no call):
        :meth:`dispose_steps` if anything does; the flag stays up while memory lingers."""
        disposals = self.disposals
        disposals.maybe_due = False  # first: what is left from now on raises it again
        if self.has_disposals():
            yield from self.dispose_steps()
        if self.pool_table.lingering:
            disposals.maybe_due = True

    def dispose_steps(self) -> Steps:
        """Unregister and close what the lent table let go of, the pools' idle surplus and
        drained retired pools, and parked extents when due."""
        yield from self.lent_table.drop_steps(self.lent_table.take_disposals())
        yield from self.pool_table.dispose_steps()

    def release_steps(self, settle: float) -> Steps:
        """The client is closing: every pool is out of service now; the steps unregister and
        close all they held, then ask again for up to *settle* seconds to unregister what the
        server refused (it answers a request before it lets go of the request's regions).
        What it still refuses then is for :meth:`hold_refused`."""
        drop = self.pool_table.close_steps()  # every pool out of service now
        # Every lent allocation, those of requests still in flight (close() stopped waiting for
        # them) too: unregistering is refused while they run, so they are parked, held, meanwhile.
        lent = self.lent_table.forget(in_use_too=True)

        def steps() -> Steps:
            yield from self.disposals.retry_steps()
            yield from drop
            yield from self.lent_table.drop_steps(lent)
            yield from self.disposals.settle_steps(settle)

        return steps()

    def forget_steps(self) -> Steps:
        """Unregister and let go of every lent allocation no request names now (the others as
        their requests finish): their owners (torch's, cupy's allocators) may free them then."""
        return self.lent_table.drop_steps(self.lent_table.forget())

    def lent(self) -> list[LentInfo]:
        """The caller's allocations registered now, to send its GPU tensors by reference. No I/O."""
        return self.lent_table.snapshot()

    def lent_stats(self) -> LentStats:
        """How GPU tensors travelled: by reference or copied (and why), and the requests given up
        on whose memory is still held for the server. No I/O."""
        return dataclasses.replace(self.lent_table.stats(), awaiting_server=self.claims.awaiting())

    def hold_refused(self) -> None:
        """After :meth:`release_steps`: close parked host memory, and hold device memory the
        server still refuses to let go of for the life of the process (never freed under it)."""
        self.disposals.give_up()

    # -- requests in flight -----------------------------------------------

    def flight(self) -> "_InFlight":
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

