"""Type stubs for tritonshm._memory._capture (Cython)."""

from types import TracebackType
from typing import Any

import numpy as np
from typing_extensions import Self

from ._stream import Event

__all__ = ["Capture", "capture", "capture_at", "describe"]

class Capture:
    """A device array as it was when :func:`capture` was called: its memory, and its work so far."""

    ptr: int
    """The device address of the captured array's first byte."""
    nbytes: int
    """The captured array's size in bytes."""
    device: int
    """The CUDA device the memory is on."""
    dtype: np.dtype[Any] | None
    """The array's numpy dtype (None for a dtype numpy lacks)."""
    shape: tuple[int, ...]
    """The array's shape."""
    readonly: bool
    """True when the producer exported the memory read-only."""
    event: Event
    """Recorded after the work the producer had queued on the array when it was captured."""
    stream: int
    """The stream :attr:`event` is recorded on: the producer's (0: the legacy default stream)."""
    buffer_id: int
    """The driver's id of the allocation holding it (``capture(pending=...)`` of a DLPack tensor), else 0."""
    def ordered_by(self, event: Event) -> None: ...
    @property
    def closed(self) -> bool: ...
    def release(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...
    def __reduce__(self) -> tuple[Any, ...]: ...

def capture(obj: Any, device: int | None = None, *, pending: dict[tuple[int, int], list[Capture]] | None = None) -> Capture:
    """Take a device array as it is now, on the caller's thread: a :class:`Capture`."""

def capture_at(obj: Any, where: tuple[int, int], *, pending: dict[tuple[int, int], list[Capture]] | None = None) -> Capture:
    """:func:`capture` of a DLPack producer of device memory whose ``__dlpack_device__()`` the caller read already."""

def describe(obj: Any) -> tuple[np.dtype[Any], tuple[int, ...], int] | None:
    """``(dtype, shape, device)`` of a C-contiguous CUDA device array, or None for anything else."""
