"""Type stubs for tritonshm._memory._args (Cython)."""

from typing import Any

import numpy as np

__all__ = ["index", "device_of", "dtype_of", "shape_of", "layout", "span"]

#: The most dims a numpy array may have (32 before numpy 2, 64 since).
MAX_NDIM: int

def index(value: Any, what: str) -> int:
    """``operator.index(value)`` with an error that names the argument."""

def device_of(device: Any) -> int:
    """A CUDA device number (this process's numbering), or OutOfBounds."""

def dtype_of(dtype: Any) -> np.dtype[Any]:
    """A numpy dtype that can live in shared memory, or DTypeMismatch."""

def shape_of(shape: Any) -> tuple[int, ...]:
    """A shape tuple of non-negative ints from an int or a sequence of ints."""

def layout(dtype: Any, shape: Any) -> tuple[np.dtype[Any], tuple[int, ...], int]:
    """``(dtype, dims, nbytes)`` of an array of *shape* x *dtype*, validated."""

def span(owner: Any, capacity: int, offset: Any = 0, nbytes: Any = None) -> tuple[int, int]:
    """Validate bytes [offset, offset + nbytes) of *capacity* and return ``(offset, nbytes)``."""
