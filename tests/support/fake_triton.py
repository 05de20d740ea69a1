"""A fake Triton server in this process, for the client engine -- TEST-ONLY, never shipped.

:class:`FakeTriton` answers at an address of its own (:data:`FAKE_URL`), as Triton's gRPC
service does, with no network: pool creation, growth, retirement, fallbacks, re-registration
and close() are tested in milliseconds, through every layer of a real client::

    fake = FakeTriton.install(monkeypatch)        # or the ``fake_triton`` fixture
    with fake.client(max_pool_bytes=1 << 20) as c:  # tritonshm.Client(FAKE_URL, ...): nothing patched
        c.infer("identity_fp32", {"INPUT0": x})
    assert fake.registered_bytes == 0 and fake.peak_bytes <= 1 << 20
    fake.check()                                  # no slot memory freed while registered

The seam
--------
The fake stands in for the *server*, one level below tritonclient's client: :meth:`install`
puts it in ``tritonshm._transport.IN_PROCESS`` at its address, so every tritonclient client
tritonshm makes for that address -- the drivers' (the blocking client's ``Connector``, the
asyncio client's aio client), the finalizer's of a forgotten client, ``Client.tritonclient`` --
is a real ``tritonclient.grpc`` (or ``.grpc.aio``) ``InferenceServerClient`` whose gRPC stub is
the fake's (``_tritonclient_compat.with_grpc_stub``).  The clients are made with nothing
patched, and everything above the stub runs as against a server: the drivers' own step
handlers (Send, Register, Unregister, FetchModel), ``Connector``, ``tritonshm.triton``'s
register / unregister (with its patience for "in use"), ``call_translated`` and the translation
of the server's errors, tritonclient's request building and its ``InferResult``.  The fake reads
and writes gRPC's messages (``service_pb2``: public), never a tritonclient object.

What it does not carry: HTTP (an ``http://`` URL: inference goes on tritonshm's own sockets,
``tritonshm._http1``, which no stub stands under -- asking it for an HTTP client is an error
that says so), gRPC streams (``ModelStreamInfer``: UNIMPLEMENTED, as for any call it has no
answer to), and CUDA memory (a server in the client's own process cannot open a CUDA IPC
handle: it refuses the registration as Triton does, "invalid args", and the client falls back).

What it is
----------
* **Models** (:data:`MODELS`): ``identity_fp32`` (FP32 ``[-1]`` -> the same),
  ``batched_add`` (max_batch_size 8, FP32 ``[-1, 4]`` -> input + 1),
  ``add_sub`` (two FP32 ``[16]`` inputs -> their sum and difference) and
  ``repeat_fp32`` (FP32 ``[-1]`` -> the input three times: larger than the
  client's guess for a variable output, so it must grow).  Metadata, config and the
  repository index are gRPC's messages, as Triton sends them.
* **Register** (system shared memory) maps the segment by its key, as Triton does
  (``SystemRegion.attach``), and reads and writes that mapping, so what the client closes
  does not pull memory from under the "server"; it records name -> that mapping and the
  client's SlotMemory of that key (found by the meter, to audit it).  The bytes registered are
  tracked at every instant (:attr:`registered_bytes`, :attr:`peak_bytes`, :attr:`history`);
  :meth:`shutdown` (the fixture calls it) drops what is left.
* **Unregister** answers "currently in use" (as Triton does) while a request that names the
  region runs, or when told (:meth:`refuse_unregister`).
* **ModelInfer** executes the model: inputs are read from the registered regions at the
  shared-memory parameters of the request's tensors, or from its raw contents (the wire path);
  outputs are written into the bound output regions (an undersized one is refused with
  Triton's words, which the client reads as OutputTooSmall with the size needed) or sent back
  as raw contents.  A region it does not know is refused as Triton does (after a restart).
* **Errors** are gRPC's (an ``RpcError`` with Triton's status and words): the client
  translates them as it does a server's.
* **Controls**: :meth:`refuse_registration`, :meth:`fail_next`, :meth:`die` /
  :meth:`come_back` / :meth:`restart` (every registration forgotten),
  :meth:`stall` / :meth:`release` (requests wait on a ``threading.Event``;
  :meth:`wait_stalled` tells when requests are parked there), :attr:`delay`
  (seconds before every call; :attr:`delays` per kind of call),
  :attr:`client_gives_up_after` (the blocking client stops waiting for a request after that
  many seconds -- DEADLINE_EXCEEDED, as gRPC says when a ``client_timeout`` passes, which the
  fake keeps too -- while the server goes on running it, holding its regions "in use", and
  writes its outputs when it is done: :attr:`late_writes`; the asyncio client always waits
  for the answer).
* **Metering**: the bytes of host slot memory alive in the process (made,
  registered or not, and not yet closed): :attr:`memory_bytes`,
  :attr:`memory_peak`, :attr:`memory_made` (``insides.meter_slot_memory``, from :meth:`install`).
* **Checks**: slot memory the client closed while the fake still has it
  registered (audited at every call), a request naming closed memory, a client's
  byte budget over its limit (looked at each time a budget takes bytes, at every call, and
  by :meth:`sampling` in between) are recorded in :attr:`violations`;
  :meth:`check` raises if there are any, or if slot memory is still open.

Kinds of call (the keys of :attr:`calls`, :attr:`begun`, :attr:`delays`, and the *ops* of
:meth:`fail_next`): "fetch" (a model's metadata, its config, the repository index: the
client's FetchModel takes two), "register", "unregister", "send" (an inference), "status".
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import math
import threading
import time
import weakref
from typing import Any, Callable, Iterator, Mapping

import grpc
import numpy as np
import pytest
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2

import tritonshm
import tritonshm.aio
from tritonshm import _transport
from tritonshm import _tritonclient_compat as compat
from tritonshm.errors import InvalidOption

from support.insides import forget_left_registrations, meter_slot_memory, watch_byte_budgets

__all__ = ["FAKE_URL", "FakeTriton", "FakeModel", "MODELS", "fake_triton"]

FAKE_URL = "127.0.0.1:1"  # the fake's address: nothing listens there, and nothing connects

_NP_DTYPES = {"FP32": np.float32, "FP64": np.float64, "INT32": np.int32, "INT64": np.int64,
              "UINT8": np.uint8, "BOOL": np.bool_}


class FakeRpcError(grpc.RpcError):
    """A call the fake refused, as gRPC raises it: tritonclient reads ``code()``, ``details()``
    and ``debug_error_string()`` (into its InferenceServerException)."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def debug_error_string(self) -> str:
        return f"fake Triton: {self._code}: {self._details}"


