"""The asyncio client: the engine's steps carried out on the event loop.

Every step is native asyncio -- inference, discovery and registration go
through tritonclient's aio client, and waiting for a slot is an
``asyncio.Event`` the pool sets -- so the loop never blocks and no thread is
left behind when a request is cancelled.

Cancellation keeps memory safe: a request cancelled while the server is
working on it keeps its slot until the server has answered (the server may
still write outputs there); a request cancelled while waiting for a slot
holds nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import weakref
from typing import Any, AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence

from .. import _http1, _transport, triton
from ..errors import ClientClosed, ServerError, ServerTimeout, translate_error
from . import _devices, _messages
from ._client import (AFTER_CLOSE, LAST_CALL, AnswerBound, BlockingDriver, answer_bound, answer_within,
                      bounded_handlers, closing_bound, release_everything, settling, unregister_now, unregisterer)
from ._engine import Engine
from ._face import ClientFace
from ._run import PLAN_REFUSALS, Runner
from ._model import ModelInfo
from ._options import RequestOptions
from ._request import RequestFace, SlotRequest
from ._steps import (Done, Emit, FetchModel, FetchModelNames, FetchServerVersion, NextResponse, Pause, Register, Send, Steps, StreamSend, Unregister,
                     WaitForDevice, WaitForSlot, advance)
from ._stream import AsyncStream, send_on_stream
from ._threads import Connector

__all__ = ["AsyncDriver", "Client", "Request"]


class Request(RequestFace):
    """:class:`tritonshm.client.Request` of the asyncio client: :meth:`run` returns an awaitable."""

    def run(self, outputs: Sequence[str] | None = None, *, stream: Any = None,
            **options: Any) -> Awaitable[dict[str, Any]]:
        """Run the inference on the inputs as they are now; outputs are slot views.

        The ordering point (see :meth:`tritonshm.client.Request.run`) is taken
        when this is called, on the calling thread; awaiting it waits for
        the device work without blocking the event loop.  Request options as
        for :meth:`tritonshm.Client.infer`.
        """
        return self._driver.drive(self._core.run_steps(outputs, stream, options))


class AsyncDriver:
    """Carries out an engine's steps on the event loop, through tritonclient's aio client.

    *handlers* maps each step type to a coroutine function that carries it
    out.  Waiting for a slot is an ``asyncio.Event`` the pool sets, and
    device work is polled: the loop never blocks.
    """

    def __init__(self, engine: Engine, aio_client: Any):
        self.aio_client = aio_client
        self._engine = engine
        self._wire = engine.wire
        self._http = engine.wire.http
        # Every call the client makes on its own: the wire's options and the headers, asked anew.
        self._control, self._headers = engine.control_options, engine.control_headers
        self._grpc_send: Callable[[Any], Any] | None = None  # ready messages, on the aio client
        endpoint = engine.endpoint
        # Plain HTTP: inference requests go on the loop's own sockets (None: tritonclient).
        self._http1 = None if endpoint is None else _http1.AsyncConnections(endpoint)
        self._streams: dict[Any, AsyncStream] = {}   # by stream_key: made on first use
        self.handlers: dict[type, Callable[[Any], Any]] = {
            StreamSend: self._stream_send,
            NextResponse: self._next_response,
            Send: self._send,
            FetchModel: self._fetch_model,
            FetchModelNames: self._fetch_model_names,
            FetchServerVersion: self._fetch_server_version,
            Register: self._register,
            Unregister: self._unregister,
            WaitForSlot: self._wait_for_slot,
            WaitForDevice: self._wait_for_device,
            Pause: lambda step: asyncio.sleep(step.seconds),
        }
        self.bounded_tables: dict[AnswerBound, dict[type, Callable[[Any], Any]]] = {}  # (bounded_handlers)

    async def drive(self, steps: Steps, bound: AnswerBound | None = None) -> Any:
        """Carry out *steps* on the event loop; their result.  The calls the client makes on its
        own for them wait for answers as *bound* allows (see :meth:`BlockingDriver.drive`)."""
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
            outcome, failure = await self._carry_out(steps, step, handlers)

    async def iterate(self, steps: Steps, bound: AnswerBound | None = None) -> AsyncGenerator[Any, None]:
        """Carry out *steps*, yielding the values they :class:`Emit`; closing the iterator (or
        cancelling the task that awaits it) closes the steps.  The calls the client makes on its
        own for them wait as *bound* allows (see :meth:`drive`)."""
        handlers = self.handlers if bound is None else bounded_handlers(self, bound)
        step = advance(steps)
        handed_on = False
        try:
            while not isinstance(step, Done):
                if isinstance(step, Emit):
                    yield step.value
                    step = advance(steps)
                    continue
                try:
                    result, failure = await self._carry_out(steps, step, handlers)
                except asyncio.CancelledError:
                    handed_on = True  # _abandon ends the steps once the step's I/O is over
                    raise
                try:
                    step = advance(steps, result, failure)
                finally:
                    failure = None  # (see _steps.advance)
        finally:
            if not handed_on:
                steps.close()

    async def _carry_out(self, steps: Steps, step: Any,
                         handlers: dict[type, Callable[[Any], Any]] | None = None) -> tuple[Any, BaseException | None]:
        """One step's outcome, or its failure.  Shielded: a cancelled caller leaves the
        step's I/O to finish, and the steps to end after it (see :meth:`_abandon`)."""
        task = asyncio.ensure_future(self._handle(step, self.handlers if handlers is None else handlers))
        try:
            return await asyncio.shield(task), None
        except asyncio.CancelledError:
            self._abandon(steps, step, task)
            raise
        except Exception as exc:
            return None, exc

    async def _handle(self, step: Any, handlers: dict[type, Callable[[Any], Any]]) -> Any:
        """Carry out *step* (in its own task: see :meth:`_carry_out`); I/O cancelled under it by
        :meth:`Client.close` fails with :class:`ClientClosed`.

        gRPC ends the calls of a channel being closed as cancelled, and grpc.aio raises
        ``CancelledError`` for them: left as it is, the caller's task would raise a cancellation
        nobody asked for (TaskGroup and ``asyncio.wait_for`` take it for their own), where over
        HTTP the same request raises ClientClosed.  The caller's own cancellation never reaches
        this task (shielded), so it still raises ``CancelledError``.
        """
        try:
            return await handlers[type(step)](step)
        except asyncio.CancelledError:
            if not self._engine.closed:
                raise  # (the loop shutting down)
            raise ClientClosed("the client was closed while this request waited on the server") from None

    async def close_wire(self) -> None:
        """End the inference streams that are open and the HTTP/1.1 connections (requests on
        them end with ClientClosed)."""
        streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            await stream.close()
        if self._http1 is not None:
            self._http1.close()

    async def cut_off(self) -> None:
        """End the calls in flight now, as tritonclient's ``close()`` ends them (see
        :meth:`BlockingDriver.cut_off`): the connection they use is closed under them, and
        what the client asks the server after this goes on a new one."""
        cut, self.aio_client = self.aio_client, self._engine.connect()
        self._grpc_send = None
        await self.close_wire()
        await cut.close()

    async def _stream_send(self, step: StreamSend) -> Any:
        return send_on_stream(self._streams, step, functools.partial(AsyncStream, self.aio_client))

    @staticmethod
    async def _next_response(step: NextResponse) -> Any:
        try:
            return await asyncio.wait_for(step.entry.inbox.get(), step.timeout)
        except asyncio.TimeoutError:
            raise ServerTimeout(f"no response from the server within client_timeout={step.timeout} s") from None

    @staticmethod
    def _abandon(steps: Steps, step: Any, task: asyncio.Future) -> None:
        """The caller was cancelled: end *steps* once their current I/O is over.

        Closing the steps returns their slot; while the server may still be
        writing outputs into it (or registering memory), that must wait.  A
        registration's outcome is handed to the steps first, so its memory
        joins its pool (and is unregistered with it) -- or, cut off, is
        unregistered before it goes -- rather than being freed while the
        server has it open.
        """
        def finish(done: asyncio.Future) -> None:
            # A registration's outcome, and a request's answer (or failure), are handed to the
            # steps: the memory joins its pool (or, a registration cut off, is unregistered before
            # it goes), and the request's claim learns that the server is done with it (else it
            # would hold the slot and lent tensors for the server).
            if not done.cancelled() and isinstance(step, (Register, Send)):
                failure = done.exception()
                try:
                    advance(steps, None if failure is not None else done.result(), failure)
                except Exception:
                    pass  # what came next failed: closing below still runs the steps' clean-up
                failure = None  # (see _steps.advance)
            steps.close()

        if task.done():
            finish(task)
        else:
            task.add_done_callback(finish)

    async def _send(self, step: Send) -> Any:
        if step.claim is not None:
            step.claim.unanswered = True  # on its way: the server may run it from now on
        doing = f"inferring with model {step.model!r}"
        if self._http1 is not None:  # on the loop's own sockets: a message made ready once, or now
            return await self._http1.send(step.message or _messages.http_request(step),
                                          None if step.claim is None else step.claim.went_out_again)
        if step.message is not None and not self._http:  # gRPC, made ready once: sent as it is
            send = self._grpc_send
            if send is None:
                send = self._grpc_send = self._wire.sender(self.aio_client)
            try:
                return await send(step.message)
            except ServerError:
                raise
            except Exception as exc:  # as triton.call_translated turns them
                raise translate_error(exc, doing) from exc
        options = {} if step.options is None else step.options.infer_kwargs(self._wire.http)
        return await triton.call_translated(
            self.aio_client, doing, "infer", step.model, step.inputs, model_version=step.version,
            outputs=step.outputs, **options)

    async def _fetch_server_version(self, step: FetchServerVersion, bound: AnswerBound | None = None) -> str:
        metadata = await triton.call_translated(self.aio_client, "reading the server's metadata",
                                                "get_server_metadata", answer_within=answer_within(bound), **self._control())
        return str(metadata.get("version", "")) if isinstance(metadata, dict) else ""

    async def _fetch_model(self, step: FetchModel, bound: AnswerBound | None = None) -> tuple[Any, Any]:
        wire, tc = self._wire, self.aio_client
        doing = f"reading metadata of model {step.model!r}"
        metadata = await triton.call_translated(tc, doing, "get_model_metadata", step.model, step.version,
                                                answer_within=answer_within(bound), **self._control())
        config = await triton.call_translated(tc, doing, "get_model_config", step.model, step.version,
                                              answer_within=answer_within(bound), **self._control())
        return metadata, wire.model_config(config)

    async def _fetch_model_names(self, step: FetchModelNames, bound: AnswerBound | None = None) -> list[str]:
        reply = await triton.call_translated(self.aio_client, "reading the server's model repository index",
                                             "get_model_repository_index", answer_within=answer_within(bound),
                                             **self._control())
        return self._wire.model_names(reply)

    async def _register(self, step: Register, bound: AnswerBound | None = None) -> str:
        if step.name is None:
            return await step.memory.register(self.aio_client, self._headers(), answer_within(bound))
        return await step.memory.reregister(self.aio_client, step.name, self._headers(), answer_within(bound))

    @staticmethod
    async def _wait_for_device(step: WaitForDevice) -> None:
        """Poll the event, yielding to the loop in between: never a blocking device sync here."""
        delay = 0.0
        while not step.event.query():
            await asyncio.sleep(delay)
            delay = min(0.001, delay * 2 or 0.00002)  # a copy lands in microseconds; back off to 1 ms
        _devices.waited(step.event)

    async def _unregister(self, step: Unregister, bound: AnswerBound | None = None) -> None:
        # No patience here: memory the server still uses is parked and tried again later.
        await unregister_now(self.aio_client, step.name, self._headers(), answer_within(bound))

    @staticmethod
    async def _wait_for_slot(step: WaitForSlot) -> bool:
        loop = asyncio.get_running_loop()
        event = asyncio.Event()

        def wake() -> None:  # called by the pool, from any thread
            loop.call_soon_threadsafe(event.set)

        step.pool.add_waiter(wake)
        try:
            if step.pool.ready():  # it came back before we were listening (this task started late)
                return True
            await asyncio.wait_for(event.wait(), step.timeout)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            step.pool.remove_waiter(wake)


