"""Slot pools: registered memory carved into equal slots, leased one at a time.

One pool serves one model (and version).  Each slot holds a full batch of
every input and output at fixed offsets (the :class:`Layout`).  The pool
is made of *extents* -- one :class:`~._slots.SlotMemory` each, registered
once -- so it can grow without moving what is already handed out:

* a slot is **running** while its request is in flight, **held** while
  only result views keep it, and **free** once those are gone too (device
  slots are watched through a probe of their native count, because DLPack
  tensors hold them without any Python object: see :meth:`SlotMemory.probe`);
* when no slot is free but some are merely held (results the caller kept),
  the pool grows by another extent, within the client's :class:`ByteBudget`
  (``max_pool_bytes``, shared by all its pools): keeping results
  is not overloading the server, so it never waits for them;
* a pool made with fewer slots than asked for (/dev/shm had little room:
  :func:`slots_with_room`) grows by extents of that size, while requests in
  flight fill it, as room allows, up to the slots asked for;
* when in-flight requests fill the pool (or the byte cap is reached, or
  /dev/shm has no room), callers wait for a slot, then get
  :class:`~tritonshm.PoolExhausted`;
* extents beyond the first that fall idle are handed back for disposal.

The pool does no I/O: registering and unregistering extents is done by
whoever drives a request (:mod:`._engine`), never from the callback that
returns a slot, which may run on any thread.
"""

from __future__ import annotations

import collections
import dataclasses
import mmap
import sys
import threading
import time
import weakref
from typing import Any, Callable, Generic, Mapping, TypeVar

from .._units import nbytes_text
from ..errors import PoolExhausted, RegionClosed, RegistrationError
from ._model import ModelInfo
from ._slots import RegisteredMemory, SlotMemory
from ._steps import Register, Steps, Unregister

__all__ = ["ByteBudget", "Layout", "SlotPool", "Lease", "Extent", "PoolInfo", "register_again_steps",
           "slots_with_room"]

_PAGE = mmap.PAGESIZE
# Each tensor of a slot starts 256-byte aligned: what cudaMalloc gives and
# what Triton's device kernels (and vectorised copies) assume of a CUDA
# buffer; on the host it is a few cache lines, which costs nothing.
_TENSOR_ALIGN = 256
# How often a waiting request looks again at slots only DLPack tensors hold:
# their deleters run in C, on any thread, and cannot wake anyone.
_PROBE_INTERVAL = 0.005


class _AfterCopy:
    """A probe of a slot whose results are being copied out (:meth:`SlotPool.finished_and_back`):
    idle once the copies' event is complete; keeps the slot's memory alive until then."""

    __slots__ = ("pending", "keep")
    holders = 1

    def __init__(self, pending: Any, keep: Any) -> None:
        self.pending, self.keep = pending, keep

    def readers_pending(self) -> bool:
        if self.pending.query():
            self.keep = None
            return False
        return True

    def settle(self) -> None:
        """Wait for the copies on the CPU (before the memory is let go of)."""
        self.pending.synchronize()
        self.keep = None


def _settle(watched: list[tuple[Any, int, Any]]) -> None:
    """No slot's memory is let go of under a copy out of it still queued."""
    for _, _, probe in watched:
        if isinstance(probe, _AfterCopy):
            probe.settle()


def _idle(probe: Any) -> bool:
    """Whether a natively held slot is free: no holder left but the probe, and every reader that
    named its stream (a DLPack consumer) done with it -- a consumer's deleter runs when its tensor
    dies, not when its kernels reading the slot have finished."""
    return probe.holders <= 1 and not probe.readers_pending()


#: The slots leased with a handle (``try_acquire(hold=True)``), by the id of the weak reference
#: that watches the handle: ``(that reference, pool, extent, index, probe)``; the slot goes back to
#: its pool when the handle dies.  One plain weak reference does what ``weakref.finalize`` did
#: here at a fraction of its cost (finalize keeps a registry of its own and atexit state: ~9 us of
#: a lease's CPU, cold).  Like finalize's registry, the table keeps the pool until the slot is back.
_leased: dict[int, tuple[Any, ...]] = {}


