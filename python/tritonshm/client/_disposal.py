"""Letting go of slot memory: unregister, then close -- never the other way round.

Triton answers a request before it lets go of the request's regions, so an
unregistration can be refused ("currently in use") for a moment, and a
server may be unreachable when we ask.  An extent it refused is *parked*:
kept open and asked again later (after requests, and when the client
closes).  Device memory is never freed while the server may still have it
open through CUDA IPC (``cudaFree`` under another process's mapping is
undefined behaviour): what a server keeps refusing is held for the life of
the process (:data:`held_for_the_server`).

These are sans-I/O steps (:mod:`._steps`) over plain lists, holding no
engine and no client: a forgotten client's finalizer runs them too.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from ..errors import ServerError, ServerUnavailable
from ._pool import Extent, SlotPool
from ._steps import Pause, Steps, Unregister

__all__ = ["close_pools_steps", "drop_extent_steps", "drop_extents_steps", "give_up_parked", "held_for_the_server",
           "retry_parked_steps", "settle_parked_steps"]

_SETTLE_INTERVAL = 0.02  # how often a closing client asks again to unregister what is parked

# Device memory a server refused to let go of when its client closed: held for the life of the
# process (freeing it under the server would be undefined behaviour; the driver frees it at exit).
held_for_the_server: list[Extent] = []

# Guards every client's list of parked extents (appended to and taken whole from any thread).
_parked_lock = threading.Lock()


def drop_extent_steps(extent: Extent, creator_pid: int, parked: list[Extent] | None = None) -> Steps:
    """Unregister one extent (never from a forked child: the name is the parent's) and close it.

    When the server refuses ("currently in use": it answers a request before
    it lets go of the request's regions), the extent is *parked* instead --
    appended to *parked*, still open, to be tried again
    (:func:`retry_parked_steps`, :func:`settle_parked`): device memory must
    never be freed under the server (``cudaFree`` of memory another process
    has open through CUDA IPC is undefined behaviour), and a name left
    registered is a leak on the server.  A server that is gone has let go.
    """
    try:
        if extent.name is not None and os.getpid() == creator_pid:
            yield Unregister(extent.name)
    except GeneratorExit:
        # The request was cancelled while this Unregister was out (aio): whether the server let
        # go is unknown, and the extent is in no pool any more: park it, to be asked again.
        if parked is not None:
            with _parked_lock:
                parked.append(extent)
        else:
            extent.release_memory()
        raise
    except ServerError as exc:
        # Unreachable may be a dead server (it holds nothing open any more) or a passing
        # network failure (it still has our memory open): device memory is parked either
        # way, and freed if the server stays unreachable (see give_up_parked).
        unreachable = isinstance(exc, ServerUnavailable)
        if parked is not None and (not unreachable or extent.memory.kind == "cuda"):
            extent.unreachable = unreachable
            with _parked_lock:
                parked.append(extent)
            return
    extent.release_memory()


def give_up_parked(parked: list[Extent], held: list[Extent]) -> None:
    """The server still refuses: close parked host memory (unlinking is safe: the server's mapping
    stays valid) and device memory of a server that stayed unreachable (gone: it holds nothing);
    move device memory the server refused to *held*, never to be freed under the server."""
    with _parked_lock:
        doomed = list(parked)
        parked.clear()
    for extent in doomed:
        if extent.memory.kind == "cuda" and not extent.unreachable:
            held.append(extent)  # its bytes stay taken: the memory is still ours
        else:
            extent.release_memory()


def retry_parked_steps(parked: list[Extent], creator_pid: int) -> Steps:
    """Try again to unregister and close the parked extents; those still refused stay parked.

    Any thread may run this (after each request, at close): the list is taken
    whole under a lock, so no extent is tried (or closed) twice.
    """
    with _parked_lock:
        doomed = list(parked)
        parked.clear()
    yield from drop_extents_steps(doomed, creator_pid, parked)


def drop_extents_steps(extents: list[Extent], creator_pid: int, parked: list[Extent] | None) -> Steps:
    """:func:`drop_extent_steps` for each of *extents*; if the steps are closed half-way (a
    cancelled request), the ones not yet tried are parked (or closed, without *parked*): none
    is left in no list at all, its memory never closed and its bytes never back."""
    for index, extent in enumerate(extents):
        try:
            yield from drop_extent_steps(extent, creator_pid, parked)
        except GeneratorExit:
            rest = extents[index + 1:]
            if parked is not None:
                with _parked_lock:
                    parked.extend(rest)
            else:
                for left in rest:
                    left.release_memory()
            raise


def settle_parked_steps(parked: list[Extent], creator_pid: int, seconds: float) -> Steps:
    """Ask again, every _SETTLE_INTERVAL for up to *seconds*, to unregister what is parked (a
    closing client: a server answers before it has released a request's regions, so it says
    "currently in use" for a moment); what is still refused then stays in *parked*."""
    deadline = time.monotonic() + seconds
    while parked and time.monotonic() < deadline:
        yield Pause(_SETTLE_INTERVAL)
        yield from retry_parked_steps(parked, creator_pid)


def close_pools_steps(pools: dict[Any, SlotPool], retired: set[SlotPool], creator_pid: int,
                      parked: list[Extent]) -> Steps:
    """Empty *pools* and *retired* now, then the steps that unregister and close all they held
    (and try the *parked* extents again; device memory still refused stays parked).

    """
    doomed = list(pools.values()) + list(retired)
    pools.clear()
    retired.clear()

    def steps() -> Steps:
        yield from retry_parked_steps(parked, creator_pid)
        yield from drop_extents_steps([e for pool in doomed for e in pool.close()], creator_pid, parked)

    return steps()
