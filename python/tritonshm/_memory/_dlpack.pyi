"""Type stubs for tritonshm._memory._dlpack (Cython)."""

from typing import Any

import numpy.typing as npt

__all__ = ["Imported", "check_request", "dl_dtype", "import_device", "KDL_CPU", "KDL_CUDA"]

KDL_CPU: int
KDL_CUDA: int
CUDA_DEVICE_TYPES: tuple[int, ...]
VERSION: tuple[int, int]

def dl_dtype(dtype: npt.DTypeLike) -> tuple[int, int]: ...
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
    def release(self) -> None: ...

def import_device(obj: Any, stream: int = 1) -> Imported | None: ...