def _refused(details: str, code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT) -> FakeRpcError:
    return FakeRpcError(code, details)


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
                raise _refused(f"[request id: <id_unknown>] expected input {name!r} for model {self.name!r}")
            array = arrays[name]
            if array.dtype != _NP_DTYPES[datatype]:
                raise _refused(f"input {name!r}: {array.dtype} is not {datatype}")
            if len(array.shape) != len(dims) or any(d != -1 and d != s for d, s in zip(dims, array.shape)):
                raise _refused(f"unexpected shape for input {name!r} for model {self.name!r}: "
                               f"{list(array.shape)}, model expects {list(dims)}")
            if self.max_batch_size and array.shape[0] > self.max_batch_size:
                raise _refused(f"inference request batch-size must be <= {self.max_batch_size}")
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


@dataclasses.dataclass
class Registration:
    """One region the fake has registered."""

    name: str
    memory: Any     # the client's SlotMemory of that key (None: not slot memory, or not a system region)
    nbytes: int
    kind: str       # "system" or "cuda"
    mapping: Any = None  # the server's own mapping of a system region (it outlives the client's)
    offset: int = 0      # where the registered bytes start in it
    key: str = ""

    def drop(self) -> None:
        if self.mapping is not None:
            self.mapping.close()


# -- the stubs: what tritonclient's clients call ------------------------------