def _handle_gone(ref: Any, _pop: Callable[..., Any] = _leased.pop,
                 _finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
    """A lease's handle died (its last view went; on any thread): its slot goes back to its pool.
    Not while the interpreter shuts down, as finalize's callbacks made with ``atexit=False``."""
    entry = _pop(id(ref), None)
    if entry is not None and not _finalizing():
        _, pool, extent, index, probe = entry
        pool._release(extent, index, probe)


def _round_up(value: int, to: int) -> int:
    return (value + to - 1) // to * to


def slots_with_room(slot_bytes: int, slots: int, free: int | None) -> int:
    """How many of *slots* slots of *slot_bytes* a new extent may have where *free* bytes of
    /dev/shm are free (None: no limit known, or memory elsewhere); 0 where not even one fits.

    At most half of what is free: the server shares /dev/shm with us and may need as much again
    for the same requests (Triton's Python backend copies each request's inputs and outputs into
    a segment of its own there, and keeps that room), and other processes take their share.  So
    *free* is what is free less what the client's pools hold there already (they took theirs of
    it: :meth:`PoolTable._free_bytes`), and all of them together stay within half."""
    if free is None:
        return slots
    return min(slots, free // 2 // slot_bytes)


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where each tensor lives inside a slot, and how much room it has."""

    offsets: Mapping[str, int]
    capacities: Mapping[str, int]
    slot_bytes: int

    @classmethod
    def for_capacities(cls, capacities: Mapping[str, int]) -> "Layout":
        """Tensors one after the other, each 256-byte aligned; slots page-aligned."""
        offsets, cursor, rooms = {}, 0, {}
        for name, capacity in capacities.items():
            # Never an empty room: Triton refuses a binding of 0 bytes.
            rooms[name] = _round_up(max(capacity, 1), _TENSOR_ALIGN)
            offsets[name] = cursor
            cursor += rooms[name]
        return cls(offsets, rooms, _round_up(max(cursor, 1), _PAGE))

    def fits(self, needs: Mapping[str, int]) -> bool:
        """Whether every tensor of *needs* (name -> bytes) has room."""
        return all(self.capacities.get(name, -1) >= size for name, size in needs.items())

    def grown(self, needs: Mapping[str, int]) -> "Layout":
        """A layout with room for *needs* and for everything this one had.

        A tensor that outgrows its room at least doubles it, so a stream of
        slowly growing requests does not replace the pool every time.
        """
        capacities = dict(self.capacities)
        for name, size in needs.items():
            old = capacities.get(name, 0)
            if size > old:
                capacities[name] = max(size, 2 * old)
        return Layout.for_capacities(capacities)


class ByteBudget:
    """A client's ``max_pool_bytes``: the bytes of every extent it holds -- being
    registered, in service, retired but not yet dropped, parked -- never exceed
    *limit*, at any instant.  An extent takes its bytes before its memory is
    made and gives them back when its memory is closed."""

    def __init__(self, limit: int):
        self.limit = limit
        self._used = 0
        self._lock = threading.Lock()

    @property
    def used(self) -> int:
        """Bytes taken now."""
        return self._used

    def fits(self, nbytes: int) -> bool:
        """Whether *nbytes* more would fit now (a hint: :meth:`take` decides)."""
        return self._used + nbytes <= self.limit

    def take(self, nbytes: int) -> bool:
        """Take *nbytes* if they fit; False (nothing taken) if not."""
        with self._lock:
            if self._used + nbytes > self.limit:
                return False
            self._used += nbytes
            return True

    def give_back(self, nbytes: int) -> None:
        with self._lock:
            self._used -= nbytes

    def __repr__(self) -> str:
        return f"<ByteBudget {self._used} of {self.limit} bytes>"


_Memory = TypeVar("_Memory", bound=RegisteredMemory)


class Extent(Generic[_Memory]):
    """One registered piece of a pool: a :class:`SlotMemory` holding *nslots* slots,
    whose *nbytes* are taken from *budget* until :meth:`release_memory` -- or another
    registered memory that is no pool's (a lent allocation: no slots, no budget)."""

    def __init__(self, memory: _Memory, nslots: int, budget: ByteBudget | None = None, nbytes: int = 0):
        self.memory = memory
        self.nslots = nslots
        self.name: str | None = None   # set once registered
        self.closed = False            # out of its pool's service (its memory may live on, parked)
        self.unreachable = False       # parked because the server could not be reached
        self._budget = budget
        self._nbytes = nbytes
        # Per slot index: the request objects naming its offsets, made once and reused (they die
        # with the extent, so a later extent can never inherit another's bindings).
        self.requests: dict[int, dict[Any, Any]] = {}
        # What requests of unknown outcome named in this memory, which the server may still read
        # or write (the caller's tensors, views of a slot): held until the server agreed to
        # unregister it (or for good, see ._claim).
        self.kept_for_server: list[Any] = []
        # A pool's extent: its pool (None: a lent allocation), and what it holds for the server.
        self.pool: "SlotPool | None" = None
        self.running = 0               # its slots whose request is in flight
        #: Its slots whose request's outcome is unknown, each with whether its lease is back (its
        #: views gone, or it had none): out of service until an unregister proves the server done.
        self.for_server: dict[int, bool] = {}
        self.suspended = False         # out of leasing until then (see SlotPool.hold_for_server)
        #: The server let go of it and its prover registers it again: the pool's close leaves it
        #: to the prover, which lets go of it after (else the memory could be freed between the
        #: server's registering it again and the prover's hearing so).
        self.reregistering = False
        self.idle: list[int] = []      # slots that came back meanwhile
        self.retry_at = 0.0            # when to ask the server again, and how long after that
        self.backoff = 0.0
        self.not_before = 0.0          # held until then for a server older than 2.50 (see ._disposal)

    @property
    def released_by_server(self) -> bool:
        """Whether the server may no longer touch anything a request of unknown outcome named
        here: the memory was let go of, or the server agreed to unregister it since."""
        return self.memory.closed or not (self.kept_for_server or self.for_server)

    def release_memory(self) -> None:
        """Close the memory (views keep what they use), give its bytes back and let go of what
        was kept for the server; idempotent."""
        budget, self._budget = self._budget, None
        try:
            self.memory.close()
        finally:
            self.kept_for_server = []
            if budget is not None:
                budget.give_back(self._nbytes)

    def __repr__(self) -> str:
        return f"<Extent {self.name!r} {self.nslots} slots>"


def register_again_steps(extents: list[Extent]) -> Steps:
    """Register *extents* again under their names (the server restarted and forgot them).  A
    pool's extent taken out of service meanwhile (idle surplus, a retired pool: closed, to be
    unregistered) is skipped, or, closed while its registration was on its way, unregistered
    again: its disposal's unregister may have come first."""
    for extent in extents:
        if extent.closed:
            continue
        try:
            yield Register(extent.memory, extent.name)
        except RegistrationError as exc:
            if "already" not in str(exc):  # another request of ours re-registered it
                raise
            continue
        except RegionClosed:
            if extent.closed:
                continue  # (its disposal closed it since we looked)
            raise
        if extent.closed and extent.name is not None:
            yield Unregister(extent.name)


@dataclasses.dataclass(slots=True)
class Lease:
    """A slot out of its pool: drop every reference to ``handle`` (and views
    of it) and the slot goes back."""

    pool: "SlotPool"
    extent: Extent
    index: int
    handle: Any           # SlotMemory.lease(): its lifetime holds the slot (None: finished_and_back())
    base: int             # the slot's offset in its extent's memory
    # A lease without a handle that still keeps its memory alive while the request runs (device
    # memory: closing the extent under an in-flight copy or inference must not free it).
    keep: Any = None
    # Its last request's outcome is unknown: held for the server (SlotPool.hold_for_server), no
    # longer counted running; a zero-copy request's lease runs again once the server let go.
    for_server: bool = False

    def offset(self, tensor: str) -> int:
        """Where *tensor* starts in the extent's memory."""
        return self.base + self.pool.layout.offsets[tensor]


@dataclasses.dataclass(frozen=True)
class PoolInfo:
    """A snapshot of one slot pool, as :meth:`tritonshm.Client.pools` reports it."""

    model: str              #: the model the pool's slots are laid out for
    version: str            #: the model version asked for ("" for the server's choice)
    memory: str             #: "system", "pinned:N" or "cuda:N": what the slots are in
    slots: int              #: slots in every extent together
    running: int            #: slots whose request is in flight
    held: int               #: slots kept out of the pool by result views (and DLPack tensors)
    slot_bytes: int         #: the bytes of one slot (every input and output of a full batch)
    nbytes: int             #: registered bytes, every extent together
    regions: tuple[str, ...]  #: the names the extents are registered under
    #: slots out of service until the server lets go of them: requests of unknown outcome
    #: (timed out, cancelled, cut off) may still run there (see :meth:`SlotPool.hold_for_server`)
    awaiting_server: int = 0


class SlotPool:
    """A model's slots, in one or more registered extents of equal size: *slots* slots each.

    *wanted* is how many slots the client asked for (default: *slots*): a pool made with fewer
    grows towards it while requests in flight fill it; *room(nbytes)* says whether memory of
    that many bytes may be made now (its filesystem, /dev/shm, has room: default, always)."""

    def __init__(self, info: ModelInfo, layout: Layout, slots: int, budget: ByteBudget,
                 make_memory: Callable[[int], SlotMemory], notice_surplus: Callable[[], None] = lambda: None,
                 *, wanted: int | None = None, room: Callable[[int], bool] = lambda nbytes: True,
                 in_dev_shm: bool = False):
        self.info = info
        self.in_dev_shm = in_dev_shm  # its memory is in /dev/shm (host slots): it takes of its room
        self.layout = layout
        self.slots_per_extent = slots
        self.wanted = slots if wanted is None else wanted
        self._room = room
        self.budget = budget
        self._make_memory = make_memory
        self._notice_surplus = notice_surplus  # the client's disposals hear of idle extents
        # One re-entrant lock (slot releases may run under it: a view dropped inside it); sections
        # that only read or update take it straight (a C call), wait() and the wake-ups go through
        # the condition over it.
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._extents: list[Extent] = []
        self._free: collections.deque[tuple[Extent, int]] = collections.deque()
        self._watched: list[tuple[Extent, int, Any]] = []  # held natively: (extent, index, probe)
        self._running = 0
        self._waiters: set[Callable[[], None]] = set()  # asyncio waiters' wake-ups
        self._sleepers = 0                               # threads blocked in wait()
        self._surplus: list[Extent] = []  # idle extents, waiting to be unregistered
        self._growing = False              # a request is registering one more extent
        self._suspended = 0                # extents held for the server (out of leasing)
        self._to_prove: list[Extent] = []  # ... that nothing of ours runs on: to ask the server
        self.retired = False               # a larger pool replaced this one
        self.closed = False
        # Per extent and slot: InferInput / InferRequestedOutput objects reused across requests.

    # -- sizes ------------------------------------------------------------

    @property
    def extent_bytes(self) -> int:
        """Bytes of one extent."""
        return self.layout.slot_bytes * self.slots_per_extent

    @property
    def nslots(self) -> int:
        """Slots in every extent together."""
        return sum(e.nslots for e in self._extents)

    @property
    def nbytes(self) -> int:
        """Bytes of every extent together."""
        return len(self._extents) * self.extent_bytes

    @property
    def running(self) -> int:
        """Slots whose request is in flight."""
        return self._running

    @property
    def held(self) -> int:
        """Slots out of the pool whose request is over but whose views live on."""
        with self._lock:
            self._look_at_watched()
            return self.nslots - len(self._free) - self._running - self._awaiting()

    def _awaiting(self) -> int:
        # Under the lock: slots out of service until the server lets go of their extent.
        if not self._suspended:
            return 0
        return sum(len(e.for_server) + len(e.idle) for e in self._extents if e.suspended)

    @property
    def dev_shm_bytes(self) -> int:
        """Bytes of /dev/shm the pool holds, or is making (an extent on its way counts); 0 for
        memory elsewhere.  No lock: read while other pools' locks may be held."""
        if not self.in_dev_shm:
            return 0
        return (len(self._extents) + (1 if self._growing else 0)) * self.extent_bytes

    @property
    def extents(self) -> list[Extent]:
        """The registered extents (a copy)."""
        with self._lock:
            return list(self._extents)

    # -- growing ----------------------------------------------------------

    def new_extent(self) -> Extent | None:
        """Memory for one more extent, not yet registered nor part of the pool; None
        (nothing made) when its bytes do not fit in the client's budget now."""
        nbytes = self.extent_bytes
        if not self.budget.take(nbytes):
            return None
        try:
            memory = self._make_memory(nbytes)
        except BaseException:
            self.budget.give_back(nbytes)
            raise
        return Extent(memory, self.slots_per_extent, self.budget, nbytes)

    def add_extent(self, extent: Extent) -> bool:
        """Put a registered extent into service; False (and nothing done) if the pool
        was closed meanwhile: the caller unregisters and closes the extent then."""
        with self._lock:
            if self.closed:
                return False
            self._extents.append(extent)
            extent.pool = self
            self._free.extend((extent, i) for i in reversed(range(extent.nslots)))
            self._wake()
            return True

    def should_grow(self) -> bool:
        """True when no slot is free, some are only held (by views, or for the server) or the
        pool has fewer than it was asked for, and one more extent fits in the client's budget
        and in /dev/shm: grow instead of waiting."""
        with self._lock:
            self._look_at_watched()  # first: a slot it frees is no reason to grow
            return (not self._free and not self.retired and not self._growing
                    and (self.held > 0 or self._suspended > 0 or not self._extents or self.nslots < self.wanted)
                    and self.budget.fits(self.extent_bytes) and self._room(self.extent_bytes))

    def claim_first_extent(self) -> None:
        """The pool's creator will add its first extent: until then (:meth:`stop_growing`)
        nobody else grows it, and requests wait for its slots."""
        with self._lock:
            self._growing = True

    def start_growing(self) -> bool:
        """Claim the right to add an extent (one request grows at a time); False if not due."""
        with self._lock:
            if not self.should_grow():
                return False
            self._growing = True
            return True

    def stop_growing(self) -> None:
        """The claimed growth is over (its extent added, or it failed)."""
        with self._lock:
            self._growing = False
            self._wake()

    # -- leasing ----------------------------------------------------------

    def try_acquire(self, hold: bool = True, spare: int = 0) -> Lease | None:
        """Lease a free slot without waiting; None if none is free or the pool is retired.

        With *hold* the lease has a handle whose views keep the slot (it
        returns when they are all gone); without, the caller hands the slot
        back with :meth:`finished_and_back` (a request that copies its results out).
        *spare*: free slots this lease must leave free (None if it would not).
        """
        with self._lock:
            if len(self._free) <= spare:
                self._look_at_watched()
            if len(self._free) <= spare or self.retired:
                return None
            extent, index = self._free.pop()  # LIFO: the slot used last is still in cache
            self._running += 1
            extent.running += 1
        base = index * self.layout.slot_bytes
        handle = keep = None
        memory = extent.memory
        try:
            if hold:
                handle = memory.lease(base, self.layout.slot_bytes)
                ref = weakref.ref(handle, _handle_gone)
                _leased[id(ref)] = (ref, self, extent, index, memory.probe(handle))
            elif memory.kind == "cuda":
                keep = memory.lease(base, self.layout.slot_bytes)
        except BaseException:
            with self._lock:  # no lease came of it: the slot is free again
                self._running -= 1
                extent.running -= 1
                if not extent.closed:
                    self._back(extent, index)
                self._wake()
            raise
        return Lease(self, extent, index, handle, base, keep)

    def wait_slice(self, left: float | None) -> float | None:
        """How long to wait for a slot at a time: *left*, or less while slots held by DLPack
        tensors must be looked at again (nothing wakes us for them), or while slots held for
        the server wait for it to let go (the waiter asks it: see :meth:`hold_for_server`)."""
        if not self._watched and not self._suspended:
            return left
        return _PROBE_INTERVAL if left is None else min(left, _PROBE_INTERVAL)

    def finished_and_back(self, lease: Lease, after: Any = None) -> None:
        """:meth:`finished`, and the slot of a lease taken without *hold* back in the pool --
        once the copies out of it that *after* marks (a :class:`~tritonshm.cuda.Pending`: queued
        on a stream, not waited for) are complete: until then it is watched, not free, and its
        memory kept alive."""
        assert lease.handle is None, "a held lease returns when its views are gone"
        keep, lease.keep = lease.keep, None
        with self._lock:
            self._end_running(lease)
            if after is not None and not after.done and not lease.extent.closed \
                    and lease.index not in lease.extent.for_server:
                # (asked no CUDA call now: the copy was only just queued)
                self._watched.append((lease.extent, lease.index, _AfterCopy(after, keep)))
                self._wake()
                return
            self._release(lease.extent, lease.index)

    def wait(self, timeout: float | None) -> bool:
        """Block until a slot may be free (or the pool retired); False on timeout.

        While slots are held natively (DLPack tensors, whose deleters wake
        nobody), look at them again every few milliseconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._sleepers += 1
            try:
                while True:
                    if self.ready():
                        return True
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._cond.wait(self.wait_slice(left))
            finally:
                self._sleepers -= 1

    def ready(self) -> bool:
        """Whether a request waiting for a slot should look again now: one is free, the pool was
        retired, it should grow, or an extent held for the server is to be asked about (the
        waiter asks: :meth:`~._pools.PoolTable.lease_steps`)."""
        with self._lock:
            self._look_at_watched()  # before looking for a free slot: it may make one
            return bool(self._free) or self.retired or bool(self._to_prove) or self.should_grow()

    def add_waiter(self, wake: Callable[[], None]) -> None:
        """Call *wake* (from any thread) when a slot comes back or the pool is retired."""
        with self._lock:
            self._waiters.add(wake)

    def remove_waiter(self, wake: Callable[[], None]) -> None:
        """Stop calling *wake*."""
        with self._lock:
            self._waiters.discard(wake)

    def exhausted(self, timeout: float | None) -> PoolExhausted:
        """The error for a request that waited *timeout* seconds for a slot."""
        with self._lock:
            running, held, awaiting = self._running, self.held, self._awaiting()
        if awaiting and not running:
            why = (f"{awaiting} slots wait for the server to finish requests whose outcome is unknown "
                   f"(timed out, cancelled or cut off: it may still write their slots); they come back once "
                   f"it lets go of them (an unregister it accepts, or a restart). Wait longer (slot_timeout=), "
                   f"or raise max_pool_bytes so that the pool can grow around them")
        elif held and not self.budget.fits(self.extent_bytes):
            why = (f"the client is at its byte cap ({nbytes_text(self.budget.used)} of max_pool_bytes="
                   f"{self.budget.limit}) with {held} slots held by live result views (copy=False "
                   f"results or request() views still referenced): drop arrays you no longer need "
                   f"or raise max_pool_bytes")
        elif (held or self.nslots < self.wanted) and not self._room(self.extent_bytes):
            why = (f"/dev/shm has no room to grow it by {nbytes_text(self.extent_bytes)} (it was asked for "
                   f"{self.wanted} slots; a pool takes at most half of what is free there): give /dev/shm "
                   f"more room (Docker: --shm-size), or drop results you keep")
        else:
            why = (f"{running} requests in flight fill it: the server is slower than the "
                   f"requests come; raise slots= or slot_timeout=")
        return PoolExhausted(
            f"no slot of the pool for model {self.info.name!r} came free for {timeout} s "
            f"({self.nslots} slots: {running} running, {held} held, {awaiting} awaiting the server): {why}"
        )

    def finished(self, lease: Lease) -> None:
        """*lease*'s request is over, or a zero-copy request let go of it (its views may still
        hold the slot)."""
        with self._lock:
            self._end_running(lease)
            self._wake()  # a held slot may now make growing worthwhile

    def resume(self, lease: Lease) -> None:
        """A zero-copy request's lease, held for the server since a run of unknown outcome,
        runs again (:meth:`finished` ends it); once: two runs of the request that waited for the
        server together resume it one time (counted twice, it ran for ever)."""
        with self._lock:
            if not lease.for_server:
                return
            self._running += 1
            lease.extent.running += 1
            lease.for_server = False

    def _end_running(self, lease: Lease) -> None:
        # Under the lock.  A lease held for the server stopped counting as running then.
        if lease.for_server:
            return
        self._running -= 1
        extent = lease.extent
        extent.running -= 1
        if extent.suspended and extent.running == 0:
            self._provable(extent)

    # -- holding slots for the server --------------------------------------

    def hold_for_server(self, lease: Lease) -> None:
        """*lease*'s request may still run on the server (its outcome is unknown): its slot stays
        out of the pool, and its extent leaves leasing, until the server provably let go of it.

        The proof is an unregister of the extent that succeeds: Triton refuses to unregister
        a region a running request uses, and a restarted server holds nothing.  It is asked
        once no request of ours runs on the extent (none would let it succeed), by whoever
        drives requests (:meth:`take_provable`; the client's disposals), on a backoff; then
        the extent is registered again and comes back whole (:meth:`restore`).  Meanwhile the
        pool grows around it within ``max_pool_bytes``, or its waiters wait, asking."""
        with self._lock:
            extent = lease.extent
            extent.for_server[lease.index] = lease.handle is None  # (no handle: nothing else holds it)
            self._suspend(extent)
            self._end_running(lease)
            lease.for_server = True
            lease.keep = None  # (the extent keeps its memory: it is closed only after the proof)
            self._wake()  # waiters grow the pool around it, or ask the server (see ready())

    def keep_for_server(self, extent: Extent, kept: list[Any]) -> None:
        """A request of unknown outcome read *kept*, views of *extent*'s slots (results passed on
        as inputs): they are held, and the extent out of leasing, as for :meth:`hold_for_server`."""
        with self._lock:
            extent.kept_for_server.extend(kept)
            self._suspend(extent)
            if extent.running == 0:
                self._provable(extent)
            self._wake()  # (as hold_for_server)

    def _suspend(self, extent: Extent) -> None:
        # Under the lock: *extent* out of leasing (its free slots wait with it).
        if extent.suspended or extent.closed:
            return
        extent.suspended = True
        self._suspended += 1
        extent.idle = [index for e, index in self._free if e is extent]
        if extent.idle:
            self._free = collections.deque(item for item in self._free if item[0] is not extent)

    def _provable(self, extent: Extent) -> None:
        # Under the lock: nothing of ours runs on *extent* any more; the server may be asked --
        # by a waiter, woken for it (else it would sleep out its slot_timeout: nobody else asks).
        if extent not in self._to_prove and not extent.closed:
            self._to_prove.append(extent)
            self._notice_surplus()
            self._wake()

    @property
    def has_provable(self) -> bool:
        """Whether extents wait for their first ask of the server (cheap: no lock)."""
        return bool(self._to_prove)

    def take_provable(self) -> list[Extent]:
        """Extents held for the server that nothing of ours runs on: to be asked (the client's
        disposals ask each on a backoff until the server agrees, then :meth:`restore`)."""
        with self._lock:
            out, self._to_prove = self._to_prove, []
            return out

    def start_reregistering(self, extent: Extent) -> bool:
        """The server let go of *extent*, held for it: its prover registers it again, and until
        :meth:`restore`, :meth:`stop_reregistering` or :meth:`drop_extent` the pool's
        :meth:`close` leaves it to the prover.  False, nothing done, when the pool closed
        meanwhile (its close lets go of it)."""
        with self._lock:
            if extent.closed:
                return False
            extent.reregistering = True
            return True

    def stop_reregistering(self, extent: Extent) -> bool:
        """The prover's registration did not happen, or its outcome is unknown: *extent* is to
        be asked about again -- False -- unless the pool closed meanwhile, which left it to the
        prover -- True: the prover lets go of it."""
        with self._lock:
            extent.reregistering = False
            return extent.closed

    def restore(self, extent: Extent) -> bool:
        """The server let go of *extent* and it is registered again: back in service, with the
        slots held for the server free (those whose lease is still out come back with it).
        False, nothing done, when the pool no longer serves (then :meth:`drop_extent`)."""
        with self._lock:
            extent.reregistering = False
            if self.retired or self.closed or extent.closed or not extent.suspended:
                return False
            extent.suspended = False
            self._suspended -= 1
            kept, extent.kept_for_server = extent.kept_for_server, []
            back = [index for index, returned in extent.for_server.items() if returned] + extent.idle
            extent.for_server, extent.idle = {}, []
            self._free.extend((extent, index) for index in back)
            self._wake()
        del kept  # (views of our own slots: dropping them may return those slots, under no lock)
        return True

    def drop_extent(self, extent: Extent) -> None:
        """*extent* leaves the pool for good (a retired pool's, proven; or one that could not be
        registered again): its slots with it; the caller closes its memory."""
        with self._lock:
            extent.reregistering = False
            if extent in self._extents:
                self._extents.remove(extent)
            if extent.suspended:
                extent.suspended = False
                self._suspended -= 1
            self._free = collections.deque(item for item in self._free if item[0] is not extent)
            _settle([item for item in self._watched if item[0] is extent])
            self._watched = [item for item in self._watched if item[0] is not extent]
            extent.closed = True
            self._wake()

    @property
    def awaiting_server(self) -> int:
        """Slots out of service until the server lets go (held for it, or in an extent that is)."""
        with self._lock:
            return self._awaiting()

    def _release(self, extent: Extent, index: int, probe: Any = None) -> None:
        # Runs when the lease handle dies: on any thread, possibly inside
        # another pool's lock; so no I/O here, only bookkeeping.  With a
        # probe, views the handle does not know of may still hold the slot.
        with self._lock:
            if extent.closed:
                return
            if index in extent.for_server:  # the server may still write it: back after the proof
                extent.for_server[index] = True
                return
            if probe is not None and not _idle(probe):
                self._watched.append((extent, index, probe))
                self._wake()  # a waiter must start looking at it
                return
            self._back(extent, index)
            if len(self._extents) > 1:  # only extents beyond the first are ever surplus
                self._collect_surplus()
            self._wake()

    def _back(self, extent: Extent, index: int) -> None:
        # Under the lock: a slot free again (to wait with its extent, while it is held for the server).
        if extent.suspended:
            extent.idle.append(index)
        else:
            self._free.append((extent, index))

    def _look_at_watched(self) -> None:
        """Free the watched slots whose last view is gone (under the lock), each asked once a
        look.  Slots whose copies out are known complete without asking CUDA (a later wait proved
        them) come back with no query; the others' events are queried only when nothing came back."""
        if not self._watched:
            return
        for ask_copies in (False, True):
            still = []
            for extent, index, probe in self._watched:
                if extent.closed:
                    continue
                if isinstance(probe, _AfterCopy) and not (probe.pending.done or ask_copies):
                    still.append((extent, index, probe))
                elif ask_copies and not isinstance(probe, _AfterCopy):
                    still.append((extent, index, probe))  # (asked in the first pass already)
                elif not _idle(probe):
                    still.append((extent, index, probe))
                else:
                    self._back(extent, index)
            if len(still) != len(self._watched):
                self._watched = still
                self._collect_surplus()
                self._wake()
                return

    def _collect_surplus(self) -> None:
        """Move idle extents beyond what the pool needs out of service."""
        if self.retired or self.closed:
            return
        for extent in self._extents[1:]:
            idle = sum(1 for e, _ in self._free if e is extent) == extent.nslots
            spare = len(self._free) - extent.nslots
            if idle and spare >= self.slots_per_extent:
                self._extents.remove(extent)
                self._free = collections.deque(item for item in self._free if item[0] is not extent)
                self._surplus.append(extent)
                self._notice_surplus()
                break  # one at a time: the next release looks again

    def _wake(self) -> None:
        if self._sleepers:
            self._cond.notify_all()
        if self._waiters:
            for wake in list(self._waiters):
                wake()

    # -- ending -----------------------------------------------------------

    @property
    def has_surplus(self) -> bool:
        """Whether idle extents wait to be unregistered (cheap: no lock)."""
        return bool(self._surplus)

    def take_disposals(self) -> list[Extent]:
        """Extents to unregister and close now: idle surplus, or all of a drained retired pool."""
        with self._lock:
            out, self._surplus = self._surplus, []
            self._look_at_watched()
            if self.retired and not self.closed and len(self._free) == self.nslots:
                out.extend(self._extents)
                self._extents = []
                self._free.clear()
                self.closed = True
            for extent in out:
                extent.closed = True
            return out

    def retire(self) -> None:
        """Stop leasing from this pool; it is disposed of once every slot is back."""
        with self._lock:
            self.retired = True
            self._wake()  # waiters move on to the new pool

    def close(self) -> list[Extent]:
        """Close the pool now (the client is closing): every extent, to unregister; idempotent."""
        with self._lock:
            if self.closed:
                out, self._surplus = self._surplus, []
            else:
                # (one being registered again is its prover's to let go of: marked closed below)
                out = [extent for extent in self._extents if not extent.reregistering] + self._surplus
                for extent in self._extents:
                    extent.closed = True
                self._extents, self._surplus = [], []
                self.closed = self.retired = True
            self._free.clear()
            _settle(self._watched)
            self._watched.clear()
            self._to_prove = []
            for extent in out:
                extent.closed = True
            self._wake()
            return out

    def snapshot(self, memory: str) -> PoolInfo:
        """A snapshot of this pool (*memory*: what the engine keys it by)."""
        with self._lock:
            return PoolInfo(self.info.name, self.info.version, memory, self.nslots,
                            self._running, self.held, self.layout.slot_bytes, self.nbytes,
                            tuple(e.name for e in self._extents if e.name is not None), self._awaiting())

    def __repr__(self) -> str:
        return (f"<SlotPool {self.info.name!r} {self.nslots} slots x {self.layout.slot_bytes} B, "
                f"{self._running} running, {self.held} held>")
