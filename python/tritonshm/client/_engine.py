"""The engine each client holds: what a client knows and decides, before any request runs.

:class:`Engine` holds the client's settings and state -- discovery (models), the pool table
(:mod:`._pools`), the lent table (:mod:`._lent`), the fallback (:mod:`._fallback`), letting
go of memory (:mod:`._disposal`), the requests in flight -- and the planner of its calls
(:class:`~._plan.Planner`).  A request's steps are :mod:`._run`'s; it never
talks to the server itself: :class:`~tritonshm.Client` drives the steps with blocking calls
and threads, :class:`tritonshm.aio.Client` with asyncio.  So all of it exists once.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
import weakref
from typing import Any, Callable, Mapping

from .. import _http1, _transport
from ..errors import UNKNOWN_MODEL, ClientClosed, InvalidOption, ServerError, unknown_model
from . import _devices
from ._claim import Claims
from ._fallback import Fallback
from ._lent import LentAllocations, LentInfo, LentStats
from ._model import ModelInfo
from ._options import RequestOptions, check_slot_timeout
from ._plan import Planner, Routing
from ._pool import ByteBudget, PoolInfo
from ._disposal import Disposals, Unregisterer
from ._pools import PoolTable, host_memory
from ._steps import FetchModel, FetchModelNames, FetchServerVersion, Steps

__all__ = ["Engine", "InFlight", "TRANSPORTS", "engine_setting"]

#: Every engine alive in this process (see :func:`_closed_in_forked_child`).
_engines: "weakref.WeakSet[Engine]" = weakref.WeakSet()


def _closed_in_forked_child() -> None:
    """A forked child's copies of the parent's clients are closed at once: their slots are the
    parent's shared memory, their bookkeeping a copy -- a child that leased from it would write
    slots the parent's requests and results are using.  (A child closing them, or collecting
    them, unregisters nothing of the parent's either: see :class:`~._disposal.Disposals`.)"""
    for engine in list(_engines):
        engine.closed = True


os.register_at_fork(after_in_child=_closed_in_forked_child)

TRANSPORTS = ("auto", "shm", "wire", "cuda")


