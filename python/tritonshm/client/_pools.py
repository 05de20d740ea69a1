"""A client's slot pools: the table of pools by model, version and memory -- find, make, grow,
retire, lease, the byte budget they share (``max_pool_bytes``) -- and the lookup of a tensor that
is a view of one of our own slots.  Sans-I/O: its steps (:mod:`._steps`) are run by a driver.

Single flight: a pool is put in service *before* its first extent is registered, so a burst of
cold requests makes one pool, not one per request (see :meth:`PoolTable.pool_steps`).  What the
server refuses is the fallback's to judge (:class:`~._fallback.Fallback`); what is let go of is
let go of the client's one way (:class:`~._disposal.Disposals`).

Host slots live in /dev/shm, which the server shares and which is often small (Docker's default
is 64 MiB): a pool starts with the slots /dev/shm has room for (:func:`~._pool.slots_with_room`,
read with ``statvfs``, a hint) and grows as room allows; a request with no room for one slot goes
on the wire.  The kernel's ENOSPC (another process was quicker) is read the same way.
"""

from __future__ import annotations

import errno
import functools
import threading
import time
import warnings
from typing import Callable, Mapping, TypeGuard

from .. import _segments
from .._units import in_units, nbytes_text
from ..errors import (InvalidOption, Outcome, PoolExhausted, ServerError, SharedMemoryOSError, SharedMemoryRefused,
                      os_error, outcome_of)
from . import _devices, _intake
from ._devices import DeviceTensor
from ._disposal import Disposals
from ._fallback import Fallback, Next
from ._lent import Lent
from ._model import ModelInfo
from ._pool import ByteBudget, Layout, Lease, PoolInfo, SlotPool, slots_with_room
from ._slots import SYSTEM, CudaSlotMemory, PinnedSlotMemory, SlotKind, SlotMemory, SystemSlotMemory
from ._steps import Pause, Register, Steps, WaitForSlot

__all__ = ["PoolTable", "host_memory"]

_BUDGET_POLL = 0.005  # how often a request waiting for max_pool_bytes room looks again


def host_memory(pinned: bool | int) -> Callable[[int], SlotMemory]:
    """What host slot pools are made of: plain segments, or page-locked ones
    (``pinned=True`` for device 0's context, or a device number)."""
    if pinned is False:
        return SystemSlotMemory
    device = 0 if pinned is True else pinned
    if isinstance(device, bool) or not isinstance(device, int) or device < 0:
        raise InvalidOption(f"pinned must be True, False or a CUDA device number, not {pinned!r}")
    _devices.require_cuda("pinned=True (page-locking slots)")
    return functools.partial(PinnedSlotMemory, device=device)


def _pool_over_budget(model: str, slots: int, slot_bytes: int, max_pool_bytes: int) -> str:
    """Why a pool of *slots* slots of *slot_bytes* cannot be had within *max_pool_bytes*, and the
    setting that would change that: only max_pool_bytes where one slot alone is over it."""
    slot = (f"a slot of model {model!r} (room for one request's inputs and outputs) is "
            f"{nbytes_text(slot_bytes)}")
    if slot_bytes > max_pool_bytes:
        return (f"{slot}, more than the client's max_pool_bytes={max_pool_bytes} ({in_units(max_pool_bytes)}) on "
                f"its own: make the client with max_pool_bytes={slot_bytes} or more (fewer slots would not help)")
    pool = slots * slot_bytes
    return (f"{slot}; slots={slots} of them need {nbytes_text(pool)}, more than the client's "
            f"max_pool_bytes={max_pool_bytes} ({in_units(max_pool_bytes)}): make the client with "
            f"slots={max_pool_bytes // slot_bytes} "
            f"(what fits) or max_pool_bytes={pool} or more")


def _no_room(exc: BaseException) -> TypeGuard[SharedMemoryOSError]:
    """Whether *exc* is the kernel saying /dev/shm has no room for slot memory (ENOSPC: the
    C core reserves a segment's pages as it makes it, so a full /dev/shm says so there)."""
    return isinstance(exc, SharedMemoryOSError) and exc.errno == errno.ENOSPC


