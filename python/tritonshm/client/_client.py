"""The blocking client: the engine's steps carried out with blocking calls and threads."""

from __future__ import annotations

import concurrent.futures
import functools
import queue
import time
import weakref
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Sequence


from .. import _http1, triton
from ..errors import ServerError, ServerTimeout, translate_error
from . import _devices, _messages
from ._disposal import Unregisterer
from ._engine import Engine
from ._face import ClientFace
from ._run import PLAN_REFUSALS, Runner
from ._model import ModelInfo
from ._options import RequestOptions
from ._request import RequestFace, SlotRequest
from ._steps import (Done, Emit, FetchModel, FetchModelNames, FetchServerVersion, NextResponse, Pause, Register, Send, Steps, StreamSend, Unregister,
                     WaitForDevice, WaitForSlot, advance)
from ._stream import BlockingStream, send_on_stream
from ._threads import Connector, Workers

__all__ = ["AnswerBound", "BlockingDriver", "Client", "Request", "answer_within", "bounded_handlers",
           "unregister_now"]


class AnswerBound(NamedTuple):
    """How long the calls a driver makes on the client's own for some steps -- model reads,
    registrations, unregisters -- may wait for the server's answer: *each* seconds a call (a
    request's ``client_timeout``; its waits for a slot stay ``slot_timeout``'s), and none past
    *deadline* (a ``time.monotonic()`` instant: a closing client's settling).  None: no bound of
    that kind.  A call cut off by it is :class:`~tritonshm.ServerTimeout`, of unknown outcome."""

    each: float | None = None
    deadline: float | None = None

    def seconds(self) -> float | None:
        """How long the next call may wait (past the deadline, 0 or less: it is not made)."""
        if self.deadline is None:
            return self.each
        left = self.deadline - time.monotonic()
        return left if self.each is None else min(self.each, left)


def answer_within(bound: AnswerBound | None) -> float | None:
    """How long a call may wait for its answer under *bound* (None: for as long as it takes)."""
    return None if bound is None else bound.seconds()


def bounded_handlers(driver: Any, bound: AnswerBound) -> dict[type, Callable[[Any], Any]]:
    """*driver*'s ``handlers`` (either driver's), the calls the client makes on its own -- model
    reads, registrations, unregisters -- bounded by *bound*.  A request's bound (its
    ``client_timeout``, the same again and again) is made once: a table per call would cost
    microseconds on every warm request."""
    cache: dict[AnswerBound, dict[type, Callable[[Any], Any]]] = driver.bounded_tables
    handlers = cache.get(bound)
    if handlers is None:
        handlers = {**driver.handlers, **{kind: functools.partial(handle, bound=bound) for kind, handle in (
            (FetchModel, driver._fetch_model), (FetchModelNames, driver._fetch_model_names),
            (FetchServerVersion, driver._fetch_server_version), (Register, driver._register),
            (Unregister, driver._unregister))}}
        if bound.deadline is None:  # (a closing client's deadline is used once)
            if len(cache) >= 8:  # (a caller varying client_timeout: bounded all the same)
                cache.clear()
            cache[bound] = handlers
    return handlers


# How long close() keeps asking a server that refuses to unregister what we parked.
SETTLE_SECONDS = 5.0
_SETTLE_AT_EXIT = 1.0   # a client collected or left open at exit: "in use" lasts milliseconds
LAST_CALL = 0.5        # close()'s last unregister, begun as the settling ends, may take this long
#: How long one question about memory held after close() may wait for the server's answer
#: (a server that hangs then is asked again later, as one that refuses).
AFTER_CLOSE = AnswerBound(each=5.0)


def _wait_for_device(step: WaitForDevice) -> None:
    """Block (the GIL released) until the step's event completes; copies it was recorded after
    are then known complete (:func:`._devices.waited`)."""
    step.event.synchronize()
    _devices.waited(step.event)


