# Declarations of the C core (csrc/tshm.h) for the Cython modules.
from libc.stdint cimport uint8_t

cdef extern from "tshm.h" nogil:
    enum: TSHM_NAME_MAX

    ctypedef struct tshm_mapping:
        uint8_t *addr
        size_t nbytes
        int readonly

    int tshm_segment_create(size_t nbytes, char *name_out, size_t name_cap, int *fd_out)
    int tshm_segment_open(const char *name, int readonly, int *fd_out, size_t *nbytes_out)
    int tshm_segment_unlink(const char *name)
    int tshm_name_check(const char *name)
    int tshm_mapping_new(int fd, size_t nbytes, int readonly, tshm_mapping **out)
    void tshm_mapping_incref(tshm_mapping *m)
    void tshm_mapping_decref(tshm_mapping *m)
    size_t tshm_mapping_refs(const tshm_mapping *m)
    int tshm_check_range(size_t capacity, size_t offset, size_t length)
    int tshm_copy_in(tshm_mapping *m, size_t offset, const void *src, size_t length)
    int tshm_copy_out(const tshm_mapping *m, size_t offset, void *dst, size_t length)
