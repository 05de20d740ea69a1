"""The high-level client (layer 5): pooled, zero-copy inference.

    with tritonshm.Client("localhost:8001") as c:      # "http://host:port" for HTTP
        out = c.infer("model", {"INPUT0": x})          # dict of numpy arrays (copies)

        with c.request("model", batch_size=8) as req:   # the zero-copy path
            req.inputs["INPUT0"][:] = x                 # numpy views into a slot
            out = req.run()                             # numpy views into the slot

How it works:

* **Discovery.**  The client reads each model's metadata and config once
  (names, datatypes, dims, ``max_batch_size``), so callers never declare
  shapes, and checks every input against it before anything is sent.
* **Slot pools.**  Per model, one shared-memory region is registered once
  and carved into page-aligned slots, each holding a full batch of every
  input and output.  A request leases a slot, copies its inputs in once and
  names offsets in the request; nothing is registered or allocated per
  request.  When a request needs more room than the slots have (variable
  dims), a larger pool replaces the old one, which is retired once its
  slots come back.
* **Leases.**  A slot is a :class:`~tritonshm.Window` of the pool's region.
  It returns to the pool only when the window and every numpy view made
  from it are gone (``weakref.finalize`` on the window, whose views hold
  it), so results handed out with ``copy=False`` are never overwritten.
* **Backpressure.**  With every slot busy, a request waits up to its
  timeout, then raises :class:`~tritonshm.PoolExhausted`.
* **Chunking.**  A batch larger than ``max_batch_size`` is split, run on
  several slots at once and reassembled in order.
* **Self-healing.**  If the server lost our registrations (it restarted),
  the pool is registered again and the request retried once; if the server
  cannot open our memory, ``transport="auto"`` falls back to plain gRPC/HTTP
  with one warning.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import math
import mmap
import os
import queue
import threading
import warnings
import weakref
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from . import _dtypes, triton
from ._memory import SystemRegion
from .errors import (
    DTypeMismatch,
    Error,
    OutputTooSmall,
    PoolExhausted,
    RegionNotRegistered,
    RegistrationError,
    ServerError,
    ShapeMismatch,
    SharedMemoryRefused,
)

__all__ = ["Client", "Request", "ModelInfo", "TensorSpec"]

_PAGE = mmap.PAGESIZE
_TENSOR_ALIGN = 64  # each tensor of a slot starts on a cache line
_TRANSPORTS = ("auto", "shm", "wire")
_GROW_ATTEMPTS = 3  # runs of one request while growing undersized outputs


def _round_up(value: int, to: int) -> int:
    return (value + to - 1) // to * to


def _shape_fits(want: Sequence[int], shape: Sequence[int]) -> bool:
    """Whether *shape* matches the model's *want*, where -1 matches any size."""
    return len(shape) == len(want) and all(w == -1 or w == s for w, s in zip(want, shape))


# --------------------------------------------------------------------------
# Model discovery
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One input or output of a model, as the server describes it."""

    name: str
    datatype: str               #: Triton datatype, e.g. "FP32"
    dims: tuple[int, ...]       #: per-item dims, without the batch dim; -1 = variable

    @property
    def dtype(self) -> np.dtype:
        """The numpy dtype (object for BYTES)."""
        return _dtypes.numpy_dtype(self.datatype)

    @property
    def fixed(self) -> bool:
        """True when no dim is variable and the datatype has a fixed size."""
        return -1 not in self.dims and self.datatype != "BYTES"


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What the client knows about a model: read from the server, never declared."""

    name: str
    version: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int         #: 0 when the model does not batch

    @property
    def batched(self) -> bool:
        """True when inputs carry a leading batch dim."""
        return self.max_batch_size > 0

    @functools.cached_property
    def _outputs_by_name(self) -> dict[str, TensorSpec]:
        return {spec.name: spec for spec in self.outputs}

    def output(self, name: str) -> TensorSpec:
        """The output called *name*."""
        return self._outputs_by_name[name]

    def shape_of(self, spec: TensorSpec, batch: int) -> tuple[int, ...]:
        """The full tensor shape for a batch of *batch* items (dims may hold -1)."""
        return (batch, *spec.dims) if self.batched else spec.dims

    @classmethod
    def from_server(cls, metadata: Mapping[str, Any], config: Mapping[str, Any],
                    version: str) -> "ModelInfo":
        """Build from the JSON forms of model metadata and model config."""
        max_batch = int(config.get("max_batch_size", 0) or 0)

        def specs(entries: Iterable[Mapping[str, Any]]) -> tuple[TensorSpec, ...]:
            out = []
            for entry in entries:
                shape = tuple(int(d) for d in entry.get("shape", ()))
                dims = shape[1:] if max_batch > 0 else shape
                out.append(TensorSpec(entry["name"], entry["datatype"], dims))
            return tuple(out)

        return cls(metadata["name"], version, specs(metadata.get("inputs", ())),
                   specs(metadata.get("outputs", ())), max_batch)