class Request(RequestFace):
    """A leased slot with views of the inputs: the zero-copy path.

    Made by :meth:`Client.request`.  Fill ``inputs[name]`` in place, then
    :meth:`run` returns the outputs as views into the same slot.  The slot
    goes back to the pool once this request and every view of it are gone.
    """

    def run(self, outputs: Sequence[str] | None = None, *, stream: Any = None, **options: Any) -> dict[str, Any]:
        """Run the inference on the inputs as they are now; outputs are slot views
        (numpy, or :class:`~tritonshm.CudaArray` for a request on a GPU).

        For a slot on a GPU, the request is sent once the work queued so far
        on the calling thread's current stream for that GPU has landed
        (torch's or cupy's current stream where they are loaded, else the
        legacy default stream): ``torch.from_dlpack(req.inputs[name]).copy_(x)``
        then ``run()`` sends what the copy wrote.  Work on another stream
        must be ordered by the caller, or named: *stream* (a handle, or a
        tritonshm, torch or cupy stream) replaces the current one.  Request
        options as for :meth:`Client.infer`.
        """
        return self._driver.drive(self._core.run_steps(outputs, stream, options))


class BlockingDriver:
    """Carries out an engine's steps with blocking calls, on the calling thread.

    *handlers* maps each step type to the call that carries it out (the
    connector's connections for the server's steps; a synchronize, with the
    GIL released, for device work; a sleep for a pause).
    """

    def __init__(self, engine: Engine, connector: Connector):
        self.connector = connector
        self._wire = engine.wire
        self._http = engine.wire.http
        self._grpc_send: Callable[[Any], Any] | None = None  # ready messages, on the shared client
        self._url = engine.url  # where the client looks, as the caller gave it
        # Every call the client makes on its own: the wire's options and the headers, asked anew.
        self._control, self._headers = engine.control_options, engine.control_headers
        endpoint = engine.endpoint
        # Plain HTTP: inference requests go on this thread's socket, not through
        # tritonclient's I/O thread (None: through tritonclient).
        self._http1 = None if endpoint is None else _http1.Connections(endpoint)
        self._connect = engine.connect
        self._streams: dict[Any, BlockingStream] = {}   # by stream_key: made on first use
        self.handlers: dict[type, Callable[[Any], Any]] = {
            StreamSend: self._stream_send,
            NextResponse: self._next_response,
            Send: self._send,
            FetchModel: self._fetch_model,
            FetchModelNames: self._fetch_model_names,
            FetchServerVersion: self._fetch_server_version,
            Register: self._register,
            Unregister: self._unregister,
            WaitForSlot: lambda step: step.pool.wait(step.timeout),
            WaitForDevice: _wait_for_device,
            Pause: lambda step: time.sleep(step.seconds),
        }
        self.bounded_tables: dict[AnswerBound, dict[type, Callable[[Any], Any]]] = {}  # (bounded_handlers)

    def drive(self, steps: Steps, bound: AnswerBound | None = None) -> Any:
        """Carry out *steps*, blocking; their result.  The calls the client makes on its own for
        them (model reads, registrations, unregisters) wait for answers as *bound* allows."""
        handlers = self.handlers if bound is None else bounded_handlers(self, bound)
        outcome: Any = None
        failure: BaseException | None = None
        while True:
            try:  # (advance(), written out: this loop runs every request)
                step = steps.throw(failure) if failure is not None else steps.send(outcome)
            except StopIteration as stop:
                return stop.value
            except BaseException:
                failure = None  # see _steps.advance: no cycle through this frame to the failure
                raise
            try:
                outcome, failure = handlers[type(step)](step), None
            except Exception as exc:
                outcome, failure = None, exc

    def iterate(self, steps: Steps, bound: AnswerBound | None = None) -> Iterator[Any]:
        """Carry out *steps* up to their first :class:`NextResponse` now (the request is
        sent when this returns), then an iterator of the values they :class:`Emit`,
        carrying out the rest as the caller asks; closing it closes the steps.  The calls
        the client makes on its own for them wait as *bound* allows (see :meth:`drive`)."""
        handlers = self.handlers if bound is None else bounded_handlers(self, bound)
        step = advance(steps)
        while not isinstance(step, (Done, NextResponse)):
            step = advance(steps, *self._carry_out(step, handlers))
        return self._emitted(steps, step, handlers)

    def _emitted(self, steps: Steps, step: Any, handlers: dict[type, Callable[[Any], Any]]) -> Iterator[Any]:
        try:
            while not isinstance(step, Done):
                if isinstance(step, Emit):
                    yield step.value
                    step = advance(steps)
                else:
                    step = advance(steps, *self._carry_out(step, handlers))
        finally:
            steps.close()

    @staticmethod
    def _carry_out(step: Any, handlers: dict[type, Callable[[Any], Any]]) -> tuple[Any, BaseException | None]:
        try:
            return handlers[type(step)](step), None
        except Exception as exc:
            return None, exc

    def close_wire(self) -> None:
        """End the inference streams that are open and the HTTP/1.1 connections (requests on
        them end with ClientClosed)."""
        streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream.close()
        if self._http1 is not None:
            self._http1.close()

    def cut_off(self) -> None:
        """End the requests in flight now, as tritonclient's ``close()`` ends them: the wire
        closed under them (gRPC: ``CANCELLED``; HTTP/1.1: the connection shut), the streams
        ended.  What the client asks the server after this goes on a new connection."""
        self._grpc_send = None
        self.close_wire()
        self.connector.cut_off()

    def _stream_send(self, step: StreamSend) -> Any:
        return send_on_stream(self._streams, step, functools.partial(BlockingStream, self._connect))

    @staticmethod
    def _next_response(step: NextResponse) -> Any:
        try:
            return step.entry.inbox.get(timeout=step.timeout)
        except queue.Empty:
            raise ServerTimeout(f"no response from the server within client_timeout={step.timeout} s") from None

    def _send(self, step: Send) -> Any:
        if step.claim is not None:
            step.claim.unanswered = True  # on its way: the server may run it from now on
        if self._http1 is not None:  # on this thread's socket: a message made ready once, or now
            return self._http1.send(step.message or _messages.http_request(step),
                                    None if step.claim is None else step.claim.went_out_again)
        if step.message is not None and not self._http:  # gRPC, made ready once: sent as it is
            send = self._grpc_send
            if send is None:
                send = self._grpc_send = self._wire.sender(self.connector.shared)
            try:
                return send(step.message)
            except ServerError:
                raise
            except Exception as exc:  # as triton.call_translated turns them
                raise translate_error(exc, f"inferring with model {step.model!r}") from exc
        doing = f"inferring with model {step.model!r}"
        options = {} if step.options is None else step.options.infer_kwargs(self._wire.http)
        return self.connector.call(lambda tc: triton.call_translated(
            tc, doing, "infer", step.model, step.inputs, model_version=step.version, outputs=step.outputs,
            **options))

    def _fetch_server_version(self, step: FetchServerVersion, bound: AnswerBound | None = None) -> str:
        timeout = answer_within(bound)
        metadata = self.connector.call(lambda tc: triton.call_translated(
            tc, "reading the server's metadata", "get_server_metadata", address=self._url, answer_within=timeout,
            **self._control()), timeout)
        return str(metadata.get("version", "")) if isinstance(metadata, dict) else ""

    def _fetch_model(self, step: FetchModel, bound: AnswerBound | None = None) -> tuple[Any, Any]:
        # (the first call a client makes: where it looked is named if nothing answers there)
        wire, doing, url = self._wire, f"reading metadata of model {step.model!r}", self._url

        def fetch(tc: Any) -> tuple[Any, Any]:
            metadata = triton.call_translated(tc, doing, "get_model_metadata", step.model, step.version,
                                              address=url, answer_within=answer_within(bound), **self._control())
            config = triton.call_translated(tc, doing, "get_model_config", step.model, step.version,
                                            address=url, answer_within=answer_within(bound), **self._control())
            return metadata, wire.model_config(config)

        return self.connector.call(fetch, answer_within(bound))

    def _fetch_model_names(self, step: FetchModelNames, bound: AnswerBound | None = None) -> list[str]:
        wire, timeout = self._wire, answer_within(bound)
        return self.connector.call(lambda tc: wire.model_names(triton.call_translated(
            tc, "reading the server's model repository index", "get_model_repository_index", address=self._url,
            answer_within=timeout, **self._control())), timeout)

    def _register(self, step: Register, bound: AnswerBound | None = None) -> str:
        headers, timeout = self._headers(), answer_within(bound)
        if step.name is None:
            return self.connector.call(lambda tc: step.memory.register(tc, headers, timeout), timeout)
        return self.connector.call(lambda tc: step.memory.reregister(tc, step.name, headers, timeout), timeout)

    def _unregister(self, step: Unregister, bound: AnswerBound | None = None) -> None:
        # No patience here: memory the server still uses is parked and tried again later.
        timeout = answer_within(bound)
        self.connector.call(functools.partial(unregister_now, name=step.name, headers=self._headers(),
                                              timeout=timeout), timeout)


