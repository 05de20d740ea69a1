"""Slot memory: the one interface between slot pools and the kind of memory under them.

A pool carves registered memory into slots and leases them out; what the
memory *is* -- a POSIX shared-memory segment (plain or page-locked), or a
CUDA allocation -- is hidden behind :class:`SlotMemory`, which knows how to

* **lease** a slot: hand out a handle whose lifetime holds the slot (views
  made through it keep it alive, so a slot returns to its pool only when
  every view of it is gone), and, where views can outlive every Python
  object (DLPack tensors held by torch), a **probe** that still sees them;
* **write** a tensor (numpy or a device input) into a slot, **view** one
  in place, and **copy one out** to the host or into a device array;
* **register** itself with a server and **bind** request tensors to itself.

Everything above (pools, request steps, the clients) goes through these
calls only, so a new kind of memory is one new class here.
"""

from __future__ import annotations

import abc
import concurrent.futures
import dataclasses
import math
import mmap
import os
from typing import Any, Mapping

import numpy as np

from .. import triton
from .._memory import SystemRegion
from .._memory._cuda_region import CudaRegion
from .._memory._pinned import PinnedRegion
from ._devices import DeviceTensor, copy_bytes

__all__ = ["SlotKind", "SYSTEM", "RegisteredMemory", "SlotMemory", "SystemSlotMemory", "PinnedSlotMemory", "CudaSlotMemory",
           "parallel_copy"]


@dataclasses.dataclass(frozen=True)
class SlotKind:
    """What a pool's slots are made of: ``system`` (POSIX shared memory: the client's
    host pools), ``pinned`` (host memory page-locked for a GPU) or ``cuda`` (device
    memory), the last two on *device*.  ``str()`` is what :class:`PoolInfo` reports:
    ``"system"``, ``"pinned:N"``, ``"cuda:N"``."""

    name: str
    device: int | None = None

    @classmethod
    def pinned(cls, device: int) -> "SlotKind":
        return cls("pinned", device)

    @classmethod
    def cuda(cls, device: int) -> "SlotKind":
        return cls("cuda", device)

    @property
    def on_gpu(self) -> bool:
        """Whether the slots are device memory (registered as CUDA shared memory)."""
        return self.name == "cuda"

    def __str__(self) -> str:
        return self.name if self.device is None else f"{self.name}:{self.device}"


SYSTEM = SlotKind("system")

# Below this many bytes one thread copies faster than several (thread hand-off
# costs ~20 us); above it the copy is bound by memory bandwidth per core.
# Measured on a 2-core VM (bench copy into a shared-memory slot, two threads
# against one): 0.73x at 4 MiB, 0.87x at 6, 0.95x at 8, 1.2-1.3x at 12, 1.4x at 16.
_PARALLEL_COPY_BYTES = 8 << 20
_COPY_THREADS = max(1, min(4, os.cpu_count() or 1))
_copy_pool: concurrent.futures.ThreadPoolExecutor | None = None


def parallel_copy(dst: np.ndarray, src: np.ndarray) -> None:
    """``np.copyto(dst, src, casting="no")``, split over a few threads when large.

    numpy releases the GIL while it copies plain numbers, so the parts run
    on several cores at once: a large copy is bound by one core's memory
    bandwidth (and, for fresh memory, its page faults), not the machine's.
    """
    nbytes = dst.nbytes
    if nbytes < _PARALLEL_COPY_BYTES or _COPY_THREADS == 1 or dst.dtype.hasobject \
            or not (dst.flags.c_contiguous and src.flags.c_contiguous) or dst.ndim == 0:
        np.copyto(dst, src, casting="no")
        return
    if src.dtype != dst.dtype or src.shape != dst.shape:
        np.copyto(dst, src, casting="no")  # raises the usual error, or broadcasts
        return
    global _copy_pool
    if _copy_pool is None:
        _copy_pool = concurrent.futures.ThreadPoolExecutor(_COPY_THREADS, "tritonshm-copy")
    flat_dst, flat_src = dst.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8)
    step = math.ceil(nbytes / _COPY_THREADS / 4096) * 4096  # page-sized parts
    parts = [(flat_dst[i:i + step], flat_src[i:i + step]) for i in range(step, nbytes, step)]
    futures = [_copy_pool.submit(np.copyto, d, s) for d, s in parts]
    np.copyto(flat_dst[:step], flat_src[:step])  # this thread does the first part
    for future in futures:
        future.result()


