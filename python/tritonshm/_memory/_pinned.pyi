"""Type stubs for tritonshm._memory._pinned (Cython)."""

from typing_extensions import Self

from ._system import SystemRegion

__all__ = ["PinnedRegion"]

class PinnedRegion(SystemRegion):
    """A :class:`SystemRegion` whose pages are locked (``cudaHostRegister``)."""

    @classmethod
    def create(cls, nbytes: int, device: int = 0) -> Self: ...
    @classmethod
    def attach(cls, key: str, *, readonly: bool = False, device: int = 0) -> Self: ...
    @property
    def pinned(self) -> bool: ...
    @property
    def device(self) -> int: ...
