"""The caller's own GPU memory, lent to the server: GPU tensors sent by reference.

A GPU tensor (torch, cupy, a :class:`~tritonshm.CudaArray`) lives inside an
allocation of its library's: a caching allocator's segment, a memory pool's
chunk, a region.  Triton can open such an allocation through CUDA IPC like
our own slots, so a request can name the tensor where it already is --
region and offset -- with no device copy (and no GPU work in the client
beyond one event wait: GPU work in the client just before a request slows
the server's answer too, measured on an H200).

:class:`LentAllocations` is the client's table of the allocations it has
registered, keyed by device and base address, owned by the engine beside
its slot pools.  Sans-I/O: :meth:`~LentAllocations.lend_steps` yields a
:class:`~._steps.Register` for an allocation seen for the first time and
otherwise costs nothing of CUDA where the driver gives allocations ids
(``CU_POINTER_ATTRIBUTE_BUFFER_ID``, asked once when the tensor was taken,
under the same device guard: an id is never reused, so the same id is the
same, registered allocation); where it does not, two driver calls
(``cuMemGetAddressRange`` and ``cudaIpcGetMemHandle``, a few microseconds: a
handle that changed at a known base means the old allocation was freed and
a new one made there, whose stale registration goes first -- a server keeps
the old mapping open and refuses the new handle at that address).

Lifetimes, by CUDA's rules: memory is never freed while the server has it
open.  Each registered allocation holds the capture of the first tensor
lent from it (:meth:`~tritonshm.CudaRegion.borrow`): torch and cupy never
free a segment with a block in use, so the allocation outlives its
registration.  An allocation is let go -- unregistered first, then its
capture released -- when the table passes its bounds (entries, bytes; the
least recently used idle one, and only one unused for a while, so that
fresh allocations per request are copied instead of registered over and
over), on ``forget()`` (before a caller's ``empty_cache()``, to give the
memory back), and when the client closes; the disposal steps
(:mod:`._disposal`) do it as for slots, parking what the server still uses.

Lend only what pays: registering an allocation costs 1-3 ms and holding it
keeps its memory from the caller's allocator, while a device copy of 64 MiB
takes tens of microseconds.  So a buffer the caller uses again is lent, and
one made afresh for each request is copied ("used once"): once an idle
allocation lent for one request only is found when a new one appears --
whatever the sizes of the two: ``x = batch.cuda()`` with variable batch or
sequence lengths is the usual case -- it is let go of (so torch can reuse its
segment), and new allocations are copied until the caller gives a tensor it
gave before (one copied, or one whose allocation was let go of so).

A request the client gave up on (:mod:`._claim`) may still be run by the
server: :meth:`~LentAllocations.abandon` takes its allocations out of the
table, to be unregistered, and has their registrations hold the request's
tensors until the server lets go of them.  A registration still on its way
when the client closes is its lend steps' to let go of: unregistered when its
reply comes, its memory held until then (:meth:`~LentAllocations.forget`).

Memory CUDA IPC cannot export (``cudaMallocAsync`` pools, expandable
segments, managed memory), a table with no room, or a server that cannot
open CUDA memory: the tensor is copied through a CUDA slot as before, and
:meth:`~LentAllocations.stats` says how many and why (:data:`COPIED_WHY`).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
import weakref
from typing import Any, Iterable, NamedTuple, Sequence

from .._memory._cuda_region import CudaRegion
from ..errors import (ClientClosed, NotShareable, Outcome, RegistrationError, ServerError, SharedMemoryRefused,
                      outcome_of)
from ._devices import DeviceTensor, ResultBlocks
from ._disposal import Disposals
from ._fallback import Fallback
from ._pool import ByteBudget, Extent
from ._slots import RegisteredMemory
from ._steps import Pause, Register, Steps, Unregister

__all__ = ["COPIED_WHY", "Lent", "LentAllocations", "LentInfo", "LentMemory", "LentStats"]

_REGISTER_POLL = 0.0005  # how often a request waits for another's registration of the same allocation
MAX_LENT_ENTRIES = 32    # allocations registered at most, whatever their size
_RECENT = 8              # tensors taken for "used once" remembered, to see them given again
_CLOSED_WHILE_REGISTERING = "the client was closed while this request registered a GPU tensor's allocation"

#: Why a GPU tensor was copied rather than lent, as :attr:`LentStats.copied` counts them.
COPIED_WHY = {
    "used once": "a fresh allocation for one request: copying costs less than registering and holding it",
    "not shareable": "memory CUDA IPC cannot export (cudaMallocAsync pools, expandable segments, managed)",
    "bounds": "the lent allocations are at max_lent_bytes (or 32 of them), none idle and cold to make room",
    "spans allocations": "a tensor that is not inside one allocation",
    "server cannot open CUDA memory": "the server cannot open this process's CUDA memory",
    "server refused": "the server refused to register the allocation",
    "on the wire": "the request travelled in the message: the server cannot open this process's shared memory",
}


class LentMemory(RegisteredMemory):
    """A lent allocation (a borrowed :class:`~tritonshm.CudaRegion`) as the engine registers it."""

    kind = "cuda"

    def __init__(self, region: CudaRegion):
        self.region = region
        self.device = region.device
        self.nbytes: int = region.nbytes  # size of the allocation in bytes (read by every request lent it)


class Lent(NamedTuple):
    """Where a lent tensor is: its allocation's registered extent (and its name there), and
    the tensor's byte offset and size in it."""

    extent: Extent
    name: str
    offset: int
    nbytes: int


