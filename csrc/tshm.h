/*
 * tshm: the C core of tritonshm.
 *
 * POSIX shared-memory segments (shm_open + mmap) and reference-counted
 * mappings, with bounds-checked copies.  Plain C, no Python: every function
 * returns 0 on success or a negative errno value on failure, so the binding
 * layer can turn failures into exceptions that carry errno.
 */
#ifndef TSHM_H
#define TSHM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Longest segment name we produce or accept, including the leading '/'.
 * NAME_MAX (255) is the limit of a file name in /dev/shm. */
#define TSHM_NAME_MAX 255

/* Prefix of every segment this library creates: "/tritonshm-<pid>-<16 hex>". */
#define TSHM_NAME_PREFIX "/tritonshm-"

/*
 * A mapping of a shared-memory segment, shared by every export of it.
 *
 * `refs` counts the owners of the mapping: the region object holds one
 * reference until close(), every buffer export and every in-flight copy
 * holds one more.  The memory is unmapped when the count drops to zero, so
 * no export can ever see unmapped memory.  The count is atomic because
 * some consumers (DLPack deleters) release without holding the GIL.
 */
typedef struct tshm_mapping tshm_mapping;

/* Called by the last decref just before munmap (e.g. to undo a
 * cudaHostRegister of the pages); must not fail or block for long. */
typedef void (*tshm_unmap_hook)(tshm_mapping *m, void *ctx);

struct tshm_mapping {
    uint8_t *addr;     /* start of the mapping; never NULL while refs > 0 */
    size_t nbytes;     /* usable size: the segment's size, and the mmap length */
    int readonly;      /* mapped PROT_READ only */
    size_t refs;       /* accessed atomically only */
    tshm_unmap_hook unmap_hook;   /* NULL, or set once by tshm_mapping_set_unmap_hook */
    void *unmap_hook_ctx;
};

/* Create a new segment of `nbytes` (> 0) with O_CREAT|O_EXCL and mode 0600,
 * named TSHM_NAME_PREFIX "<pid>-<16 hex>" from getrandom().  On success
 * writes the name to `name_out` (capacity `name_cap`) and the open
 * descriptor (O_CLOEXEC) to `*fd_out`.
 *
 * The descriptor holds flock(LOCK_SH) on the segment: the owner's proof of
 * life.  Keep it open for as long as you own the name and close it after
 * unlinking; `tritonshm gc` removes a segment only when it can take
 * LOCK_EX, which works across PID namespaces (containers sharing /dev/shm)
 * where the pid in the name proves nothing.  The kernel drops the lock when
 * the last descriptor of this open file goes, so a process that dies holds
 * nothing; a forked child shares the open file, so the lock lives while
 * either process keeps its copy.  Never LOCK_UN it: that would release the
 * lock for every copy.
 *
 * Draws a new name on a clash (EEXIST) and when the name was removed
 * between shm_open and flock (a gc elsewhere took the free lock: the
 * segment is then unreachable); -EEXIST or -EAGAIN after
 * TSHM_CREATE_TRIES draws. */
int tshm_segment_create(size_t nbytes, char *name_out, size_t name_cap, int *fd_out);

/* Open an existing segment read-write or read-only; its size goes to
 * `*nbytes_out`.  Refuses names that are not a single '/'-prefixed
 * component (-EINVAL). */
int tshm_segment_open(const char *name, int readonly, int *fd_out, size_t *nbytes_out);

/* Remove a segment's name.  Existing mappings stay valid. */
int tshm_segment_unlink(const char *name);

/* Check that `name` is a well-formed POSIX shm name: '/' then 1..254
 * characters, none of them '/' or NUL.  Returns 0 or -EINVAL. */
int tshm_name_check(const char *name);

/* Map `nbytes` of `fd` shared (PROT_READ, plus PROT_WRITE unless readonly)
 * into a new mapping whose reference count is 1.  The descriptor may be
 * closed afterwards. */
int tshm_mapping_new(int fd, size_t nbytes, int readonly, tshm_mapping **out);

/* Take one more reference. */
void tshm_mapping_incref(tshm_mapping *m);

/* Drop one reference; the last one unmaps and frees the mapping. */
void tshm_mapping_decref(tshm_mapping *m);

/* Install the hook the last decref calls before munmap, with its non-NULL
 * context.  Only one hook per mapping: returns -EALREADY if one is set (a
 * mapping is pinned once).  The caller must hold a reference. */
int tshm_mapping_set_unmap_hook(tshm_mapping *m, tshm_unmap_hook hook, void *ctx);

/* Current reference count (for diagnostics and tests). */
size_t tshm_mapping_refs(const tshm_mapping *m);

/* 0 when [offset, offset + len) lies within `capacity` bytes, else
 * -ERANGE.  Written so that no addition can wrap. */
int tshm_check_range(size_t capacity, size_t offset, size_t len);

/* Bounds-checked copies between a mapping and ordinary memory. */
int tshm_copy_in(tshm_mapping *m, size_t offset, const void *src, size_t len);
int tshm_copy_out(const tshm_mapping *m, size_t offset, void *dst, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* TSHM_H */
