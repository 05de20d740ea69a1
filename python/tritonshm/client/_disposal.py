"""Letting go of slot memory: unregister, then close -- never the other way round.

Triton answers a request before it lets go of the request's regions, so an
unregistration can be refused ("currently in use") for a moment, and a
server may be unreachable when we ask.  An extent it refused is *parked*:
kept open and asked again later (after requests, and when the client
closes).  Device memory is never freed while the server may still have it
open through CUDA IPC (``cudaFree`` under another process's mapping is
undefined behaviour): what a server still refuses when its client has closed
is held (:data:`held_for_the_server`) and asked about again, on a backoff, by
one thread of the process's, through the closed client's connection -- freed
once the server lets go of it.

An unregister that succeeds means the server let go, on every release:
Triton 2.50-2.52 refuse one while a request uses the region, and from 2.53,
which says yes at once and keeps the region until its last request ends,
:func:`tritonshm.triton.unregister` finds the region still listed and says
"in use" too.  A pool's extent that holds slots for a request of unknown
outcome (timed out, cancelled, cut off: the server may still write them) is
*proven* before it serves again (:meth:`Disposals.prove_steps`): unregistered,
then registered again under its name, which every release refuses ("already
in manager") while the old registration lives on.  Both done, the server holds
nothing of it: the extent comes back whole.  A restarted server forgets it at
once.  Asked on a backoff, by whoever drives requests.

A server older than 2.50 unregisters a region a running request uses at once
and writes on into its mapping: nothing it says proves it done.  There what a
request of unknown outcome named is held for *old_server_hold* seconds, or
until the server is seen to have restarted (a request finds our regions
forgotten), with one warning (:meth:`Disposals.server_is`).

:class:`Disposals` holds one client's parked extents and runs these steps;
they hold no engine and no client: a forgotten client's finalizer runs them too.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import warnings
import weakref
from typing import Any, Callable

from .._transport import release_gevent_hub
from ..errors import Outcome, RegistrationError, ServerError, outcome_of
from ._pool import Extent, SlotPool
from ._steps import Pause, Register, Steps, Unregister

__all__ = ["Disposals", "LeftRegistration", "Unregisterer", "held_for_the_server", "left_registered"]

_SETTLE_INTERVAL = 0.02  # how often a closing client asks again to unregister what is parked
_RETRY_INTERVAL = 0.05   # at most this often, requests ask again to unregister what is parked
_PROVE_FIRST = 0.01      # an extent held for the server: first asked again after this, then
_PROVE_MAX = 0.5         # ... twice as long each time, up to this
# The first Triton release that refuses to unregister a region a running request uses (server
# PR #7567, 24.09); from 2.53 (PR #7743) the unregister is deferred and re-registering refused.
PROVING_SERVER = (2, 50)

#: Device memory a server refused to let go of when its client closed: held (freeing it under the
#: server would be undefined behaviour), and asked about again on a backoff, after the close, by one
#: thread of the process's (:func:`_ask_until_let_go`) through the closed client's connection, until
#: the server lets go of it (or is gone): freed then.  Memory with no one to ask (a forked child's
#: names are its parent's) is held for the life of the process; the driver frees it at exit.
#: Host memory refused likewise is closed at once (unlinking is safe: the server's mapping stays
#: valid) and listed here only until the server lets go of its registration.
held_for_the_server: list[Extent] = []
_held_lock = threading.Lock()
_asking: threading.Thread | None = None  # the thread asking about held_for_the_server, while it has any
_exiting = False  # the interpreter is going: nothing more is asked
_AFTER_CLOSE_FIRST = 0.05  # held after close: first asked again after this, then
_AFTER_CLOSE_MAX = 2.0     # ... twice as long each time, up to this

#: Unregisters a name through a closed client's connection; raises as the unregister does
#: (:func:`tritonshm.triton.unregister`: "in use" while the server still uses the region).
Unregisterer = Callable[[str], Any]


class Disposals:
    """One client's letting go of memory: unregister, then close; what the server refuses is
    *parked* -- kept open, asked again (after requests, at most every _RETRY_INTERVAL; and when
    the client closes) -- and what it still refuses at the end is held until it lets go (device
    memory: :meth:`hold_for_the_server`) or closed (host memory).  The only writer of the parked
    list.

    *creator_pid*: a forked child unregisters nothing (the names are its parent's).  Sans-I/O:
    its steps (:mod:`._steps`) are run by the client's driver, or by the finalizer's.
    """

    def __init__(self, creator_pid: int, old_server_hold: float = 60.0):
        self.creator_pid = creator_pid
        self.old_server_hold = old_server_hold
        #: Seconds what a request of unknown outcome named is held before the server is asked
        #: (0: the server's answers prove it; set by :meth:`server_is`).
        self.hold = 0.0
        self._version = ""
        self._warned = False
        self._lock = threading.Lock()   # extents are parked, and taken whole, from any thread
        self._parked: list[Extent] = []
        self._given_up = False  # the client closed: nothing parked is asked about again (give_up)
        self._unregister_after_close: Unregisterer | None = None  # ... but what it holds for the server
        self._in_hand = 0  # parked extents taken by retry_steps() whose steps have not ended
        self._retry_at = 0.0
        self._proving: list[Extent] = []  # pools' extents held for the server, asked on a backoff
        #: Something may be waiting to be let go of: set by whoever leaves it (a pool's idle
        #: surplus, a retired pool, the lent table, a parked extent), cleared by the one request
        #: end that looks (:meth:`~._engine.Engine.settle_steps`): a request that leaves nothing
        #: behind ends on this one read.
        self.maybe_due = False

    def server_is(self, version: str) -> None:
        """The server said it is *version* (its metadata; '' where it gave none: taken as one
        whose answers prove, as every release since 2.50 and tritonclient's own servers)."""
        try:
            major, minor = (int(part) for part in version.split(".")[:2])
        except ValueError:
            self.hold = 0.0
            return
        self.hold = self.old_server_hold if (major, minor) < PROVING_SERVER else 0.0
        self._version = version

    def hold_for_old_server(self, extents: list[Extent]) -> None:
        """*extents* hold what a request of unknown outcome named: on a server whose answers
        prove nothing, none is asked about (nor let go of) for :attr:`hold` seconds."""
        if not self.hold or not extents:
            return
        until = time.monotonic() + self.hold
        for extent in extents:
            extent.not_before = max(extent.not_before, until)
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"Triton {self._version} lets go of shared memory a running request still uses when asked "
                f"(releases before 2.50 do): what a request given up on named (its slot, lent tensors) is held "
                f"old_server_hold={self.old_server_hold} s, or until the server restarts, instead of until the "
                f"server provably finished it. Upgrade the server, or set old_server_hold= to the longest a "
                f"request may run", RuntimeWarning, stacklevel=3)

    def server_restarted(self) -> None:
        """A request found our regions forgotten: the server restarted, and holds nothing of
        what it ran before; what was held for an older server may be asked about now."""
        with self._lock:
            for extent in (*self._proving, *self._parked):
                extent.not_before = extent.retry_at = 0.0
        self.maybe_due = True

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
            if not self._given_up:
                self._parked.extend(extents)
                self.maybe_due = True
                return
        # The client closed and gave up on what was parked (give_up): nobody asks again, so what
        # is refused from now on -- a request that was still running when close() stopped waiting
        # lets go of its slot after -- is held or closed at once, never left in a list nobody reads.
        self._give_up_on(extents)

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
        if extent.not_before > time.monotonic():  # held for a server whose answers prove nothing
            self._park([extent])
            return
        try:
            if extent.name is not None and os.getpid() == self.creator_pid:
                yield Unregister(extent.name)
        except GeneratorExit:
            # Cancelled while this Unregister was out (aio): whether the server let go is
            # unknown, and the extent is in no pool any more: parked, to be asked again.
            self._park([extent])
            raise
        except ServerError as exc:
            # Unreachable -- no connection could be made (refused: nothing listens where the
            # server was) -- may be a dead server (it holds nothing open any more) or a passing
            # network failure (it still has our memory open): device memory is parked either
            # way, and freed if the server stays unreachable (see give_up).  A call cut off
            # after it went out (a closed socket, a proxy's 502/503/504, a timeout) says
            # nothing of the server: one alive but slow still maps the memory.
            unreachable = outcome_of(exc) is Outcome.NOT_SENT
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
        """Whether parked extents, or extents held for the server, should be asked about again
        now (on their backoff: requests must not each pay a round trip to a server that still
        says no)."""
        if not self._parked and not self._proving:
            return False
        now = time.monotonic()
        return bool(self._parked) and now >= self._retry_at or any(e.retry_at <= now for e in self._proving)

    @property
    def proving(self) -> bool:
        """Whether extents held for the server wait to be proven (cheap: no lock)."""
        return bool(self._proving)

    def prove(self, extents: list[Extent]) -> None:
        """Ask the server about *extents* (held for it: :meth:`~._pool.SlotPool.hold_for_server`,
        nothing of ours running on them) from now on, until it let go of each."""
        if extents:
            self.hold_for_old_server(extents)
            for extent in extents:
                extent.retry_at, extent.backoff = extent.not_before, _PROVE_FIRST
            with self._lock:
                self._proving.extend(extents)
            self.maybe_due = True

    def prove_steps(self) -> Steps:
        """Ask the server about each extent held for it whose backoff is over: unregister it,
        then register it again under its name (see the module); an extent both succeed for is
        back in its pool (:meth:`~._pool.SlotPool.restore`), or let go of if its pool no longer
        serves.  Refused or unreachable: asked again later, twice as late."""
        now = time.monotonic()
        with self._lock:
            due = [e for e in self._proving if e.retry_at <= now]
            if not due:
                return
            self._proving = [e for e in self._proving if e.retry_at > now]
        for index, extent in enumerate(due):
            try:
                proven = yield from self._prove_steps(extent)
            except GeneratorExit:
                with self._lock:
                    self._proving.extend(due[index:])  # (the one cut short starts over: idempotent)
                raise
            if not proven:
                extent.retry_at = time.monotonic() + extent.backoff
                extent.backoff = min(2 * extent.backoff, _PROVE_MAX)
                with self._lock:
                    self._proving.append(extent)

    def _prove_steps(self, extent: Extent) -> Steps:
        """One ask about *extent*: True once it is settled (back in its pool, or let go of)."""
        pool = extent.pool
        if extent.closed or pool is None:  # its pool closed: its close unregisters it
            return True
        if os.getpid() != self.creator_pid:
            return False  # (a forked child asks nothing of the server: the names are its parent's)
        name = extent.name
        assert name is not None, "a pool's extents are registered"
        # Both every time: a server that restarted in between may have it registered again by a
        # request that healed (then the unregister lets go of that, and the register succeeds).
        try:
            yield Unregister(name)
        except ServerError:
            return False  # in use (Triton 2.50-2.52), or unreachable: ask again later
        if not pool.start_reregistering(extent):
            return True  # its pool closed meanwhile: its close lets go of it
        try:
            yield Register(extent.memory, name)
        except RegistrationError as exc:
            if "already" in str(exc):  # the old registration lives on: a request still uses it (2.53+)
                return self._ask_again_unless_closed(pool, extent)
            self._drop(pool, extent)  # it cannot be registered again: let go of, its slots with it
            return True
        except ServerError:
            # Unreachable, or cut off: the server may have registered it -- asked about again, or,
            # its pool closed meanwhile, unregistered (held while refused) as it is let go of.
            return self._ask_again_unless_closed(pool, extent)
        except GeneratorExit:
            # Whether the server registered it is unknown: out of the pool, unregistered later.
            pool.drop_extent(extent)
            self._park([extent])
            raise
        if not pool.restore(extent):  # its pool retired meanwhile: the memory goes
            self._drop(pool, extent)
            return True
        return True

    def _ask_again_unless_closed(self, pool: SlotPool, extent: Extent) -> bool:
        """*extent*'s registration again did not happen, or its outcome is unknown: asked about
        again later (False), unless its pool closed meanwhile and left it to us: let go of (True)."""
        if pool.stop_reregistering(extent):
            self._drop(pool, extent)
            return True
        return False

    def _drop(self, pool: SlotPool, extent: Extent) -> None:
        """*extent* leaves *pool*, registered with the server or not: parked, its unregister
        (harmless for a name the server does not have) and closing to follow."""
        pool.drop_extent(extent)
        self._park([extent])

    def retry_steps(self, when_due: bool = False) -> Steps:
        """Ask again to unregister and close the parked extents (only if :meth:`due`, with
        *when_due*); those still refused stay parked.  Any thread may run this: the list is
        taken whole, so no extent is tried (or closed) twice; until its steps end, the extents
        taken are *in hand* (a closing client's :meth:`settle_steps` waits for them too)."""
        if when_due:
            if not self.due():
                return
            self._retry_at = time.monotonic() + _RETRY_INTERVAL
        with self._lock:
            taken, self._parked = self._parked, []
            self._in_hand += len(taken)
        try:
            yield from self.drop_all_steps(taken)
        finally:
            with self._lock:
                self._in_hand -= len(taken)

    def settle_steps(self, seconds: float) -> Steps:
        """Ask again, every _SETTLE_INTERVAL for up to *seconds*, to unregister what is parked (a
        closing client: a server answers before it has released a request's regions, so it says
        "currently in use" for a moment); what is still refused then stays parked.  Extents
        another thread's steps are asking about meanwhile (a request close() stopped waiting for
        ends, and asks too) are waited for: refused there, they are parked again and asked here."""
        deadline = time.monotonic() + seconds
        while (self._parked or self._in_hand) and time.monotonic() < deadline:
            yield Pause(_SETTLE_INTERVAL)
            yield from self.retry_steps()

    def give_up(self, unregister: Unregisterer | None = None) -> None:
        """The client closed, and the server still refuses: close parked host memory (unlinking
        is safe: the server's mapping stays valid) and device memory of a server that stayed
        unreachable (gone: it holds nothing); hold device memory the server refused
        (:data:`held_for_the_server`), never freed under the server, and ask about it again
        through *unregister* (the closed client's connection) until the server lets go of it.
        What is refused after this is treated so at once (:meth:`_park`)."""
        with self._lock:
            self._given_up = True
            self._unregister_after_close = unregister if os.getpid() == self.creator_pid else None
        self._give_up_on(self._take_parked())

    def _give_up_on(self, extents: list[Extent]) -> None:
        for extent in extents:
            if extent.unreachable:  # (the server is gone: it holds nothing)
                extent.release_memory()
            elif extent.memory.kind == "cuda":
                self.hold_for_the_server(extent)  # its bytes stay taken: the memory is still ours
            else:
                # Host memory is closed at once (the server's mapping stays valid), but its name
                # is still asked to be unregistered after the close: else the server keeps the
                # registration, and its mapping of the unlinked pages, until it restarts.
                extent.release_memory()
                with self._lock:
                    unregister = self._unregister_after_close
                if unregister is not None and extent.name is not None:
                    _ask_about(LeftRegistration(extent.name), unregister)

    def hold_for_the_server(self, extent: Extent) -> None:
        """Hold *extent*, device memory the server may still use after the client closed (or
        while it closes), in :data:`held_for_the_server` -- asked about again through the closed
        client's connection once :meth:`give_up` gave one, else for the life of the process."""
        with self._lock:
            unregister = self._unregister_after_close
        _hold_for_the_server(extent, unregister)


def _hold_for_the_server(extent: Extent, unregister: Unregisterer | None) -> None:
    """Hold *extent* (device memory of a closed client's, which the server still uses) until
    *unregister* of its name succeeds -- asked on a backoff by one thread -- or for the life of
    the process, with no one to ask."""
    name = extent.name
    with _held_lock:
        held_for_the_server.append(extent)
    if unregister is not None and name is not None:
        _ask_about(extent, unregister)


class LeftRegistration:
    """The name of a closed client's host memory the server still had registered when the client
    closed: the memory is closed (unlinking is safe: the server's mapping stays valid), nothing
    is held; the name is asked to be unregistered after the close, as held device memory is."""

    __slots__ = ("name", "retry_at", "backoff", "__weakref__")

    def __init__(self, name: str):
        self.name = name
        self.retry_at = 0.0
        self.backoff = 0.0

    def release_memory(self) -> None:
        """Nothing to let go of: the memory was closed already."""


#: The host registrations the asking thread unregisters after their clients closed.
left_registered: list[LeftRegistration] = []


def _ask_about(entry: "Extent | LeftRegistration", unregister: Unregisterer) -> None:
    """Have the asking thread unregister *entry*'s name through *unregister*, on a backoff,
    until the server lets go of it (then it leaves its list and lets go of its memory)."""
    global _asking
    entry.retry_at = time.monotonic() + _AFTER_CLOSE_FIRST
    entry.backoff = _AFTER_CLOSE_FIRST
    assert entry.name is not None
    with _held_lock:
        if isinstance(entry, LeftRegistration):
            left_registered.append(entry)
        _after_close[entry] = (unregister, entry.name)
        if _asking is None and not _exiting:
            _asking = threading.Thread(target=_ask_until_let_go, name="tritonshm-held-for-the-server", daemon=True)
            _asking.start()


#: What each extent held after its client closed (and each left registration) is asked about
#: through, and its name.
_after_close: "weakref.WeakKeyDictionary[Extent | LeftRegistration, tuple[Unregisterer, str]]" = \
    weakref.WeakKeyDictionary()


def _ask_until_let_go() -> None:
    """The thread of :data:`held_for_the_server`: ask the server again about each extent held
    whose backoff is over -- unregistered (the server let go), or unreachable (gone: it holds
    nothing), it is freed; refused, or cut off, it is asked again twice as late -- until none is
    left to ask about (the next one held starts another thread)."""
    global _asking
    try:
        _ask_while_held()
    finally:
        with _held_lock:
            if _asking is threading.current_thread():  # (at exit, or failed)
                _asking = None
        release_gevent_hub()  # (a closed HTTP client's connection asks on clients made here)


def _asked_about() -> "list[Extent | LeftRegistration]":
    """Everything the asking thread has to ask about (under the lock)."""
    return [*held_for_the_server, *left_registered]


def _ask_while_held() -> None:
    # (_ask_until_let_go's loop: returns when nothing held is left to ask about, or at exit)
    global _asking
    while not _exiting:
        now = time.monotonic()
        with _held_lock:
            asked = [(entry, *_after_close[entry]) for entry in _asked_about() if entry in _after_close]
            if not asked:
                _asking = None  # (under the lock that holds: the next entry held starts another)
                return
        for entry, unregister, name in asked:
            if entry.retry_at > now or _exiting:
                continue
            try:
                unregister(name)
            except ServerError as exc:
                if outcome_of(exc) is not Outcome.NOT_SENT:  # in use, or no answer: ask again later
                    entry.retry_at = time.monotonic() + entry.backoff
                    entry.backoff = min(2 * entry.backoff, _AFTER_CLOSE_MAX)
                    continue
            except Exception:  # noqa: BLE001 (a daemon thread: nobody would see it; ask again later)
                entry.retry_at = time.monotonic() + _AFTER_CLOSE_MAX
                continue
            with _held_lock:
                _after_close.pop(entry, None)
                try:
                    if isinstance(entry, LeftRegistration):
                        left_registered.remove(entry)
                    else:
                        held_for_the_server.remove(entry)
                except ValueError:
                    continue  # (let go of meanwhile by whoever else holds the list)
            entry.release_memory()
        with _held_lock:
            due = min((e.retry_at for e in _asked_about() if e in _after_close), default=now)
        time.sleep(min(max(due - time.monotonic(), 0.005), 0.5))


def _stop_asking() -> None:
    # At exit nothing more is asked (the driver frees what is still held as the process ends).
    global _exiting
    _exiting = True


# Before the atexit callbacks, where the finalizer of a client never closed holds what its server
# still uses: threading's own exit hook (concurrent.futures' too), where there is one.
getattr(threading, "_register_atexit", atexit.register)(_stop_asking)


def _after_fork_in_child() -> None:
    # The parent's asking thread is not the child's (and may have held the lock at the fork); what
    # the parent holds stays held in the child, which asks nothing about its parent's names.
    global _held_lock, _asking
    _held_lock, _asking = threading.Lock(), None
    _after_close.clear()
    left_registered.clear()  # (the parent's names)


os.register_at_fork(after_in_child=_after_fork_in_child)