def answer_bound(options: RequestOptions | None) -> AnswerBound | None:
    """What bounds the client's own calls for a request with *options*: its ``client_timeout``,
    each (None without one)."""
    return None if options is None or options.client_timeout is None else AnswerBound(each=options.client_timeout)


def unregister_now(tc: Any, name: str, headers: Mapping[str, str] | None = None,
                    timeout: float | None = None) -> Any:
    """Unregister *name* on tritonclient *tc* at once: the steps themselves decide when to ask again."""
    return triton.unregister(tc, name, patience=0.0, headers=headers, timeout=timeout)


def release_everything(driver: BlockingDriver, engine: Engine, workers: dict[str, Workers], wait: bool,
                       settle: float = _SETTLE_AT_EXIT) -> None:
    """Stop the threads, unregister and close every pool, close the connections.

    Holds no reference to the client: it is also the finalizer of a client
    that was never closed, so it is best effort: a name the server cannot
    unregister does not stop the rest (host memory is closed all the same).
    Memory the server refuses to let go of is asked for again for up to
    *settle* seconds; device memory still refused then is held, never freed
    under the server, and asked about again after that through *driver*'s
    connection (short-lived clients once it is closed) until the server lets go.
    """
    for group in list(workers.values()):
        group.shutdown(wait)
    workers.clear()
    driver.close_wire()  # its requests' slots come back, to be released below
    # The unregisters end with the settling: a server that hangs does not hold close() past it
    # (what it did not answer is held for it, or closed, as what it refused).
    closing = closing_bound(settle)
    headers = engine.control_headers()
    _carry_out_unregisters(unregisterer(driver.connector, headers, closing), engine.release_steps(settle))
    engine.hold_refused(unregisterer(driver.connector, headers, AFTER_CLOSE))  # (asked about after the close)
    driver.connector.close(wait, max(0.0, closing.seconds() or 0.0))


