# cython: language_level=3, embedsignature=True
"""The CUDA Array Interface (v3), read from a producer: what cupy, numba and torch export besides DLPack.

:func:`parse_cai` reads ``__cuda_array_interface__`` (under the
producer's device guard when it names its device through
``__dlpack_device__``) and checks it: C-contiguous, no mask, no stream 0
(which v3 forbids).  The interface carries no device: :func:`cai_device`
takes it from ``__dlpack_device__`` when the object has one.  A producer's
``stream`` is where its pending work is queued: :func:`producer_event`
records an event there for our copy stream to wait for.

Used by :meth:`CudaRegion.write`, :func:`~._copy.copy`,
:func:`~._capture.capture` and :func:`~._capture.describe`.  A typestr
of the void kind (``'<V2'``: how torch 2.11 exports bfloat16) gives only
the item size: the copies need no more, and all but :func:`describe`
take DLPack first where an object speaks both; :func:`describe`, which
reads the interface first, asks DLPack what such a type is.
"""

from ._runtime cimport Runtime, current
from ._stream cimport Event, new_event
from ._tshm cimport tshm_cuda_device_enter, tshm_cuda_device_leave

import math
import operator

import numpy as np

from ..errors import Error, UnsupportedBuffer
from . import _dlpack

__all__ = ["cai_device", "cuda_array_interface", "parse_cai", "read_cai"]

_MAX_ADDRESS = <size_t>-1  # a pointer or stream handle: what a size_t holds
_MAX_BYTES = (<size_t>-1) // 2  # no allocation is larger (ptrdiff_t)


cdef Event producer_event(Runtime rt, int device, size_t stream):
    """An event recorded now on a CUDA Array Interface producer's *stream* (0: none to wait for)."""
    cdef Event event
    if stream == 0:
        return None
    event = new_event(rt, device)
    event._record(stream)
    return event


def cai_device(obj, int fallback):
    """The device of a CUDA Array Interface producer (its ``__dlpack_device__``), else *fallback*.

    The interface carries no device; finding it from the pointer would
    need ``cudaPointerGetAttributes``, whose struct changed between CUDA 12
    and 13.
    """
    where = _dlpack.dlpack_device(obj, False)
    if where is not None and where[0] in _dlpack.DEVICE_MEMORY_TYPES:
        return where[1]
    return fallback


def read_cai(obj):
    """``obj.__cuda_array_interface__`` (None when absent), read with the object's device current."""
    cdef Runtime rt
    cdef int previous = 0, rc
    cdef int device
    where = _dlpack.dlpack_device(obj, False)
    if where is None or where[0] not in _dlpack.DEVICE_MEMORY_TYPES:
        return getattr(obj, "__cuda_array_interface__", None)
    rt = current()
    device = where[1]
    rc = tshm_cuda_device_enter(rt.rt, device, &previous)
    if rc != 0:
        rt.check(rc, f"selecting CUDA device {device}")
    try:
        return getattr(obj, "__cuda_array_interface__", None)
    finally:
        tshm_cuda_device_leave(rt.rt, device, previous)


def cuda_array_interface(obj):
    """``(ptr, nbytes, stream, readonly)`` of a C-contiguous CUDA Array Interface export, else None."""
    parsed = parse_cai(obj)
    if parsed is None:
        return None
    ptr, dt, shape, stream, readonly = parsed
    return ptr, math.prod(shape) * dt.itemsize, stream, readonly


def parse_cai(obj, cai=None):
    """``(ptr, dtype, shape, stream, readonly)`` of a C-contiguous CUDA Array Interface export, else None.

    *cai* is ``obj.__cuda_array_interface__`` when the caller has it already.
    *stream* is 0 when the producer gave None (nothing to wait for).
    """
    if cai is None:
        try:
            cai = read_cai(obj)
        except Error:
            raise
        except Exception as exc:  # the producer's own refusal
            raise UnsupportedBuffer(f"{type(obj).__name__}.__cuda_array_interface__ refused "
                                    f"({type(exc).__name__}: {exc})") from exc
    if cai is None:
        return None
    try:
        shape = tuple(int(d) for d in cai["shape"])
        dt = np.dtype(cai["typestr"])
        ptr = int(cai["data"][0])
        readonly = bool(cai["data"][1])
        strides = cai.get("strides")
        stream = cai.get("stream")
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise UnsupportedBuffer(f"{type(obj).__name__} has a malformed __cuda_array_interface__ ({exc})") from None
    if cai.get("mask") is not None:
        raise UnsupportedBuffer(f"{type(obj).__name__} is a masked array; copy its data first")
    # Numbers C will hold as size_t, checked here as Python ints (numpy's int64 product wraps):
    # a malformed export is refused by name, never an OverflowError deep down or a 0-byte copy.
    if any(d < 0 for d in shape):
        raise UnsupportedBuffer(f"{type(obj).__name__} has a negative dimension in __cuda_array_interface__ "
                                f"(shape {shape})")
    count = math.prod(shape)
    if count * dt.itemsize > _MAX_BYTES:
        raise UnsupportedBuffer(f"{type(obj).__name__}'s __cuda_array_interface__ shape {shape} of {dt} is larger "
                                f"than any allocation can be")
    if not 0 <= ptr <= _MAX_ADDRESS:
        raise UnsupportedBuffer(f"{type(obj).__name__} gave data pointer {ptr} in __cuda_array_interface__, "
                                f"which is no address")
    if strides is not None and count > 0:
        expected = dt.itemsize
        for d, s in zip(reversed(shape), reversed(tuple(strides))):
            if d != 1 and s != expected:
                raise UnsupportedBuffer(f"{type(obj).__name__} is not C-contiguous; make it so first")
            expected *= d
    if stream is None:
        return ptr, dt, shape, 0, readonly
    try:
        stream = operator.index(stream)
    except TypeError:
        raise UnsupportedBuffer(f"{type(obj).__name__} gave stream {stream!r} in __cuda_array_interface__, "
                                f"not an int or None") from None
    if stream == 0:
        raise UnsupportedBuffer(f"{type(obj).__name__} gave stream 0 in __cuda_array_interface__, which v3 forbids")
    if not 0 < stream <= _MAX_ADDRESS:
        raise UnsupportedBuffer(f"{type(obj).__name__} gave stream {stream} in __cuda_array_interface__, which "
                                f"is no stream handle (1: legacy default, 2: per-thread default, or a handle)")
    return ptr, dt, shape, stream, readonly
