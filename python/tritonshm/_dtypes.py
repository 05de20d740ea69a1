"""Triton datatype names and their numpy equivalents, in one table.

Used by the registration layer (to size bindings) and by the client (to
check inputs against model metadata).  ``BYTES`` has no fixed size; its
numpy form is an object array of ``bytes``.
"""

from __future__ import annotations

import numpy as np

# Triton datatype -> numpy dtype.  BF16 has no numpy dtype and is absent.
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
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}

NUMPY_TO_TRITON: dict[np.dtype, str] = {v: k for k, v in TRITON_TO_NUMPY.items()}


def itemsize(datatype: str) -> int | None:
    """Bytes per element of a Triton datatype; None for BYTES (variable)."""
    if datatype == "BYTES":
        return None
    try:
        return TRITON_TO_NUMPY[datatype].itemsize
    except KeyError:
        if datatype == "BF16":
            return 2
        raise


def numpy_dtype(datatype: str) -> np.dtype:
    """The numpy dtype of a Triton datatype (object for BYTES)."""
    return TRITON_TO_NUMPY[datatype]
