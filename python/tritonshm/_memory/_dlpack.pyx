# cython: language_level=3, embedsignature=True
"""DLPack, both ways, for every region's views.

*Export*: :func:`export_capsule` wraps memory in a ``"dltensor_versioned"``
capsule (or a legacy ``"dltensor"`` one), built by the C core in one
allocation whose deleter releases the memory's owner in plain C -- consumers
call it on any thread, without the GIL.  :func:`check_request` applies the
``__dlpack__`` keyword rules once for all exporters.

*Import*: :func:`import_device` takes a producer's tensor (torch, cupy,
jax, our own views) for the length of a copy, with the stream handshake
that orders the copy after the producer's work.  The producer is asked
under the guard of its tensor's device (torch refuses to export a tensor
that is not on the current device), and its refusals (BufferError and
co) become :class:`~tritonshm.UnsupportedBuffer` that say what to do.
"""

from cpython.pycapsule cimport (
    PyCapsule_GetPointer,
    PyCapsule_IsValid,
    PyCapsule_New,
    PyCapsule_SetName,
)
from libc.stdint cimport int64_t

from ._runtime cimport Runtime, current

from ._tshm cimport (
    DLDataType,
    DLDevice,
    DLManagedTensor,
    DLManagedTensorVersioned,
    DLTensor,
    DLPACK_FLAG_BITMASK_READ_ONLY,
    kDLBfloat,
    kDLBool,
    kDLComplex,
    kDLCPU,
    kDLCUDA,
    kDLCUDAHost,
    kDLCUDAManaged,
    kDLFloat,
    kDLInt,
    kDLUInt,
    TSHM_CU_POINTER_ATTRIBUTE_BUFFER_ID,
    tshm_dlpack_is_c_contiguous,
    tshm_cuda_device_enter,
    tshm_cuda_device_leave,
    tshm_dlpack_new,
    tshm_release_fn,
)

import numpy as np

from .._dtypes import BFLOAT16
from ..errors import DLPackError, DTypeMismatch, Error, UnsupportedBuffer

__all__ = ["Imported", "check_request", "dl_dtype", "numpy_dtype", "import_device", "KDL_CPU", "KDL_CUDA"]

KDL_CPU = kDLCPU
KDL_CUDA = kDLCUDA
#: Device types whose memory the CUDA runtime can copy from.
CUDA_DEVICE_TYPES = (kDLCUDA, kDLCUDAHost, kDLCUDAManaged)
#: Device types that are device memory (not pinned host memory).
DEVICE_MEMORY_TYPES = (kDLCUDA, kDLCUDAManaged)

#: The DLPack version we produce.
VERSION = (1, 1)

cdef const char *_VERSIONED = b"dltensor_versioned"
cdef const char *_LEGACY = b"dltensor"
cdef const char *_USED_VERSIONED = b"used_dltensor_versioned"
cdef const char *_USED_LEGACY = b"used_dltensor"

# numpy kind -> DLPack type code
_CODES = {"b": kDLBool, "i": kDLInt, "u": kDLUInt, "f": kDLFloat, "c": kDLComplex}


# DLPack type code -> numpy kind, for the codes with numpy equivalents
_KINDS = {kDLInt: "i", kDLUInt: "u", kDLFloat: "f", kDLComplex: "c"}


# What numpy_dtype() found, by (code, bits): asked for every tensor taken (only the few pairs numpy
# has are ever kept: the rest are refused).
cdef dict _NUMPY_DTYPES = {}


def numpy_dtype(int code, int bits):
    """The numpy dtype of DLPack's ``(code, bits)`` (one lane), else DTypeMismatch."""
    key = (code, bits)
    dtype = _NUMPY_DTYPES.get(key)
    if dtype is None:
        dtype = _NUMPY_DTYPES[key] = _numpy_dtype(code, bits)
    return dtype


cdef object _numpy_dtype(int code, int bits):
    if code == kDLBool and bits == 8:
        return np.dtype(np.bool_)
    if code == kDLBfloat and bits == 16:
        return BFLOAT16  # ml_dtypes.bfloat16: torch's bfloat16, Triton's BF16
    kind = _KINDS.get(code)
    if kind is not None and bits % 8 == 0:
        try:
            return np.dtype(f"{kind}{bits // 8}")
        except TypeError:
            pass
    raise DTypeMismatch(f"DLPack dtype (code {code}, {bits} bits) has no numpy equivalent "
                        f"(formats neither numpy nor ml_dtypes' bfloat16 has)")


