/*
 * tshm_dlpack: DLPack tensors for the views tritonshm exports.
 *
 * The structs below are the DLPack 1.x ABI (dlpack/include/dlpack/dlpack.h),
 * written out from the specification so that nothing needs the header.  The
 * builder makes a tensor in one allocation (struct, shape and strides) whose
 * deleter calls a release function in plain C: consumers (torch, cupy) call
 * it on any thread, without the GIL.
 */
#ifndef TSHM_DLPACK_H
#define TSHM_DLPACK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TSHM_DLPACK_MAJOR 1
#define TSHM_DLPACK_MINOR 1

enum { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13 };
enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLComplex = 5, kDLBool = 6 };

#define DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0)
#define DLPACK_FLAG_BITMASK_IS_COPIED (1UL << 1)

typedef struct { uint32_t major, minor; } DLPackVersion;
typedef struct { int32_t device_type; int32_t device_id; } DLDevice;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } DLDataType;

typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides;
    uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;

/* Gives back what an exported tensor held (e.g. a device allocation). */
typedef void (*tshm_release_fn)(void *ctx);

/*
 * A C-contiguous tensor of `ndim` dims over `data`, as a versioned tensor
 * (DLManagedTensorVersioned *) or, with versioned == 0, a legacy one
 * (DLManagedTensor *).  Its deleter calls release(ctx) and frees the tensor.
 * Returns NULL when out of memory (release is then not called).
 */
void *tshm_dlpack_new(int versioned, void *data, DLDevice device, DLDataType dtype,
                      int32_t ndim, const int64_t *shape, int readonly,
                      tshm_release_fn release, void *ctx);

/* 1 when a tensor's strides (NULL = C order) describe a C-contiguous layout. */
int tshm_dlpack_is_c_contiguous(const DLTensor *t);

#ifdef __cplusplus
}
#endif

#endif /* TSHM_DLPACK_H */