class PoolTable:
    """One client's slot pools (see the module), the only writer of the table.

    *slots* is how many slots a pool starts with (fewer where /dev/shm has little room);
    *max_pool_bytes* bounds every pool's extents together, at every instant (:attr:`budget`);
    *host_memory* makes host slots (:func:`host_memory`), *pinned_host* says whether they are
    page-locked already (then CUDA slots the server refuses become plain host slots); *lock* is
    the engine's; *check_open* raises once the client closed.
    """

    def __init__(self, slots: int, max_pool_bytes: int, host_memory: Callable[[int], SlotMemory], pinned_host: bool,
                 fallback: Fallback, disposals: Disposals, lock: threading.RLock, check_open: Callable[[], None]):
        self.slots = slots
        self.max_pool_bytes = max_pool_bytes
        self.budget = ByteBudget(max_pool_bytes)  # every pool's extents together, at every instant
        self._host_memory = host_memory
        self._pinned_host = pinned_host
        self._fallback = fallback
        self._disposals = disposals
        self._lock = lock
        self._check_open = check_open
        self._pools: dict[tuple[str, str, SlotKind], SlotPool] = {}   # by model, version and slot kind
        self._retired: set[SlotPool] = set()
        self._needs_by_shapes: dict[tuple, dict[str, int]] = {}   # slot needs by model and input shapes

    def get(self, key: tuple[str, str, SlotKind]) -> SlotPool | None:
        """The pool in service for (model, version, kind), if any (no I/O, no lock: a dict read)."""
        return self._pools.get(key)

    def in_service(self) -> list[SlotPool]:
        """The pools in service and those retired but not yet dropped."""
        with self._lock:
            return [*self._pools.values(), *self._retired]

    @property
    def lingering(self) -> bool:
        """Whether memory stays to be let go of later: a retired pool not yet drained, parked
        extents, or extents held for the server (asked about again when due)."""
        return bool(self._retired) or bool(self._disposals.parked) or self._disposals.proving

    def has_disposals(self) -> bool:
        """Whether a pool has idle surplus or extents held for the server to ask about, a retired
        pool is waiting to be dropped, or parked (or held) memory is due to be asked about again."""
        return bool(self._retired) or self._disposals.due() \
            or any(pool.has_surplus or pool.has_provable for pool in list(self._pools.values()))

    def dispose_steps(self) -> Steps:
        """Unregister and close idle surplus extents and drained retired pools (and ask again about
        parked memory, when due: it holds pool bytes too)."""
        yield from self._disposals.retry_steps(when_due=True)
        for pool in self.in_service():
            self._disposals.prove(pool.take_provable())
            yield from self._disposals.drop_all_steps(pool.take_disposals())
            if pool.closed:
                with self._lock:
                    self._retired.discard(pool)
        yield from self._disposals.prove_steps()

    def close_steps(self) -> Steps:
        """Empty the table now (every pool out of service), then the steps that unregister and
        close all the pools held."""
        with self._lock:
            doomed = [*self._pools.values(), *self._retired]
            self._pools.clear()
            self._retired.clear()
        return self._disposals.drop_all_steps([extent for pool in doomed for extent in pool.close()])

    def _memory_for(self, kind: SlotKind) -> Callable[[int], SlotMemory]:
        """Makes the memory of slots of *kind*."""
        if kind == SYSTEM:
            return self._host_memory
        device = kind.device
        assert device is not None, "pinned and CUDA slots are on a GPU"
        if kind.name == "pinned":
            return functools.partial(PinnedSlotMemory, device=device)
        return functools.partial(CudaSlotMemory, device=device)

    def memory_after_refusal(self, kind: SlotKind) -> SlotKind:
        """*kind*, or the host memory that replaces CUDA slots the server cannot open."""
        if not (self._fallback.cuda_refused and kind.on_gpu) or kind.device is None:
            return kind
        return SYSTEM if self._pinned_host else SlotKind.pinned(kind.device)

    def _free_bytes(self, kind: SlotKind) -> int | None:
        """Bytes free where slots of *kind* are made, for :func:`slots_with_room`: in /dev/shm for
        host memory, less what this client's pools hold or are making there (the server needs
        room for their requests too: each pool taking half of what the others left would take
        it all); None for device memory, which /dev/shm does not hold, or where it is unknown."""
        if kind.on_gpu:
            return None
        space = _segments.space()
        if space is None:
            return None
        # (list(): taken at once, no lock -- a pool's should_grow() asks this under its own lock)
        held = sum(pool.dev_shm_bytes for pool in [*list(self._pools.values()), *list(self._retired)])
        return max(space.free - held, 0)

    def _room(self, kind: SlotKind, nbytes: int) -> bool:
        """Whether an extent of *nbytes* of *kind* may be made now (see :func:`slots_with_room`)."""
        return slots_with_room(nbytes, 1, self._free_bytes(kind)) == 1

    def _wire_for_no_room(self, info: ModelInfo, slot_bytes: int, strict: bool, cause: str = "") -> bool:
        """/dev/shm has no room for a slot of *slot_bytes* (*cause*: the kernel's words, where it
        said so): True when this request goes on the wire (the client's one warning given), False
        when the transport or the caller insists on shared memory (the caller raises)."""
        space = _segments.space()
        where = "/dev/shm" if space is None else f"/dev/shm ({in_units(space.size)}, {in_units(space.free)} free)"
        why = (f"{where} has no room for a slot of model {info.name!r} ({in_units(slot_bytes)}: one request's "
               f"inputs and outputs, and as much again left for the server){cause}; in Docker, /dev/shm is "
               f"64 MiB unless the container is started with --shm-size (e.g. --shm-size=1g) or --ipc=host")
        step = self._fallback.no_room(why, strict)
        if step.next is Next.RAISE:
            return False
        if step.warning is not None:
            warnings.warn(step.warning, RuntimeWarning, stacklevel=3)
        return True

    def pool_steps(self, info: ModelInfo, needs: Mapping[str, int], kind: SlotKind,
                    strict: bool = False, deadline: float | None = None) -> Steps:
        """The model's pool of slots of *kind*, made or replaced by a larger one to fit
        *needs*; None for the wire.  Where the server cannot open CUDA slots, host
        slots serve (and plain gRPC/HTTP where it cannot open those), each with one
        warning, unless the transport (or *strict*) says to raise instead.

        Host slots are made in /dev/shm: a pool starts with as many of the client's *slots*
        as it has room for (:func:`slots_with_room`), after letting go of a pool this one
        replaces where that makes the room; where not one slot has room (or the kernel says
        ENOSPC), this request goes on the wire, with one warning in the client's life (the
        transport, or *strict*, may say to raise instead), and the next one looks again.

        Single flight: a pool is put in service *before* its first extent is
        registered, marked as growing, so concurrent requests that need it
        find it and wait for its first slots (:meth:`SlotPool.wait`) instead
        of each making and registering a pool of their own -- a burst of cold
        requests makes one pool, not one per request.  A creator that fails
        or is cancelled takes the pool out of service again (retiring it
        wakes the waiters; the next of them makes it).  A pool whose first
        extent does not fit in the client's budget (``max_pool_bytes``, every
        pool together) is made only once it does, until *deadline*.
        """
        looked_again = False
        while True:
            if self._fallback.wire:
                return None
            if not strict:
                kind = self.memory_after_refusal(kind)
            key = (info.name, info.version, kind)
            with self._lock:
                self._check_open()
                old = self._pools.get(key)
                if old is not None and old.layout.fits(needs):
                    return old  # in service, or being made: its slots come with its first extent
                layout = Layout.for_capacities(needs) if old is None else old.layout.grown(needs)
                if layout.slot_bytes * self.slots > self.max_pool_bytes:
                    raise InvalidOption(_pool_over_budget(info.name, self.slots, layout.slot_bytes,
                                                          self.max_pool_bytes))
                free = self._free_bytes(kind)
                slots = slots_with_room(layout.slot_bytes, self.slots, free)
                if slots:
                    pool = SlotPool(info, layout, slots, self.budget, self._memory_for(kind), self._disposals.notice,
                                    wanted=self.slots, room=functools.partial(self._room, kind),
                                    in_dev_shm=not kind.on_gpu)
                    fits = self.budget.fits(pool.extent_bytes)
                    # In service at once, fitting the budget or not: the model's requests that it
                    # fits wait for its first slots -- not each making a pool of the old size that
                    # takes back the bytes this one waits for (the old one drains meanwhile).
                    pool.claim_first_extent()
                    self._pools[key] = pool
                    if old is not None:
                        self._retire(old)
            if not slots:
                assert free is not None
                # What the pool this one replaces holds, or retired pools, may make the room: once.
                # (Letting go of the old pool gives its bytes back to /dev/shm, and takes them off
                # what the client holds there: twice its bytes in *free*'s terms.)
                making_room = old if old is not None and slots_with_room(
                    layout.slot_bytes, 1, free + 2 * old.dev_shm_bytes) else None
                if not looked_again and (making_room is not None or self._retired):
                    looked_again = True
                    if making_room is not None:
                        with self._lock:
                            if self._pools.get(key) is making_room:
                                del self._pools[key]
                                self._retire(making_room)
                    yield from self.dispose_steps()  # drops what drained
                    continue
                if self._wire_for_no_room(info, layout.slot_bytes, strict):
                    return None
                raise os_error(errno.ENOSPC, f"a slot of model {info.name!r} ({in_units(layout.slot_bytes)}, and "
                                             f"as much again left for the server) has no room in /dev/shm")
            if not fits:  # its bytes come back as the pool it replaces drains, or others let go
                try:
                    yield from self._budget_steps(pool.extent_bytes, deadline, info)
                except BaseException:
                    self._take_out_of_service(key, pool)  # (its waiters wake, and make it themselves)
                    raise
            try:
                extent = yield from self._register_extent_steps(pool)
                if extent is None:  # another pool took the bytes meanwhile: wait for them
                    self._take_out_of_service(key, pool)
                    yield from self._budget_steps(pool.extent_bytes, deadline, info)
                    continue
            except BaseException as exc:
                self._take_out_of_service(key, pool)
                if _no_room(exc):  # statvfs was only a hint: another process was quicker
                    if self._wire_for_no_room(info, layout.slot_bytes, strict, " (the kernel said ENOSPC)"):
                        return None
                    raise
                if not isinstance(exc, SharedMemoryRefused):
                    raise
                step = self.refused(kind.on_gpu, exc, strict)
                if step is Next.RAISE:
                    raise
                if step is Next.HOST:
                    continue
                return None
            added = pool.add_extent(extent)
            pool.stop_growing()
            if not added:  # close() has taken the pool meanwhile: nobody else will unregister it
                yield from self._disposals.drop_steps(extent)
                self._check_open()
            return pool  # retired meanwhile (a larger one replaced it)? the caller looks again


    def _retire(self, pool: SlotPool) -> None:
        """*pool* out of service (under the lock): it drains, then it is dropped."""
        self._retired.add(pool)
        pool.retire()
        self._disposals.notice()

    def retire_model(self, model: str) -> None:
        """Retire every pool of *model* (its layout is of a model that changed): each drains,
        then it is let go of; the next request makes a pool for the model as it is now (and
        works out its needs again)."""
        with self._lock:
            for key, pool in list(self._pools.items()):
                if key[0] == model:
                    del self._pools[key]
                    self._retire(pool)
            self._needs_by_shapes = {key: needs for key, needs in self._needs_by_shapes.items() if key[0] != model}

    def stop_leasing(self) -> None:
        """Every pool out of service now (a client closing without waiting for its requests):
        the requests waiting for a slot wake, and find the client closed; what the pools hold
        is let go of as :meth:`close_steps` says."""
        with self._lock:
            for pool in self._pools.values():
                self._retire(pool)
            self._pools.clear()

    def refused(self, on_gpu: bool, refusal: SharedMemoryRefused, strict: bool) -> Next:
        """The server refused slot memory of ours (*on_gpu*: CUDA slots), as a pool registered
        it or as a request registered it again after a restart: the client steps down
        (:meth:`~._fallback.Fallback.refused`; *strict*: the caller insists on it), warning once
        in its life for each step; what the request does next."""
        # The state steps before the warning (warnings may be errors); concurrent requests may
        # each be refused: the first one to report it warns.
        step = self._fallback.refused(on_gpu, str(refusal), strict)
        if step.next is not Next.RAISE and step.warning is not None:
            warnings.warn(step.warning, RuntimeWarning, stacklevel=3)
        return step.next

    def retire(self, pool: SlotPool) -> None:
        """*pool* out of service, where it still is (the server cannot open its memory): it
        drains, then it is let go of."""
        with self._lock:
            for key, serving in list(self._pools.items()):
                if serving is pool:
                    del self._pools[key]
                    self._retire(pool)

    def _take_out_of_service(self, key: tuple[str, str, SlotKind], pool: SlotPool) -> None:
        """A pool whose first extent could not be made: out of the pools, its waiters woken."""
        with self._lock:
            if self._pools.get(key) is pool:
                del self._pools[key]
        pool.retire()
        pool.stop_growing()


    def _register_extent_steps(self, pool: SlotPool) -> Steps:
        """A new registered extent for *pool* (not yet in service); None when its bytes
        do not fit in the client's budget now."""
        extent = pool.new_extent()
        if extent is None:
            return None
        try:
            extent.name = yield Register(extent.memory)
        except ServerError as exc:
            if outcome_of(exc) is not Outcome.UNKNOWN:
                extent.release_memory()
                raise
            # Cut off (a deadline, a lost connection): the server may have registered it all the
            # same -- unregistered before its memory goes, as any extent is let go of.
            extent.name = extent.memory.registration_name
            yield from self._disposals.drop_steps(extent)
            raise exc
        except BaseException:
            extent.release_memory()
            raise
        return extent


    def _budget_steps(self, nbytes: int, deadline: float | None, info: ModelInfo) -> Steps:
        """Wait until *nbytes* more fit in the client's budget (dropping what is due
        meanwhile: drained retired pools, idle surplus, parked memory the server let
        go of); :class:`PoolExhausted`, with the numbers, at *deadline*."""
        while not self.budget.fits(nbytes):
            if self.has_disposals():  # (a retired pool whose slots are kept stays a disposal)
                yield from self.dispose_steps()
                if self.budget.fits(nbytes):
                    break
            if deadline is not None and time.monotonic() >= deadline:
                with self._lock:
                    pools = [f"{key[0]!r} ({key[2]}): {pool.nbytes}" for key, pool in self._pools.items()]
                raise PoolExhausted(
                    f"model {info.name!r} needs {nbytes_text(nbytes)} of slot memory, but this client holds "
                    f"{nbytes_text(self.budget.used)} of max_pool_bytes={self.budget.limit} (pools: "
                    f"{', '.join(pools) or 'none'}; the rest retired, waiting for their slots or "
                    f"views to come back): raise max_pool_bytes, or drop results you keep")
            yield Pause(_BUDGET_POLL)


    def lease_now(self, info: ModelInfo, needs: Mapping[str, int], kind: SlotKind, hold: bool,
                  spare: int = 0) -> Lease | None:
        """The usual case of :meth:`lease_steps`, with no steps at all: a free slot of the pool
        in service that fits *needs*, leaving *spare* free ones; None when there is none (then
        take the steps)."""
        pool = self._pools.get((info.name, info.version, kind))
        if pool is not None and pool.layout.fits(needs):
            return pool.try_acquire(hold, spare)
        return None

    def lease_steps(self, info: ModelInfo, needs: Mapping[str, int], timeout: float | None,
                     hold: bool, kind: SlotKind = SYSTEM, strict: bool = False) -> Steps:
        """A leased slot of *kind* that fits *needs* (None for the wire),
        growing the pool instead of waiting when the busy slots are only held by
        views.  *hold*: see :meth:`SlotPool.try_acquire`; *strict*: no fallback."""
        lease = self.lease_now(info, needs, kind, hold)
        if lease is not None:
            return lease
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            pool = yield from self.pool_steps(info, needs, kind, strict, deadline)
            if pool is None:
                return None
            lease = pool.try_acquire(hold)
            if lease is not None:
                return lease
            if pool.retired:
                continue  # a larger pool replaced it meanwhile
            if pool.start_growing():
                try:
                    extent = yield from self._register_extent_steps(pool)
                except SharedMemoryOSError as exc:
                    if not _no_room(exc):
                        raise
                    extent = None  # another process took /dev/shm's room meanwhile
                finally:
                    pool.stop_growing()
                if extent is not None and not pool.add_extent(extent):  # the client closed meanwhile
                    yield from self._disposals.drop_steps(extent)
                    self._check_open()
                if extent is not None:
                    continue  # else another pool took the bytes (or the room) meanwhile: wait for a slot
            if pool.has_provable or self._disposals.due():  # slots held for the server: ask it about them
                yield from self.dispose_steps()
                if pool.ready():
                    continue  # the server let go of slots, and they are free: no wake-up comes for them
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise pool.exhausted(timeout)
            yield WaitForSlot(pool, pool.wait_slice(left))


    def needs(self, info: ModelInfo, shapes: Mapping[str, tuple[int, ...]],
               bytes_sizes: Mapping[str, int]) -> dict[str, int]:
        """:func:`_intake.slot_needs`, remembered per model and input shapes."""
        if bytes_sizes:
            return _intake.slot_needs(info, shapes, bytes_sizes)  # varies with the strings
        key = (info.name, info.version, tuple(shapes.items()))
        needs = self._needs_by_shapes.get(key)
        if needs is None:
            if len(self._needs_by_shapes) > 1024:  # many distinct variable shapes: start over
                self._needs_by_shapes.clear()
            needs = self._needs_by_shapes[key] = _intake.slot_needs(info, shapes, bytes_sizes)
        return needs


    def outgrown(self, info: ModelInfo, shapes: Mapping[str, tuple[int, ...]], output: str,
                 needed: int) -> dict[str, int]:
        """A request of these input *shapes* made *output* larger than its room (*needed* bytes):
        what its slot must hold from now on, kept as :meth:`needs` for requests of these shapes --
        which then start on a slot that large, or on the wire where that has no room, not on a
        slot they outgrow (the model run twice, every request)."""
        key = (info.name, info.version, tuple(shapes.items()))
        needs = self._needs_by_shapes.get(key)
        if needs is None:
            needs = _intake.slot_needs(info, shapes, {})
        grown = {**needs, output: max(needs.get(output, 0), needed)}
        self._needs_by_shapes[key] = grown
        return grown

    def snapshot(self) -> list[PoolInfo]:
        """What this client holds now: one snapshot per slot pool in service
        (model, version, the memory its slots are in, slots running and held,
        registered bytes and region names).  No I/O."""
        with self._lock:
            return [pool.snapshot(str(kind)) for (_, _, kind), pool in self._pools.items()]


    def own_slot(self, tensor: DeviceTensor) -> Lent | None:
        """Where *tensor* is when it is a view of one of this client's own CUDA slots (a result
        kept with ``copy=False``, a zero-copy request's input): in an extent registered already,
        kept alive by the view for as long as the request holds it -- never held by the lent
        table, which would keep the slot out of its pool."""
        if not self._pools and not self._retired:
            return None
        ptr = tensor.source.ptr + tensor.offset
        for pool in self.in_service():
            for extent in pool.extents:
                memory = extent.memory
                if memory.kind != "cuda" or memory.device != tensor.device or extent.name is None or memory.closed:
                    continue
                region = memory.region
                if region.ptr <= ptr and ptr + tensor.nbytes <= region.ptr + region.nbytes:
                    return Lent(extent, extent.name, ptr - region.ptr, tensor.nbytes)
        return None