# dl_dtype()'s answers for numpy's builtin dtypes, by id: each ``(dtype, (code, bits))`` (see
# _args._DTYPES_SEEN: such an id is never another object's).  Every view of every request asks again.
cdef dict _DL_DTYPES_SEEN = {}


cpdef tuple dl_dtype(object dtype):
    """``(code, bits)`` of a numpy dtype DLPack can describe, else DTypeMismatch."""
    seen = _DL_DTYPES_SEEN.get(id(dtype))
    if seen is not None and (<tuple>seen)[0] is dtype:
        return (<tuple>seen)[1]
    dt = np.dtype(dtype)
    code_bits = _dl_dtype(dt)
    if dt.isbuiltin == 1 and dt is dtype and len(_DL_DTYPES_SEEN) < 64:
        _DL_DTYPES_SEEN[id(dt)] = (dt, code_bits)
    return code_bits


cdef tuple _dl_dtype(dt):
    if dt == BFLOAT16:
        return kDLBfloat, 16
    code = _CODES.get(dt.kind)
    if code is None or not dt.isnative and dt.itemsize > 1:
        raise DTypeMismatch(f"dtype {dt} has no DLPack equivalent (bool, int, uint, float, bfloat16, "
                            f"complex only)")
    return code, dt.itemsize * 8


def check_request(stream, max_version, dl_device, copy, int device_type, int device_id):
    """Apply the ``__dlpack__`` keyword rules; True when a versioned capsule is wanted.

    A needed copy, another device or an invalid stream raise DLPackError
    (a BufferError, as the array API asks).  Our memory has no pending
    work on any stream, so every valid stream needs no synchronisation.
    """
    if copy:
        raise DLPackError("this view exports its memory in place; copy=True is not supported")
    if dl_device is not None:
        try:
            wanted = (int(dl_device[0]), int(dl_device[1]))
        except (TypeError, ValueError, IndexError):
            raise DLPackError(f"dl_device must be a (device_type, device_id) pair, not {dl_device!r}") from None
        if wanted != (device_type, device_id):
            raise DLPackError(f"this view lives on device {(device_type, device_id)}, not {wanted}; "
                              f"copy it there first")
    if stream is not None:
        if not isinstance(stream, int):
            raise DLPackError(f"stream must be an int or None, not {type(stream).__name__}")
        if device_type == kDLCUDA and (stream == 0 or stream < -1 or stream > <size_t>-1):
            raise DLPackError(f"stream={stream} is not valid for CUDA (0 is ambiguous; use 1 for the legacy "
                              f"default stream, 2 for per-thread, or a stream handle)")
        if device_type == kDLCPU and stream not in (-1,):
            raise DLPackError(f"stream={stream} given for host memory; only None is valid")
    if max_version is None:
        return False
    try:
        return int(max_version[0]) >= 1
    except (TypeError, ValueError, IndexError):
        raise DLPackError(f"max_version must be a (major, minor) pair, not {max_version!r}") from None


cdef void _capsule_destructor(object capsule) noexcept:
    # A consumer renames the capsule when it takes the tensor; only an
    # unconsumed capsule still owns it.
    cdef void *p
    if PyCapsule_IsValid(capsule, _VERSIONED):
        p = PyCapsule_GetPointer(capsule, _VERSIONED)
        (<DLManagedTensorVersioned *>p).deleter(<DLManagedTensorVersioned *>p)
    elif PyCapsule_IsValid(capsule, _LEGACY):
        p = PyCapsule_GetPointer(capsule, _LEGACY)
        (<DLManagedTensor *>p).deleter(<DLManagedTensor *>p)


cdef object export_capsule(void *data, int device_type, int device_id, object dtype,
                           tuple shape, bint readonly, bint versioned,
                           tshm_release_fn release, void *ctx):
    """A capsule of a C-contiguous tensor over *data*.

    Takes over one reference of *ctx*: the tensor's deleter releases it, and
    on any failure here it is released before raising.
    """
    cdef DLDevice device
    cdef DLDataType dl
    cdef int64_t dims[64]
    cdef void *managed
    cdef int i
    try:
        code, bits = dl_dtype(dtype)
        if len(shape) > 64:
            raise DLPackError(f"{len(shape)} dims are more than DLPack exports here (64)")
        for i in range(len(shape)):
            dims[i] = shape[i]
    except BaseException:
        release(ctx)
        raise
    device.device_type = device_type
    device.device_id = device_id
    dl.code = code
    dl.bits = bits
    dl.lanes = 1
    managed = tshm_dlpack_new(versioned, data, device, dl, len(shape), dims, readonly, release, ctx)
    if managed == NULL:
        release(ctx)
        raise MemoryError("cannot allocate a DLPack tensor")
    try:
        return PyCapsule_New(managed, _VERSIONED if versioned else _LEGACY, _capsule_destructor)
    except BaseException:
        if versioned:
            (<DLManagedTensorVersioned *>managed).deleter(<DLManagedTensorVersioned *>managed)
        else:
            (<DLManagedTensor *>managed).deleter(<DLManagedTensor *>managed)
        raise


