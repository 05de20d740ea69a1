"""The asyncio client: :class:`tritonshm.Client` on tritonclient's aio clients.

    async with tritonshm.aio.Client("localhost:8001") as c:
        out = await c.infer("model", {"INPUT0": x})

It runs exactly the request steps of :class:`tritonshm.Client` (discovery,
slot pools, chunking, BYTES, re-registration, output growth, wire
fallback) -- one engine, two drivers; see :mod:`tritonshm.client._aio`.
"""

from __future__ import annotations

from .client._aio import Client, Request

__all__ = ["Client", "Request"]
