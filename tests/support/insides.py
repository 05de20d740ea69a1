"""The client's insides that some tests must see -- TEST-ONLY, one place to follow them.

Most tests read what a client holds through the public ``pools()``.  A few
must reach the live objects behind it (an extent's device pointer, a pool
object's identity across growth, the memory parked after a refusal, the
byte budget): they go through these, so the tests never name a client's
private attributes themselves.
"""

from __future__ import annotations

from typing import Any

from tritonshm.client._slots import SYSTEM, SlotKind

__all__ = ["budget_used", "lent_allocations", "live_pool", "live_pools", "parked", "release_held_for_the_server"]


def live_pools(client: Any) -> dict[tuple[str, str, SlotKind], Any]:
    """The client's pools in service, by (model, version, slot kind): the engine's own table."""
    return client._engine._pools


def live_pool(client: Any, model: str, kind: SlotKind = SYSTEM, version: str = "") -> Any:
    """The :class:`~tritonshm.client._pool.SlotPool` in service for *model* in *kind* slots."""
    return client._engine._pools[(model, version, kind)]


def parked(client: Any) -> list[Any]:
    """Extents the server refused to unregister, kept open to be asked again."""
    return client._engine._parked


def budget_used(client: Any) -> int:
    """Bytes of slot memory the client holds now (registered, being registered or retiring)."""
    return client._engine.budget.used


def lent_allocations(client: Any) -> Any:
    """The client's table of lent GPU allocations (:class:`~tritonshm.client._lent.LentAllocations`)."""
    return client._engine._lent


def release_held_for_the_server(tritonclient: Any) -> None:
    """Unregister (through *tritonclient*) and let go of the device memory closed clients held
    for the life of the process (the server refused to unregister it then): a test's clean-up,
    once the test made the server let go."""
    from tritonshm import triton
    from tritonshm.client._disposal import held_for_the_server

    held, held_for_the_server[:] = list(held_for_the_server), []
    for extent in held:
        if extent.name is not None:
            triton.unregister(tritonclient, extent.name)
        extent.release_memory()
