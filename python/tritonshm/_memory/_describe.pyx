# cython: language_level=3, embedsignature=True
"""What a device array is: :func:`describe` gives ``(dtype, shape, device)``, or None for host memory.

The client sorts its inputs with it (host or device, which GPU) before it
captures or copies anything, so it holds nothing: our own
:class:`CudaArray` and :class:`Capture` are read directly, a CUDA Array
Interface producer is parsed (:mod:`._cai`), and a DLPack producer is
imported without stream synchronization and released at once.
"""

from ._capture cimport Capture
from ._cuda_array cimport CudaArray
from ._dlpack cimport Imported

import numpy as np

from ..errors import DTypeMismatch, Error
from . import _dlpack
from ._cai import cai_device, parse_cai, read_cai

__all__ = ["describe"]


def describe(obj):
    """``(dtype, shape, device)`` of a C-contiguous CUDA device array, or None for anything else.

    Device arrays are :class:`CudaArray` (also a :class:`CudaWindow`'s
    views), :class:`Capture`\ s, objects with ``__cuda_array_interface__``
    (looked at first: it is cheap) and DLPack producers whose
    ``__dlpack_device__`` is CUDA or CUDA-managed memory.  Pinned host
    memory (kDLCUDAHost) is not a device array here: None, as for numpy and
    everything else.

    The CUDA Array Interface carries no device: it is taken from the
    object's ``__dlpack_device__`` when it has one, else assumed to be 0
    (finding it from the pointer would need ``cudaPointerGetAttributes``).
    DLPack producers are imported without stream synchronisation, under
    their device's guard, and released at once.

    Raises :class:`UnsupportedBuffer` for a non-contiguous (or malformed)
    device array and :class:`DTypeMismatch` for a dtype numpy lacks.
    """
    cdef CudaArray array
    cdef Capture cap
    cdef Imported imp
    if isinstance(obj, CudaArray) and (<CudaArray>obj)._alloc != NULL:
        array = <CudaArray>obj
        return array.dtype, array.shape, array._alloc.device
    if isinstance(obj, Capture):
        cap = <Capture>obj
        cap._live()
        if cap.dtype is None:
            raise DTypeMismatch(f"{cap!r} has a dtype numpy lacks")
        return cap.dtype, cap.shape, cap.device
    if isinstance(obj, np.ndarray):
        return None
    try:
        cai = read_cai(obj)
    except Error:
        raise
    except Exception:  # torch raises for dtypes the interface cannot name (bfloat16): ask DLPack
        cai = None
    parsed = parse_cai(obj, cai) if cai is not None else None
    if parsed is not None:
        _, dt, shape, _, _ = parsed
        return dt, shape, cai_device(obj, 0)
    imp = _dlpack.import_device(obj, -1, _dlpack.DEVICE_MEMORY_TYPES)
    if imp is None:
        return None
    try:
        return imp.dtype, imp.shape, imp.device_id
    finally:
        imp.release()