class RegisteredMemory:
    """One region the client registers with the server and names in requests: what the
    engine's :class:`~._steps.Register` step and the disposal steps (``close``) need of it.
    Slot memory is one; the caller's own GPU allocations, lent (:mod:`._lent`), another."""

    #: "system" or "cuda": the Triton extension the memory is registered with.
    kind: str
    #: The CUDA device the memory is on; None for host memory.
    device: int | None = None

    def register(self, client: Any, headers: Mapping[str, str] | None = None, timeout: float | None = None) -> Any:
        """Register with the server behind *client* (*headers* with the call; its answer awaited
        *timeout* seconds at most) under :attr:`registration_name`: the name (an awaitable for
        aio clients)."""
        return triton.register(client, self.region, headers=headers, timeout=timeout)

    def reregister(self, client: Any, name: str, headers: Mapping[str, str] | None = None,
                   timeout: float | None = None) -> Any:
        """Register again under *name* after the server forgot it."""
        return triton.register(client, self.region, name, headers=headers, timeout=timeout)

    @property
    def registration_name(self) -> str:
        """The name :meth:`register` registers under (what to unregister when whether it was
        registered is unknown: a call cut off)."""
        return triton.default_name(self.region)

    def bind_input(self, infer_input: Any, name: str, offset: int, nbytes: int) -> None:
        """Make *infer_input* read ``nbytes`` at *offset* (absolute) of this memory."""
        triton.bind_input(infer_input, self.region, offset, nbytes, name=name)

    def bind_output(self, requested_output: Any, name: str, offset: int, nbytes: int) -> None:
        """Make the server write *requested_output* into ``nbytes`` at *offset* (absolute)."""
        triton.bind_output(requested_output, self.region, offset, nbytes, name=name)

    def close(self) -> None:
        """Let go of the memory; live views keep what they use."""
        self.region.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run (nothing may be read or written through this any more)."""
        return self.region.closed

    region: Any


class SlotMemory(RegisteredMemory, abc.ABC):
    """Memory a slot pool carves into slots: one region, registered once."""

    @property
    @abc.abstractmethod
    def nbytes(self) -> int:
        """Size of the memory in bytes."""

    @abc.abstractmethod
    def lease(self, offset: int, nbytes: int) -> Any:
        """A handle on ``[offset, offset + nbytes)`` whose lifetime holds the slot.

        The pool watches it with a weak reference; views made through
        :meth:`view` keep it alive.
        """

    def probe(self, handle: Any) -> Any:
        """For memory whose views hold the slot natively (not through *handle*):
        an object whose ``holders`` falls to 1 once every view is gone; None
        when the handle's lifetime says it all."""
        return None

    @abc.abstractmethod
    def write(self, offset: int, array: Any, stream: Any = None) -> None:
        """Copy *array* (numpy or a :class:`DeviceTensor`) in at *offset*
        (within this memory; the caller holds the slot).  A copy to or from
        a GPU is queued on *stream* (the request's copy stream) where one is
        given, and lands once the caller has waited for it."""

    @abc.abstractmethod
    def view(self, handle: Any, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> Any:
        """A zero-copy view of a tensor at *offset* of the slot *handle*
        (from :meth:`lease`) covers; the view keeps the slot leased."""

    @abc.abstractmethod
    def bytes_at(self, offset: int, nbytes: int) -> memoryview:
        """A writable byte view of ``[offset, offset + nbytes)`` (serialized BYTES go there);
        it must not outlive the caller's hold on the slot."""

    @abc.abstractmethod
    def copy_out(self, offset: int, dtype: np.dtype, shape: tuple[int, ...], stream: Any = None) -> np.ndarray:
        """A fresh numpy copy of the tensor at *offset*, independent of this memory
        (from device memory: queued on *stream* where given, like :meth:`write`)."""

    @abc.abstractmethod
    def read_into(self, dst: Any, offset: int, nbytes: int, dst_offset: int = 0, stream: Any = None,
                  done: Any = None, then: Any = None) -> None:
        """Copy ``nbytes`` at *offset* into bytes ``dst_offset...`` of *dst*: a
        C-contiguous numpy array, or a device array (queued on *stream* where given; then
        the event *done* recorded after it, and the stream *then* made to wait for it)."""



class SystemSlotMemory(SlotMemory):
    """Slots in a POSIX shared-memory segment (a :class:`~tritonshm.SystemRegion`)."""

    kind = "system"

    def __init__(self, nbytes: int, region: Any = None):
        self.region = SystemRegion.create(nbytes) if region is None else region
        # One byte view of the whole region for the copies in and out: slicing
        # it costs a microsecond, a checked Window view ten.  Only views that
        # leave the request (view()) go through the slot's Window.
        self._bytes: np.ndarray = np.frombuffer(self.region, np.uint8)  # deleted by close()
        # Touch every page now, once: a request must never wait for the
        # kernel to fault in fresh shared memory (the copy-in would pay it).
        self._bytes[::mmap.PAGESIZE] = 0

    @property
    def nbytes(self) -> int:
        return self.region.nbytes

    def array_at(self, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """A numpy view of *shape* at *offset* (for copies in and out; it keeps the mapping)."""
        nbytes = math.prod(shape) * dtype.itemsize
        return self._bytes[offset:offset + nbytes].view(dtype).reshape(shape)

    def lease(self, offset: int, nbytes: int) -> Any:
        return self.region.window(offset, nbytes)

    def write(self, offset: int, array: np.ndarray | DeviceTensor, stream: Any = None) -> None:
        if isinstance(array, DeviceTensor):  # a GPU tensor into host slots: one device-to-host copy
            copy_bytes(self._bytes, array.source, array.nbytes, offset, array.offset, stream)
            return
        parallel_copy(self.array_at(offset, array.dtype, array.shape), array)

    def view(self, handle: Any, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        # The window's own ndarray() checks its arguments as public API must; these come from
        # the slot's layout, and numpy still refuses a view past the window's end.  A 1-D view
        # is frombuffer's own (reshaping it would only make another view object).
        flat = np.frombuffer(handle, dtype, math.prod(shape), offset)
        return flat if len(shape) == 1 else flat.reshape(shape)

    def bytes_at(self, offset: int, nbytes: int) -> memoryview:
        return self._bytes[offset:offset + nbytes].data

    def copy_out(self, offset: int, dtype: np.dtype, shape: tuple[int, ...], stream: Any = None) -> np.ndarray:
        source = self.array_at(offset, dtype, shape)
        if source.nbytes < _PARALLEL_COPY_BYTES:
            return source.copy()
        result = np.empty(shape, dtype)
        parallel_copy(result, source)
        return result

    def read_into(self, dst: Any, offset: int, nbytes: int, dst_offset: int = 0, stream: Any = None,
                  done: Any = None, then: Any = None) -> None:
        if isinstance(dst, np.ndarray):
            flat = dst.reshape(-1).view(np.uint8)
            parallel_copy(flat[dst_offset:dst_offset + nbytes], self._bytes[offset:offset + nbytes])
        else:
            copy_bytes(dst, self._bytes, nbytes, dst_offset, offset, stream, done, then)

    def close(self) -> None:
        self.__dict__.pop("_bytes", None)  # the view goes: the mapping can go with the region
        self.region.close()

    @property
    def closed(self) -> bool:
        return "_bytes" not in self.__dict__


class PinnedSlotMemory(SystemSlotMemory):
    """System slots page-locked for CUDA (a :class:`~tritonshm.PinnedRegion`).

    Registered with Triton as system shared memory like any segment; what the
    page-locking buys is speed for copies between these slots and a GPU
    (tensors moving in from, or results out to, device memory).
    """

    def __init__(self, nbytes: int, device: int = 0):
        super().__init__(nbytes, PinnedRegion.create(nbytes, device))


class CudaSlotMemory(SlotMemory):
    """Slots in device memory (a :class:`~tritonshm.CudaRegion`), registered as CUDA shared memory.

    A slot's lease is a :class:`~tritonshm.cuda.CudaWindow`; its views, and
    DLPack tensors made from them, count on the window natively (their
    deleters run in C, on any thread), so the pool watches a shared probe
    of the window rather than trusting the handle's lifetime alone.
    """

    kind = "cuda"

    def __init__(self, nbytes: int, device: int = 0):
        self.region = CudaRegion.create(nbytes, device)
        self.device = device

    @property
    def nbytes(self) -> int:
        return self.region.nbytes

    def lease(self, offset: int, nbytes: int) -> Any:
        return self.region.window(offset, nbytes)

    def probe(self, handle: Any) -> Any:
        return handle.share()

    def write(self, offset: int, array: np.ndarray | DeviceTensor, stream: Any = None) -> None:
        if isinstance(array, DeviceTensor):  # device to device, after the capture's event
            copy_bytes(self.region, array.source, array.nbytes, offset, array.offset, stream)
        elif array.flags.c_contiguous:  # read where it lands: the caller's array outlives the request's wait
            copy_bytes(self.region, array, array.nbytes, offset, 0, stream)
        else:  # CUDA may read pageable memory as the copy lands: a temporary made here is copied now
            copy_bytes(self.region, np.ascontiguousarray(array), array.nbytes, offset, 0)

    def view(self, handle: Any, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> Any:
        return handle.view(dtype, shape, offset)

    def bytes_at(self, offset: int, nbytes: int) -> memoryview:
        raise TypeError("BYTES tensors travel in host slots, never in CUDA ones")

    def copy_out(self, offset: int, dtype: np.dtype, shape: tuple[int, ...], stream: Any = None) -> np.ndarray:
        out = np.empty(shape, dtype)
        copy_bytes(out, self.region, out.nbytes, 0, offset, stream)
        return out

    def read_into(self, dst: Any, offset: int, nbytes: int, dst_offset: int = 0, stream: Any = None,
                  done: Any = None, then: Any = None) -> None:
        copy_bytes(dst, self.region, nbytes, dst_offset, offset, stream, done, then)
