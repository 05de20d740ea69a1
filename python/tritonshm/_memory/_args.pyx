"""Argument checks shared by every region type (compiled: every request's views and copies ask them).

Offsets, sizes, dtypes and shapes are validated here, the same way for
system, pinned and CUDA regions, before any copy or view touches memory.
The C core checks ranges again (without additions that can wrap); these
checks exist to give the caller an error that names the argument.
"""

from __future__ import annotations

import operator
import sys

import numpy as np

from ..errors import DTypeMismatch, OutOfBounds, ShapeMismatch

__all__ = ["index", "device_of", "dtype_of", "shape_of", "layout", "span"]

# The most dims a numpy array may have (32 before numpy 2, 64 since).
MAX_NDIM = 64 if int(np.__version__.split(".")[0]) >= 2 else 32


cpdef object index(object value, str what):
    """``operator.index(value)`` with an error that names the argument."""
    try:
        return operator.index(value)
    except TypeError:
        raise OutOfBounds(f"{what} must be an integer, not {type(value).__name__}") from None


cpdef object device_of(object device):
    """A CUDA device number (this process's numbering), or OutOfBounds."""
    if type(device) is int and 0 <= device <= 1 << 30:  # (the usual case, asked on every request)
        return device
    dev = index(device, "device")
    if dev < 0 or dev > 1 << 30:
        raise OutOfBounds(f"device={dev} is not a CUDA device number")
    return dev


# The dtypes dtype_of() found good, by id: numpy's builtin ones only (one instance each, never
# freed, so an id here is never another object's).  A view of every request asks again; the checks
# run once per dtype.
_DTYPES_SEEN: dict[int, np.dtype] = {}
_DTYPES_KEPT = 64


cpdef object dtype_of(object dtype):
    """A numpy dtype that can live in shared memory, or DTypeMismatch."""
    if _DTYPES_SEEN.get(id(dtype)) is dtype:
        return dtype
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError) as exc:
        raise DTypeMismatch(f"not a numpy dtype: {dtype!r} ({exc})") from None
    if dt.subdtype is not None:
        # ("f4", (2,)) makes numpy add dims to the shape given: say so instead.
        raise DTypeMismatch(f"dtype {dt} is a sub-array; put its dims in the shape instead")
    if dt.hasobject:
        raise DTypeMismatch(
            f"dtype {dt} holds Python object pointers, which mean nothing in shared memory"
        )
    if dt.itemsize == 0:
        raise DTypeMismatch(f"dtype {dt} has no size")
    if dt is dtype and dt.isbuiltin == 1 and len(_DTYPES_SEEN) < _DTYPES_KEPT:
        _DTYPES_SEEN[id(dt)] = dt
    return dt


cpdef tuple shape_of(object shape):
    """A shape tuple of non-negative ints from an int or a sequence of ints."""
    try:
        if type(shape) is tuple or type(shape) is list:  # (the usual case: no TypeError raised to find out)
            dims = tuple(map(operator.index, shape))
        else:
            try:
                dims = (operator.index(shape),)
            except TypeError:
                dims = tuple(map(operator.index, shape))
    except TypeError:
        raise ShapeMismatch(f"shape must be an int or a sequence of ints, not {shape!r}") from None
    if len(dims) > MAX_NDIM:
        raise ShapeMismatch(f"shape has {len(dims)} dims; numpy allows at most {MAX_NDIM}")
    for d in dims:
        if d < 0:
            raise ShapeMismatch(f"shape {dims} has a negative dimension")
    return dims


cpdef tuple layout(object dtype, object shape):
    """``(dtype, dims, nbytes)`` of an array of *shape* x *dtype*, validated."""
    dt = dtype_of(dtype)
    dims = shape_of(shape)
    count, nonzero = 1, dt.itemsize
    for d in dims:
        count *= d
        nonzero *= max(d, 1)
    # An empty array passes every bounds check, but numpy still refuses one
    # whose other dims multiply past what it can address.  (A non-empty
    # one that large fails the bounds check: OutOfBounds.)
    if count == 0 and nonzero > sys.maxsize:
        raise ShapeMismatch(f"shape {dims} of {dt} is larger than any array can be")
    return dt, dims, count * dt.itemsize


cpdef tuple span(object owner, object capacity, object offset=0, object nbytes=None):
    """Validate bytes [offset, offset + nbytes) of *capacity* and return ``(offset, nbytes)``.

    *nbytes* defaults to the rest after *offset*.  Negative, non-integer,
    oversized or wrapping values raise :class:`OutOfBounds` naming *owner*;
    nothing is ever truncated.
    """
    off = index(offset, "offset")
    if off < 0 or off > capacity:
        raise OutOfBounds(f"{owner!r}: offset={off} is outside its {capacity} bytes")
    size = capacity - off if nbytes is None else index(nbytes, "nbytes")
    if size < 0 or size > capacity - off:
        raise OutOfBounds(
            f"{owner!r}: {size} bytes at offset={off} do not fit in its {capacity} bytes"
            f" ({capacity - off} available)"
        )
    return off, size
