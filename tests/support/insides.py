"""The client's insides that some tests must see -- TEST-ONLY, one place to follow them.

Most tests read what a client holds through the public ``pools()``.  A few
must reach the live objects behind it (an extent's device pointer, a pool
object's identity across growth, the memory parked after a refusal, the
byte budget), count what it does inside (the requests it plans, the slot
memory it makes), or step into its driver: they go through these, so the
tests never name a client's private attributes themselves.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import weakref
from typing import Any, Callable

import pytest

from tritonshm.client import _pool, _slots
from tritonshm.client._slots import SYSTEM, SlotKind

__all__ = ["SlotMemoryMeter", "budget_used", "count_stream_sends", "facade_slots", "forget_left_registrations",
           "free_slots", "lent_allocations", "live_pool", "live_pools", "meter_slot_memory", "parked", "record_plans",
           "release_held_for_the_server", "run_finalizer", "tritonclient_url_and_verbose", "watch_byte_budgets", "wrap_step"]


def live_pools(client: Any) -> dict[tuple[str, str, SlotKind], Any]:
    """The client's pools in service, by (model, version, slot kind): the pool table's own dict."""
    return client._engine.pool_table._pools


def live_pool(client: Any, model: str, kind: SlotKind = SYSTEM, version: str = "") -> Any:
    """The :class:`~tritonshm.client._pool.SlotPool` in service for *model* in *kind* slots."""
    return client._engine.pool_table._pools[(model, version, kind)]


def free_slots(pool: Any) -> int:
    """How many of *pool*'s slots are free now (in none of its requests, held by no result)."""
    return len(pool._free)


def parked(client: Any) -> list[Any]:
    """Extents the server refused to unregister, kept open to be asked again."""
    return client._engine.disposals.parked


def budget_used(client: Any) -> int:
    """Bytes of slot memory the client holds now (registered, being registered or retiring)."""
    return client._engine.budget.used


def lent_allocations(client: Any) -> Any:
    """The client's table of lent GPU allocations (:class:`~tritonshm.client._lent.LentAllocations`)."""
    return client._engine.lent_table


def record_plans(monkeypatch: pytest.MonkeyPatch, client: Any) -> list[str]:
    """A list that gets the model's name of each request *client* (a ``tritonshm.Client`` or
    ``aio.Client``) plans in full -- checks, splits and routes -- from now on (not the small
    requests seen before, which take the quick path), until *monkeypatch* is undone."""
    planner = client._engine.planner
    planned: list[str] = []
    real = planner.plan

    def plan(info: Any, *args: Any, **kwargs: Any) -> Any:
        planned.append(info.name)
        return real(info, *args, **kwargs)

    monkeypatch.setattr(planner, "plan", plan)
    return planned


def run_finalizer(client: Any) -> None:
    """Run what garbage collection runs for *client* if it was never closed (close()'s work,
    best effort), now."""
    client._finalizer()


def wrap_step(client: Any, step_type: type, wrap: Callable[[Callable[[Any], Any]], Callable[[Any], Any]]) -> None:
    """Carry out *client*'s steps of *step_type* (``tritonshm.client._steps``) with
    ``wrap(handler)`` instead of its driver's own *handler* (a coroutine function for the
    asyncio client): to hold a step back, or watch it, where the server runs it."""
    handlers = client._driver.handlers
    handlers[step_type] = wrap(handlers[step_type])


def facade_slots(facade_client: Any) -> Any:
    """The slots' route of a ``tritonshm.grpc`` / ``.http`` client (what decides whether a call
    goes through the held tritonshm client's slots, or is tritonclient's own)."""
    return facade_client._tritonshm_slots


def tritonclient_url_and_verbose(tritonclient: Any) -> tuple[str, bool]:
    """The URL and verbosity a tritonclient HTTP client (blocking or aio) was made with:
    tritonclient's own private fields, read by tests only (tritonshm never reads them: they are
    not in ``tritonshm._tritonclient_compat``'s CONTRACT)."""
    return tritonclient._url, tritonclient._verbose


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


def forget_left_registrations() -> None:
    """Stop asking about the host registrations closed clients left with their servers (their
    memory is closed already): a test's clean-up once its server is gone, so that the asking
    thread's next question does not reach the next test's server at the same address."""
    from tritonshm.client import _disposal

    with _disposal._held_lock:
        for entry in _disposal.left_registered:
            _disposal._after_close.pop(entry, None)
        _disposal.left_registered.clear()


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


# -- meters: what every client of a test makes, counted as it is made --------------------------


@dataclasses.dataclass
class SlotMemoryMeter:
    """The host slot memory (``SystemSlotMemory``, pinned included) made in this process while
    :func:`meter_slot_memory` is in force: bytes alive now (made, registered or not, not yet
    closed), their peak, how many were made; the memory alive, and each by its region's key."""

    live: int = 0
    peak: int = 0
    made: int = 0
    alive: set = dataclasses.field(default_factory=set)
    by_key: "weakref.WeakValueDictionary[str, Any]" = dataclasses.field(default_factory=weakref.WeakValueDictionary)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


def meter_slot_memory(monkeypatch: pytest.MonkeyPatch) -> SlotMemoryMeter:
    """Count the host slot memory every client makes and closes (a :class:`SlotMemoryMeter`),
    until *monkeypatch* is undone."""
    meter = SlotMemoryMeter()
    cls = _slots.SystemSlotMemory
    real_init, real_close = cls.__init__, cls.close

    def init(memory: Any, *args: Any, **kwargs: Any) -> None:
        real_init(memory, *args, **kwargs)
        with meter.lock:
            meter.alive.add(memory)
            meter.by_key[memory.region.key] = memory
            meter.made += 1
            meter.live += memory.nbytes
            meter.peak = max(meter.peak, meter.live)

    def close(memory: Any) -> None:
        if not memory.closed:  # its first close
            with meter.lock:
                meter.alive.discard(memory)
                meter.live -= memory.nbytes
        real_close(memory)

    monkeypatch.setattr(cls, "__init__", init)
    monkeypatch.setattr(cls, "close", close)
    return meter


def watch_byte_budgets(monkeypatch: pytest.MonkeyPatch, taken: Callable[[Any], None]) -> None:
    """Call ``taken(budget)`` each time a client's byte budget (``max_pool_bytes``: a
    :class:`~tritonshm.client._pool.ByteBudget`, with ``used`` and ``limit``) has taken bytes --
    every instant its use grows -- until *monkeypatch* is undone."""
    real_take = _pool.ByteBudget.take

    def take(budget: Any, nbytes: int) -> bool:
        took = real_take(budget, nbytes)
        taken(budget)
        return took

    monkeypatch.setattr(_pool.ByteBudget, "take", take)
