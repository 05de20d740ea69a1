# The DLPack exchange shared by every view type.
from ._tshm cimport tshm_release_fn

cdef object export_capsule(void *data, int device_type, int device_id, object dtype,
                           tuple shape, bint readonly, bint versioned,
                           tshm_release_fn release, void *ctx)

cdef class Imported:
    cdef object _capsule
    cdef void *_managed
    cdef bint _versioned
    cdef readonly object ptr
    cdef readonly object nbytes
    cdef readonly int device_type
    cdef readonly int device_id
    cdef readonly tuple shape
    cdef readonly int dtype_code
    cdef readonly int dtype_bits
    cdef readonly bint readonly
    cdef readonly unsigned long long buffer_id  # the driver's id of the allocation (identify=True), else 0
    cpdef release(self)

cpdef tuple dl_dtype(object dtype)

cdef Imported import_device_at(object obj, tuple where, object stream, object device_types, bint identify)
