"""Type stubs for tritonshm._memory._region (Cython)."""

from types import TracebackType

from typing_extensions import Self

__all__ = ["Region"]

class Region:
    """The base of :class:`SystemRegion`, :class:`PinnedRegion` and :class:`CudaRegion`: their common lifecycle."""

    @property
    def key(self) -> str: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def owner(self) -> bool: ...
    @property
    def closed(self) -> bool: ...
    def span(self, offset: int = 0, nbytes: int | None = None) -> tuple[int, int]: ...
    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...
