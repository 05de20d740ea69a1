"""Letting go of slot memory: unregister, then close -- never the other way round.

Triton answers a request before it lets go of the request's regions, so an
unregistration can be refused ("currently in use") for a moment, and a
server may be unreachable when we ask.  An extent it refused is *parked*:
kept open and asked again later (after requests, and when the client
closes).  Device memory is never freed while the server may still have it
open through CUDA IPC (``cudaFree`` under another process's mapping is
undefined behaviour): what a server keeps refusing is held for the life of
the process (:data:`held_for_the_server`).

:class:`Disposals` holds one client's parked extents and runs these steps;
they hold no engine and no client: a forgotten client's finalizer runs them too.
"""

from __future__ import annotations

import os
import threading
import time

from ..errors import ServerError, ServerUnavailable
from ._pool import Extent
from ._steps import Pause, Steps, Unregister

__all__ = ["Disposals", "held_for_the_server"]

_SETTLE_INTERVAL = 0.02  # how often a closing client asks again to unregister what is parked
_RETRY_INTERVAL = 0.05   # at most this often, requests ask again to unregister what is parked

# Device memory a server refused to let go of when its client closed: held for the life of the
# process (freeing it under the server would be undefined behaviour; the driver frees it at exit).
held_for_the_server: list[Extent] = []


class Disposals:
    """One client's letting go of memory: unregister, then close; what the server refuses is
    *parked* -- kept open, asked again (after requests, at most every _RETRY_INTERVAL; and when
    the client closes) -- and what it still refuses at the end is held for the life of the
    process (device memory) or closed (host memory).  The only writer of the parked list.

    *creator_pid*: a forked child unregisters nothing (the names are its parent's).  Sans-I/O:
    its steps (:mod:`._steps`) are run by the client's driver, or by the finalizer's.
    """

    def __init__(self, creator_pid: int):
        self.creator_pid = creator_pid
        self._lock = threading.Lock()   # extents are parked, and taken whole, from any thread
        self._parked: list[Extent] = []
        self._retry_at = 0.0
        #: Something may be waiting to be let go of: set by whoever leaves it (a pool's idle
        #: surplus, a retired pool, the lent table, a parked extent), cleared by the one request
        #: end that looks (:meth:`~._engine.Engine.settle_steps`): a request that leaves nothing
        #: behind ends on this one read.
        self.maybe_due = False

    def notice(self) -> None:
        """Something was left to let go of (any thread): the next request's end looks."""
        self.maybe_due = True

    @property
    def parked(self) -> list[Extent]:
        """The extents the server refused to unregister, still open (a copy)."""
        with self._lock:
            return list(self._parked)

    def _park(self, extents: list[Extent]) -> None:
        with self._lock:
            self._parked.extend(extents)
        self.maybe_due = True

    def _take_parked(self) -> list[Extent]:
        with self._lock:
            taken, self._parked = self._parked, []
        return taken

    def drop_steps(self, extent: Extent) -> Steps:
        """Unregister one extent (never from a forked child) and close it.

        When the server refuses ("currently in use": it answers a request before it lets go of
        the request's regions), the extent is parked instead, still open: device memory must
        never be freed under the server (``cudaFree`` of memory another process has open
        through CUDA IPC is undefined behaviour), and a name left registered is a leak on the
        server.  A server that is gone has let go.
        """
        try:
            if extent.name is not None and os.getpid() == self.creator_pid:
                yield Unregister(extent.name)
        except GeneratorExit:
            # Cancelled while this Unregister was out (aio): whether the server let go is
            # unknown, and the extent is in no pool any more: parked, to be asked again.
            self._park([extent])
            raise
        except ServerError as exc:
            # Unreachable may be a dead server (it holds nothing open any more) or a passing
            # network failure (it still has our memory open): device memory is parked either
            # way, and freed if the server stays unreachable (see give_up).
            unreachable = isinstance(exc, ServerUnavailable)
            if not unreachable or extent.memory.kind == "cuda":
                extent.unreachable = unreachable
                self._park([extent])
                return
        extent.release_memory()

    def drop_all_steps(self, extents: list[Extent]) -> Steps:
        """:meth:`drop_steps` for each of *extents*; if the steps are closed half-way (a cancelled
        request), the ones not yet tried are parked: none is left in no list at all, its memory
        never closed and its bytes never back."""
        for index, extent in enumerate(extents):
            try:
                yield from self.drop_steps(extent)
            except GeneratorExit:
                self._park(extents[index + 1:])
                raise

    def due(self) -> bool:
        """Whether parked extents should be asked about again now (at most every
        _RETRY_INTERVAL: requests must not each pay a round trip to a server that still says no)."""
        return bool(self._parked) and time.monotonic() >= self._retry_at

    def retry_steps(self, when_due: bool = False) -> Steps:
        """Ask again to unregister and close the parked extents (only if :meth:`due`, with
        *when_due*); those still refused stay parked.  Any thread may run this: the list is
        taken whole, so no extent is tried (or closed) twice."""
        if when_due:
            if not self.due():
                return
            self._retry_at = time.monotonic() + _RETRY_INTERVAL
        yield from self.drop_all_steps(self._take_parked())

    def settle_steps(self, seconds: float) -> Steps:
        """Ask again, every _SETTLE_INTERVAL for up to *seconds*, to unregister what is parked (a
        closing client: a server answers before it has released a request's regions, so it says
        "currently in use" for a moment); what is still refused then stays parked."""
        deadline = time.monotonic() + seconds
        while self._parked and time.monotonic() < deadline:
            yield Pause(_SETTLE_INTERVAL)
            yield from self.retry_steps()

    def give_up(self) -> None:
        """The server still refuses (the client closed): close parked host memory (unlinking is
        safe: the server's mapping stays valid) and device memory of a server that stayed
        unreachable (gone: it holds nothing); hold device memory the server refused for the life
        of the process (:data:`held_for_the_server`), never freed under the server."""
        for extent in self._take_parked():
            if extent.memory.kind == "cuda" and not extent.unreachable:
                held_for_the_server.append(extent)  # its bytes stay taken: the memory is still ours
            else:
                extent.release_memory()
