"""A fake Triton server for the client engine's steps -- TEST-ONLY, never shipped.

The clients write every request as sans-I/O steps (``tritonshm.client._steps``)
and carry them out through a table of handlers, one per step type.
:class:`FakeTriton` answers the steps that would go to a server --
``FetchModel``, ``Register``, ``Unregister``, ``Send`` -- in this process,
with no network, so pool creation, growth, retirement, fallbacks,
re-registration and close() can be tested in milliseconds::

    fake = FakeTriton.install(monkeypatch)        # or the ``fake_triton`` fixture
    with fake.client(max_pool_bytes=1 << 20) as c:  # a real tritonshm.Client, plugged in
        c.infer("identity_fp32", {"INPUT0": x})
    assert fake.registered_bytes == 0 and fake.peak_bytes <= 1 << 20
    fake.check()                                  # no slot memory freed while registered

What it is
----------
* **Models** (:data:`MODELS`): ``identity_fp32`` (FP32 ``[-1]`` -> the same),
  ``batched_add`` (max_batch_size 8, FP32 ``[-1, 4]`` -> input + 1),
  ``add_sub`` (two FP32 ``[16]`` inputs -> their sum and difference) and
  ``repeat_fp32`` (FP32 ``[-1]`` -> the input three times: larger than the
  client's guess for a variable output, so it must grow).  Metadata
  and config are shaped like tritonclient's gRPC ``as_json=True`` replies
  (int64 dims as strings, the config nested under ``"config"``).
* **Register** records name -> the SlotMemory and its bytes; the bytes
  registered are tracked at every instant (:attr:`registered_bytes`,
  :attr:`peak_bytes`, :attr:`history`).  Like Triton, the fake maps a system
  region itself (``SystemRegion.attach``) and reads and writes that mapping, so
  what the client closes does not pull memory from under the "server";
  :meth:`shutdown` (the fixture calls it) drops what is left.
* **Unregister** answers "currently in use" (a :class:`~tritonshm.errors.ServerError`,
  as Triton does) while a Send that names the region runs, or when told
  (:meth:`refuse_unregister`).
* **Send** executes the model: inputs are read from the registered slot memory at
  the shared-memory parameters of the gRPC ``InferInput`` objects the engine
  built (``infer_input._input.parameters``) or from their raw contents (the
  wire path); outputs are written into the bound output regions (an
  undersized one raises :class:`~tritonshm.errors.OutputTooSmall` with the
  size needed) or kept for ``as_numpy``.  A region it does not know raises
  :class:`~tritonshm.errors.RegionNotRegistered` (after a restart).
* **Controls**: :meth:`refuse_registration`, :meth:`fail_next`, :meth:`die` /
  :meth:`come_back` / :meth:`restart` (every registration forgotten),
  :meth:`stall` / :meth:`release` (Send waits on a ``threading.Event``;
  :meth:`wait_stalled` tells when requests are parked there), :attr:`delay`
  (seconds before every call; :attr:`delays` per kind of call),
  :attr:`client_gives_up_after` (the client stops waiting for a Send after
  that many seconds -- ServerTimeout, as with ``client_timeout`` -- while the
  server goes on running it, holding its regions "in use", and writes its
  outputs when it is done: :attr:`late_writes`).
* **Metering**: the bytes of host slot memory alive in the process (made,
  registered or not, and not yet closed): :attr:`memory_bytes`,
  :attr:`memory_peak`, :attr:`memory_made` (``SystemSlotMemory`` hooked by
  :meth:`install`).
* **Checks**: slot memory the client closed while the fake still has it
  registered (audited at every call), a Send naming closed memory, a client's
  byte budget over its limit (sampled at every step the client takes, and
  by :meth:`sampling` in between) are recorded in :attr:`violations`;
  :meth:`check` raises if there are any, or if slot memory is still open.

Plugging in: :meth:`client` / :meth:`aio_client` make real clients whose
step handlers route to the fake; their connector (used by ``close()`` and the
garbage-collection finalizer) is a stand-in whose client object reaches the
fake only (:meth:`install` routes ``tritonshm.triton.unregister`` calls on it
to the fake; every other client goes to the real function), so no network is
ever touched.  The clients' private attributes (``_driver``: its ``handlers``,
``connector`` and ``aio_client``; ``_engine.budget``; ``_finalizer``) are
touched in :meth:`plug` and :meth:`aio_client` only: if the clients' insides
move, this is the one place to follow them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import math
import threading
import time
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import pytest

import tritonshm
import tritonshm.aio
from tritonshm import triton
from tritonshm.client import _client as _client_module
from tritonshm.client import _slots
from tritonshm.client._steps import FetchModel, FetchModelNames, Pause, Register, Send, Unregister, WaitForSlot
from tritonshm.errors import (
    OutputTooSmall,
    RegionNotRegistered,
    RegistrationError,
    ServerError,
    ServerTimeout,
    ServerUnavailable,
    SharedMemoryRefused,
)

__all__ = ["FakeTriton", "FakeModel", "MODELS", "fake_triton"]

FAKE_URL = "127.0.0.1:1"  # never connected to: nothing listens there, and nothing tries

_NP_DTYPES = {"FP32": np.float32, "FP64": np.float64, "INT32": np.int32, "INT64": np.int64,
              "UINT8": np.uint8, "BOOL": np.bool_}


# -- models -------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FakeModel:
    """A model of the fake: its tensors (name, datatype, dims as in the metadata,
    batch dim included for batching models) and what it computes."""

    name: str
    inputs: tuple[tuple[str, str, tuple[int, ...]], ...]
    outputs: tuple[tuple[str, str, tuple[int, ...]], ...]
    compute: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]
    max_batch_size: int = 0

    def metadata(self) -> dict[str, Any]:
        """Like ``get_model_metadata(..., as_json=True)`` over gRPC (int64 dims are strings there)."""
        def tensors(specs):
            return [{"name": n, "datatype": t, "shape": [str(d) for d in dims]} for n, t, dims in specs]

        return {"name": self.name, "versions": ["1"], "platform": "python",
                "inputs": tensors(self.inputs), "outputs": tensors(self.outputs)}

    def config_reply(self) -> dict[str, Any]:
        """Like ``get_model_config(..., as_json=True)`` over gRPC: the config under "config"."""
        def tensors(specs):
            return [{"name": n, "data_type": f"TYPE_{t}",
                     "dims": [str(d) for d in (dims[1:] if self.max_batch_size else dims)]}
                    for n, t, dims in specs]

        return {"config": {"name": self.name, "platform": "", "backend": "python",
                           "max_batch_size": self.max_batch_size,
                           "input": tensors(self.inputs), "output": tensors(self.outputs),
                           "instance_group": [{"name": self.name, "kind": "KIND_CPU", "count": 1}]}}

    def run(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        for name, datatype, dims in self.inputs:
            if name not in arrays:
                raise ServerError(f"[request id: <id_unknown>] expected input {name!r} for model {self.name!r}")
            array = arrays[name]
            if array.dtype != _NP_DTYPES[datatype]:
                raise ServerError(f"input {name!r}: {array.dtype} is not {datatype}")
            if len(array.shape) != len(dims) or any(d != -1 and d != s for d, s in zip(dims, array.shape)):
                raise ServerError(f"unexpected shape for input {name!r} for model {self.name!r}: "
                                  f"{list(array.shape)}, model expects {list(dims)}")
            if self.max_batch_size and array.shape[0] > self.max_batch_size:
                raise ServerError(f"inference request batch-size must be <= {self.max_batch_size}")
        return self.compute(arrays)


MODELS = {
    model.name: model for model in (
        FakeModel("identity_fp32", (("INPUT0", "FP32", (-1,)),), (("OUTPUT0", "FP32", (-1,)),),
                  lambda a: {"OUTPUT0": a["INPUT0"].copy()}),
        FakeModel("batched_add", (("INPUT0", "FP32", (-1, 4)),), (("OUTPUT0", "FP32", (-1, 4)),),
                  lambda a: {"OUTPUT0": a["INPUT0"] + np.float32(1)}, max_batch_size=8),
        FakeModel("repeat_fp32", (("INPUT0", "FP32", (-1,)),), (("OUTPUT0", "FP32", (-1,)),),
                  lambda a: {"OUTPUT0": np.concatenate([a["INPUT0"]] * 3)}),
        FakeModel("add_sub", (("INPUT0", "FP32", (16,)), ("INPUT1", "FP32", (16,))),
                  (("OUTPUT0", "FP32", (16,)), ("OUTPUT1", "FP32", (16,))),
                  lambda a: {"OUTPUT0": a["INPUT0"] + a["INPUT1"], "OUTPUT1": a["INPUT0"] - a["INPUT1"]}),
    )
}


# -- what the fake hands back -------------------------------------------------

class FakeResult:
    """Like tritonclient's InferResult: ``get_output(name)`` (a dict with "shape"),
    ``as_numpy(name)`` (None for outputs that went into shared memory)."""

    def __init__(self, model: str, tensors: dict[str, tuple[str, tuple[int, ...]]],
                 arrays: dict[str, np.ndarray]):
        self.model = model
        self._tensors = tensors
        self._arrays = arrays

    def get_output(self, name: str) -> dict[str, Any] | None:
        if name not in self._tensors:
            return None
        datatype, shape = self._tensors[name]
        return {"name": name, "datatype": datatype, "shape": list(shape)}

    def as_numpy(self, name: str) -> np.ndarray | None:
        return self._arrays.get(name)


@dataclasses.dataclass
class Registration:
    """One region the fake has registered."""

    name: str
    memory: Any     # the client's SlotMemory
    nbytes: int
    kind: str       # "system" or "cuda"
    mapping: Any = None  # the server's own mapping of a system region (None: read the client's memory)

    def region(self) -> Any:
        """What the server reads and writes: its own mapping, as Triton has (it outlives the client's)."""
        return self.mapping if self.mapping is not None else self.memory.region

    def drop(self) -> None:
        if self.mapping is not None:
            self.mapping.close()


class _Wire:
    """Stands in for a tritonclient client where the clients hand one to the triton layer
    (close() and the finalizer unregister through it): it reaches the fake only."""

    def __init__(self, fake: "FakeTriton"):
        self.fake = fake

    def close(self) -> None:
        pass


class _AioWire(_Wire):
    async def close(self) -> None:  # type: ignore[override]
        pass


class _FakeConnector:
    """Stands in for the blocking client's Connector: calls run against a :class:`_Wire`."""

    http = False

    def __init__(self, fake: "FakeTriton"):
        self.shared = _Wire(fake)

    def call(self, fn: Callable[[Any], Any]) -> Any:
        return fn(self.shared)

    def close(self, wait: bool = True) -> None:
        pass


# -- the fake -----------------------------------------------------------------

class FakeTriton:
    """An in-process Triton for the engine's steps (see the module docstring)."""

    def __init__(self, models: Mapping[str, FakeModel] | None = None):
        self.models = dict(MODELS if models is None else models)
        self._lock = threading.RLock()
        self._regions: dict[str, Registration] = {}
        self._holds: collections.Counter = collections.Counter()  # region -> Sends using it now
        self.registered_bytes = 0
        self.peak_bytes = 0
        self.history: list[tuple[float, int]] = [(time.monotonic(), 0)]  # (when, bytes registered)
        self.registrations = 0          # successful Register calls, re-registrations included
        self.calls: collections.Counter = collections.Counter()  # by op: fetch, register, unregister, send
        self.begun: collections.Counter = collections.Counter()  # the same, counted before the delay
        self.violations: list[str] = []
        self.alive = True
        self.delay = 0.0                 # seconds before every call
        self.delays: dict[str, float] = {}  # per op ("fetch", "register", "unregister", "send"): instead
        self._refuse_registration = False
        self._refuse_unregister = 0
        self._failures: list[tuple[frozenset, BaseException]] = []
        self._gate = threading.Event()   # set: Sends go through; clear: they stall
        self._gate.set()
        self._stalled = 0
        self._stalled_changed = threading.Condition(self._lock)
        #: Seconds after which the client gives up on a Send (as with client_timeout) while the
        #: server goes on running it (None: it waits for the answer); late_writes counts those.
        self.client_gives_up_after: float | None = None
        self.late_writes = 0
        self._budgets: list[Any] = []
        self.budget_peak = 0
        # Host slot memory alive in this process (made, not yet closed), whether registered or
        # not: counted once install() has hooked SystemSlotMemory.
        self.memory_bytes = 0
        self.memory_peak = 0
        self.memory_made = 0
        self._live_memory: set = set()  # SlotMemory made and not yet closed (closed by shutdown())

    # -- plugging in ------------------------------------------------------

    @classmethod
    def install(cls, monkeypatch: pytest.MonkeyPatch, models: Mapping[str, FakeModel] | None = None) -> "FakeTriton":
        """A fake, with ``tritonshm.triton.unregister`` routing calls on the fake's stand-in
        clients to it (every other client goes to the real function) until *monkeypatch*
        is undone.  That is the path of ``close()`` and of the finalizer of a forgotten client."""
        fake = cls(models)
        real = triton.unregister

        def unregister(client: Any, name_or_region: Any, *, patience: float = 1.0) -> Any:
            if isinstance(client, _Wire):
                return client.fake._wire_unregister(client, name_or_region, patience)
            return real(client, name_or_region, patience=patience)

        monkeypatch.setattr(triton, "unregister", unregister)
        fake._meter_slot_memory(monkeypatch)
        return fake

    def _meter_slot_memory(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Count the bytes of host slot memory alive (:attr:`memory_bytes`, :attr:`memory_peak`)."""
        cls = _slots.SystemSlotMemory
        real_init, real_close = cls.__init__, cls.close

        def init(memory: Any, *args: Any, **kwargs: Any) -> None:
            real_init(memory, *args, **kwargs)
            with self._lock:
                self._live_memory.add(memory)
                self.memory_made += 1
                self.memory_bytes += memory.nbytes
                self.memory_peak = max(self.memory_peak, self.memory_bytes)

        def close(memory: Any) -> None:
            if memory._bytes is not None:  # its first close
                with self._lock:
                    self._live_memory.discard(memory)
                    self.memory_bytes -= memory.nbytes
            real_close(memory)

        monkeypatch.setattr(cls, "__init__", init)
        monkeypatch.setattr(cls, "close", close)

    def client(self, url: str = FAKE_URL, **kwargs: Any) -> tritonshm.Client:
        """A real blocking :class:`tritonshm.Client` whose server is this fake."""
        client = tritonshm.Client(url, **kwargs)
        self.plug(client)
        return client

    async def aio_client(self, url: str = FAKE_URL, **kwargs: Any) -> tritonshm.aio.Client:
        """A real :class:`tritonshm.aio.Client` whose server is this fake (call in a running loop)."""
        client = tritonshm.aio.Client(url, **kwargs)
        driver = client._driver
        real, driver.aio_client = driver.aio_client, _AioWire(self)
        await real.close()  # made by the constructor; never connected
        self.plug(client)
        return client

    def plug(self, client: Any) -> None:
        """Route *client*'s server steps to this fake, and its close()/finalizer unregistrations."""
        aio = isinstance(client, tritonshm.aio.Client)
        driver = client._driver
        handlers = driver.handlers
        if aio:
            handlers.update({FetchModel: self.fetch_model_async, FetchModelNames: self.fetch_model_names_async,
                             Register: self.register_async,
                             Unregister: self.unregister_async, Send: self.send_async})
        else:
            handlers.update({FetchModel: self.fetch_model, FetchModelNames: self.fetch_model_names,
                             Register: self.register,
                             Unregister: self.unregister, Send: self.send})
            driver.connector = _FakeConnector(self)
        for step in (WaitForSlot, Pause):  # sample the byte budget while requests wait, too
            handlers[step] = self._sampling(handlers[step])
        self._budgets.append(client._engine.budget)
        # The finalizer (close()'s work for a forgotten client) unregisters through the connector
        # of a blocking driver (the aio client's is one of its own): give it the stand-in instead.
        _, release, args, _ = client._finalizer.peek()
        assert release is _client_module.release_everything, release
        args[0].connector = _FakeConnector(self)

    def _sampling(self, handler: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def sampled(step: Any) -> Any:
            self.sample_budgets()
            return handler(step)
        return sampled

    # -- controls -----------------------------------------------------------

    def refuse_registration(self, refuse: bool = True) -> None:
        """Answer every Register like a server that cannot open our memory."""
        self._refuse_registration = refuse

    def refuse_unregister(self, times: int) -> None:
        """Answer the next *times* Unregister calls "currently in use"."""
        with self._lock:
            self._refuse_unregister = times

    def fail_next(self, times: int = 1, ops: tuple[str, ...] = ("fetch", "register", "unregister", "send"),
                  error: BaseException | None = None) -> None:
        """Fail the next *times* calls of *ops* with *error* (a ServerError by default)."""
        with self._lock:
            for _ in range(times):
                self._failures.append((frozenset(ops), error or ServerError("injected failure of the fake Triton")))

    def die(self) -> None:
        """Become unreachable (ServerUnavailable for every call); every registration is forgotten."""
        with self._lock:
            self.alive = False
            self._forget_all()

    def come_back(self) -> None:
        """Answer again, knowing no region."""
        with self._lock:
            self.alive = True

    def shutdown(self) -> None:
        """The server exits: every registration (and its mapping) goes; and slot memory a
        client left open is closed (a test that found it open has failed already)."""
        self.die()
        with self._lock:
            left = list(self._live_memory)
        for memory in left:
            memory.close()

    def restart(self) -> None:
        """Die and come back: every registration is forgotten."""
        self.die()
        self.come_back()

    def stall(self) -> None:
        """Make every Send wait (from its start) until :meth:`release`."""
        self._gate.clear()

    def release(self) -> None:
        """Let stalled Sends (and later ones) go on."""
        self._gate.set()

    def wait_stalled(self, count: int, timeout: float = 5.0) -> bool:
        """Wait until *count* Sends are stalled; False on timeout."""
        with self._stalled_changed:
            return self._stalled_changed.wait_for(lambda: self._stalled >= count, timeout)

    # -- what it holds --------------------------------------------------------

    @property
    def registered(self) -> dict[str, Registration]:
        """The regions registered now (a copy)."""
        with self._lock:
            return dict(self._regions)

    def sample_budgets(self) -> None:
        """Record the clients' byte budgets now; one over its limit is a violation."""
        for budget in self._budgets:
            used = budget.used
            if used > self.budget_peak:
                self.budget_peak = used
            if used > budget.limit:
                self.violations.append(f"a client's byte budget holds {used} > max_pool_bytes={budget.limit}")

    @contextlib.contextmanager
    def sampling(self, interval: float = 0.0005) -> Iterator[None]:
        """Also sample the clients' byte budgets from a thread of its own, every *interval*
        seconds, for the duration (instants between the steps, too)."""
        stop = threading.Event()

        def run() -> None:
            while not stop.wait(interval):
                self.sample_budgets()

        thread = threading.Thread(target=run, name="fake-triton-sampler", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def audit(self) -> None:
        """Record slot memory the client closed while this server still has it registered."""
        with self._lock:
            for reg in self._regions.values():
                if _closed(reg.memory):
                    message = f"slot memory of {reg.name!r} was closed while registered"
                    if message not in self.violations:
                        self.violations.append(message)

    def check(self) -> None:
        """Raise AssertionError listing the violations seen (after a last audit), or if
        host slot memory is still open (every client should be closed by now)."""
        self.audit()
        self.sample_budgets()
        assert not self.violations, "\n".join(self.violations)
        assert self.memory_bytes == 0, f"{self.memory_bytes} bytes of slot memory left open"

    # -- the steps (blocking driver) --------------------------------------------

    def fetch_model(self, step: FetchModel) -> tuple[dict, dict]:
        self._pause('fetch')
        return self._fetch_model(step)

    def fetch_model_names(self, step: FetchModelNames) -> list[str]:
        self._pause('fetch')
        self._begin("fetch", "reading the server's model repository index")
        return sorted(self.models)

    def register(self, step: Register) -> str:
        self._pause('register')
        return self._register(step)

    def unregister(self, step: Unregister) -> None:
        self._pause('unregister')
        self._unregister(step.name)

    def send(self, step: Send) -> FakeResult:
        self._pause('send')
        names = self._begin_send(step)
        if step.claim is not None:
            step.claim.unanswered = True  # as the drivers' own send handlers do
        if self.client_gives_up_after is not None:
            return self._send_given_up_on(step, names, self.client_gives_up_after)
        try:
            self._wait_at_gate()
            return self._execute(step)
        finally:
            self._end_send(names)

    def _wait_at_gate(self) -> None:
        if not self._gate.is_set():
            self._count_stalled(+1)
            try:
                self._gate.wait()
            finally:
                self._count_stalled(-1)

    def _send_given_up_on(self, step: Send, names: list[str], seconds: float) -> FakeResult:
        """The request runs on a "server" thread; the client stops waiting after *seconds*
        (ServerTimeout) and the server goes on: it writes the outputs when it is done (the gate
        opened), and its regions stay in use until then."""
        done: list[Any] = []

        def run() -> None:
            try:
                self._wait_at_gate()
                done.append(self._execute(step))
            except BaseException as exc:
                done.append(exc)
            finally:
                self._end_send(names)
                with self._lock:
                    self.late_writes += 1

        server = threading.Thread(target=run, daemon=True)
        server.start()
        server.join(seconds)
        if server.is_alive() or not done:
            raise ServerTimeout(f"inferring with model {step.model!r}: the client gave up after "
                                f"{seconds} s (client_timeout); the server goes on running it")
        with self._lock:
            self.late_writes -= 1  # answered in time after all
        if isinstance(done[0], BaseException):
            raise done[0]
        return done[0]

    # -- the steps (asyncio driver): the same, never blocking the loop ------------

    async def fetch_model_async(self, step: FetchModel) -> tuple[dict, dict]:
        await self._pause_async('fetch')
        return self._fetch_model(step)

    async def fetch_model_names_async(self, step: FetchModelNames) -> list[str]:
        await self._pause_async('fetch')
        self._begin("fetch", "reading the server's model repository index")
        return sorted(self.models)

    async def register_async(self, step: Register) -> str:
        await self._pause_async('register')
        return self._register(step)

    async def unregister_async(self, step: Unregister) -> None:
        await self._pause_async('unregister')
        self._unregister(step.name)

    async def send_async(self, step: Send) -> FakeResult:
        await self._pause_async('send')
        names = self._begin_send(step)
        if step.claim is not None:
            step.claim.unanswered = True  # as the drivers' own send handlers do
        try:
            if not self._gate.is_set():
                self._count_stalled(+1)
                try:
                    while not self._gate.is_set():
                        await asyncio.sleep(0.001)
                finally:
                    self._count_stalled(-1)
            return self._execute(step)
        finally:
            self._end_send(names)

    # -- inside ---------------------------------------------------------------

    def _pause(self, op: str) -> None:
        self.sample_budgets()
        with self._lock:
            self.begun[op] += 1
        delay = self.delays.get(op, self.delay)
        if delay:
            time.sleep(delay)

    async def _pause_async(self, op: str) -> None:
        self.sample_budgets()
        with self._lock:
            self.begun[op] += 1
        await asyncio.sleep(self.delays.get(op, self.delay))  # 0: a turn of the loop, as real I/O takes

    def _begin(self, op: str, doing: str) -> None:
        """Every call: counted, audited; refused by a dead server or an injected failure."""
        self.audit()
        with self._lock:
            self.calls[op] += 1
            if not self.alive:
                raise ServerUnavailable(f"{doing}: cannot reach the Triton server (failed to connect to all "
                                        f"addresses; fake Triton is down)")
            for i, (ops, error) in enumerate(self._failures):
                if op in ops:
                    del self._failures[i]
                    raise error

    def _fetch_model(self, step: FetchModel) -> tuple[dict, dict]:
        doing = f"reading metadata of model {step.model!r}"
        self._begin("fetch", doing)
        model = self.models.get(step.model)
        if model is None:
            raise ServerError(f"{doing}: Request for unknown model: '{step.model}' is not found")
        # The client asks for the config and unwraps gRPC's "config" level (Transport.model_config).
        reply = model.config_reply()
        return model.metadata(), reply.get("config", reply)

    def _register(self, step: Register) -> str:
        memory = step.memory
        region = memory.region
        name = step.name if step.name is not None else triton.default_name(region)
        doing = f"registering {region!r} as {name!r}"
        self._begin("register", doing)
        if _closed(memory):
            self.violations.append(f"closed slot memory registered as {name!r}")
            raise RegistrationError(f"{doing}: the region is closed")
        if self._refuse_registration:
            raise SharedMemoryRefused(
                f"{doing}: the server cannot open our shared memory. It must run on this machine, "
                f"in the same IPC namespace (--ipc=host for containers), as a user allowed to open "
                f"mode-0600 segments of ours. Server said: Unable to open shared memory region: "
                f"'{region.key}' (fake Triton told to refuse)")
        with self._lock:
            if name in self._regions:
                raise RegistrationError(
                    f"{doing}: the server already has a region of that name; unregister it first or "
                    f"pick another name. Server said: shared memory region '{name}' already in manager")
            mapping = tritonshm.SystemRegion.attach(region.key) if memory.kind == "system" else None
            self._regions[name] = Registration(name, memory, memory.nbytes, memory.kind, mapping)
            self.registrations += 1
            self._bytes_changed(+memory.nbytes)
        return name

    def _unregister(self, name: str) -> None:
        doing = f"unregistering {name!r}"
        self._begin("unregister", doing)
        with self._lock:
            if self._refuse_unregister > 0 or self._holds[name] > 0:
                if self._refuse_unregister > 0:
                    self._refuse_unregister -= 1
                raise ServerError(f"{doing}: failed to unregister shared memory region '{name}': "
                                  f"Cannot unregister shared memory region '{name}', it is currently in use.")
            reg = self._regions.pop(name, None)  # an unknown name: nothing to do (as Triton)
            if reg is not None:
                reg.drop()
                self._bytes_changed(-reg.nbytes)

    def _wire_unregister(self, wire: _Wire, name_or_region: Any, patience: float) -> None:
        name = name_or_region if isinstance(name_or_region, str) else triton.registered_name(name_or_region)
        if name is None:
            name = triton.default_name(name_or_region)
        deadline = time.monotonic() + patience
        while True:
            try:
                return self._unregister(name)
            except ServerError as exc:
                if "currently in use" not in str(exc) or time.monotonic() >= deadline:
                    raise
            time.sleep(0.01)

    def _bytes_changed(self, delta: int) -> None:  # under the lock
        self.registered_bytes += delta
        self.peak_bytes = max(self.peak_bytes, self.registered_bytes)
        self.history.append((time.monotonic(), self.registered_bytes))

    def _forget_all(self) -> None:  # under the lock
        if self._regions:
            for reg in self._regions.values():
                reg.drop()
            self._regions.clear()
            self._bytes_changed(-self.registered_bytes)

    def _count_stalled(self, delta: int) -> None:
        with self._stalled_changed:
            self._stalled += delta
            self._stalled_changed.notify_all()

    @staticmethod
    def _shm(tensor: Any) -> tuple[str, int, int] | None:
        """(region, byte size, offset) of a gRPC InferInput / InferRequestedOutput bound to shared memory."""
        proto = tensor._input if hasattr(tensor, "_input") else tensor._output
        params = proto.parameters
        if "shared_memory_region" not in params:
            return None
        offset = params["shared_memory_offset"].int64_param if "shared_memory_offset" in params else 0
        return params["shared_memory_region"].string_param, params["shared_memory_byte_size"].int64_param, offset

    def _begin_send(self, step: Send) -> list[str]:
        """Count the call; the regions the Send names are "in use" until it ends."""
        self._begin("send", f"inferring with model {step.model!r}")
        names = [bound[0] for bound in map(self._shm, list(step.inputs) + list(step.outputs or ())) if bound]
        with self._lock:
            self._holds.update(names)
        return names

    def _end_send(self, names: list[str]) -> None:
        with self._lock:
            self._holds.subtract(names)

    def _region(self, name: str, doing: str) -> Registration:
        with self._lock:
            reg = self._regions.get(name)
        if reg is None:
            raise RegionNotRegistered(
                f"{doing}: the server does not know this region: it was unregistered, or the server "
                f"restarted since it was registered; register it again. Server said: Unable to find "
                f"system shared memory region: '{name}'")
        return reg

    def _execute(self, step: Send) -> FakeResult:
        doing = f"inferring with model {step.model!r}"
        with self._lock:
            if not self.alive:
                raise ServerUnavailable(f"{doing}: cannot reach the Triton server (fake Triton died)")
        model = self.models.get(step.model)
        if model is None:
            raise ServerError(f"{doing}: Request for unknown model: '{step.model}' is not found")
        arrays = {}
        for infer_input in step.inputs:
            name, datatype, shape = infer_input.name(), infer_input.datatype(), tuple(infer_input.shape())
            dtype = np.dtype(_NP_DTYPES[datatype])
            bound = self._shm(infer_input)
            if bound is None:
                arrays[name] = np.frombuffer(infer_input._raw_content, dtype).reshape(shape).copy()
                continue
            region, size, offset = bound
            reg = self._region(region, doing)
            if size != math.prod(shape) * dtype.itemsize or offset + size > reg.nbytes:
                raise ServerError(f"{doing}: input {name!r} binds {size} bytes at {offset} of {region!r} "
                                  f"({reg.nbytes} bytes) for {datatype} {list(shape)}")
            if _closed(reg.memory):
                self.violations.append(f"Send read {region!r} after its slot memory was closed")
                if reg.mapping is None:
                    raise ServerError(f"{doing}: {region!r} is gone")
            arrays[name] = reg.region().read(dtype, shape, offset)
        results = model.run(arrays)
        wanted = [o._output.name for o in step.outputs] if step.outputs else list(results)
        bindings = {o._output.name: self._shm(o) for o in step.outputs or ()}
        tensors, plain = {}, {}
        datatypes = {name: datatype for name, datatype, _ in model.outputs}
        for name in wanted:
            if name not in results:
                raise ServerError(f"{doing}: unexpected inference output '{name}' for model '{model.name}'")
            array = np.ascontiguousarray(results[name])
            tensors[name] = (datatypes[name], array.shape)
            bound = bindings.get(name)
            if bound is None:
                plain[name] = array
                continue
            region, size, offset = bound
            reg = self._region(region, doing)
            if array.nbytes > size:
                raise OutputTooSmall(
                    f"{doing}: output {name!r} needs {array.nbytes} bytes but only {size} were bound; bind "
                    f"a larger nbytes. Server said: shared memory size specified with the request for output "
                    f"'{name}' ({size} bytes) should be at least {array.nbytes} bytes to hold the results",
                    name, array.nbytes)
            if offset + size > reg.nbytes:
                raise ServerError(f"{doing}: output {name!r} binds past the end of {region!r}")
            if _closed(reg.memory):
                self.violations.append(f"Send wrote {region!r} after its slot memory was closed")
                if reg.mapping is None:
                    raise ServerError(f"{doing}: {region!r} is gone")
            if array.nbytes:
                reg.region().write(array, offset)
        return FakeResult(model.name, tensors, plain)


def _closed(memory: Any) -> bool:
    return bool(getattr(memory.region, "closed", False))


@pytest.fixture
def fake_triton(monkeypatch: pytest.MonkeyPatch):
    """A :class:`FakeTriton` for one test; fails the test if it saw memory freed while registered."""
    fake = FakeTriton.install(monkeypatch)
    try:
        yield fake
        fake.check()
    finally:
        fake.shutdown()  # its own mappings of regions still registered go