class LentInfo(NamedTuple):
    """One registered allocation, as :meth:`LentAllocations.snapshot` shows it."""

    name: str | None    #: the registration's name (None while it is being registered)
    device: int         #: the GPU the allocation is on
    base: int           #: device address of the allocation
    nbytes: int         #: its size (what the server maps)
    in_use: int         #: requests naming it now
    lent: int           #: tensors lent from it so far


@dataclasses.dataclass
class LentStats:
    """How the client's GPU tensors travelled (counted since the client was made)."""

    inputs_lent: int = 0       #: GPU inputs sent by reference
    outputs_lent: int = 0      #: outputs the server wrote straight into the caller's tensors (``out=``)
    #: GPU tensors copied, by reason (the keys of :data:`COPIED_WHY`)
    copied: dict[str, int] = dataclasses.field(default_factory=dict)
    registrations: int = 0     #: allocations registered
    evictions: int = 0         #: allocations let go to stay within the bounds, or made for one request
    allocations: int = 0       #: allocations registered now
    nbytes: int = 0            #: their bytes
    #: requests the client gave up on (client_timeout, cancelled, closed) before the server answered
    abandoned: int = 0
    #: of those, the ones whose memory (lent tensors) is still held now, until the server lets go
    awaiting_server: int = 0


class _Entry:
    __slots__ = ("extent", "handle", "buffer_id", "users", "last_used", "lent", "reused", "origin")

    extent: Extent[LentMemory]

    def __init__(self, extent: Extent, handle: bytes, origin: "weakref.ref[Any] | None" = None,
                 buffer_id: int = 0):
        self.extent = extent
        self.handle = handle
        self.buffer_id = buffer_id  # the driver's id of the allocation (0: it does not say)
        self.users = 1
        self.last_used = time.monotonic()
        self.lent = 1
        self.reused = False  # registered for a tensor the caller gave again: never taken for "used once"
        self.origin = origin  # the caller's tensor it was registered for (to see it given again)


