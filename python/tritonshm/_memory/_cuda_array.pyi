"""Type stubs for tritonshm._memory._cuda_array (Cython)."""

from typing import Any, Sequence

import numpy as np
import numpy.typing as npt

from ._stream import Pending

__all__ = ["CudaArray", "empty"]

class CudaArray:
    """A C-contiguous array in device memory: a view of a :class:`CudaRegion`."""

    @property
    def dtype(self) -> np.dtype[Any]:
        """The numpy dtype of the elements."""
    @property
    def shape(self) -> tuple[int, ...]:
        """The array's shape (C-contiguous)."""
    @property
    def nbytes(self) -> int:
        """The array's size in bytes."""
    @property
    def ptr(self) -> int: ...
    @property
    def device(self) -> int: ...
    @property
    def ndim(self) -> int: ...
    @property
    def size(self) -> int: ...
    def __len__(self) -> int: ...
    @property
    def pending(self) -> bool:
        """True while a copy into this array (a client's result) may still be landing."""
    def synchronize(self) -> None:
        """Wait until a copy into this array, if any is pending, has landed."""
    def _after(self, pending: Pending | None) -> None: ...
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any: ...
    def get(self) -> np.ndarray[Any, np.dtype[Any]]: ...
    def __reduce__(self) -> tuple[Any, ...]: ...

def empty(dtype: npt.DTypeLike, shape: int | Sequence[int], device: int = 0) -> CudaArray:
    """A new, uninitialised :class:`CudaArray` in an allocation of its own (no IPC handle)."""
