"""The asyncio client: :class:`tritonshm.Client` on tritonclient's aio clients.

    async with tritonshm.aio.Client("localhost:8001") as c:
        out = await c.infer("model", {"INPUT0": x})

It runs exactly the request steps of :class:`tritonshm.Client` (discovery,
slot pools, chunking, re-registration, output growth, wire fallback): only
the way each step is carried out differs.  Inference goes through
``tritonclient.grpc.aio`` / ``tritonclient.http.aio`` on the event loop; the
rare control steps (making a pool and registering it, waiting for a slot
when all are busy) run in a worker thread so the loop never blocks.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from . import triton
from .client import Client as _SyncClient
from .client import ModelInfo, StepsDone, join_chunks, next_step
from .errors import ServerError

__all__ = ["Client"]


class Client:
    """An asyncio Triton client that moves tensors through pooled shared memory.

    Takes the same arguments as :class:`tritonshm.Client`.  Use it with
    ``async with``, or call :meth:`close` (a coroutine) when done.
    """

    def __init__(self, url: str = "localhost:8001", **kwargs: Any):
        # The blocking client owns discovery, pools and registrations; its
        # request steps are shared with this one.
        self._sync = _SyncClient(url, **kwargs)
        if self._sync._http:
            import tritonclient.http.aio as protocol
        else:
            import tritonclient.grpc.aio as protocol
        self._aio = protocol.InferenceServerClient(self._sync._connector.address)

    @property
    def tritonclient(self) -> Any:
        """The underlying tritonclient aio client."""
        return self._aio

    async def model_info(self, model: str, version: str = "") -> ModelInfo:
        """What the server says about *model* (cached per model and version)."""
        return await asyncio.to_thread(self._sync.model_info, model, version)

    async def infer(self, model: str, inputs: Mapping[str, Any], *,
                    outputs: Sequence[str] | None = None, version: str = "", copy: bool = True,
                    timeout: float | None = None) -> dict[str, np.ndarray]:
        """Like :meth:`tritonshm.Client.infer`; chunks of a large batch run concurrently."""
        sync = self._sync
        sync._check_open()
        info = sync._models.get((model, version)) or await self.model_info(model, version)
        chunks, names = sync._plan(info, inputs, outputs, copy)
        wait = sync.timeout if timeout is None else timeout
        if len(chunks) == 1:
            return await self._drive(sync._chunk_steps(info, chunks[0], names, copy, wait))
        parts = await asyncio.gather(*(
            self._drive(sync._chunk_steps(info, chunk, names, True, wait)) for chunk in chunks))
        return join_chunks(parts, names)

    async def _drive(self, steps) -> Any:
        """Carry out request steps (see ``Client._chunk_steps``) on the event loop."""
        handlers: dict[str, Callable[..., Any]] = {
            "send": self._send,
            "acquire": self._acquire,
            "pool": self._pool,
            "reregister": lambda pool, generation: asyncio.to_thread(pool.reregister, generation),
        }
        step = next_step(steps)
        while not isinstance(step, StepsDone):
            try:
                outcome, failure = await handlers[step[0]](*step[1:]), None
            except Exception as exc:
                outcome, failure = None, exc
            step = next_step(steps, outcome, failure)
        return step.value

    async def _acquire(self, pool: Any, timeout: float | None) -> Any:
        # Waiting for a slot blocks: do it in a thread, and only when none is free.
        return pool.try_acquire() or await asyncio.to_thread(pool.acquire, timeout)

    async def _pool(self, info: ModelInfo, needs: Mapping[str, int]) -> Any:
        # Making a pool registers it (blocking I/O): only when the current one won't do.
        return self._sync._ready_pool(info, needs) or await asyncio.to_thread(self._sync._pool, info, needs)

    async def _send(self, info: ModelInfo, inputs: list, outputs: list) -> Any:
        try:
            return await self._aio.infer(info.name, inputs, model_version=info.version,
                                         outputs=outputs)
        except ServerError:
            raise
        except Exception as exc:
            raise triton.translate_error(exc, f"inferring with model {info.name!r}") from exc

    async def close(self) -> None:
        """Unregister and unlink this client's regions, close its connections; idempotent."""
        await asyncio.to_thread(self._sync.close)
        await self._aio.close()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()
