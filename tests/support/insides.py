"""The client's insides that some tests must see -- TEST-ONLY, one place to follow them.

Most tests read what a client holds through the public ``pools()``.  A few
must reach the live objects behind it (an extent's device pointer, a pool
object's identity across growth, the memory parked after a refusal, the
byte budget): they go through these, so the tests never name a client's
private attributes themselves.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from tritonshm.client._slots import SYSTEM, SlotKind

__all__ = ["budget_used", "count_stream_sends", "lent_allocations", "live_pool", "live_pools", "parked",
           "release_held_for_the_server"]


def live_pools(client: Any) -> dict[tuple[str, str, SlotKind], Any]:
    """The client's pools in service, by (model, version, slot kind): the pool table's own dict."""
    return client._engine.pool_table._pools


def live_pool(client: Any, model: str, kind: SlotKind = SYSTEM, version: str = "") -> Any:
    """The :class:`~tritonshm.client._pool.SlotPool` in service for *model* in *kind* slots."""
    return client._engine.pool_table._pools[(model, version, kind)]


def parked(client: Any) -> list[Any]:
    """Extents the server refused to unregister, kept open to be asked again."""
    return client._engine.disposals.parked


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


def count_stream_sends(client_class: type, count: Callable[[str], None]) -> None:
    """Make *client_class* (``tritonshm.Client`` or ``tritonshm.aio.Client``) call ``count(model)``
    for each request a facade's stream sends through its slots: its ``_stream_to``, the way
    ``tritonshm.grpc``'s streams go into the held client (tests/examples/facade_runner.py)."""
    send = client_class._stream_to  # type: ignore[attr-defined]

    @functools.wraps(send)
    def counted(self: Any, stream: Any, model: str, *args: Any, **kwargs: Any) -> Any:
        count(model)
        return send(self, stream, model, *args, **kwargs)

    client_class._stream_to = counted  # type: ignore[attr-defined]