cdef class Imported:
    """A producer's C-contiguous tensor, held for the length of a copy.

    ``ptr`` and ``nbytes`` are valid until :meth:`release` (also called when
    the object dies), which hands the tensor back to its producer.
    ``shape``, ``dtype_code``/``dtype_bits`` (DLPack's) with ``dtype`` (numpy's),
    ``readonly`` (the producer's READ_ONLY flag; legacy capsules carry none)
    and the device stay readable after the release.
    """

    def __dealloc__(self):
        self.release()

    @property
    def dtype(self):
        """The tensor's numpy dtype; DTypeMismatch when numpy has none (bfloat16, ...)."""
        return numpy_dtype(self.dtype_code, self.dtype_bits)

    cpdef release(self):
        """Hand the tensor back to the producer (call its deleter); idempotent."""
        cdef void *p = self._managed
        if p == NULL:
            return
        self._managed = NULL
        if self._versioned:
            if (<DLManagedTensorVersioned *>p).deleter != NULL:
                (<DLManagedTensorVersioned *>p).deleter(<DLManagedTensorVersioned *>p)
        elif (<DLManagedTensor *>p).deleter != NULL:
            (<DLManagedTensor *>p).deleter(<DLManagedTensor *>p)
        self._capsule = None


cdef object _take_capsule(object obj, object stream):
    """``obj.__dlpack__`` with the newest protocol it speaks."""
    try:
        return obj.__dlpack__(stream=stream, max_version=VERSION)
    except TypeError:  # a producer from before DLPack 1.0 knows no max_version
        return obj.__dlpack__(stream=stream)


def dlpack_stream(size_t handle):
    """A ``cudaStream_t`` as ``__dlpack__``'s *stream*: 0 (the legacy default stream) is spelled 1."""
    return 1 if handle == 0 else handle


cdef object _refusal(object obj, str what, object exc):
    """A producer's own exception (BufferError, RuntimeError ...) as the UnsupportedBuffer we raise."""
    return UnsupportedBuffer(
        f"{type(obj).__name__}.{what} refused ({type(exc).__name__}: {exc}); tritonshm asks for a "
        f"C-contiguous CUDA tensor with its device made current: make the tensor contiguous, or "
        f"copy it to host memory first")


def dlpack_device(obj, bint exporter=True):
    """``obj.__dlpack_device__()`` as ``(type, id)`` ints, or None when *obj* has none -- or, with
    *exporter*, has no ``__dlpack__`` either (a CUDA Array Interface object may say where it
    lives through ``__dlpack_device__`` alone: ask with ``exporter=False``)."""
    device_of = getattr(obj, "__dlpack_device__", None)
    if device_of is None or (exporter and not hasattr(obj, "__dlpack__")):
        return None
    try:
        device_type, device_id = device_of()
        return int(device_type), int(device_id)
    except Error:
        raise
    except Exception as exc:
        raise _refusal(obj, "__dlpack_device__()", exc) from exc


cdef unsigned long long _buffer_id(Runtime rt, size_t ptr) noexcept:
    """The driver's id of the allocation holding *ptr* (CU_POINTER_ATTRIBUTE_BUFFER_ID: never
    reused in the process's life), or 0 where the driver does not say.  Under the device's guard."""
    cdef unsigned long long id = 0
    if rt.rt.PointerGetAttribute == NULL or ptr == 0:
        return 0
    # A driver call: the driver API keeps no last error to settle.
    if rt.rt.PointerGetAttribute(&id, TSHM_CU_POINTER_ATTRIBUTE_BUFFER_ID, ptr) != 0:
        return 0
    return id


def import_device(obj, stream=1, device_types=CUDA_DEVICE_TYPES, bint identify=False):
    """Take *obj*'s tensor through DLPack if it lives in CUDA-reachable memory.

    Returns an :class:`Imported`, or None when *obj* speaks no DLPack or
    lives on the host (the caller then uses the buffer protocol).  *stream*
    is the consumer's CUDA stream in ``__dlpack__``'s terms (1: the legacy
    default stream; a handle: the copy's stream; -1: no synchronisation):
    the producer orders its pending work before it.  *device_types* are the
    DLPack device types taken (default: CUDA, pinned host and managed
    memory).  Device memory is asked for under its device's guard; with
    *identify*, the driver is asked under the same guard which allocation
    holds it (:attr:`Imported.buffer_id`: one attribute query, no more
    device bookkeeping).
    """
    where = dlpack_device(obj)
    if where is None:
        return None
    return import_device_at(obj, where, stream, device_types, identify)