#: The calls the fake answers: gRPC method -> (kind of call, FakeTriton method).
_RPCS: dict[str, tuple[str, str]] = {
    "ModelMetadata": ("fetch", "_model_metadata"),
    "ModelConfig": ("fetch", "_model_config"),
    "RepositoryIndex": ("fetch", "_repository_index"),
    "SystemSharedMemoryRegister": ("register", "_register_system"),
    "CudaSharedMemoryRegister": ("register", "_register_cuda"),
    "SystemSharedMemoryUnregister": ("unregister", "_unregister_system"),
    "CudaSharedMemoryUnregister": ("unregister", "_unregister_cuda"),
    "SystemSharedMemoryStatus": ("status", "_system_status"),
    "CudaSharedMemoryStatus": ("status", "_cuda_status"),
}


class _Stub:
    """``GRPCInferenceServiceStub``'s face of a fake, for tritonclient's blocking gRPC client:
    each method takes the request message (and gRPC's ``metadata``, ``timeout``, ``compression``)
    and returns the response message, or raises :class:`FakeRpcError`."""

    def __init__(self, fake: "FakeTriton"):
        self._fake = fake

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)
        fake = self._fake

        def call(request: Any, metadata: Any = None, timeout: float | None = None, **_: Any) -> Any:
            return fake._call(method, request, timeout)

        return call


class _AioStub(_Stub):
    """:class:`_Stub` for tritonclient's aio client: each method returns an awaitable."""

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)
        fake = self._fake

        async def call(request: Any, metadata: Any = None, timeout: float | None = None, **_: Any) -> Any:
            return await fake._call_async(method, request, timeout)

        return call


# -- the fake -----------------------------------------------------------------

