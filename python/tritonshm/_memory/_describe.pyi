"""Type stubs for tritonshm._memory._describe (Cython)."""

from typing import Any

import numpy as np

__all__ = ["describe"]

def describe(obj: Any) -> tuple[np.dtype[Any], tuple[int, ...], int] | None:
    """``(dtype, shape, device)`` of a C-contiguous CUDA device array, or None for anything else."""