def settling(slot_timeout: float | None, cancel_requests: bool) -> float:
    """How long a closing client asks the server again to unregister what it refuses (it
    answers a request before it lets go of the request's regions): within *slot_timeout*; not
    at all for a client that cancels its requests, which does not wait for the server -- what
    it refuses is asked about after the close (:meth:`~._engine.Engine.hold_refused`)."""
    if cancel_requests:
        return 0.0
    return SETTLE_SECONDS if slot_timeout is None else min(slot_timeout, SETTLE_SECONDS)


def closing_bound(settle: float) -> AnswerBound:
    """A closing client's unregisters end with its settling (*settle* seconds from now, and the
    last one's grace): a server that hangs does not hold ``close()`` past it; what it did not
    answer is held for it, or closed, as what it refused."""
    return AnswerBound(deadline=time.monotonic() + settle + LAST_CALL)


def unregisterer(connector: Connector, headers: Mapping[str, str] | None, bound: AnswerBound) -> Unregisterer:
    """Unregisters a name, with *headers*, through *connector* -- once it is closed, on a
    short-lived client of the calling thread's own (see :meth:`Connector.call`) -- each call
    waiting for the answer as *bound* allows."""
    def unregister(name: str) -> Any:
        timeout = bound.seconds()
        return connector.call(functools.partial(unregister_now, name=name, headers=headers, timeout=timeout),
                              timeout)

    return unregister