# --------------------------------------------------------------------------
# Slot pools
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Where each tensor lives inside a slot, and how much room it has."""

    offsets: Mapping[str, int]
    capacities: Mapping[str, int]
    slot_bytes: int

    @classmethod
    def for_capacities(cls, capacities: Mapping[str, int]) -> "_Layout":
        offsets, cursor = {}, 0
        for name, capacity in capacities.items():
            offsets[name] = cursor
            cursor = _round_up(cursor + max(capacity, 1), _TENSOR_ALIGN)
        return cls(offsets, dict(capacities), _round_up(max(cursor, 1), _PAGE))

    def fits(self, needs: Mapping[str, int]) -> bool:
        return all(self.capacities.get(name, -1) >= size for name, size in needs.items())


class _Workers:
    """A fixed set of worker threads fed from a queue, returning Futures.

    Unlike ``ThreadPoolExecutor`` each worker runs *on_exit* in its own
    thread before it ends, so per-thread state (an HTTP connection and its
    gevent hub) is released by the thread that owns it.
    """

    def __init__(self, count: int, name: str, on_exit: Callable[[], None] | None = None):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._on_exit = on_exit
        self._idents: set[int] = set()
        self._threads = [threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True)
                         for i in range(count)]
        for thread in self._threads:
            thread.start()

    def owns_current_thread(self) -> bool:
        """True inside one of these workers."""
        return threading.get_ident() in self._idents

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        """Run ``fn(*args, **kwargs)`` on a worker; its Future."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((future, fn, args, kwargs))
        return future

    def _run(self) -> None:
        self._idents.add(threading.get_ident())
        try:
            while (item := self._queue.get()) is not None:
                future, fn, args, kwargs = item
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # handed to whoever waits on the future
                    future.set_exception(exc)
                del future, fn, args, kwargs, item  # drop leases before waiting again
        finally:
            if self._on_exit is not None:
                self._on_exit()

    def shutdown(self) -> None:
        """Finish queued work, then stop every worker and wait for it."""
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()


