"""Type stubs for tritonshm._memory._dlpack (Cython)."""

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["Imported", "check_request", "dl_dtype", "numpy_dtype", "import_device", "KDL_CPU", "KDL_CUDA"]

KDL_CPU: int
KDL_CUDA: int
CUDA_DEVICE_TYPES: tuple[int, ...]
DEVICE_MEMORY_TYPES: tuple[int, ...]
VERSION: tuple[int, int]

def dl_dtype(dtype: npt.DTypeLike) -> tuple[int, int]: ...
def numpy_dtype(code: int, bits: int) -> np.dtype[Any]: ...
def check_request(
    stream: int | None,
    max_version: tuple[int, int] | None,
    dl_device: tuple[int, int] | None,
    copy: bool | None,
    device_type: int,
    device_id: int,
) -> bool: ...

class Imported:
    """A producer's C-contiguous tensor, held for the length of a copy."""

    ptr: int
    nbytes: int
    device_type: int
    device_id: int
    shape: tuple[int, ...]
    dtype_code: int
    dtype_bits: int
    readonly: bool
    buffer_id: int
    @property
    def dtype(self) -> np.dtype[Any]: ...
    def release(self) -> None: ...

def dlpack_stream(handle: int) -> int: ...
def dlpack_device(obj: Any, exporter: bool = True) -> tuple[int, int] | None: ...
def import_device(
    obj: Any, stream: int | None = 1, device_types: tuple[int, ...] = ..., identify: bool = False
) -> Imported | None: ...