def _carry_out_unregisters(unregister: Unregisterer, steps: Steps) -> None:
    """Drive steps that only unregister (through *unregister*) and pause, blocking; failures go
    back into the steps."""
    step = advance(steps)
    while not isinstance(step, Done):
        try:
            if isinstance(step, Pause):
                time.sleep(step.seconds)
                outcome, failure = None, None
            else:
                outcome, failure = unregister(step.name), None
        except Exception as exc:
            outcome, failure = None, exc
        step = advance(steps, outcome, failure)


class Client(ClientFace):
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
    being registered, retired but not yet dropped), at every instant.  *slot_timeout* is how
    long a request waits for a slot, in seconds, before :class:`~tritonshm.PoolExhausted`
    (None: for ever) -- not tritonclient's ``timeout``, which calls take: the server's, in
    microseconds.
    *connect_options* go to tritonclient's client constructor as they are
    (e.g. ``root_certificates`` for gRPC over TLS).  *pinned* page-locks the
    slot pools for CUDA (``True``: with device 0's context; or a device
    number), so copies between them and a GPU run at pinned speed.
    *headers* go with every call (gRPC metadata or HTTP headers: e.g.
    authentication behind a gateway); a call's own ``headers=`` add to them.
    *by_reference* sends GPU tensors where they are, with no device copy: the
    allocation each is in (a torch or cupy segment, a region) is registered
    with the server once and kept alive until it is let go of -- when more than
    *max_lent_bytes* (or 32 allocations) are registered, on :meth:`forget`, on
    :meth:`close`; memory CUDA IPC cannot share is copied (:meth:`stats` says
    how many and why).  A request given up on (a timeout, a cancel, a lost
    connection) holds what it named until the server provably finished it; a
    server older than Triton 2.50 cannot say so, and there it is held
    *old_server_hold* seconds (or until the server restarts), with one warning.
    """

    def __init__(self, url: str = "localhost:8001", *, transport: str = "auto", slots: int = 4,
                 max_pool_bytes: int = 1 << 30, slot_timeout: float | None = 60.0, verbose: bool = False,
                 connect_options: Mapping[str, Any] | None = None, pinned: bool | int = False,
                 headers: Mapping[str, str] | None = None, by_reference: bool = True,
                 max_lent_bytes: int = 2 << 30, old_server_hold: float = 60.0):
        self._engine = engine = Engine(url, aio=False, transport=transport, slots=slots,
                                       max_pool_bytes=max_pool_bytes, slot_timeout=slot_timeout, verbose=verbose,
                                       connect_options=connect_options, pinned=pinned, headers=headers,
                                       by_reference=by_reference, max_lent_bytes=max_lent_bytes,
                                       old_server_hold=old_server_hold)
        connector = Connector(engine.connect, engine.wire.http, io_threads=slots)
        self._driver = BlockingDriver(engine, connector)
        self._runner = Runner(engine)  # every request's steps, over the engine's state
        # "async" (infer_async), "chunk" (large batches), "facade" (tritonshm.http's async_infer)
        self._workers: dict[str, Workers] = {}
        # Runs close()'s work if the user forgets: at garbage collection or exit.
        self._finalizer = weakref.finalize(self, release_everything, self._driver, engine, self._workers, False)

    @property
    def tritonclient(self) -> Any:
        """The underlying tritonclient client: every standard call stays available.

        An HTTP one (like every tritonclient HTTP client) works only in the
        thread that first asked for it.
        """
        return self._driver.connector.shared

    def forget(self) -> None:
        """Unregister and let go of the caller's GPU allocations registered to send its tensors
        by reference (those a request still uses, once it is done).  Call it before
        ``torch.cuda.empty_cache()`` (or cupy's ``free_all_blocks()``) to give their memory back:
        the client holds one tensor of each registered allocation so that it is never freed
        while the server has it open."""
        self._engine.check_open()
        self._driver.drive(self._engine.forget_steps())

    def _workers_for(self, purpose: str, count: int | None = None) -> Workers:
        # The worker threads for *purpose*: *count* of them (made on first use; None: as many as slots).
        engine = self._engine
        with engine.lock:
            engine.check_open()
            workers = self._workers.get(purpose)
            if workers is None:
                workers = self._workers[purpose] = Workers(count or engine.slots, f"tritonshm-{purpose}")
            return workers

    # -- discovery --------------------------------------------------------

    def model_info(self, model: str, version: str = "") -> ModelInfo:
        """What the server says about *model* (cached per model and version)."""
        return self._model_info(model, version)

    def _model_info(self, model: str, version: str, bound: AnswerBound | None = None) -> ModelInfo:
        # (model_info, its reads bounded by a request's *bound*)
        engine = self._engine
        if engine.closed:
            engine.check_open()
        return engine.cached_model(model, version) or self._driver.drive(engine.model_steps(model, version), bound)

    # -- inference --------------------------------------------------------

    def infer(self, model: str, inputs: Mapping[str, Any], *, outputs: Sequence[str] | None = None,
              version: str = "", copy: bool = True, slot_timeout: float | None = None,
              output_device: str | int = "auto", out: Mapping[str, Any] | None = None,
              **options: Any) -> dict[str, Any]:
        """Run *model* on *inputs* (name -> array) and return its outputs.

        Inputs are numpy arrays (or array-likes) or GPU tensors -- anything
        with ``__cuda_array_interface__`` or a CUDA ``__dlpack_device__``
        (torch, cupy, jax, :class:`~tritonshm.CudaArray`); GPU tensors are sent
        by reference where their memory can be shared (see *by_reference*),
        else through CUDA slots with one device-to-device copy, never through
        host memory.  They must match the model's datatypes and shapes exactly (no
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
        results are wanted, they are copies all the same.  With ``copy=True``
        a ``CudaArray`` result on the GPU of its CUDA slot is that slot, which
        the server wrote it in (nothing is copied after the answer), while the
        pool has another slot free; it too holds its slot until it is gone, and
        is never written again meanwhile.  *out* names GPU
        tensors the caller allocated (output name -> writable tensor, of the
        output's dtype and shape, where the results go) for the server to write
        in place -- on every route, host slots included; copied into only where
        its memory cannot be lent (``stats().copied`` says why) -- and they are
        what is returned for those outputs.  *slot_timeout* bounds the wait for
        a slot, in seconds (default: the client's), and for tensors an earlier
        request the client gave up on may still touch (:class:`TensorInUse`).

        Memory the server may touch -- the slot, the tensors sent by reference,
        *out* -- is held until the server is done with the request, also when
        the client stops waiting for it (``client_timeout``): see README's
        "GPU tensors by reference".

        Per-request options take tritonclient's names and meanings
        (:class:`~tritonshm.RequestOptions`): ``timeout`` (the server's, in
        microseconds: how long the request may wait in the model's queue),
        ``parameters``, ``priority``, ``client_timeout``, ``headers``,
        ``compression_algorithm`` (gRPC) or ``request_compression_algorithm``
        / ``response_compression_algorithm`` (HTTP), ``sequence_id``,
        ``sequence_start``, ``sequence_end``, ``idempotent`` (tritonshm's own:
        False never sends the request twice); or ``options=`` a prepared
        :class:`~tritonshm.RequestOptions`.  They are
        checked before anything is sent; the client's *headers* come first.
        """
        engine = self._engine
        planner = engine.planner
        checked = planner.request_options(options) if options else planner.default_options
        bound = answer_bound(checked)
        drive = self._driver.drive if bound is None else functools.partial(self._driver.drive, bound=bound)
        if out is None:
            quick = self._runner.quick_steps_for(model, version, inputs, outputs, copy, output_device,
                                                 slot_timeout, checked)
            if quick is not None:  # seen before
                return drive(quick)
        info, runner = self._model_info(model, version, bound), self._runner
        try:
            run = runner.infer_steps(info, inputs, outputs, copy, output_device, slot_timeout, checked, out)
        except PLAN_REFUSALS as refusal:  # against what the client knew: the model may have changed
            info = drive(runner.reread_steps(info, refusal))
            run = runner.infer_steps(info, inputs, outputs, copy, output_device, slot_timeout, checked, out)
        if run.join is None:
            return drive(run.steps[0])
        workers = self._workers_for("chunk")  # the chunks of a large batch at once
        return run.join([future.result() for future in [workers.submit(drive, steps) for steps in run.steps]])

    def stream(self, model: str, inputs: Mapping[str, Any], *, outputs: Sequence[str] | None = None,
               version: str = "", slot_timeout: float | None = None,
               output_device: str | int = "auto", **options: Any) -> Iterator[dict[str, Any]]:
        """Send one request on the client's gRPC stream; an iterator of its responses' outputs.

        For decoupled models (any number of responses per request: token
        streaming, audio, video), and any other model too (one response).
        The request is sent when this returns; each ``next()`` waits for the
        next response, and the iterator ends after the server's final one.
        Inputs are checked and travel as with :meth:`infer` (through a slot,
        held until the server is done with the request); outputs travel in
        the responses -- Triton writes all responses of one request into the
        same output region without waiting for a reader, so shared memory
        cannot carry them safely.  Closing the iterator early (``break``)
        drops the rest; its slot comes back once the server has finished
        the request.  Many streams may be open at once: one gRPC stream per
        client carries them all, by request id.  gRPC only.  Options as for
        :meth:`infer`; ``client_timeout`` bounds the wait for each response
        (:class:`~tritonshm.ServerTimeout`), and requests with other
        ``headers`` or compression go on a stream of their own.
        """
        planner = self._engine.planner
        checked = planner.request_options(options)
        bound = answer_bound(checked)  # (its client_timeout bounds the client's own calls too)
        info = self._model_info(model, version, bound)
        plan = self._driver.drive(self._runner.replanned_steps(info, lambda info: planner.stream_plan(
            info, inputs, outputs, output_device, slot_timeout, checked)), bound)
        return self._driver.iterate(self._runner.stream_steps(plan), bound)

    def _stream_to(self, stream: Any, model: str, inputs: Mapping[str, Any], requested: list | None,
                   version: str, options: RequestOptions | None) -> Any:
        """Send one request on *stream* -- not the client's own: tritonshm.grpc's, which hands
        each response to its user's callback -- its inputs through a slot as :meth:`stream`
        sends them, its outputs asked for with tritonclient's *requested* objects (None:
        all); its :class:`~._stream.Streamed` entry (the slot comes back after the request's
        final response, or once the server lets go of it)."""
        planner = self._engine.planner
        info = self.model_info(model, version)
        plan = self._driver.drive(self._runner.replanned_steps(info, lambda info: planner.stream_plan(
            info, inputs, None, "auto", None, options)))
        return self._driver.drive(self._runner.stream_send_steps(plan, stream, requested))

    def infer_async(self, model: str, inputs: Mapping[str, Any], **kwargs: Any) -> concurrent.futures.Future:
        """:meth:`infer` in a background thread; returns a ``concurrent.futures.Future``.

        GPU inputs are captured now, on the calling thread: what is sent is
        ordered after the work queued on them (on the caller's current
        stream) by the time of this call, as with :meth:`infer`.
        """
        workers = self._workers_for("async")
        if kwargs.get("out") is not None:  # results the caller allocated: captured now too
            inputs, kwargs["out"] = _devices.capture_call(inputs, kwargs["out"])
        else:
            inputs = _devices.capture_inputs(inputs)
        return workers.submit(self.infer, model, inputs, **kwargs)

    def request(self, model: str, batch_size: int | None = None, *,
                shapes: Mapping[str, Sequence[int]] | None = None, version: str = "",
                slot_timeout: float | None = None, device: str | int | None = None,
                **misplaced: Any) -> Request:
        """Lease a slot for a zero-copy request (see :class:`Request`).

        *batch_size* is required for batching models; *shapes* gives the
        full shape of inputs whose dims are variable; *slot_timeout* bounds
        the wait for the slot, in seconds (default: the client's).  Request
        options (``timeout``, ``priority``, ...) go to :meth:`Request.run`,
        which sends the request.  *device* (``"cuda"``,
        ``"cuda:N"``) puts the slot in GPU memory: the inputs and outputs are
        :class:`~tritonshm.CudaArray` views to fill and read in place (e.g.
        ``torch.from_dlpack(req.inputs["INPUT0"])``).
        """
        engine = self._engine
        engine.planner.refuse_lease_options(misplaced)
        info, full = self._driver.drive(self._runner.replanned_steps(
            self.model_info(model, version),
            lambda info: (info, engine.planner.request_shapes(info, batch_size, shapes))))
        kind = engine.routing.request_memory(info, device)
        wait = engine.planner.slot_wait(slot_timeout)  # (checked though a slot is free now)
        lease = self._runner.lease_now(info, full, kind) or \
            self._driver.drive(self._runner.request_steps(info, full, wait, kind))
        return Request(SlotRequest(self._runner, info, lease, full), self._driver)

    # -- lifetime ---------------------------------------------------------

    def close(self, *, cancel_requests: bool = False) -> None:
        """Unregister and unlink this client's regions and close its connections; idempotent.

        New requests are refused at once; those :meth:`infer_async` queued are
        run, and requests in flight (on any thread) waited for -- up to the
        client's *slot_timeout* -- before the memory they use is unregistered.
        With *cancel_requests* (tritonclient's ``close()``, and its
        ``stop_stream(cancel_requests=True)``) none is waited for: those queued end
        cancelled, those waiting for a slot with :class:`~tritonshm.ClientClosed`,
        and those on the wire are cut off (gRPC: ``StatusCode.CANCELLED``) --
        the memory of each is held until the server is done with it, as for
        any request given up on.  Device memory the server refuses
        to unregister (it may still be reading it) is never freed under it:
        it is asked about again after this returns, on a backoff, and freed
        once the server lets go.  Result views handed out earlier stay valid:
        they keep their memory.
        """
        engine = self._engine
        if not engine.stop_accepting():
            return
        if cancel_requests:
            for group in list(self._workers.values()):
                group.cancel_queued()
            self._driver.cut_off()
            engine.pool_table.stop_leasing()  # the requests waiting for a slot find the client closed
            engine.in_flight.wait_idle(LAST_CALL)  # (cut off, they end at once: their memory held for the server)
        else:
            for group in list(self._workers.values()):
                group.shutdown()  # finish what was submitted, while the pools still exist
            engine.in_flight.wait_idle(engine.slot_timeout)
        self._driver.close_wire()  # streams still open end with ClientClosed; their slots come back
        detached = self._finalizer.detach()
        if detached is not None:
            release: Callable[..., None] = detached[1]  # release_everything(driver, engine, workers, wait)
            driver, _, workers, _ = detached[2]  # the finalizer's wait=False is for a collected client
            release(driver, engine, workers, True, settle=settling(engine.slot_timeout, cancel_requests))

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