class LentAllocations:
    """The caller's allocations this client registered, by device and base (see the module).

    *max_bytes* and *max_entries* bound them together, at every instant;
    *disposals* is the client's one way of letting go (a forked child unregisters
    nothing; what the server refuses to let go of is parked with the slots');
    *fallback* says whether the server can open the caller's GPU memory.
    """

    #: An idle allocation unused for this long may make room for a new one; a younger one may
    #: not: the new tensor is copied instead (no registration churn for fresh allocations).
    cold_seconds = 1.0

    def __init__(self, max_bytes: int, disposals: Disposals, fallback: Fallback,
                 max_entries: int = MAX_LENT_ENTRIES):
        self.max_bytes = max_bytes
        self._fallback = fallback  # whether the server can open the caller's GPU memory (its writer)
        self.max_entries = max_entries
        self._letting_go = disposals  # how allocations are let go of: the client's one way
        #: Bytes of every allocation the table holds -- registered, being registered, let go of
        #: but not yet unregistered, parked -- never over *max_bytes*, at any instant.
        self.budget = ByteBudget(max_bytes)
        self._lock = threading.Lock()
        self._entries: collections.OrderedDict[tuple[int, int], _Entry] = collections.OrderedDict()
        self._nbytes = 0                  # of the entries in the table
        self._disposals: list[Extent] = []  # out of the table and unused: to unregister, then let go
        self._doomed: list[_Entry] = []   # out of the table, still named by requests
        self._stats = LentStats()
        self._closed = False              # the client closed: nothing is registered any more
        # Whether the caller makes a fresh allocation per request (then new ones are copied), and
        # the tensors taken for "used once" (copied, or their allocation let go of), to see one
        # given again (then it is lent: see the module).
        self._fresh_per_request = False
        self._recent: collections.deque[weakref.ref[Any]] = collections.deque(maxlen=_RECENT)
        #: The device memory of the client's CudaArray results, cached beside the lent allocations
        #: and let go of with them (:meth:`forget`: the caller's forget(), the client's close()).
        self.results = ResultBlocks()

    # -- lending ---------------------------------------------------------

    def lend_steps(self, tensor: DeviceTensor) -> Steps:
        """*tensor*'s allocation registered (now, or before): its :class:`Lent`, which the
        request hands back to :meth:`finished`; None where it must be copied instead."""
        if self._fallback.lending_refused is not None:
            return self._copied("server cannot open CUDA memory")
        known = self.lend_known((tensor,))[0]
        if known is not None:
            return known
        source = tensor.source
        buffer_id = getattr(source, "buffer_id", 0)
        try:
            region = CudaRegion.borrow(source)
        except NotShareable:
            return self._copied("not shareable")
        offset = source.ptr + tensor.offset - region.ptr
        if offset + tensor.nbytes > region.nbytes:  # a tensor is one allocation; a malformed one is not
            region.close()
            return self._copied("spans allocations")
        key = (region.device, region.ptr)
        handle = region.ipc_handle
        while True:
            full = used_once = given_again = False
            with self._lock:
                if self._closed:
                    region.close()
                    raise ClientClosed("the client was closed while this request lent a GPU tensor")
                entry = self._entries.get(key)
                if entry is not None and (entry.handle != handle or entry.extent.memory.nbytes != region.nbytes):
                    # A new allocation where a freed one was: its registration is stale, and the
                    # server, which still maps the old one there, would refuse the new handle.
                    self._remove(key)
                    entry = None
                if entry is not None and entry.extent.name is not None:
                    if not entry.buffer_id:  # (registered for a tensor taken without its id)
                        entry.buffer_id = buffer_id
                    entry.users += 1
                    entry.lent += 1
                    entry.last_used = time.monotonic()
                    self._entries.move_to_end(key)
                    region.close()  # the entry's own region holds the allocation
                    return Lent(entry.extent, entry.extent.name, offset, tensor.nbytes)
                if entry is None:
                    used_once, given_again = self._used_once(tensor)
                if entry is not None or used_once:
                    pass
                elif not self._make_room(region.nbytes):
                    full = True
                elif not self._disposals:  # what was let go of is gone: its bytes are back
                    if self.budget.take(region.nbytes):
                        entry = _Entry(Extent(LentMemory(region), 0, self.budget, region.nbytes), handle,
                                       tensor.origin, buffer_id)
                        entry.reused = given_again
                        self._entries[key] = entry
                        self._nbytes += region.nbytes
                        break
                    full = True  # bytes still held by allocations on their way out (in use, parked)
            if full or used_once:
                region.close()
                return self._copied("used once" if used_once else "bounds")
            if self.has_disposals():
                # What the table let go of (stale, evicted) goes first: unregistered, then its
                # bytes back -- the bound holds at every instant, and the server never maps a
                # new allocation where it still maps an old one.
                yield from self.drop_steps(self.take_disposals())
                continue
            yield Pause(_REGISTER_POLL)  # another request is registering it: wait for its name
            if self._fallback.lending_refused is not None:  # ... and the server refused it
                region.close()
                return self._copied("server cannot open CUDA memory")
        try:
            name = yield Register(entry.extent.memory)
        except (SharedMemoryRefused, RegistrationError) as exc:
            if self._forget_failed(key, entry, exc):
                raise ClientClosed(_CLOSED_WHILE_REGISTERING) from exc
            if isinstance(exc, SharedMemoryRefused):
                self._fallback.lending_refused_because(str(exc))
                return self._copied("server cannot open CUDA memory")
            return self._copied("server refused")
        except BaseException as exc:
            self._forget_failed(key, entry, exc)
            raise
        with self._lock:
            # Named, and the client's closing seen, at once (under the lock forget() holds).
            entry.extent.name = name
            self._stats.registrations += 1
            late = self._closed
            if late and entry in self._doomed:
                self._doomed.remove(entry)  # forget() left it to these steps
        if late:
            # The reply came after the client closed and let go of the rest: these steps alone
            # know this registration now; the request is not sent.
            yield from self._unregister_late_steps(entry.extent, name)
            raise ClientClosed(_CLOSED_WHILE_REGISTERING)
        return Lent(entry.extent, name, offset, tensor.nbytes)

    def lend_known(self, tensors: Sequence[DeviceTensor]) -> list[Lent | None]:
        """Each of *tensors* as a :class:`Lent` where its allocation is registered already and
        known by the driver's id of it -- the warm request's case: one look under the lock for all
        of a request's tensors, no steps -- else None (take :meth:`lend_steps` for it).  Ids are
        never reused in a process's life, so the same id is the same allocation, whose registration
        holds, with nothing asked of CUDA (no borrow, no IPC export).  Each Lent goes back through
        :meth:`finished`."""
        if self._fallback.lending_refused is not None:
            return [None] * len(tensors)
        lents: list[Lent | None] = []
        now = time.monotonic()
        with self._lock:  # (held throughout: a close() cannot come between two tensors' looks)
            for tensor in tensors:
                lents.append(None)
                buffer_id = getattr(tensor.source, "buffer_id", 0)  # (0: the driver gave none)
                if not buffer_id:
                    continue
                if self._closed:
                    raise ClientClosed("the client was closed while this request lent a GPU tensor")
                ptr = tensor.source.ptr + tensor.offset
                for key, entry in self._entries.items():  # (at most max_entries)
                    if entry.buffer_id != buffer_id or key[0] != tensor.device or entry.extent.name is None:
                        continue
                    offset = ptr - key[1]
                    if 0 <= offset and offset + tensor.nbytes <= entry.extent.memory.nbytes:
                        entry.users += 1
                        entry.lent += 1
                        entry.last_used = now
                        self._entries.move_to_end(key)
                        lents[-1] = Lent(entry.extent, entry.extent.name, offset, tensor.nbytes)
                    break  # (outside it: the full way says why -- it spans allocations)
        return lents

    def finished(self, lents: Iterable[Lent]) -> None:
        """A request that named *lents* is over, answered: the server is done with them."""
        with self._lock:
            for lent in lents:
                self._one_user_less(lent.extent)

    def abandon(self, lent: Lent, tensors: list[DeviceTensor]) -> Extent:
        """The client gave up on a request that named *lent* (the server may still run it): the
        allocation leaves the table -- to be unregistered once no other request names it, and
        let go of once the server agrees (it refuses while the request runs) -- and its
        registration holds *tensors*, the request's own, until then.  Returns that registration.

        A view of one of the client's own slots (:meth:`Engine._in_own_slot`) is held by the
        slot's extent likewise, until the pool lets go of it."""
        extent = lent.extent
        with self._lock:
            extent.kept_for_server.extend(tensors)
            for key, entry in self._entries.items():
                if entry.extent is extent:
                    self._remove(key)  # named by this request still: doomed, until the last one ends
                    break
            self._one_user_less(extent)
        self._letting_go.hold_for_old_server([extent])
        return extent

    # An entry leaves _doomed when its last user is done, and every user is: the request that
    # registers it ends its use on every path (_forget_failed; a reply after close() takes it out
    # itself), a request it is lent to enters the Lent in its claim with no step in between
    # (Runner._lend_steps), and the claim's end, in a finally, ends each (finished, or abandon),
    # as healed() does for healing().
    def _one_user_less(self, extent: Extent) -> None:
        # Under the lock.  A request naming *extent* is over.
        for entry in self._doomed:
            if entry.extent is extent:
                entry.users -= 1
                if entry.users == 0:
                    self._doomed.remove(entry)
                    self._disposals.append(entry.extent)
                    self._letting_go.notice()
                return
        for entry in self._entries.values():
            if entry.extent is extent:
                entry.users -= 1
                return

    def count(self, inputs: int = 0, outputs: int = 0) -> None:
        """Count tensors a request sent by reference."""
        with self._lock:
            self._stats.inputs_lent += inputs
            self._stats.outputs_lent += outputs

    def count_copied(self, why: str, tensors: int = 1) -> None:
        """Count GPU *tensors* copied, not lent, for the reason *why* (a key of :data:`COPIED_WHY`)."""
        with self._lock:
            self._stats.copied[why] = self._stats.copied.get(why, 0) + tensors

    def _copied(self, why: str) -> None:
        self.count_copied(why)
        return None

    def _used_once(self, tensor: DeviceTensor) -> tuple[bool, bool]:
        """``(copy, given_again)`` for *tensor*, in an allocation the table does not hold:
        whether it is better copied (the caller makes a fresh allocation per request: see the
        module), and whether the caller gave this very tensor before.  Under the lock.

        Whether the caller still has a tensor cannot be seen: torch keeps a tensor's Python
        object alive while its storage has another owner (our capture holds one), and cupy's
        export holds the array.  So the sign is the allocation pattern: an idle allocation lent
        for one request only (and never given again) when a new one appears, whatever the
        sizes of the two -- batches of variable size make a new allocation of another size each
        time, and a buffer used again is found in the table, never new."""
        given = None if tensor.origin is None else tensor.origin()
        if given is not None and any(ref() is given for ref in self._recent):
            self._fresh_per_request = False  # a tensor given again: the caller reuses its buffers
            return False, True
        for key, entry in list(self._entries.items()):
            if entry.users == 0 and entry.lent == 1 and not entry.reused and entry.extent.name is not None:
                # Holding it keeps its memory from the caller's allocator, which then makes a
                # new segment for each request: let go of it, and copy such tensors from now on
                # (its tensor given again after all is lent again: the caller reuses it).
                self._remove(key)
                self._stats.evictions += 1
                self._fresh_per_request = True
                if entry.origin is not None:
                    self._recent.append(entry.origin)
        if not self._fresh_per_request:
            return False, False
        if tensor.origin is not None:
            self._recent.append(tensor.origin)
        return True, False

    # -- the table -------------------------------------------------------

    def _make_room(self, nbytes: int) -> bool:
        """Evict idle, cold entries (least recently used first) until *nbytes* more fit beside
        the table's; False when they cannot.  Under the lock.  (The evicted ones' bytes come
        back once they are dropped: :attr:`budget` decides then.)"""
        if nbytes > self.max_bytes:
            return False
        cold_before = time.monotonic() - self.cold_seconds
        while len(self._entries) >= self.max_entries or self._nbytes + nbytes > self.max_bytes:
            victim = next((key for key, e in self._entries.items()
                           if e.users == 0 and e.extent.name is not None and e.last_used <= cold_before), None)
            if victim is None:
                return False
            self._remove(victim)
            self._stats.evictions += 1
        return True

    def _remove(self, key: tuple[int, int]) -> None:
        """Take an entry out of the table (under the lock): unused, to the disposals; named
        by requests, doomed (to the disposals when the last one finishes)."""
        entry = self._entries.pop(key)
        self._nbytes -= entry.extent.memory.nbytes
        if entry.users:
            self._doomed.append(entry)
        else:
            self._disposals.append(entry.extent)
            self._letting_go.notice()

    def _forget_failed(self, key: tuple[int, int], entry: _Entry, exc: BaseException) -> bool:
        """A registration that failed with *exc*: out of the table (or of the doomed), its
        borrowed region closed -- except where the call was cut rather than answered (a
        deadline, a lost connection, a closed client's channel): the server may have registered
        it all the same, so its name is unregistered before the memory goes (held for the server,
        :meth:`~._disposal.Disposals.hold_for_the_server`, once the client closed).  Returns
        whether the client closed."""
        with self._lock:
            if self._entries.get(key) is entry:
                self._entries.pop(key)
                self._nbytes -= entry.extent.memory.nbytes
            elif entry in self._doomed:  # taken out of the table (forget(), closing) meanwhile
                self._doomed.remove(entry)
            closed = self._closed
        # A registration of unknown outcome (cut short: a channel closed under it, a deadline, a
        # lost connection) may have been carried out all the same (errors.OUTCOMES): its memory is
        # let go of only once its name is unregistered -- held for the server if the client
        # closed, else dropped as the table drops an allocation (parked while the server refuses).
        if outcome_of(exc) is not Outcome.UNKNOWN:
            entry.extent.release_memory()
            return closed
        entry.extent.name = entry.extent.memory.registration_name
        if closed:
            self._letting_go.hold_for_the_server(entry.extent)
        else:
            with self._lock:
                self._disposals.append(entry.extent)
            self._letting_go.notice()
        return closed

    def _unregister_late_steps(self, extent: Extent, name: str) -> Steps:
        """Unregister (*name*), then let go of, an allocation whose registration's reply came
        after the client closed.  Its closing has let go of the rest: an allocation the server
        does not let go of now (refused, or the closed client's connection is gone) is held for
        the server as the closing client's own refused memory is, never freed under it
        (:meth:`~._disposal.Disposals.hold_for_the_server`)."""
        try:
            yield Unregister(name)
        except ServerError:
            self._letting_go.hold_for_the_server(extent)
            return
        except GeneratorExit:  # (aio: cancelled while the Unregister was out; its outcome unknown)
            self._letting_go.hold_for_the_server(extent)
            raise
        extent.release_memory()

    def drop_steps(self, extents: list[Extent]) -> Steps:
        """Unregister, then let go of, extents out of the table (parked where the server refuses)."""
        return self._letting_go.drop_all_steps(extents)

    def has_disposals(self) -> bool:
        """Whether allocations out of the table wait to be unregistered and let go."""
        return bool(self._disposals)

    def take_disposals(self) -> list[Extent]:
        """The extents to drop now (the caller drops them: :meth:`drop_steps`)."""
        with self._lock:
            taken, self._disposals = self._disposals, []
        return taken

    def forget(self, in_use_too: bool = False) -> list[Extent]:
        """Every allocation out of the table: the idle ones to drop now (returned), the ones
        requests still name once they finish -- or, *in_use_too* (a closing client that stopped
        waiting for its requests), now as well: the server refuses to unregister what a request
        still uses, so those are parked, held, until it lets go of them.

        The client's cached result blocks (:attr:`results`) are let go of too.

        *in_use_too* closes the table: nothing is lent from it any more.  A registration still
        on its way then has no name to unregister yet: it is left to the lend steps awaiting its
        reply, which unregister it when it comes (its memory held until then: dropping it now
        would close it unnamed, with no unregister, while the server may map it)."""
        self.results.clear(close=in_use_too)  # (cached result blocks: freed as their last results go)
        with self._lock:
            for key in list(self._entries):
                self._remove(key)
            if in_use_too:
                self._closed = True
                named = [entry for entry in self._doomed if entry.extent.name is not None]
                self._disposals.extend(entry.extent for entry in named)
                self._doomed = [entry for entry in self._doomed if entry.extent.name is None]
        return self.take_disposals()

    def healing(self) -> list[Extent]:
        """The registered allocations' extents, to register again after a server restart, each
        held -- one user more, as a request that names it -- until :meth:`healed`: another
        thread that lets go of one meanwhile (evicts it, forgets it) leaves it doomed, to be
        unregistered only once this registration is over, never closed under it."""
        with self._lock:
            entries = [e for e in self._entries.values() if e.extent.name is not None]
            for entry in entries:
                entry.users += 1
            return [entry.extent for entry in entries]

    def healed(self, extents: list[Extent]) -> None:
        """The registrations :meth:`healing` held for are over."""
        with self._lock:
            for extent in extents:
                self._one_user_less(extent)

    # -- what users see --------------------------------------------------

    def snapshot(self) -> list[LentInfo]:
        """The allocations registered now."""
        with self._lock:
            return [LentInfo(e.extent.name, key[0], key[1], e.extent.memory.nbytes, e.users, e.lent)
                    for key, e in self._entries.items()]

    def stats(self) -> LentStats:
        """A copy of the counters, with the table's size now."""
        with self._lock:
            return dataclasses.replace(self._stats, copied=dict(self._stats.copied),
                                       allocations=len(self._entries), nbytes=self._nbytes)

    def count_abandoned(self) -> None:
        """Count a request the client gave up on before the server answered."""
        with self._lock:
            self._stats.abandoned += 1
