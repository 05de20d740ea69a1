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
import functools
import weakref
from typing import Any, Awaitable, Callable, Mapping, Sequence

import numpy as np

from .. import _transport, triton
from . import _devices, _intake
from ._client import Request as _BlockingRequest
from ._client import _SETTLE_SECONDS, _held_for_the_server, _release_everything
from ._engine import Engine, give_up_parked, settle_parked_steps
from ._model import ModelInfo
from ._steps import (Done, FetchModel, Pause, Register, Send, Steps, Unregister, WaitForDevice, WaitForSlot,
                     advance)
from ._threads import Connector

__all__ = ["Client", "Request"]


class Request(_BlockingRequest):
    """:class:`tritonshm.client.Request` whose :meth:`run` returns an awaitable."""

    def run(self, outputs: Sequence[str] | None = None, *,  # type: ignore[override]
            stream: Any = None) -> Awaitable[dict[str, Any]]:
        """Run the inference on the inputs as they are now; outputs are slot views.

        The ordering point (see :meth:`tritonshm.client.Request.run`) is taken
        when this is called, on the calling thread; awaiting it waits for
        the device work without blocking the event loop.
        """
        return self._client._drive(self._run_steps(outputs, stream))


class Client(Engine):
    """An asyncio Triton client that moves tensors through pooled shared memory.

    Takes the same arguments as :class:`tritonshm.Client` (*connect_options*
    go to tritonclient's aio client).  Use it with ``async with``, or await
    :meth:`close` when done.
    """

    _aio = True

    def __init__(self, url: str = "localhost:8001", **kwargs: Any):
        super().__init__(url, **kwargs)
        self._aio_client = self._connect()   # TLS and verbosity as the URL and options say
        self._handlers: dict[type, Callable[[Any], Any]] = {
            Send: self._send,
            FetchModel: self._fetch_model,
            Register: self._register,
            Unregister: lambda step: triton.unregister(self._aio_client, step.name, patience=0.0),
            WaitForSlot: self._wait_for_slot,
            WaitForDevice: self._wait_for_device,
            Pause: lambda step: asyncio.sleep(step.seconds),
        }
        # A forgotten client cannot await anything at garbage collection: a
        # blocking connection (made only then) unregisters its pools.
        blocking, address, ssl = _transport.parse_url(url, aio=False)
        connect = functools.partial(blocking.connect, address, ssl=ssl)
        self._finalizer = weakref.finalize(
            self, _release_everything, Connector(connect, blocking.http, io_threads=1),
            self._pools, self._retired, {}, self._creator_pid, False, self._parked)

    @property
    def tritonclient(self) -> Any:
        """The underlying tritonclient aio client."""
        return self._aio_client

    # -- carrying out steps -----------------------------------------------

    async def _drive(self, steps: Steps) -> Any:
        """Carry out request steps on the event loop; the steps' result."""
        step = advance(steps)
        while not isinstance(step, Done):
            task = asyncio.ensure_future(self._handlers[type(step)](step))
            try:
                outcome, failure = await asyncio.shield(task), None
            except asyncio.CancelledError:
                self._abandon(steps, step, task)
                raise
            except Exception as exc:
                outcome, failure = None, exc
            step = advance(steps, outcome, failure)
        return step.value

    @staticmethod
    def _abandon(steps: Steps, step: Any, task: asyncio.Future) -> None:
        """The caller was cancelled: end *steps* once their current I/O is over.

        Closing the steps returns their slot; while the server may still be
        writing outputs into it (or registering memory), that must wait.  A
        registration that went through is handed to the steps first, so its
        memory joins its pool (and is unregistered with it) rather than
        being freed while the server has it open.
        """
        def finish(done: asyncio.Future) -> None:
            if not done.cancelled() and done.exception() is None and isinstance(step, Register):
                try:
                    advance(steps, done.result())
                except Exception:
                    pass  # what came next failed: closing below still runs the steps' clean-up
            steps.close()

        if task.done():
            finish(task)
        else:
            task.add_done_callback(finish)

    async def _send(self, step: Send) -> Any:
        return await triton.call_translated(
            self._aio_client, f"inferring with model {step.model!r}", "infer", step.model,
            step.inputs, model_version=step.version, outputs=step.outputs)

    async def _fetch_model(self, step: FetchModel) -> tuple[Any, Any]:
        wire, tc = self._wire, self._aio_client
        doing = f"reading metadata of model {step.model!r}"
        metadata = await triton.call_translated(tc, doing, "get_model_metadata", step.model, step.version,
                                                **wire.json)
        config = await triton.call_translated(tc, doing, "get_model_config", step.model, step.version,
                                              **wire.json)
        return metadata, wire.model_config(config)

    async def _register(self, step: Register) -> str:
        if step.name is None:
            return await step.memory.register(self._aio_client)
        return await step.memory.reregister(self._aio_client, step.name)

    @staticmethod
    async def _wait_for_device(step: WaitForDevice) -> None:
        """Poll the event, yielding to the loop in between: never a blocking device sync here."""
        delay = 0.0
        while not step.event.query():
            await asyncio.sleep(delay)
            delay = min(0.001, delay * 2 or 0.00002)  # a copy lands in microseconds; back off to 1 ms

    async def _wait_for_slot(self, step: WaitForSlot) -> bool:
        loop = asyncio.get_running_loop()
        event = asyncio.Event()

        def wake() -> None:  # called by the pool, from any thread
            loop.call_soon_threadsafe(event.set)

        step.pool.add_waiter(wake)
        try:
            await asyncio.wait_for(event.wait(), step.timeout)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            step.pool.remove_waiter(wake)

    # -- the public calls ---------------------------------------------------

    async def model_info(self, model: str, version: str = "") -> ModelInfo:
        """What the server says about *model* (cached per model and version)."""
        self._check_open()
        return self._models.get((model, version)) or await self._drive(self._model_steps(model, version))

    def infer(self, model: str, inputs: Mapping[str, Any], *, outputs: Sequence[str] | None = None,
              version: str = "", copy: bool = True, timeout: float | None = None,
              output_device: str | int = "auto") -> Awaitable[dict[str, Any]]:
        """Like :meth:`tritonshm.Client.infer`; chunks of a large batch run concurrently.

        GPU inputs are captured when this is called, on the calling thread
        (the order point of the contract), not when the result is awaited.
        """
        return self._infer(model, _devices.capture_inputs(inputs), outputs, version, copy, timeout,
                           output_device)

    async def _infer(self, model: str, inputs: Any, outputs: Sequence[str] | None, version: str,
                     copy: bool, timeout: float | None, output_device: str | int) -> dict[str, Any]:
        info = await self.model_info(model, version)
        plan = self._plan(info, inputs, outputs, copy, output_device, timeout)
        if len(plan.chunks) == 1:
            return await self._drive(self._chunk_steps(plan, plan.chunks[0]))
        rows = _intake.result_rows(info, plan.names, plan.chunks, plan.route.results)
        parts = await asyncio.gather(*(self._drive(self._chunk_steps(plan, chunk, into))
                                       for chunk, into in zip(plan.chunks, rows)))
        return _intake.join_chunks(parts, plan.names, plan.route.results, rows[0])

    async def request(self, model: str, batch_size: int | None = None, *,
                      shapes: Mapping[str, Sequence[int]] | None = None, version: str = "",
                      timeout: float | None = None, device: str | int | None = None) -> Request:
        """Like :meth:`tritonshm.Client.request`; the request's ``run()`` is a coroutine."""
        info = await self.model_info(model, version)
        full = self._request_shapes(info, batch_size, shapes)
        kind = self._request_memory(info, device)
        wait = self.timeout if timeout is None else timeout
        return Request(self, info, await self._drive(self._request_steps(info, full, wait, kind)), full)

    async def close(self) -> None:
        """Unregister and unlink this client's regions, close its connections; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        try:
            await self._until_idle(self.timeout)  # in-flight requests finish on the memory they use
            await self._drive(self._close_steps())
            settle = _SETTLE_SECONDS if self.timeout is None else min(self.timeout, _SETTLE_SECONDS)
            await self._drive(settle_parked_steps(self._parked, self._creator_pid, settle))
            give_up_parked(self._parked, _held_for_the_server)  # device memory: never freed under the server
        finally:
            await self._aio_client.close()

    async def _until_idle(self, timeout: float | None) -> None:
        """Wait (without blocking the loop) until no request is in flight, or *timeout* passed."""
        deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
        while self._in_flight and (deadline is None or asyncio.get_running_loop().time() < deadline):
            await asyncio.sleep(0.005)

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()
