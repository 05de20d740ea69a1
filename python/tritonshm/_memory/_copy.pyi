"""Type stubs for tritonshm._memory._copy (Cython)."""

from typing import Any

from ._stream import Event, Stream

__all__ = ["copy"]

def copy(
    dst: Any,
    src: Any,
    nbytes: int | None = None,
    *,
    dst_offset: int = 0,
    src_offset: int = 0,
    stream: Stream | None = None,
    done: Event | None = None,
    then: Stream | int | None = None,
) -> int:
    """Copy *nbytes* bytes from ``src[src_offset:]`` to ``dst[dst_offset:]``; returns *nbytes*."""
