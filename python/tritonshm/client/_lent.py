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
otherwise costs two driver calls (``cuMemGetAddressRange`` and
``cudaIpcGetMemHandle``, a few microseconds: a handle that changed at a
known base means the old allocation was freed and a new one made there,
whose stale registration goes first -- a server keeps the old mapping open
and refuses the new handle at that address).

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

Memory CUDA IPC cannot export (``cudaMallocAsync`` pools, expandable
segments, managed memory), a table with no room, or a server that cannot
open CUDA memory: the tensor is copied through a CUDA slot as before, and
:meth:`~LentAllocations.stats` says how many and why.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import NamedTuple

from .._memory._cuda_region import CudaRegion
from ..errors import NotShareable, RegistrationError, SharedMemoryRefused
from ._devices import DeviceTensor
from ._disposal import drop_extents_steps
from ._pool import ByteBudget, Extent
from ._slots import RegisteredMemory
from ._steps import Pause, Register, Steps

__all__ = ["Lent", "LentAllocations", "LentInfo", "LentMemory", "LentStats"]

_REGISTER_POLL = 0.0005  # how often a request waits for another's registration of the same allocation
MAX_LENT_ENTRIES = 32    # allocations registered at most, whatever their size


class LentMemory(RegisteredMemory):
    """A lent allocation (a borrowed :class:`~tritonshm.CudaRegion`) as the engine registers it."""

    kind = "cuda"

    def __init__(self, region: CudaRegion):
        self.region = region
        self.device = region.device

    @property
    def nbytes(self) -> int:
        """Size of the allocation in bytes."""
        return self.region.nbytes


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
    device: int
    base: int           #: device address of the allocation
    nbytes: int         #: its size (what the server maps)
    in_use: int         #: requests naming it now
    lent: int           #: tensors lent from it so far


@dataclasses.dataclass
class LentStats:
    """How the client's GPU tensors travelled (counted since the client was made)."""

    inputs_lent: int = 0       #: GPU inputs sent by reference
    outputs_lent: int = 0      #: outputs the server wrote straight into the caller's tensors (``out=``)
    copied: dict[str, int] = dataclasses.field(default_factory=dict)  #: GPU tensors copied, by reason
    registrations: int = 0     #: allocations registered
    evictions: int = 0         #: allocations let go to stay within the bounds
    allocations: int = 0       #: allocations registered now
    nbytes: int = 0            #: their bytes


class _Entry:
    __slots__ = ("extent", "handle", "users", "last_used", "lent")

    def __init__(self, extent: Extent, handle: bytes):
        self.extent = extent
        self.handle = handle
        self.users = 1
        self.last_used = time.monotonic()
        self.lent = 1