cdef Imported import_device_at(object obj, tuple where, object stream, object device_types, bint identify):
    """:func:`import_device` of *obj* whose ``__dlpack_device__()`` the caller read already
    (*where*, as :func:`dlpack_device` gives it): asked once per tensor, not again here (torch's
    is Python, a few microseconds a call)."""
    cdef Runtime rt
    cdef int previous = 0, rc
    cdef Imported imp
    device_type, device_id = where
    if device_type not in device_types:
        return None
    if device_type not in DEVICE_MEMORY_TYPES:
        return _import(obj, stream)
    rt = current()
    rc = tshm_cuda_device_enter(rt.rt, device_id, &previous)
    if rc != 0:  # (the message is made only for a failure: this runs for every tensor taken)
        rt.check(rc, f"selecting CUDA device {device_id}")
    try:
        imp = _import(obj, stream)
        if identify:
            imp.buffer_id = _buffer_id(rt, <size_t>imp.ptr)
        return imp
    finally:
        tshm_cuda_device_leave(rt.rt, device_id, previous)


cdef Imported _import(object obj, object stream):
    """:func:`import_device`'s exchange, under the device's guard where it needs one."""
    cdef Imported imp
    cdef DLTensor *t
    cdef void *p
    try:
        capsule = _take_capsule(obj, stream)
    except Error:
        raise
    except Exception as exc:  # BufferError (torch: another device, a needed copy), RuntimeError ...
        raise _refusal(obj, "__dlpack__()", exc) from exc
    imp = Imported.__new__(Imported)
    if PyCapsule_IsValid(capsule, _VERSIONED):
        p = PyCapsule_GetPointer(capsule, _VERSIONED)
        major = (<DLManagedTensorVersioned *>p).version.major
        if major != VERSION[0]:
            # A layout we do not know past the version (DLPack's rule): not taken, not touched --
            # the capsule, still unconsumed, hands it back to its producer, now (its destructor
            # may be Python code, which must not run with our exception set).
            capsule = None
            raise UnsupportedBuffer(f"{type(obj).__name__}.__dlpack__() gave a DLPack {major}.x tensor; "
                                    f"tritonshm reads {VERSION[0]}.x")
        imp._versioned = True
        t = &(<DLManagedTensorVersioned *>p).dl_tensor
        PyCapsule_SetName(capsule, _USED_VERSIONED)
    elif PyCapsule_IsValid(capsule, _LEGACY):
        p = PyCapsule_GetPointer(capsule, _LEGACY)
        imp._versioned = False
        t = &(<DLManagedTensor *>p).dl_tensor
        PyCapsule_SetName(capsule, _USED_LEGACY)
    else:
        raise UnsupportedBuffer(f"{type(obj).__name__}.__dlpack__() returned no usable DLPack capsule")
    imp._managed = p
    imp._capsule = capsule
    capsule = None  # (imp holds it: its release lets go of it, before any raise below)
    imp.readonly = imp._versioned and ((<DLManagedTensorVersioned *>p).flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0
    imp.dtype_code = t.dtype.code
    imp.dtype_bits = t.dtype.bits
    imp.shape = tuple([t.shape[i] for i in range(t.ndim)])
    refused = None
    if t.ndim < 0 or any(d < 0 for d in imp.shape):
        refused = f"{type(obj).__name__}.__dlpack__() gave a tensor of {t.ndim} dims, shape {imp.shape}: malformed"
    elif t.dtype.lanes != 1 or t.dtype.bits % 8 != 0:
        refused = f"cannot copy a DLPack tensor of {t.dtype.bits}-bit x{t.dtype.lanes} lanes"
    elif not tshm_dlpack_is_c_contiguous(t):
        refused = f"{type(obj).__name__} is not C-contiguous; make it so first (e.g. .contiguous())"
    if refused is not None:
        imp.release()  # handed back before the raise: the producer's deleter may be Python code
        raise UnsupportedBuffer(refused)
    count = 1
    for i in range(t.ndim):
        count *= t.shape[i]
    imp.ptr = <size_t>t.data + t.byte_offset
    imp.nbytes = count * (t.dtype.bits // 8)
    imp.device_type = t.device.device_type
    imp.device_id = t.device.device_id
    return imp
