"""Type stubs for tritonshm._memory._cai (Cython)."""

from typing import Any

import numpy as np

__all__ = ["cai_device", "cuda_array_interface", "parse_cai", "read_cai"]

def cai_device(obj: Any, fallback: int) -> int:
    """The device of a CUDA Array Interface producer (its ``__dlpack_device__``), else *fallback*."""

def read_cai(obj: Any) -> dict[str, Any] | None:
    """``obj.__cuda_array_interface__`` (None when absent), read with the object's device current."""

def cuda_array_interface(obj: Any) -> tuple[int, int, int, bool] | None:
    """``(ptr, nbytes, stream, readonly)`` of a C-contiguous CUDA Array Interface export, else None."""

def parse_cai(
    obj: Any, cai: dict[str, Any] | None = None
) -> tuple[int, np.dtype[Any], tuple[int, ...], int, bool] | None:
    """``(ptr, dtype, shape, stream, readonly)`` of a C-contiguous CUDA Array Interface export, else None."""