class LentAllocations:
    """The caller's allocations this client registered, by device and base (see the module).

    *max_bytes* and *max_entries* bound them together, at every instant;
    *creator_pid* and *parked* are the engine's (a forked child unregisters
    nothing; what the server refuses to let go of is parked with the slots').
    """

    #: An idle allocation unused for this long may make room for a new one; a younger one may
    #: not: the new tensor is copied instead (no registration churn for fresh allocations).
    cold_seconds = 1.0

    def __init__(self, max_bytes: int, creator_pid: int, parked: list[Extent],
                 max_entries: int = MAX_LENT_ENTRIES):
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._creator_pid = creator_pid
        self._parked = parked
        #: Bytes of every allocation the table holds -- registered, being registered, let go of
        #: but not yet unregistered, parked -- never over *max_bytes*, at any instant.
        self.budget = ByteBudget(max_bytes)
        self._lock = threading.Lock()
        self._entries: collections.OrderedDict[tuple[int, int], _Entry] = collections.OrderedDict()
        self._nbytes = 0                  # of the entries in the table
        self._disposals: list[Extent] = []  # out of the table and unused: to unregister, then let go
        self._doomed: list[_Entry] = []   # out of the table, still named by requests
        self._stats = LentStats()
        self.refused: str | None = None   # why the server cannot open lent memory (then: copies)

    # -- lending ---------------------------------------------------------

    def lend_steps(self, tensor: DeviceTensor) -> Steps:
        """*tensor*'s allocation registered (now, or before): its :class:`Lent`, which the
        request hands back to :meth:`finished`; None where it must be copied instead."""
        if self.refused is not None:
            return self._copied("the server cannot open CUDA memory")
        source = tensor.source
        try:
            region = CudaRegion.borrow(source)
        except NotShareable:
            return self._copied("not shareable (pool, virtual or managed memory)")
        offset = source.ptr + tensor.offset - region.ptr
        if offset + tensor.nbytes > region.nbytes:  # a tensor is one allocation; a malformed one is not
            region.close()
            return self._copied("spans allocations")
        key = (region.device, region.ptr)
        handle = region.ipc_handle
        while True:
            full = False
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None and (entry.handle != handle or entry.extent.memory.nbytes != region.nbytes):
                    # A new allocation where a freed one was: its registration is stale, and the
                    # server, which still maps the old one there, would refuse the new handle.
                    self._remove(key)
                    entry = None
                if entry is not None and entry.extent.name is not None:
                    entry.users += 1
                    entry.lent += 1
                    entry.last_used = time.monotonic()
                    self._entries.move_to_end(key)
                    region.close()  # the entry's own region holds the allocation
                    return Lent(entry.extent, entry.extent.name, offset, tensor.nbytes)
                if entry is None:
                    if not self._make_room(region.nbytes):
                        full = True
                    elif not self._disposals:  # what was let go of is gone: its bytes are back
                        if self.budget.take(region.nbytes):
                            entry = _Entry(Extent(LentMemory(region), 0, self.budget, region.nbytes), handle)
                            self._entries[key] = entry
                            self._nbytes += region.nbytes
                            break
                        full = True  # bytes still held by allocations on their way out (in use, parked)
            if full:
                region.close()
                return self._copied("lent allocations at their bounds")
            if self.has_disposals():
                # What the table let go of (stale, evicted) goes first: unregistered, then its
                # bytes back -- the bound holds at every instant, and the server never maps a
                # new allocation where it still maps an old one.
                yield from self.drop_steps(self.take_disposals())
                continue
            yield Pause(_REGISTER_POLL)  # another request is registering it: wait for its name
            if self.refused is not None:  # ... and the server refused it
                region.close()
                return self._copied("the server cannot open CUDA memory")
        try:
            name = entry.extent.name = yield Register(entry.extent.memory)
        except (SharedMemoryRefused, RegistrationError) as exc:
            self._forget_failed(key, entry)
            if isinstance(exc, SharedMemoryRefused):
                self.refused = str(exc)
                return self._copied("the server cannot open CUDA memory")
            return self._copied("the server refused the allocation")
        except BaseException:
            self._forget_failed(key, entry)
            raise
        with self._lock:
            self._stats.registrations += 1
        return Lent(entry.extent, name, offset, tensor.nbytes)

    def finished(self, lent: Lent) -> None:
        """A request that named *lent* is over (answered, failed or cancelled)."""
        with self._lock:
            for entry in self._doomed:
                if entry.extent is lent.extent:
                    entry.users -= 1
                    if entry.users == 0:
                        self._doomed.remove(entry)
                        self._disposals.append(entry.extent)
                    return
            for entry in self._entries.values():
                if entry.extent is lent.extent:
                    entry.users -= 1
                    return

    def count(self, inputs: int = 0, outputs: int = 0) -> None:
        """Count tensors a request sent by reference."""
        with self._lock:
            self._stats.inputs_lent += inputs
            self._stats.outputs_lent += outputs

    def _copied(self, why: str) -> None:
        with self._lock:
            self._stats.copied[why] = self._stats.copied.get(why, 0) + 1
        return None

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

    def _forget_failed(self, key: tuple[int, int], entry: _Entry) -> None:
        """A registration that failed: out of the table, its borrowed region closed."""
        with self._lock:
            if self._entries.get(key) is entry:
                self._entries.pop(key)
                self._nbytes -= entry.extent.memory.nbytes
        entry.extent.release_memory()

    def drop_steps(self, extents: list[Extent]) -> Steps:
        """Unregister, then let go of, extents out of the table (parked where the server refuses)."""
        return drop_extents_steps(extents, self._creator_pid, self._parked)

    def has_disposals(self) -> bool:
        """Whether allocations out of the table wait to be unregistered and let go."""
        return bool(self._disposals)

    def take_disposals(self) -> list[Extent]:
        """The extents to drop now (the caller drops them: :meth:`drop_steps`)."""
        with self._lock:
            taken, self._disposals = self._disposals, []
        return taken

    def forget(self) -> list[Extent]:
        """Every allocation out of the table: the idle ones to drop now (returned), the ones
        requests still name once they finish."""
        with self._lock:
            for key in list(self._entries):
                self._remove(key)
        return self.take_disposals()

    def extents(self) -> list[Extent]:
        """The registered allocations' extents (to register again after a server restart)."""
        with self._lock:
            return [e.extent for e in self._entries.values() if e.extent.name is not None]

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
