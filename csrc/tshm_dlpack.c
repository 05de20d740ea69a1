/* tshm_dlpack: one-allocation DLPack tensors.  See tshm_dlpack.h. */
#include "tshm_dlpack.h"

#include <stdlib.h>
#include <string.h>

/* What manager_ctx points to: the release callback and its argument. */
struct owner {
    tshm_release_fn release;
    void *ctx;
};

struct versioned {
    DLManagedTensorVersioned tensor;
    struct owner owner;
    int64_t dims[];          /* shape, then strides */
};

struct legacy {
    DLManagedTensor tensor;
    struct owner owner;
    int64_t dims[];
};

static void delete_versioned(DLManagedTensorVersioned *self)
{
    struct owner *owner = self->manager_ctx;
    owner->release(owner->ctx);
    free(self);
}

static void delete_legacy(DLManagedTensor *self)
{
    struct owner *owner = self->manager_ctx;
    owner->release(owner->ctx);
    free(self);
}

/* Everything of a C-contiguous DLTensor: shape and strides (in elements)
 * go to dims[0..2*ndim). */
static void fill_tensor(DLTensor *t, int64_t *dims, void *data, DLDevice device, DLDataType dtype,
                        int32_t ndim, const int64_t *shape)
{
    int64_t stride = 1;
    memcpy(dims, shape, (size_t)ndim * sizeof *dims);
    for (int32_t i = ndim - 1; i >= 0; i--) {
        dims[ndim + i] = stride;
        stride *= shape[i] > 1 ? shape[i] : 1;
    }
    t->data = data;
    t->device = device;
    t->dtype = dtype;
    t->ndim = ndim;
    /* DLPack 1.2 forbids NULL strides with ndim > 0; a scalar has neither. */
    t->shape = ndim > 0 ? dims : NULL;
    t->strides = ndim > 0 ? dims + ndim : NULL;
}

void *tshm_dlpack_new(int versioned, void *data, DLDevice device, DLDataType dtype,
                      int32_t ndim, const int64_t *shape, int readonly,
                      tshm_release_fn release, void *ctx)
{
    if (ndim < 0 || release == NULL)
        return NULL;
    size_t dims_bytes = 2 * (size_t)ndim * sizeof(int64_t);
    if (versioned) {
        struct versioned *v = calloc(1, sizeof *v + dims_bytes);
        if (v == NULL)
            return NULL;
        v->tensor.version.major = TSHM_DLPACK_MAJOR;
        v->tensor.version.minor = TSHM_DLPACK_MINOR;
        v->tensor.manager_ctx = &v->owner;
        v->tensor.deleter = delete_versioned;
        v->tensor.flags = readonly ? DLPACK_FLAG_BITMASK_READ_ONLY : 0;
        v->owner.release = release;
        v->owner.ctx = ctx;
        fill_tensor(&v->tensor.dl_tensor, v->dims, data, device, dtype, ndim, shape);
        return v;
    }
    struct legacy *l = calloc(1, sizeof *l + dims_bytes);
    if (l == NULL)
        return NULL;
    l->tensor.manager_ctx = &l->owner;
    l->tensor.deleter = delete_legacy;
    l->owner.release = release;
    l->owner.ctx = ctx;
    fill_tensor(&l->tensor.dl_tensor, l->dims, data, device, dtype, ndim, shape);
    return l;
}

int tshm_dlpack_is_c_contiguous(const DLTensor *t)
{
    if (t->strides == NULL)
        return 1;
    for (int32_t i = 0; i < t->ndim; i++)
        if (t->shape[i] == 0)
            return 1;  /* empty: no element has an address to disagree on */
    int64_t expected = 1;
    for (int32_t i = t->ndim - 1; i >= 0; i--) {
        /* A dim of size 1 may carry any stride (torch, cupy do this). */
        if (t->shape[i] != 1 && t->strides[i] != expected)
            return 0;
        expected *= t->shape[i];
    }
    return 1;
}
