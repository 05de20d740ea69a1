"""The blocking client: the engine's steps carried out with blocking calls and threads."""

from __future__ import annotations

import concurrent.futures
import time
import weakref
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .. import triton
from ..errors import ClientClosed
from . import _devices, _intake
from ._devices import Placement
from ._engine import Engine, close_pools_steps, give_up_parked, settle_parked_steps
from ._model import ModelInfo
from ._pool import Extent, Lease, SlotPool
from ._steps import (Done, FetchModel, Pause, Register, Send, Steps, Unregister, WaitForDevice, WaitForSlot,
                     advance)
from ._threads import Connector, Workers

__all__ = ["Client", "Request"]


class Request:
    """A leased slot with views of the inputs: the zero-copy path.

    Made by :meth:`Client.request`.  Fill ``inputs[name]`` in place, then
    :meth:`run` returns the outputs as views into the same slot.  The slot
    goes back to the pool once this request and every view of it are gone.
    """

    def __init__(self, client: Engine, info: ModelInfo, lease: Lease,
                 shapes: Mapping[str, tuple[int, ...]]):
        self._client = client
        self._info = info
        self._lease: Lease | None = lease
        self._shapes = dict(shapes)
        memory, layout = lease.extent.memory, lease.pool.layout
        self.inputs: dict[str, Any] = {
            spec.name: memory.view(lease.handle, layout.offsets[spec.name], spec.dtype,
                                   self._shapes[spec.name])
            for spec in info.inputs
        }

    @property
    def model(self) -> ModelInfo:
        """What the client knows about the model."""
        return self._info

    def _run_steps(self, outputs: Sequence[str] | None, stream: Any = None) -> Steps:
        """The steps of :meth:`run`; the ordering point (an event on the caller's stream for a
        slot on a GPU) is taken here, on the calling thread, at call time."""
        if self._lease is None:
            raise ClientClosed("this request is closed")
        names = _intake.output_names(self._info, outputs)
        device = self._lease.extent.memory.device
        ready = None if device is None else _devices.current_stream_event(device, stream)
        return self._client._slot_steps(self._info, self._lease, self._shapes, names, False, {},
                                        Placement(device), ready=ready)

    def run(self, outputs: Sequence[str] | None = None, *, stream: Any = None) -> dict[str, Any]:
        """Run the inference on the inputs as they are now; outputs are slot views
        (numpy, or :class:`~tritonshm.CudaArray` for a request on a GPU).

        For a slot on a GPU, the request is sent once the work queued so far
        on the calling thread's current stream for that GPU has landed
        (torch's or cupy's current stream where they are loaded, else the
        legacy default stream): ``torch.from_dlpack(req.inputs[name]).copy_(x)``
        then ``run()`` sends what the copy wrote.  Work on another stream
        must be ordered by the caller, or named: *stream* (a handle, or a
        tritonshm, torch or cupy stream) replaces the current one.
        """
        return self._client._drive(self._run_steps(outputs, stream))

    def close(self) -> None:
        """Give up this request's hold on the slot (views keep it until they go)."""
        lease, self._lease = self._lease, None
        if lease is not None:
            self.inputs = {}
            lease.pool.finished()

    def __enter__(self) -> "Request":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


# Device memory a server refused to let go of when its client closed: held for the life of the
# process (freeing it under the server would be undefined behaviour; the driver frees it at exit).
_held_for_the_server: list[Extent] = []
# How long close() keeps asking a server that refuses to unregister what we parked.
_SETTLE_SECONDS = 5.0
_SETTLE_AT_EXIT = 1.0   # a client collected or left open at exit: "in use" lasts milliseconds


def _release_everything(connector: Connector, pools: dict[Any, SlotPool], retired: set[SlotPool],
                        workers: dict[str, Workers], creator_pid: int, wait: bool,
                        parked: list[Extent], settle: float = _SETTLE_AT_EXIT) -> None:
    """Stop the threads, unregister and close every pool, close the connections.

    Module level, holding no reference to the client: it is also the
    finalizer of a client that was never closed, so it is best effort: a
    name the server cannot unregister does not stop the rest (host memory is
    closed all the same).  Memory the server refuses to let go of is tried
    again for up to *settle* seconds (a server answers before it has
    released a request's regions: "currently in use" for a moment); device
    memory still refused then is held for the life of the process, never
    freed under the server.
    """
    for group in list(workers.values()):
        group.shutdown(wait)
    workers.clear()
    _carry_out_unregisters(connector, close_pools_steps(pools, retired, creator_pid, parked))
    _carry_out_unregisters(connector, settle_parked_steps(parked, creator_pid, settle))
    give_up_parked(parked, _held_for_the_server)
    connector.close(wait)


