"""What both clients -- :class:`tritonshm.Client` and :class:`tritonshm.aio.Client` -- answer
the same way, without I/O: their settings and the snapshots of what they hold, read from the
engine each holds (``self._engine``).  The calls that wait are each client's own (they differ
by ``await``); this is the rest, written once."""

from __future__ import annotations

from ._engine import Engine, engine_setting
from ._lent import LentInfo, LentStats
from ._pool import PoolInfo

__all__ = ["ClientFace"]


class ClientFace:
    """The base of both clients: settings and snapshots (see the module)."""

    _engine: Engine

    url = engine_setting("url", "The server's address, as given.")
    transport = engine_setting("transport", '"auto", "shm", "wire" or "cuda", as given.')
    slots = engine_setting("slots", "The slots a pool starts with.")
    max_pool_bytes = engine_setting("max_pool_bytes", "The most slot memory this client holds at any instant.")
    slot_timeout = engine_setting("slot_timeout", "How long a request waits for a slot, in seconds (None: for ever).")
    by_reference = engine_setting("by_reference", "Whether GPU tensors are sent where they are (lent).")
    max_lent_bytes = engine_setting("max_lent_bytes", "The most bytes of the caller's GPU allocations registered.")

    def __repr__(self) -> str:
        return self._engine.describe()

    def pools(self) -> list[PoolInfo]:
        """What this client holds now: one snapshot per slot pool in service
        (model, version, the memory its slots are in, slots running and held,
        registered bytes and region names).  No I/O."""
        return self._engine.pools()

    def lent(self) -> list[LentInfo]:
        """The caller's GPU allocations registered now to send its tensors by reference
        (name, device, base, size, requests naming it, tensors lent from it).  No I/O."""
        return self._engine.lent()

    def stats(self) -> LentStats:
        """How this client's GPU tensors travelled: inputs sent by reference, results written in
        place (``out=``), tensors copied and why (:data:`tritonshm.client.COPIED_WHY`),
        registrations and evictions; requests given up on before the server answered, and those
        whose memory is still held for the server.  No I/O."""
        return self._engine.lent_stats()