def _retrieved(task: asyncio.Future) -> None:
    """Take a finished task's failure, so that asyncio does not report it as never retrieved
    (a close() whose caller was cancelled: nobody awaits its task)."""
    if not task.cancelled():
        task.exception()


class Client(ClientFace):
    """An asyncio Triton client that moves tensors through pooled shared memory.

    Takes the same arguments as :class:`tritonshm.Client` (*connect_options*
    go to tritonclient's aio client).  Use it with ``async with``, or await
    :meth:`close` when done.
    """

    def __init__(self, url: str = "localhost:8001", *, transport: str = "auto", slots: int = 4,
                 max_pool_bytes: int = 1 << 30, slot_timeout: float | None = 60.0, verbose: bool = False,
                 connect_options: Mapping[str, Any] | None = None, pinned: bool | int = False,
                 headers: Mapping[str, str] | None = None, by_reference: bool = True,
                 max_lent_bytes: int = 2 << 30, old_server_hold: float = 60.0):
        self._engine = engine = Engine(url, aio=True, transport=transport, slots=slots,
                                       max_pool_bytes=max_pool_bytes, slot_timeout=slot_timeout, verbose=verbose,
                                       connect_options=connect_options, pinned=pinned, headers=headers,
                                       by_reference=by_reference, max_lent_bytes=max_lent_bytes,
                                       old_server_hold=old_server_hold)
        self._driver = AsyncDriver(engine, engine.connect())   # TLS and verbosity as the URL and options say
        self._runner = Runner(engine)  # every request's steps, over the engine's state
        # A forgotten client cannot await anything at garbage collection: a
        # blocking connection (made only then) unregisters its pools.
        blocking, address, ssl = _transport.parse_url(url, aio=False)
        connect = functools.partial(blocking.connect, address, ssl=ssl)
        # (its connection also asks about what close() leaves held for the server, after the close)
        self._blocking_connector = Connector(connect, blocking.http, io_threads=1)
        self._finalizer = weakref.finalize(
            self, release_everything, BlockingDriver(engine, self._blocking_connector), engine, {}, False)
        self._closing: asyncio.Future | None = None  # close()'s work, once begun (see close())

    @property
    def tritonclient(self) -> Any:
        """The underlying tritonclient aio client."""
        return self._driver.aio_client

    async def forget(self) -> None:
        """Like :meth:`tritonshm.Client.forget`."""
        self._engine.check_open()
        await self._driver.drive(self._engine.forget_steps())

    # -- the public calls ---------------------------------------------------

    async def model_info(self, model: str, version: str = "") -> ModelInfo:
        """What the server says about *model* (cached per model and version)."""
        return await self._model_info(model, version)

    async def _model_info(self, model: str, version: str, bound: AnswerBound | None = None) -> ModelInfo:
        # (model_info, its reads bounded by a request's *bound*)
        engine = self._engine
        if engine.closed:
            engine.check_open()
        return engine.cached_model(model, version) or \
            await self._driver.drive(engine.model_steps(model, version), bound)

    def infer(self, model: str, inputs: Mapping[str, Any], *, outputs: Sequence[str] | None = None,
              version: str = "", copy: bool = True, slot_timeout: float | None = None,
              output_device: str | int = "auto", out: Mapping[str, Any] | None = None,
              **options: Any) -> Awaitable[dict[str, Any]]:
        """Like :meth:`tritonshm.Client.infer`; chunks of a large batch run concurrently.

        GPU inputs (and the results the caller allocated, *out*) are captured,
        and request options checked, when this is called, on the calling
        thread (the order point of the contract), not when the result is awaited.
        """
        engine = self._engine
        planner = engine.planner
        checked = planner.request_options(options) if options else planner.default_options
        bound = answer_bound(checked)
        if out is None:
            quick = self._runner.quick_steps_for(model, version, inputs, outputs, copy, output_device,
                                                 slot_timeout, checked)
            if quick is not None:  # seen before
                return self._driver.drive(quick, bound)
        inputs, captured_out = _devices.capture_call(inputs, out)  # (now, on the caller's thread)
        return self._infer(model, inputs, outputs, version, copy, slot_timeout, output_device, checked, captured_out,
                           bound)

    async def _infer(self, model: str, inputs: Any, outputs: Sequence[str] | None, version: str,
                     copy: bool, slot_timeout: float | None, output_device: str | int,
                     options: RequestOptions | None, out: Mapping[str, Any] | None = None,
                     bound: AnswerBound | None = None) -> dict[str, Any]:
        runner = self._runner
        drive = self._driver.drive if bound is None else functools.partial(self._driver.drive, bound=bound)
        info = await self._model_info(model, version, bound)
        try:
            run = runner.infer_steps(info, inputs, outputs, copy, output_device, slot_timeout, options, out)
        except PLAN_REFUSALS as refusal:  # against what the client knew: the model may have changed
            info = await drive(runner.reread_steps(info, refusal))
            run = runner.infer_steps(info, inputs, outputs, copy, output_device, slot_timeout, options, out)
        if run.join is None:
            return await drive(run.steps[0])
        return run.join(await asyncio.gather(*(drive(steps) for steps in run.steps)))  # the chunks at once

    def stream(self, model: str, inputs: Mapping[str, Any], *, outputs: Sequence[str] | None = None,
               version: str = "", slot_timeout: float | None = None,
               output_device: str | int = "auto", **options: Any) -> AsyncIterator[dict[str, Any]]:
        """Like :meth:`tritonshm.Client.stream`: an async iterator of the responses' outputs.

        GPU inputs are captured when this is called; the request is sent when
        the iteration starts.  Cancelling the task that iterates (or leaving
        ``async for`` early) drops the rest; the slot comes back once the
        server has finished the request.
        """
        return self._stream(model, _devices.capture_inputs(inputs), outputs, version, slot_timeout, output_device,
                            self._engine.planner.request_options(options))

    async def _stream(self, model: str, inputs: Any, outputs: Sequence[str] | None, version: str,
                      slot_timeout: float | None, output_device: str | int,
                      options: RequestOptions | None) -> AsyncIterator[dict[str, Any]]:
        bound = answer_bound(options)  # (its client_timeout bounds the client's own calls too)
        info = await self._model_info(model, version, bound)
        planner = self._engine.planner
        plan = await self._driver.drive(self._runner.replanned_steps(info, lambda info: planner.stream_plan(
            info, inputs, outputs, output_device, slot_timeout, options)), bound)
        async with contextlib.aclosing(self._driver.iterate(self._runner.stream_steps(plan), bound)) as responses:
            async for outputs_of_one in responses:
                yield outputs_of_one

    async def _stream_to(self, stream: Any, model: str, inputs: Mapping[str, Any], requested: list | None,
                         version: str, options: RequestOptions | None) -> Any:
        """:meth:`tritonshm.Client._stream_to`, awaited (for tritonshm.grpc.aio's ``stream_infer``)."""
        planner = self._engine.planner
        info = await self.model_info(model, version)
        plan = await self._driver.drive(self._runner.replanned_steps(info, lambda info: planner.stream_plan(
            info, inputs, None, "auto", None, options)))
        return await self._driver.drive(self._runner.stream_send_steps(plan, stream, requested))

    async def request(self, model: str, batch_size: int | None = None, *,
                      shapes: Mapping[str, Sequence[int]] | None = None, version: str = "",
                      slot_timeout: float | None = None, device: str | int | None = None,
                      **misplaced: Any) -> Request:
        """Like :meth:`tritonshm.Client.request`; the request's ``run()`` returns an awaitable."""
        engine = self._engine
        engine.planner.refuse_lease_options(misplaced)
        info, full = await self._driver.drive(self._runner.replanned_steps(
            await self.model_info(model, version),
            lambda info: (info, engine.planner.request_shapes(info, batch_size, shapes))))
        kind = engine.routing.request_memory(info, device)
        wait = engine.planner.slot_wait(slot_timeout)  # (checked though a slot is free now)
        lease = self._runner.lease_now(info, full, kind) or \
            await self._driver.drive(self._runner.request_steps(info, full, wait, kind))
        return Request(SlotRequest(self._runner, info, lease, full), self._driver)

    async def close(self, *, cancel_requests: bool = False) -> None:
        """Unregister and unlink this client's regions, close its connections; idempotent.

        Requests in flight are waited for (up to the client's *slot_timeout*), or with
        *cancel_requests* cut off, as with :meth:`tritonshm.Client.close`.  A caller
        cancelled meanwhile (``asyncio.wait_for``, a TaskGroup) leaves the close to
        finish on the loop; a second call waits for it.
        """
        if self._engine.stop_accepting():
            # Its own task, shielded: a caller cancelled meanwhile (asyncio.wait_for, a TaskGroup,
            # Ctrl-C) leaves it to finish, and a second close() waits for the same.
            self._closing = asyncio.ensure_future(self._close(cancel_requests))
            self._closing.add_done_callback(_retrieved)
        closing = self._closing
        if closing is not None and not closing.done():
            await asyncio.shield(closing)

    async def _close(self, cancel_requests: bool) -> None:
        # (close()'s work.)  The finalizer stays until everything is let go of: a close cut short
        # (its loop ending) leaves the rest to it, at garbage collection or exit.
        engine = self._engine
        try:
            if cancel_requests:
                await self._driver.cut_off()
                engine.pool_table.stop_leasing()  # the requests waiting for a slot find the client closed
                await self._until_idle(LAST_CALL)  # (cut off, they end at once: their memory held for the server)
            else:
                await self._until_idle(engine.slot_timeout)  # in-flight requests finish on the memory they use
            await self._driver.close_wire()  # streams still open end with ClientClosed; their slots come back
            settle = settling(engine.slot_timeout, cancel_requests)
            await self._driver.drive(engine.release_steps(settle), closing_bound(settle))
            # Device memory the server still refuses: never freed under it; asked about again, on
            # a thread of its own, through a blocking connection (short-lived clients once closed).
            engine.hold_refused(unregisterer(self._blocking_connector, engine.control_headers(), AFTER_CLOSE))
            self._finalizer.detach()
        finally:
            self._blocking_connector.close()
            await self._driver.aio_client.close()

    async def _until_idle(self, timeout: float | None) -> None:
        """Wait (without blocking the loop) until no request is in flight, or *timeout* passed:
        woken by the last one's end, on whichever thread it ends."""
        loop = asyncio.get_running_loop()
        idle = loop.create_future()

        def resolve() -> None:
            if not idle.done():
                idle.set_result(None)

        def wake() -> None:
            try:
                loop.call_soon_threadsafe(resolve)
            except RuntimeError:
                pass  # the loop is gone: nobody waits any more

        if self._engine.in_flight.on_idle(wake):
            return
        try:
            await asyncio.wait_for(idle, timeout)
        except asyncio.TimeoutError:
            pass  # close() stops waiting: what the requests left is held for the server

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()