class _Connector:
    """Runs tritonclient calls for one server; holds no reference to a Client.

    gRPC clients are thread-safe, so one shared client serves every thread.
    HTTP clients run on gevent and work only in the thread that made them,
    so HTTP calls are carried out by a few I/O threads of our own, each with
    its own client, which it closes (and its gevent hub with it) on exit.
    User threads never touch gevent.
    """

    def __init__(self, url: str, verbose: bool, io_threads: int):
        self.http = url.startswith(("http://", "https://"))
        if self.http:
            import tritonclient.http as protocol

            self.address = url.split("://", 1)[1]
        else:
            import tritonclient.grpc as protocol

            self.address = url
        self.protocol = protocol
        self.ssl = url.startswith("https://")
        self.verbose = verbose
        # gRPC: the one client every call uses.  HTTP: made only if the user
        # asks for Client.tritonclient, as gevent ties it to the asking thread.
        self._shared = None if self.http else self.new()
        self._io_threads = io_threads
        self._creator_pid = os.getpid()
        self._io: _Workers | None = None
        self._local = threading.local()   # an I/O thread's own HTTP client
        self._lock = threading.Lock()
        self._closed = False

    def new(self) -> Any:
        """A new tritonclient client."""
        if self.http:
            return self.protocol.InferenceServerClient(self.address, verbose=self.verbose, ssl=self.ssl)
        return self.protocol.InferenceServerClient(self.address, verbose=self.verbose)

    @property
    def shared(self) -> Any:
        """The client handed to users as ``Client.tritonclient``."""
        if self._shared is None:
            with self._lock:
                if self._shared is None:
                    self._shared = self.new()
        return self._shared

    def call(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(client)`` with a tritonclient client that is safe in this thread."""
        if not self.http:
            return fn(self._shared)
        io = self._io_workers()
        if io is None:
            # Closing (or closed): a short-lived client of this thread's own.
            client = self.new()
            try:
                return fn(client)
            finally:
                client.close()
        if io.owns_current_thread():
            return fn(self._thread_client())
        return io.submit(lambda: fn(self._thread_client())).result()

    def _io_workers(self) -> _Workers | None:
        with self._lock:
            if self._io is None and not self._closed:
                self._io = _Workers(self._io_threads, "tritonshm-http", self._release_thread_client)
            return self._io

    def _thread_client(self) -> Any:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = self.new()
        return client

    def _release_thread_client(self) -> None:
        client = getattr(self._local, "client", None)
        if client is None:
            return
        self._local.client = None
        client.close()
        import gevent

        gevent.get_hub().destroy(destroy_loop=True)

    def close(self) -> None:
        """Stop the I/O threads and close the shared client; idempotent.

        In a forked child this does nothing: the connections (and the
        threads behind them) belong to the parent, and gRPC's must not be
        touched after a fork.
        """
        if os.getpid() != self._creator_pid:
            return
        with self._lock:
            io, self._io, self._closed = self._io, None, True
        if io is not None:
            io.shutdown()
        if self._shared is not None:
            try:
                self._shared.close()
            except Exception:
                pass  # closing a connection to a dead server may fail; nothing to keep


class _SlotPool:
    """One registered region carved into equal slots, leased one at a time."""

    def __init__(self, client: "Client", info: ModelInfo, layout: _Layout, nslots: int):
        self.info = info
        self.layout = layout
        self.nslots = nslots
        self.region = SystemRegion.create(layout.slot_bytes * nslots)
        self._creator_pid = os.getpid()  # a forked child must not unregister our name
        self._connector = client._connector
        # Weak: the client's finalizer holds its pools, which must not keep it alive.
        self._owner = weakref.ref(client)
        self._cond = threading.Condition(threading.RLock())  # finalizers may run under it
        self._free = collections.deque(range(nslots))
        self._running = 0                # leased, request in flight
        self._retired = False
        self._generation = 0             # bumped on every (re-)registration
        self._register_lock = threading.Lock()
        # Per slot: InferInput / InferRequestedOutput objects, reused across requests.
        self.request_objects: list[dict[str, Any]] = [{} for _ in range(nslots)]
        try:
            self.name = self._connector.call(lambda tc: triton.register(tc, self.region))
        except BaseException:
            self.region.close()
            raise

    @property
    def held(self) -> int:
        """Slots out of the pool whose request is over but whose views live on."""
        return self.nslots - len(self._free) - self._running

    def try_acquire(self) -> tuple[int, Any] | None:
        """Lease a free slot without waiting: ``(index, window)``, or None
        (none free, or the pool was retired)."""
        with self._cond:
            if not self._free or self._retired:
                return None
            index = self._free.pop()  # LIFO: the slot used last is the one still in cache
            self._running += 1
        return self._lease(index)

    def acquire(self, timeout: float | None) -> tuple[int, Any] | None:
        """Lease a free slot: ``(index, window)``; waits up to *timeout* seconds.

        None when the pool is retired (a larger one replaced it between the
        caller's lookup and now): the caller looks the pool up again.
        """
        with self._cond:
            if not self._cond.wait_for(lambda: self._free or self._retired, timeout):
                raise PoolExhausted(
                    f"all {self.nslots} slots of the pool for model {self.info.name!r} stayed busy "
                    f"for {timeout} s: {self._running} running a request, {self.held} held by live "
                    f"result views (copy=False results or request() views still referenced). "
                    f"Drop arrays you no longer need, or raise slots= or the timeout."
                )
            if self._retired:
                return None
            index = self._free.pop()  # LIFO: the slot used last is the one still in cache
            self._running += 1
        return self._lease(index)

    def _lease(self, index: int) -> tuple[int, Any]:
        window = self.region.window(index * self.layout.slot_bytes, self.layout.slot_bytes)
        finalizer = weakref.finalize(window, self._release, index)
        finalizer.atexit = False
        return index, window

    def finished(self) -> None:
        """A leased slot's request is over (its views may still hold it)."""
        with self._cond:
            self._running -= 1

    def _release(self, index: int) -> None:
        with self._cond:
            self._free.append(index)
            self._cond.notify()
            drained = self._retired and len(self._free) == self.nslots
        if drained:
            self._drained()

    def retire(self) -> None:
        """Stop leasing from this pool; it is dropped once every slot is back."""
        with self._cond:
            self._retired = True
            self._cond.notify_all()  # waiters move on to the new pool
            drained = len(self._free) == self.nslots
        if drained:
            self._drained()

    def _drained(self) -> None:
        owner = self._owner()
        if owner is not None:
            owner._drop_pool(self)
        else:
            self.close()

    def reregister(self, seen_generation: int) -> None:
        """Register the region again after the server lost it (once per loss)."""
        # A lock of its own, not _cond: slot releases run from finalizers on
        # any thread (an HTTP I/O worker too) and must never wait for this I/O.
        with self._register_lock:
            if self._generation != seen_generation:
                return  # another thread already did it
            self._connector.call(lambda tc: triton.register(tc, self.region, self.name))
            self._generation += 1

    @property
    def generation(self) -> int:
        return self._generation

    def close(self) -> None:
        """Unregister and close the region; live views keep their memory.

        In a forked child this only lets go of the child's mapping: the
        registration and the segment still belong to the parent.
        """
        try:
            if os.getpid() == self._creator_pid:
                self._connector.call(lambda tc: triton.unregister(tc, self.name))
        except (ServerError, OSError):
            pass  # a dead server has forgotten it anyway
        finally:
            self.region.close()


# --------------------------------------------------------------------------
# The client
# --------------------------------------------------------------------------


def join_chunks(parts: Sequence[Mapping[str, np.ndarray]], names: Sequence[str]) -> dict[str, np.ndarray]:
    """The outputs of a chunked batch, reassembled in order."""
    return {name: np.concatenate([part[name] for part in parts]) for name in names}


@dataclasses.dataclass(frozen=True)
class StepsDone:
    """What :func:`next_step` returns once request steps have finished."""

    value: Any


def next_step(steps, outcome: Any = None, failure: BaseException | None = None) -> Any:
    """Hand the last step's *outcome* (or *failure*) to *steps*: the next step,
    or :class:`StepsDone` with their result."""
    try:
        return steps.throw(failure) if failure is not None else steps.send(outcome)
    except StopIteration as stop:
        return StepsDone(stop.value)


class Request:
    """A leased slot with numpy views for the inputs: the zero-copy path.

    Made by :meth:`Client.request`.  Fill ``inputs[name]`` in place, then
    :meth:`run` returns the outputs as views into the same slot.  The slot
    goes back to the pool once this request and every view of it are gone.
    """

    def __init__(self, client: "Client", info: ModelInfo, pool: _SlotPool, index: int,
                 window: Any, shapes: Mapping[str, tuple[int, ...]]):
        self._client = client
        self._info = info
        self._pool = pool
        self._index = index
        self._window: Any = window
        self._shapes = dict(shapes)
        self.inputs: dict[str, np.ndarray] = {
            spec.name: window.ndarray(spec.dtype, shapes[spec.name], pool.layout.offsets[spec.name])
            for spec in info.inputs
        }

    @property
    def model(self) -> ModelInfo:
        """What the client knows about the model."""
        return self._info

    def run(self, outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Run the inference on the inputs as they are now; outputs are slot views."""
        if self._window is None:
            raise Error("this request is closed")
        client = self._client
        return client._drive(client._slot_steps(self._info, self._pool, self._index, self._window,
                                                self._shapes, outputs, copy=False))

    def close(self) -> None:
        """Give up this request's hold on the slot (views keep it until they go)."""
        if self._window is not None:
            self._window = None
            self.inputs = {}
            self._pool.finished()

    def __enter__(self) -> "Request":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


class Client:
    """A Triton client that moves tensors through pooled shared memory.

    *url* is ``"host:port"`` for gRPC or ``"http://host:port"`` for HTTP.
    *transport* is ``"auto"`` (shared memory, falling back to the wire with a
    warning when the server cannot open it), ``"shm"`` (never fall back) or
    ``"wire"`` (plain gRPC/HTTP).  *slots* is the number of slots per model
    pool, *max_pool_bytes* caps one pool's size, and *timeout* is how long a
    request waits for a free slot before :class:`PoolExhausted`.
    """

    def __init__(self, url: str = "localhost:8001", *, transport: str = "auto", slots: int = 4,
                 max_pool_bytes: int = 1 << 30, timeout: float | None = 60.0,
                 verbose: bool = False):
        if transport not in _TRANSPORTS:
            raise ValueError(f"transport must be one of {_TRANSPORTS}, not {transport!r}")
        if slots < 1:
            raise ValueError(f"slots must be >= 1, not {slots}")
        self.url = url
        self.transport = transport
        self.slots = slots
        self.max_pool_bytes = max_pool_bytes
        self.timeout = timeout
        self._connector = _Connector(url, verbose, io_threads=slots)
        self._http = self._connector.http
        self._protocol = self._connector.protocol
        self._lock = threading.RLock()
        self._models: dict[tuple[str, str], ModelInfo] = {}
        self._pools: dict[tuple[str, str], _SlotPool] = {}
        self._retired: set[_SlotPool] = set()
        self._wire_only = transport == "wire"
        self._async_workers: _Workers | None = None   # infer_async
        self._chunk_workers: _Workers | None = None   # chunks of large batches
        self._closed = False
        # Runs close()'s work if the user forgets: at garbage collection or exit.
        self._finalizer = weakref.finalize(self, Client._cleanup, self._connector,
                                           self._pools, self._retired)

    # -- plumbing ---------------------------------------------------------

    @property
    def tritonclient(self) -> Any:
        """The underlying tritonclient client: every standard call stays available.

        An HTTP one (like every tritonclient HTTP client) works only in the
        thread that first asked for it.
        """
        return self._connector.shared

    def _check_open(self) -> None:
        if self._closed:
            raise Error(f"{self!r} is closed")

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("wire" if self._wire_only else self.transport)
        return f"<tritonshm.Client {self.url!r} {state}>"

    # -- discovery --------------------------------------------------------

    def model_info(self, model: str, version: str = "") -> ModelInfo:
        """What the server says about *model* (cached per model and version)."""
        self._check_open()
        key = (model, version)
        info = self._models.get(key)
        if info is not None:
            return info
        doing = f"reading metadata of model {model!r}"
        if self._http:
            def fetch(tc: Any) -> tuple[Any, Any]:
                return tc.get_model_metadata(model, version), tc.get_model_config(model, version)
        else:
            def fetch(tc: Any) -> tuple[Any, Any]:
                config = tc.get_model_config(model, version, as_json=True)
                return tc.get_model_metadata(model, version, as_json=True), config.get("config", config)
        try:
            metadata, config = self._connector.call(fetch)
        except Exception as exc:
            raise triton.translate_error(exc, doing) from exc
        info = ModelInfo.from_server(metadata, config, version)
        with self._lock:
            self._models[key] = info
        return info

    def _check_inputs(self, info: ModelInfo, inputs: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], int]:
        """Inputs as arrays, checked against the model; and the batch size (1 if unbatched)."""
        expected = {spec.name for spec in info.inputs}
        missing = expected - set(inputs)
        unknown = set(inputs) - expected
        if missing or unknown:
            raise ShapeMismatch(
                f"model {info.name!r} takes inputs {sorted(expected)}; "
                + (f"missing {sorted(missing)}" if missing else "")
                + ("; " if missing and unknown else "")
                + (f"unknown {sorted(unknown)}" if unknown else "")
            )
        arrays: dict[str, np.ndarray] = {}
        batch = None
        for spec in info.inputs:
            value = inputs[spec.name]
            array = value if isinstance(value, np.ndarray) else np.asarray(value)
            if spec.datatype == "BYTES":
                if array.dtype.kind not in "OSU":
                    raise DTypeMismatch(
                        f"input {spec.name!r} of model {info.name!r} is BYTES: give bytes/str "
                        f"(an object or bytes array), not {array.dtype}"
                    )
            elif array.dtype != spec.dtype:
                raise DTypeMismatch(
                    f"input {spec.name!r} of model {info.name!r} is {spec.datatype} ({spec.dtype}), "
                    f"got {array.dtype}; convert it explicitly (no silent casts)"
                )
            want = info.shape_of(spec, -1)
            if not _shape_fits(want, array.shape):
                raise ShapeMismatch(
                    f"input {spec.name!r} of model {info.name!r} has shape {list(want)} "
                    f"(-1 = any), got {list(array.shape)}"
                )
            if info.batched:
                if batch is not None and array.shape[0] != batch:
                    raise ShapeMismatch(
                        f"inputs of model {info.name!r} disagree on the batch size: "
                        f"{spec.name!r} has {array.shape[0]}, others {batch}"
                    )
                batch = array.shape[0]
            arrays[spec.name] = array
        return arrays, (batch if batch is not None else 1)

    def _output_names(self, info: ModelInfo, outputs: Sequence[str] | None) -> list[str]:
        known = [spec.name for spec in info.outputs]
        if outputs is None:
            return known
        unknown = [name for name in outputs if name not in known]
        if unknown:
            raise ShapeMismatch(f"model {info.name!r} has outputs {known}; unknown {unknown}")
        return list(outputs)

    # -- pools ------------------------------------------------------------

    def _needs(self, info: ModelInfo, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
        """Bytes each shared-memory tensor needs for a request of these input shapes.

        Fixed outputs are sized for a full batch; variable ones are guessed as
        large as the largest input (right for elementwise models) and grown if
        the server says they were too small.
        """
        rows = info.max_batch_size if info.batched else 1
        needs: dict[str, int] = {}
        for spec in info.inputs:
            if spec.datatype == "BYTES":
                continue
            dims = spec.dims if spec.fixed else (
                shapes[spec.name][1:] if info.batched else shapes[spec.name])
            needs[spec.name] = math.prod(dims) * spec.dtype.itemsize * rows
        largest = max(needs.values(), default=0)
        for spec in info.outputs:
            if spec.datatype == "BYTES":
                continue
            fixed_size = math.prod(spec.dims) * spec.dtype.itemsize * rows
            needs[spec.name] = fixed_size if spec.fixed else largest
        return needs

    def _ready_pool(self, info: ModelInfo, needs: Mapping[str, int]) -> _SlotPool | None:
        """The model's pool if it exists and fits *needs* (no I/O), else None."""
        pool = self._pools.get((info.name, info.version))
        return pool if pool is not None and pool.layout.fits(needs) else None

    def _pool(self, info: ModelInfo, needs: Mapping[str, int]) -> _SlotPool | None:
        """The model's pool, made or grown to fit *needs*; None for the wire."""
        key = (info.name, info.version)
        with self._lock:
            pool = self._pools.get(key)
            if pool is not None and pool.layout.fits(needs):
                return pool
            capacities = dict(needs)
            if pool is not None:  # grow: keep what the old pool had room for
                for name, capacity in pool.layout.capacities.items():
                    capacities[name] = max(capacities.get(name, 0), capacity)
            layout = _Layout.for_capacities(capacities)
            if layout.slot_bytes * self.slots > self.max_pool_bytes:
                raise Error(
                    f"a pool for model {info.name!r} would need {layout.slot_bytes * self.slots} "
                    f"bytes ({self.slots} slots x {layout.slot_bytes}), over max_pool_bytes="
                    f"{self.max_pool_bytes}; raise max_pool_bytes or lower slots"
                )
            try:
                new_pool = _SlotPool(self, info, layout, self.slots)
            except SharedMemoryRefused as exc:
                if self.transport == "shm":
                    raise
                warnings.warn(
                    f"tritonshm: falling back to plain {'HTTP' if self._http else 'gRPC'}: {exc}",
                    RuntimeWarning,
                    stacklevel=4,
                )
                self._wire_only = True
                return None
            self._pools[key] = new_pool
            if pool is not None:
                self._retired.add(pool)
                pool.retire()
            return new_pool

    def _drop_pool(self, pool: _SlotPool) -> None:
        with self._lock:
            self._retired.discard(pool)
        pool.close()

    # -- inference --------------------------------------------------------

    def infer(self, model: str, inputs: Mapping[str, Any], *, outputs: Sequence[str] | None = None,
              version: str = "", copy: bool = True, timeout: float | None = None) -> dict[str, np.ndarray]:
        """Run *model* on *inputs* (name -> array-like) and return its outputs.

        Inputs must match the model's datatypes and shapes exactly (no silent
        casts).  Batches larger than ``max_batch_size`` are split, run on
        several slots at once and reassembled in order.  With ``copy=False``
        the outputs are read-write views into the slot, which stays out of
        the pool until they are gone.  *timeout* bounds the wait for a slot
        (default: the client's).
        """
        self._check_open()
        info = self.model_info(model, version)
        chunks, names = self._plan(info, inputs, outputs, copy)
        wait = self.timeout if timeout is None else timeout
        if len(chunks) == 1:
            return self._infer_chunk(info, chunks[0], names, copy, wait)
        with self._lock:
            if self._chunk_workers is None:
                self._chunk_workers = _Workers(self.slots, "tritonshm-chunk")
        futures = [self._chunk_workers.submit(self._infer_chunk, info, chunk, names, True, wait)
                   for chunk in chunks]
        return join_chunks([f.result() for f in futures], names)

    def _plan(self, info: ModelInfo, inputs: Mapping[str, Any], outputs: Sequence[str] | None,
              copy: bool) -> tuple[list[dict[str, np.ndarray]], list[str]]:
        """Checked inputs split into chunks of at most ``max_batch_size``, and the output names."""
        arrays, batch = self._check_inputs(info, inputs)
        names = self._output_names(info, outputs)
        if not info.batched or batch <= info.max_batch_size:
            return [arrays], names
        if not copy:
            raise ValueError(
                f"copy=False needs one slot, but a batch of {batch} on model {info.name!r} "
                f"(max_batch_size {info.max_batch_size}) spans several; use copy=True or smaller batches"
            )
        step = info.max_batch_size
        return [{n: a[i:i + step] for n, a in arrays.items()} for i in range(0, batch, step)], names

    def infer_async(self, model: str, inputs: Mapping[str, Any], **kwargs: Any) -> concurrent.futures.Future:
        """:meth:`infer` in a background thread; returns a ``concurrent.futures.Future``."""
        self._check_open()
        with self._lock:
            if self._async_workers is None:
                self._async_workers = _Workers(self.slots, "tritonshm-async")
        return self._async_workers.submit(self.infer, model, inputs, **kwargs)

    def request(self, model: str, batch_size: int | None = None, *,
                shapes: Mapping[str, Sequence[int]] | None = None, version: str = "",
                timeout: float | None = None) -> Request:
        """Lease a slot for a zero-copy request (see :class:`Request`).

        *batch_size* is required for batching models; *shapes* gives the
        full shape of inputs whose dims are variable.
        """
        self._check_open()
        if self._wire_only:
            raise Error("request() needs shared memory, but this client is on the wire transport")
        info = self.model_info(model, version)
        shapes = {k: tuple(v) for k, v in (shapes or {}).items()}
        if info.batched:
            if batch_size is None or not 1 <= batch_size <= info.max_batch_size:
                raise ShapeMismatch(
                    f"model {info.name!r} batches up to {info.max_batch_size}: "
                    f"give 1 <= batch_size <= {info.max_batch_size}, not {batch_size}"
                )
        elif batch_size is not None:
            raise ShapeMismatch(f"model {info.name!r} does not batch: leave batch_size out")
        full: dict[str, tuple[int, ...]] = {}
        for spec in info.inputs:
            if spec.datatype == "BYTES":
                raise DTypeMismatch(f"input {spec.name!r} is BYTES, which request() cannot view")
            shape = shapes.get(spec.name) or info.shape_of(spec, batch_size or 1)
            want = info.shape_of(spec, batch_size or 1)
            if not _shape_fits(want, shape) or any(s < 0 for s in shape):
                raise ShapeMismatch(
                    f"input {spec.name!r} of model {info.name!r} needs a shape like {list(want)} "
                    f"(give variable dims with shapes=), got {list(shape)}"
                )
            full[spec.name] = tuple(shape)
        needs = self._needs(info, full)
        while True:
            pool = self._pool(info, needs)
            if pool is None:
                raise Error("request() needs shared memory, but the server cannot open ours")
            lease = pool.acquire(self.timeout if timeout is None else timeout)
            if lease is not None:  # None: the pool was replaced meanwhile, look again
                return Request(self, info, pool, *lease, full)

    # A request is written once, as generators of steps with no I/O in them
    # ("sans-I/O"): they yield what needs doing -- ("pool", info, needs),
    # ("acquire", pool, timeout), ("send", info, inputs, outputs),
    # ("reregister", pool, generation) -- and get the outcome sent back (or
    # its exception thrown in).  _drive() carries the steps out blocking;
    # tritonshm.aio carries the same steps out with asyncio.

    def _chunk_steps(self, info: ModelInfo, arrays: Mapping[str, np.ndarray], names: list[str],
                     copy: bool, timeout: float | None):
        """Steps of one request that fits a slot: lease, copy in, run, collect."""
        shapes = {name: array.shape for name, array in arrays.items()}
        needs = self._needs(info, shapes)
        grown = 0
        while True:
            pool = None if self._wire_only else (yield ("pool", info, needs))
            if pool is None:
                result = yield ("send", info, *self._wire_request(info, arrays, names))
                return {name: result.as_numpy(name) for name in names}
            lease = yield ("acquire", pool, timeout)
            if lease is None:
                continue  # another request replaced the pool meanwhile: use the new one
            index, window = lease
            try:
                for spec in info.inputs:
                    if spec.datatype != "BYTES":
                        view = window.ndarray(spec.dtype, shapes[spec.name],
                                              pool.layout.offsets[spec.name])
                        np.copyto(view, arrays[spec.name], casting="no")
                        del view
                return (yield from self._slot_steps(info, pool, index, window, shapes, names, copy,
                                                    arrays))
            except OutputTooSmall as exc:
                # A variable-size output outgrew its guess: grow to what the
                # server asked for and run again on a slot of the new pool.
                grown += 1
                if exc.output not in needs or exc.needed is None or grown >= _GROW_ATTEMPTS:
                    raise
                needs = {**needs, exc.output: exc.needed}
            finally:
                pool.finished()
                # Drop the lease now, not when a traceback holding this frame dies.
                del window, lease

    def _slot_steps(self, info: ModelInfo, pool: _SlotPool, index: int, window: Any,
                    shapes: Mapping[str, tuple[int, ...]], names: Sequence[str] | None, copy: bool,
                    arrays: Mapping[str, np.ndarray] | None = None):
        """Steps of running the inputs already in slot *index*; outputs land there too."""
        names = self._output_names(info, names)
        inputs, requested = self._slot_request(info, pool, index, window, shapes, names, arrays)
        generation = pool.generation
        try:
            result = yield ("send", info, inputs, requested)
        except RegionNotRegistered:
            yield ("reregister", pool, generation)  # the server restarted: register, retry once
            result = yield ("send", info, inputs, requested)
        outputs = {}
        for name in names:
            spec = info.output(name)
            if spec.datatype == "BYTES":
                outputs[name] = result.as_numpy(name)
                continue
            tensor = result.get_output(name)
            shape = [int(d) for d in (tensor["shape"] if isinstance(tensor, dict) else tensor.shape)]
            view = window.ndarray(spec.dtype, shape, pool.layout.offsets[name])
            outputs[name] = view.copy() if copy else view
        return outputs

    def _drive(self, steps) -> Any:
        """Carry out request steps, blocking; the steps' result."""
        handlers: dict[str, Callable[..., Any]] = {
            "send": self._send,
            "acquire": lambda pool, timeout: pool.acquire(timeout),
            "pool": self._pool,
            "reregister": lambda pool, generation: pool.reregister(generation),
        }
        step = next_step(steps)
        while not isinstance(step, StepsDone):
            try:
                outcome, failure = handlers[step[0]](*step[1:]), None
            except Exception as exc:
                outcome, failure = None, exc
            step = next_step(steps, outcome, failure)
        return step.value

    def _infer_chunk(self, info: ModelInfo, arrays: Mapping[str, np.ndarray], names: list[str],
                     copy: bool, timeout: float | None) -> dict[str, np.ndarray]:
        return self._drive(self._chunk_steps(info, arrays, names, copy, timeout))

    def _slot_request(self, info: ModelInfo, pool: _SlotPool, index: int, window: Any,
                      shapes: Mapping[str, tuple[int, ...]], names: Sequence[str],
                      arrays: Mapping[str, np.ndarray] | None) -> tuple[list, list]:
        """InferInputs and InferRequestedOutputs naming the slot's offsets.

        They are made once per slot and reused: only shapes change between
        requests, and an output's binding (its offset and room) never does.
        """
        protocol = self._protocol
        cache = pool.request_objects[index]
        slot_base = window.offset
        inputs = []
        for spec in info.inputs:
            shape = list(shapes[spec.name])
            if spec.datatype == "BYTES":  # variable-size serialisation: over the wire
                assert arrays is not None, "request() refuses BYTES inputs"
                wire = protocol.InferInput(spec.name, shape, "BYTES")
                wire.set_data_from_numpy(np.asarray(arrays[spec.name], dtype=np.object_))
                inputs.append(wire)
                continue
            infer_input = cache.get(spec.name)
            if infer_input is None:
                infer_input = cache[spec.name] = protocol.InferInput(spec.name, shape, spec.datatype)
            else:
                infer_input.set_shape(shape)
            nbytes = math.prod(shape) * spec.dtype.itemsize
            triton.bind_input(infer_input, pool.region, slot_base + pool.layout.offsets[spec.name],
                              nbytes, name=pool.name)
            inputs.append(infer_input)
        requested = []
        for name in names:
            spec = info.output(name)
            if spec.datatype == "BYTES":
                requested.append(self._requested_output(name))
                continue
            key = "out:" + name
            requested_output = cache.get(key)
            if requested_output is None:
                requested_output = cache[key] = self._requested_output(name)
                triton.bind_output(requested_output, pool.region,
                                   slot_base + pool.layout.offsets[name],
                                   pool.layout.capacities[name], name=pool.name)
            requested.append(requested_output)
        return inputs, requested

    def _requested_output(self, name: str) -> Any:
        if self._http:
            return self._protocol.InferRequestedOutput(name, binary_data=True)
        return self._protocol.InferRequestedOutput(name)

    def _send(self, info: ModelInfo, inputs: list, outputs: list) -> Any:
        try:
            return self._connector.call(
                lambda tc: tc.infer(info.name, inputs, model_version=info.version, outputs=outputs))
        except ServerError:
            raise
        except Exception as exc:
            raise triton.translate_error(exc, f"inferring with model {info.name!r}") from exc

    def _wire_request(self, info: ModelInfo, arrays: Mapping[str, np.ndarray],
                      names: list[str]) -> tuple[list, list]:
        """Inputs and outputs for the plain gRPC/HTTP path: tensors inside the messages."""
        inputs = []
        for spec in info.inputs:
            array = arrays[spec.name]
            if spec.datatype == "BYTES":
                array = np.asarray(array, dtype=np.object_)
            wire = self._protocol.InferInput(spec.name, list(array.shape), spec.datatype)
            wire.set_data_from_numpy(array)
            inputs.append(wire)
        return inputs, [self._requested_output(n) for n in names]

    # -- lifetime ---------------------------------------------------------

    @staticmethod
    def _cleanup(connector: _Connector, pools: dict, retired: set) -> None:
        for pool in list(pools.values()) + list(retired):
            pool.close()
        pools.clear()
        retired.clear()
        connector.close()

    def close(self) -> None:
        """Unregister and unlink this client's regions and close its connections; idempotent.

        Result views handed out earlier stay valid: they keep their memory.
        """
        if self._closed:
            return
        self._closed = True
        for workers in (self._async_workers, self._chunk_workers):
            if workers is not None:
                workers.shutdown()
        self._finalizer()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