def _carry_out_unregisters(connector: Connector, steps: Steps) -> None:
    """Drive steps that only unregister (and pause), blocking; failures go back into the steps."""
    step = advance(steps)
    while not isinstance(step, Done):
        try:
            if isinstance(step, Pause):
                outcome, failure = time.sleep(step.seconds), None
            else:
                outcome, failure = connector.call(
                    lambda tc, name=step.name: triton.unregister(tc, name, patience=0.0)), None
        except Exception as exc:
            outcome, failure = None, exc
        step = advance(steps, outcome, failure)


class Client(Engine):
    """A Triton client that moves tensors through pooled shared memory.

    *url* is ``"host:port"`` for gRPC (``"grpcs://host:port"`` with TLS) or
    ``"http://host:port"`` / ``"https://host:port"`` for HTTP.  *transport*
    is ``"auto"`` (shared memory -- CUDA slots for GPU tensors -- falling
    back with a warning each: from CUDA to pinned system slots, from system
    slots to the wire, when the server cannot open ours), ``"shm"`` (never
    to the wire), ``"cuda"`` (every request in CUDA slots, never falling
    back) or ``"wire"`` (plain gRPC/HTTP).  *slots* is the number of slots a pool
    starts with; it grows past that only to make room for results the
    caller keeps, within *max_pool_bytes*: every pool of the client together (registered,
    being registered, retired but not yet dropped), at every instant.  *timeout* is how long
    a request waits for a slot before :class:`~tritonshm.PoolExhausted`.
    *connect_options* go to tritonclient's client constructor as they are
    (e.g. ``root_certificates`` for gRPC over TLS).  *pinned* page-locks the
    slot pools for CUDA (``True``: with device 0's context; or a device
    number), so copies between them and a GPU run at pinned speed.
    """

    def __init__(self, url: str = "localhost:8001", *, transport: str = "auto", slots: int = 4,
                 max_pool_bytes: int = 1 << 30, timeout: float | None = 60.0, verbose: bool = False,
                 connect_options: Mapping[str, Any] | None = None, pinned: bool | int = False):
        super().__init__(url, transport=transport, slots=slots, max_pool_bytes=max_pool_bytes,
                         timeout=timeout, verbose=verbose, connect_options=connect_options,
                         pinned=pinned)
        self._connector = Connector(self._connect, self._wire.http, io_threads=slots)
        self._workers: dict[str, Workers] = {}   # "async" (infer_async), "chunk" (large batches)
        self._handlers: dict[type, Callable[[Any], Any]] = {
            Send: self._send,
            FetchModel: self._fetch_model,
            Register: self._register,
            Unregister: self._unregister,
            WaitForSlot: lambda step: step.pool.wait(step.timeout),
            WaitForDevice: lambda step: step.event.synchronize(),  # the GIL released meanwhile
            Pause: lambda step: time.sleep(step.seconds),
        }
        # Runs close()'s work if the user forgets: at garbage collection or exit.
        self._finalizer = weakref.finalize(self, _release_everything, self._connector, self._pools,
                                           self._retired, self._workers, self._creator_pid, False,
                                           self._parked)

    @property
    def tritonclient(self) -> Any:
        """The underlying tritonclient client: every standard call stays available.

        An HTTP one (like every tritonclient HTTP client) works only in the
        thread that first asked for it.
        """
        return self._connector.shared

    # -- carrying out steps -----------------------------------------------

    def _drive(self, steps: Steps) -> Any:
        """Carry out request steps, blocking; the steps' result."""
        handlers = self._handlers
        step = advance(steps)
        while not isinstance(step, Done):
            try:
                outcome, failure = handlers[type(step)](step), None
            except Exception as exc:
                outcome, failure = None, exc
            step = advance(steps, outcome, failure)
        return step.value

    def _send(self, step: Send) -> Any:
        return self._connector.call(lambda tc: triton.call_translated(
            tc, f"inferring with model {step.model!r}", "infer", step.model, step.inputs,
            model_version=step.version, outputs=step.outputs))

    def _fetch_model(self, step: FetchModel) -> tuple[Any, Any]:
        wire, doing = self._wire, f"reading metadata of model {step.model!r}"

        def fetch(tc: Any) -> tuple[Any, Any]:
            metadata = triton.call_translated(tc, doing, "get_model_metadata", step.model, step.version,
                                              **wire.json)
            config = triton.call_translated(tc, doing, "get_model_config", step.model, step.version,
                                            **wire.json)
            return metadata, wire.model_config(config)

        return self._connector.call(fetch)

    def _register(self, step: Register) -> str:
        if step.name is None:
            return self._connector.call(step.memory.register)
        return self._connector.call(lambda tc: step.memory.reregister(tc, step.name))

    def _unregister(self, step: Unregister) -> None:
        # No patience here: memory the server still uses is parked and tried again later.
        self._connector.call(lambda tc: triton.unregister(tc, step.name, patience=0.0))

    def _workers_for(self, purpose: str) -> Workers:
        with self._lock:
            self._check_open()
            workers = self._workers.get(purpose)
            if workers is None:
                workers = self._workers[purpose] = Workers(self.slots, f"tritonshm-{purpose}")
            return workers

    # -- discovery --------------------------------------------------------

    def model_info(self, model: str, version: str = "") -> ModelInfo:
        """What the server says about *model* (cached per model and version)."""
        self._check_open()
        return self._models.get((model, version)) or self._drive(self._model_steps(model, version))

    # -- inference --------------------------------------------------------

    def infer(self, model: str, inputs: Mapping[str, Any], *, outputs: Sequence[str] | None = None,
              version: str = "", copy: bool = True, timeout: float | None = None,
              output_device: str | int = "auto") -> dict[str, Any]:
        """Run *model* on *inputs* (name -> array) and return its outputs.

        Inputs are numpy arrays (or array-likes) or GPU tensors -- anything
        with ``__cuda_array_interface__`` or a CUDA ``__dlpack_device__``
        (torch, cupy, jax, :class:`~tritonshm.CudaArray`); GPU tensors go
        through CUDA slots with one device-to-device copy, never through host
        memory.  They must match the model's datatypes and shapes exactly (no
        silent casts); BYTES inputs take bytes or str.  Batches larger than
        ``max_batch_size`` are split, run on several slots at once and
        reassembled in order.

        *output_device* is where results land: ``"auto"`` (where the inputs
        were), ``"cpu"`` (numpy), ``"cuda"`` or ``"cuda:N"`` (arrays of the
        inputs' library: torch tensors for torch inputs, cupy arrays for
        cupy, else :class:`~tritonshm.CudaArray`).  With ``copy=False`` the
        outputs are views into the slot (numpy, or ``CudaArray`` on a GPU),
        which stays out of the pool until every view -- and every DLPack
        tensor made from one -- is gone; where the slot is not where the
        results are wanted, they are copies all the same.  *timeout* bounds
        the wait for a slot (default: the client's).
        """
        info = self.model_info(model, version)
        plan = self._plan(info, inputs, outputs, copy, output_device, timeout)
        if len(plan.chunks) == 1:
            return self._drive(self._chunk_steps(plan, plan.chunks[0]))
        workers = self._workers_for("chunk")
        rows = _intake.result_rows(info, plan.names, plan.chunks, plan.route.results)
        futures = [workers.submit(lambda chunk=chunk, into=into: self._drive(self._chunk_steps(plan, chunk, into)))
                   for chunk, into in zip(plan.chunks, rows)]
        return _intake.join_chunks([f.result() for f in futures], plan.names, plan.route.results, rows[0])

    def infer_async(self, model: str, inputs: Mapping[str, Any], **kwargs: Any) -> concurrent.futures.Future:
        """:meth:`infer` in a background thread; returns a ``concurrent.futures.Future``.

        GPU inputs are captured now, on the calling thread: what is sent is
        ordered after the work queued on them (on the caller's current
        stream) by the time of this call, as with :meth:`infer`.
        """
        workers = self._workers_for("async")
        return workers.submit(self.infer, model, _devices.capture_inputs(inputs), **kwargs)

    def request(self, model: str, batch_size: int | None = None, *,
                shapes: Mapping[str, Sequence[int]] | None = None, version: str = "",
                timeout: float | None = None, device: str | int | None = None) -> Request:
        """Lease a slot for a zero-copy request (see :class:`Request`).

        *batch_size* is required for batching models; *shapes* gives the
        full shape of inputs whose dims are variable.  *device* (``"cuda"``,
        ``"cuda:N"``) puts the slot in GPU memory: the inputs and outputs are
        :class:`~tritonshm.CudaArray` views to fill and read in place (e.g.
        ``torch.from_dlpack(req.inputs["INPUT0"])``).
        """
        info = self.model_info(model, version)
        shapes_full = self._request_shapes(info, batch_size, shapes)
        kind = self._request_memory(info, device)
        wait = self.timeout if timeout is None else timeout
        return Request(self, info, self._drive(self._request_steps(info, shapes_full, wait, kind)),
                       shapes_full)

    # -- lifetime ---------------------------------------------------------

    def close(self) -> None:
        """Unregister and unlink this client's regions and close its connections; idempotent.

        New requests are refused at once; requests already in flight (on any
        thread) are waited for -- up to the client's *timeout* -- before the
        memory they use is unregistered.  Device memory the server refuses
        to unregister (it may still be reading it) is never freed under it.
        Result views handed out earlier stay valid: they keep their memory.
        """
        if self._closed:
            return
        self._closed = True
        for group in list(self._workers.values()):
            group.shutdown()  # finish what was submitted, while the pools still exist
        self._wait_idle(self.timeout)
        detached = self._finalizer.detach()
        if detached is not None:
            _, release, args, _ = detached
            release(*args, settle=_SETTLE_SECONDS if self.timeout is None else min(self.timeout, _SETTLE_SECONDS))

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
