"""Triton datatype names and their numpy equivalents, in one table.

Used by the registration layer (to size bindings) and by the client (to
check inputs against model metadata).  ``BYTES`` has no fixed size; its
numpy form is an object array of ``bytes``.  ``BF16`` is ``ml_dtypes.bfloat16``,
as in tritonclient (which depends on ml_dtypes for it).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .errors import DTypeMismatch

#: numpy's form of BF16 (numpy has none of its own): what tritonclient's ``as_numpy`` returns.
BFLOAT16: np.dtype = np.dtype(ml_dtypes.bfloat16)

# Triton datatype -> numpy dtype.
TRITON_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "BF16": BFLOAT16,
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}

NUMPY_TO_TRITON: dict[np.dtype, str] = {v: k for k, v in TRITON_TO_NUMPY.items()}


def itemsize(datatype: str) -> int | None:
    """Bytes per element of a Triton datatype; None for BYTES (variable)."""
    return None if datatype == "BYTES" else numpy_dtype(datatype).itemsize


def numpy_dtype(datatype: str) -> np.dtype:
    """The numpy dtype of a Triton datatype (object for BYTES); DTypeMismatch for one we do not know."""
    try:
        return TRITON_TO_NUMPY[datatype]
    except KeyError:
        raise DTypeMismatch(f"Triton datatype {datatype!r} has no numpy form here "
                            f"(known: {', '.join(TRITON_TO_NUMPY)})") from None