class InFlight:
    """The requests between their first step and their last, counted: ``with in_flight:`` (a
    plain context manager: a request enters it several times, and a contextlib generator costs
    microseconds).  A closing client waits until none is left, blocking (:meth:`wait_idle`) or
    woken from any thread (:meth:`on_idle`: the asyncio client's future); until one does, a
    request's end wakes nobody."""

    __slots__ = ("count", "_lock", "_idle", "_closing", "_wakes")

    def __init__(self) -> None:
        self.count = 0  #: requests in flight now (its only writer: this object)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._closing = False  # someone waits for the last one
        self._wakes: list[Callable[[], None]] = []

    def __enter__(self) -> None:
        with self._lock:
            self.count += 1

    def __exit__(self, *exc_info: Any) -> None:
        with self._lock:
            self.count -= 1
            if self.count or not self._closing:
                return
            self._idle.notify_all()
            wakes, self._wakes = self._wakes, []
        for wake in wakes:
            wake()

    def wait_idle(self, timeout: float | None) -> bool:
        """Block until no request is in flight (True), or *timeout* seconds passed (False)."""
        with self._lock:
            self._closing = True
            return self._idle.wait_for(lambda: self.count == 0, timeout)

    def on_idle(self, wake: Callable[[], None]) -> bool:
        """Call *wake* (once, from the thread that ends the last request) when no request is in
        flight; True, and no call, when none is now."""
        with self._lock:
            self._closing = True
            if self.count == 0:
                return True
            self._wakes.append(wake)
            return False


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
                 by_reference: bool = True, max_lent_bytes: int = 2 << 30, old_server_hold: float = 60.0):
        if transport not in TRANSPORTS:
            raise InvalidOption(f"transport must be one of {TRANSPORTS}, not {transport!r}")
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise InvalidOption(f"slots must be an int >= 1, not {slots!r}")
        slot_timeout = check_slot_timeout(slot_timeout)
        if not isinstance(by_reference, bool):
            raise InvalidOption(f"by_reference must be True or False, not {by_reference!r}")
        if isinstance(max_lent_bytes, bool) or not isinstance(max_lent_bytes, int) or max_lent_bytes < 0:
            raise InvalidOption(f"max_lent_bytes must be an int >= 0, not {max_lent_bytes!r}")
        if isinstance(old_server_hold, bool) or not isinstance(old_server_hold, (int, float)) \
                or not 0 <= old_server_hold < float("inf"):
            raise InvalidOption(f"old_server_hold must be a finite number of seconds >= 0, not {old_server_hold!r}")
        make_host_memory = host_memory(pinned)
        if transport == "cuda":
            _devices.require_cuda("transport='cuda'")
        self.routing = Routing(transport, 0 if isinstance(pinned, bool) else pinned, pinned is not False, by_reference)
        self.aio = aio
        self.url = url
        self.transport = transport
        self.wire, self._address, self._ssl = _transport.parse_url(url, aio=aio)
        # What the server has shown it cannot open, and so how requests travel (its only writer).
        self.fallback = Fallback(transport, "HTTP" if self.wire.http else "gRPC")
        # Every call's checks, chunks and route (the client's headers under its options).
        self.planner = Planner(self.routing, self.wire, url, self.fallback, slot_timeout,
                               None if headers is None else RequestOptions.of(headers=headers))
        self._verbose = verbose
        #: The client's headers, sent with every call it makes -- registrations and model reads too
        #: (a gateway's auth, a server whose shared-memory API is restricted); None: none.
        self.headers = dict(headers) if headers else None
        #: Headers asked for anew at each such call, beside those (a tritonclient plugin's, for
        #: ``tritonshm.grpc`` / ``.http``); None: none.
        self.headers_from: Callable[[], Mapping[str, str] | None] | None = None
        self._connect_options = dict(connect_options or {})
        self._lock = threading.RLock()
        self._models: dict[tuple[str, str], ModelInfo] = {}
        # Letting go of memory, the one way (a forked child must not unregister our names).
        self.disposals = Disposals(os.getpid(), float(old_server_hold))
        self._version_known = False  # the server's version read (on the first model read)
        # The slot pools, by model, version and memory, and the budget they share.
        self.pool_table = PoolTable(slots, max_pool_bytes, make_host_memory, self.routing.pinned, self.fallback,
                                    self.disposals, self._lock, self.check_open)
        # The caller's GPU allocations registered to send its tensors by reference (beside the pools).
        self.lent_table = LentAllocations(max_lent_bytes, self.disposals, self.fallback)
        # The caller's memory that unfinished requests name (a request that would clash waits).
        self.claims = Claims()
        #: Requests between their first step and their last: close() lets them finish first.
        self.in_flight = InFlight()
        #: Whether the client stopped taking requests (see :meth:`stop_accepting`): a plain
        #: attribute, read on every request.
        self.closed = False
        _engines.add(self)

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
    def slot_timeout(self) -> float | None:
        """How long a request waits for a slot, in seconds, unless it says otherwise (the
        planner's setting)."""
        return self.planner.slot_timeout

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
        """Raise :class:`ClientClosed` once the client stopped taking requests -- in a process
        forked from the one that made it, at once (:func:`_closed_in_forked_child`)."""
        if self.closed:
            made_in = self.disposals.creator_pid
            if made_in != os.getpid():
                raise ClientClosed(f"{self.describe()} was made in process {made_in}, before a fork(): "
                                   f"make a new client in this process")
            raise ClientClosed(f"{self.describe()} is closed")

    def describe(self) -> str:
        """The client's repr: its flavour, URL and state."""
        state = "closed" if self.closed else self.fallback.describe()
        kind = "aio.Client" if self.aio else "Client"
        return f"<tritonshm.{kind} {self.url!r} {state}>"

    # -- discovery --------------------------------------------------------

    def cached_model(self, model: str, version: str) -> ModelInfo | None:
        """What the server said about *model* before, if it was asked (no I/O; None for what is no
        model name: :meth:`model_steps` says why)."""
        if type(model) is not str or type(version) is not str:
            return None
        return self._models.get((model, version))

    def model_steps(self, model: str, version: str) -> Steps:
        """What the server says about *model* (cached per model and version)."""
        if not isinstance(model, str) or not model:
            raise InvalidOption(f"a model name must be a non-empty str, not {model!r}")
        if not isinstance(version, str):
            raise InvalidOption(f"a model version must be a str ('' for the server's choice), not {version!r}")
        info = self._models.get((model, version))
        if info is None:
            info = self.remember_model((yield from self.read_model_steps(model, version)))
        return info

    def read_model_steps(self, model: str, version: str) -> Steps:
        """What the server says about *model* now (not cached: :meth:`model_steps` caches)."""
        if not self._version_known:
            yield from self._server_version_steps()
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
        return ModelInfo.from_server(metadata, config, version)

    def remember_model(self, info: ModelInfo) -> ModelInfo:
        """Keep *info* for the next calls on its model and version; returns it."""
        with self._lock:
            self._models[(info.name, info.version)] = info
        return info

    def control_headers(self) -> dict[str, str] | None:
        """The headers of a call the client makes on its own -- registrations, unregisters, model
        and server reads: the client's, and what :attr:`headers_from` adds now."""
        more = self.headers_from() if self.headers_from is not None else None
        return {**(self.headers or {}), **more} if more else self.headers

    def control_options(self) -> dict[str, Any]:
        """Such a call's keyword arguments for tritonclient: the wire's (JSON answers) and the headers."""
        headers = self.control_headers()
        return {**self.wire.json, "headers": headers} if headers else self.wire.json

    def forget_model(self, model: str) -> None:
        """Forget what the client read of *model* (every version) and retire its pools: it
        changed on the server (see :class:`~tritonshm.ModelChanged`); the next call reads it again."""
        with self._lock:
            for key in [key for key in self._models if key[0] == model]:
                del self._models[key]
        self.pool_table.retire_model(model)

    def _server_version_steps(self) -> Steps:
        """Read which release the server is, once: it decides what proves that the server let go
        of memory a request given up on named (:meth:`~._disposal.Disposals.server_is`)."""
        try:
            version = yield FetchServerVersion()
        except ServerError:
            return  # (asked again with the next model; the model read says what is wrong)
        self.disposals.server_is(version)
        self._version_known = True

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

    def hold_refused(self, unregister: Unregisterer | None = None) -> None:
        """After :meth:`release_steps`: close parked host memory, and hold device memory the
        server still refuses to let go of (never freed under it) until *unregister* (through
        the closed client's connection), asked again on a backoff, finds the server let go."""
        self.disposals.give_up(unregister)