class FakeTriton:
    """An in-process Triton at :attr:`address` (see the module docstring)."""

    def __init__(self, models: Mapping[str, FakeModel] | None = None, address: str = FAKE_URL):
        self.models = dict(MODELS if models is None else models)
        self.address = address
        self._lock = threading.RLock()
        self._regions: dict[str, Registration] = {}
        self._holds: collections.Counter = collections.Counter()  # region -> requests using it now
        self.registered_bytes = 0
        self.peak_bytes = 0
        self.history: list[tuple[float, int]] = [(time.monotonic(), 0)]  # (when, bytes registered)
        self.registrations = 0          # successful Register calls, re-registrations included
        self.calls: collections.Counter = collections.Counter()  # by kind of call (see the module doc)
        self.begun: collections.Counter = collections.Counter()  # the same, counted before the delay
        self.violations: list[str] = []
        #: The parameters of each inference request run, in order (what options reached the server:
        #: "priority", "timeout", "sequence_id", ... as ``InferParameter`` messages).
        self.parameters_seen: list[dict[str, Any]] = []
        self.alive = True
        self.delay = 0.0                 # seconds before every call
        self.delays: dict[str, float] = {}  # per kind of call ("fetch", "register", ...): instead
        self._refuse_registration = False
        self._refuse_unregister = 0
        self._failures: list[tuple[frozenset, BaseException]] = []
        self._cut_off = 0  # registrations to carry out and answer as cut off (cut_off_registrations)
        self._gate = threading.Event()   # set: requests go through; clear: they stall
        self._gate.set()
        self._stalled = 0
        self._stalled_changed = threading.Condition(self._lock)
        #: Seconds after which the client gives up on a request (as with client_timeout) while
        #: the server goes on running it (None: it waits for the answer); late_writes counts those.
        self.client_gives_up_after: float | None = None
        self.late_writes = 0
        self._budgets: "weakref.WeakSet[Any]" = weakref.WeakSet()  # the clients' byte budgets seen
        self.budget_peak = 0
        # Host slot memory made in this process, counted once install() has hooked it.
        self._meter = None

    # -- plugging in ------------------------------------------------------

    @classmethod
    def install(cls, monkeypatch: pytest.MonkeyPatch, models: Mapping[str, FakeModel] | None = None,
                address: str = FAKE_URL) -> "FakeTriton":
        """A fake serving at *address* (every client tritonshm makes for it is the fake's) and
        metering slot memory and byte budgets, until *monkeypatch* is undone."""
        fake = cls(models, address)
        monkeypatch.setitem(_transport.IN_PROCESS, address, fake.connect)
        fake._meter = meter_slot_memory(monkeypatch)
        watch_byte_budgets(monkeypatch, fake._budget_took)
        return fake

    def connect(self, transport: Any, *, ssl: bool = False, verbose: bool = False,
                options: Mapping[str, Any] | None = None) -> Any:
        """What ``Transport.connect`` hands out for this fake's address (see :data:`IN_PROCESS
        <tritonshm._transport.IN_PROCESS>`): tritonclient's own gRPC client of *transport*
        (blocking or aio), its calls answered by this fake."""
        if transport.http:
            raise InvalidOption(f"the fake Triton at {self.address} answers gRPC only: tritonshm sends HTTP "
                                f"inference requests on sockets of its own, which no stub stands under")
        client = transport.module.InferenceServerClient(self.address, verbose=verbose, ssl=ssl, **dict(options or {}))
        return compat.with_grpc_stub(client, _AioStub(self) if transport.aio else _Stub(self))

    def client(self, url: str | None = None, **kwargs: Any) -> tritonshm.Client:
        """A :class:`tritonshm.Client` whose server is this fake (its address: the default *url*)."""
        return tritonshm.Client(self.address if url is None else url, **kwargs)

    async def aio_client(self, url: str | None = None, **kwargs: Any) -> tritonshm.aio.Client:
        """A :class:`tritonshm.aio.Client` whose server is this fake (call in a running loop)."""
        return tritonshm.aio.Client(self.address if url is None else url, **kwargs)

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
        """Fail the next *times* calls of *ops* with *error* (raised as it is; by default a gRPC
        INTERNAL error "injected failure of the fake Triton", which the client translates)."""
        with self._lock:
            for _ in range(times):
                failure = error or _refused("injected failure of the fake Triton", grpc.StatusCode.INTERNAL)
                self._failures.append((frozenset(ops), failure))

    def cut_off_registrations(self, times: int = 1) -> None:
        """Carry out the next *times* registrations, then answer each with DEADLINE_EXCEEDED: a
        call whose answer did not come in time, though the server did what it asked."""
        with self._lock:
            self._cut_off += times

    def die(self) -> None:
        """Become unreachable (UNAVAILABLE for every call); every registration is forgotten."""
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
        if self._meter is not None:
            with self._meter.lock:
                left = list(self._meter.alive)
            for memory in left:
                memory.close()

    def restart(self) -> None:
        """Die and come back: every registration is forgotten."""
        self.die()
        self.come_back()

    def stall(self) -> None:
        """Make every inference wait (from its start) until :meth:`release`."""
        self._gate.clear()

    def release(self) -> None:
        """Let stalled inferences (and later ones) go on."""
        self._gate.set()

    def wait_stalled(self, count: int, timeout: float = 5.0) -> bool:
        """Wait until *count* inferences are stalled; False on timeout."""
        with self._stalled_changed:
            return self._stalled_changed.wait_for(lambda: self._stalled >= count, timeout)

    # -- what it holds --------------------------------------------------------

    @property
    def registered(self) -> dict[str, Registration]:
        """The regions registered now (a copy)."""
        with self._lock:
            return dict(self._regions)

    @property
    def memory_bytes(self) -> int:
        """Bytes of host slot memory alive now (made, registered or not, not yet closed)."""
        return self._meter.live if self._meter is not None else 0

    @property
    def memory_peak(self) -> int:
        """The most :attr:`memory_bytes` were at any instant."""
        return self._meter.peak if self._meter is not None else 0

    @property
    def memory_made(self) -> int:
        """How many pieces of host slot memory were made."""
        return self._meter.made if self._meter is not None else 0

    def _budget_took(self, budget: Any) -> None:
        with self._lock:
            self._budgets.add(budget)
        self._sample(budget)

    def _sample(self, budget: Any) -> None:
        used = budget.used
        if used > self.budget_peak:
            self.budget_peak = used
        if used > budget.limit:
            self.violations.append(f"a client's byte budget holds {used} > max_pool_bytes={budget.limit}")

    def sample_budgets(self) -> None:
        """Record the clients' byte budgets now; one over its limit is a violation."""
        with self._lock:
            budgets = list(self._budgets)
        for budget in budgets:
            self._sample(budget)

    @contextlib.contextmanager
    def sampling(self, interval: float = 0.0005) -> Iterator[None]:
        """Also sample the clients' byte budgets from a thread of its own, every *interval*
        seconds, for the duration (instants between the calls, too)."""
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

    # -- the calls, as the stubs make them --------------------------------------

    def _answer(self, method: str) -> tuple[str, Callable[[Any], Any]]:
        if method not in _RPCS:
            raise _refused(f"the fake Triton has no answer to {method}", grpc.StatusCode.UNIMPLEMENTED)
        op, name = _RPCS[method]
        return op, getattr(self, name)

    def _call(self, method: str, request: Any, timeout: float | None) -> Any:
        if method == "ModelInfer":
            self._pause("send")
            return self._infer(request, timeout)
        op, answer = self._answer(method)
        self._pause(op)
        return answer(request)

    async def _call_async(self, method: str, request: Any, timeout: float | None) -> Any:
        if method == "ModelInfer":
            await self._pause_async("send")
            return await self._infer_async(request)
        op, answer = self._answer(method)
        await self._pause_async(op)
        return answer(request)

    def _infer(self, request: Any, timeout: float | None) -> Any:
        names = self._begin_send(request)
        waits = [s for s in (self.client_gives_up_after, timeout) if s is not None]
        if waits:
            return self._infer_given_up_on(request, names, min(waits))
        try:
            self._wait_at_gate()
            return self._execute(request)
        finally:
            self._end_send(names)

    async def _infer_async(self, request: Any) -> Any:
        names = self._begin_send(request)
        try:
            if not self._gate.is_set():
                self._count_stalled(+1)
                try:
                    while not self._gate.is_set():
                        await asyncio.sleep(0.001)
                finally:
                    self._count_stalled(-1)
            return self._execute(request)
        finally:
            self._end_send(names)

    def _wait_at_gate(self) -> None:
        if not self._gate.is_set():
            self._count_stalled(+1)
            try:
                self._gate.wait()
            finally:
                self._count_stalled(-1)

    def _infer_given_up_on(self, request: Any, names: list[str], seconds: float) -> Any:
        """The request runs on a "server" thread; the client stops waiting after *seconds*
        (DEADLINE_EXCEEDED) and the server goes on: it writes the outputs when it is done (the
        gate opened), and its regions stay in use until then."""
        done: list[Any] = []

        def run() -> None:
            try:
                self._wait_at_gate()
                done.append(self._execute(request))
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
            raise _refused("Deadline Exceeded", grpc.StatusCode.DEADLINE_EXCEEDED)
        with self._lock:
            self.late_writes -= 1  # answered in time after all
        if isinstance(done[0], BaseException):
            raise done[0]
        return done[0]

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

    def _begin(self, op: str) -> None:
        """Every call: counted, audited; refused by a dead server or an injected failure."""
        self.audit()
        with self._lock:
            self.calls[op] += 1
            if not self.alive:
                raise _refused(f"failed to connect to all addresses; last error: UNKNOWN: ipv4:{self.address}: "
                               f"Failed to connect to remote host: Connection refused (fake Triton is down)",
                               grpc.StatusCode.UNAVAILABLE)
            for i, (ops, error) in enumerate(self._failures):
                if op in ops:
                    del self._failures[i]
                    raise error

    def _model(self, name: str) -> FakeModel:
        model = self.models.get(name)
        if model is None:
            raise _refused(f"Request for unknown model: '{name}' is not found", grpc.StatusCode.NOT_FOUND)
        return model

    def _model_metadata(self, request: Any) -> Any:
        self._begin("fetch")
        return json_format.ParseDict(self._model(request.name).metadata(), service_pb2.ModelMetadataResponse())

    def _model_config(self, request: Any) -> Any:
        self._begin("fetch")
        config = json_format.ParseDict(self._model(request.name).config_reply()["config"],
                                       model_config_pb2.ModelConfig())
        return service_pb2.ModelConfigResponse(config=config)

    def _repository_index(self, request: Any) -> Any:
        self._begin("fetch")
        return service_pb2.RepositoryIndexResponse(models=[
            service_pb2.RepositoryIndexResponse.ModelIndex(name=name, version="1", state="READY")
            for name in sorted(self.models)])

    def _register_system(self, request: Any) -> Any:
        name, key, offset, nbytes = request.name, request.key, request.offset, request.byte_size
        self._begin("register")
        memory = self._meter.by_key.get(key) if self._meter is not None else None
        if _closed(memory):
            self.violations.append(f"closed slot memory registered as {name!r}")
        if self._refuse_registration:
            raise _refused(f"Unable to open shared memory region: '{key}' (fake Triton told to refuse)")
        with self._lock:
            if name in self._regions:
                raise _refused(f"shared memory region '{name}' already in manager", grpc.StatusCode.ALREADY_EXISTS)
            try:
                mapping = tritonshm.SystemRegion.attach(key)
            except OSError as exc:
                raise _refused(f"Unable to open shared memory region: '{key}' ({exc})") from None
            if offset + nbytes > mapping.nbytes:
                mapping.close()
                raise _refused(f"failed to register shared memory region '{name}': the region of {mapping.nbytes} "
                               f"bytes has no {nbytes} at offset {offset}")
            self._regions[name] = Registration(name, memory, nbytes, "system", mapping, offset, key)
            self.registrations += 1
            self._bytes_changed(+nbytes)
            if self._cut_off:
                self._cut_off -= 1
                raise _refused("Deadline Exceeded", grpc.StatusCode.DEADLINE_EXCEEDED)
        return service_pb2.SystemSharedMemoryRegisterResponse()

    def _register_cuda(self, request: Any) -> Any:
        self._begin("register")
        # A server in the client's own process cannot open the client's CUDA IPC handle.
        raise _refused(f"failed to register CUDA shared memory region '{request.name}': invalid args")

    def _unregister_system(self, request: Any) -> Any:
        self._unregister(request.name, "system")
        return service_pb2.SystemSharedMemoryUnregisterResponse()

    def _unregister_cuda(self, request: Any) -> Any:
        self._unregister(request.name, "cuda")
        return service_pb2.CudaSharedMemoryUnregisterResponse()

    def _unregister(self, name: str, kind: str) -> None:
        self._begin("unregister")
        with self._lock:
            names = [name] if name else [n for n, reg in self._regions.items() if reg.kind == kind]  # "": all
            for one in names:
                if self._refuse_unregister > 0 or self._holds[one] > 0:
                    if self._refuse_unregister > 0:
                        self._refuse_unregister -= 1
                    raise _refused(f"failed to unregister shared memory region '{one}': Cannot unregister shared "
                                   f"memory region '{one}', it is currently in use.", grpc.StatusCode.INTERNAL)
                reg = self._regions.get(one)  # an unknown name: nothing to do (as Triton)
                if reg is not None and reg.kind == kind:
                    del self._regions[one]
                    reg.drop()
                    self._bytes_changed(-reg.nbytes)

    def _system_status(self, request: Any) -> Any:
        self._begin("status")
        regions = self._status_of("system", request.name)
        return service_pb2.SystemSharedMemoryStatusResponse(regions={
            reg.name: service_pb2.SystemSharedMemoryStatusResponse.RegionStatus(
                name=reg.name, key=reg.key, offset=reg.offset, byte_size=reg.nbytes) for reg in regions})

    def _cuda_status(self, request: Any) -> Any:
        self._begin("status")
        regions = self._status_of("cuda", request.name)
        return service_pb2.CudaSharedMemoryStatusResponse(regions={
            reg.name: service_pb2.CudaSharedMemoryStatusResponse.RegionStatus(name=reg.name, byte_size=reg.nbytes)
            for reg in regions})

    def _status_of(self, kind: str, name: str) -> list[Registration]:
        with self._lock:
            regions = [reg for reg in self._regions.values() if reg.kind == kind and name in ("", reg.name)]
        if name and not regions:
            raise _refused(f"Unable to find {kind} shared memory region: '{name}'")
        return regions

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
        """(region, byte size, offset) of a request's input or requested output bound to shared
        memory (its parameters, in the ``ModelInferRequest``), or None."""
        params = tensor.parameters
        if "shared_memory_region" not in params:
            return None
        offset = params["shared_memory_offset"].int64_param if "shared_memory_offset" in params else 0
        return params["shared_memory_region"].string_param, params["shared_memory_byte_size"].int64_param, offset

    def _begin_send(self, request: Any) -> list[str]:
        """Count the call; the regions the request names are "in use" until it ends."""
        self._begin("send")
        names = [bound[0] for bound in map(self._shm, list(request.inputs) + list(request.outputs)) if bound]
        with self._lock:
            self._holds.update(names)
        return names

    def _end_send(self, names: list[str]) -> None:
        with self._lock:
            self._holds.subtract(names)

    def _region(self, name: str) -> Registration:
        with self._lock:
            reg = self._regions.get(name)
        if reg is None:
            raise _refused(f"Unable to find system shared memory region: '{name}'")
        if reg.mapping is None:
            raise _refused(f"the fake Triton cannot read or write CUDA shared memory region '{name}'")
        return reg

    def _execute(self, request: Any) -> Any:
        """Run the model of a ``ModelInferRequest``: its ``ModelInferResponse``."""
        with self._lock:
            if not self.alive:
                raise _refused("Socket closed (fake Triton died)", grpc.StatusCode.UNAVAILABLE)
        model = self._model(request.model_name)
        with self._lock:
            self.parameters_seen.append(dict(request.parameters))
        raw = iter(request.raw_input_contents)
        arrays = {}
        for tensor in request.inputs:
            name, datatype, shape = tensor.name, tensor.datatype, tuple(tensor.shape)
            dtype = np.dtype(_NP_DTYPES[datatype])
            bound = self._shm(tensor)
            if bound is None:
                content = next(raw, None)
                if content is None:
                    raise _refused(f"expected raw contents for input {name!r} of model {model.name!r}")
                arrays[name] = np.frombuffer(content, dtype).reshape(shape).copy()
                continue
            region, size, offset = bound
            reg = self._region(region)
            if size != math.prod(shape) * dtype.itemsize or offset + size > reg.nbytes:
                raise _refused(f"input {name!r} binds {size} bytes at {offset} of {region!r} "
                               f"({reg.nbytes} bytes) for {datatype} {list(shape)}")
            if _closed(reg.memory):
                self.violations.append(f"Send read {region!r} after its slot memory was closed")
            arrays[name] = reg.mapping.read(dtype, shape, reg.offset + offset)
        results = model.run(arrays)
        wanted = [o.name for o in request.outputs] or list(results)
        bindings = {o.name: self._shm(o) for o in request.outputs}
        datatypes = {name: datatype for name, datatype, _ in model.outputs}
        response = service_pb2.ModelInferResponse(model_name=model.name, model_version="1", id=request.id)
        for name in wanted:
            if name not in results:
                raise _refused(f"unexpected inference output '{name}' for model '{model.name}'")
            array = np.ascontiguousarray(results[name])
            response.outputs.add(name=name, datatype=datatypes[name], shape=list(array.shape))
            bound = bindings.get(name)
            if bound is None:
                response.raw_output_contents.append(array.tobytes())
                continue
            region, size, offset = bound
            reg = self._region(region)
            if array.nbytes > size:
                raise _refused(f"shared memory size specified with the request for output '{name}' ({size} bytes) "
                               f"should be at least {array.nbytes} bytes to hold the results")
            if offset + size > reg.nbytes:
                raise _refused(f"output {name!r} binds past the end of {region!r}")
            if _closed(reg.memory):
                self.violations.append(f"Send wrote {region!r} after its slot memory was closed")
            if array.nbytes:
                reg.mapping.write(array, reg.offset + offset)
        return response


def _closed(memory: Any) -> bool:
    return memory is not None and bool(memory.closed)


@pytest.fixture
def fake_triton(monkeypatch: pytest.MonkeyPatch):
    """A :class:`FakeTriton` for one test; fails the test if it saw memory freed while registered."""
    fake = FakeTriton.install(monkeypatch)
    try:
        yield fake
        fake.check()
    finally:
        fake.shutdown()  # its own mappings of regions still registered go
        forget_left_registrations()  # (asked about after a close: this fake is gone, the next is not it)
