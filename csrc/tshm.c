/* tshm: POSIX shared-memory segments and reference-counted mappings.
 * See tshm.h for the contract of each function. */
#define _GNU_SOURCE
#include "tshm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

/* How often to draw a new random name before giving up on EEXIST (or on
 * names removed under us, see tshm_segment_create).  With 64 random bits a
 * clash means something is wrong, not bad luck. */
#define TSHM_CREATE_TRIES 16

int tshm_name_check(const char *name)
{
    if (name == NULL || name[0] != '/')
        return -EINVAL;
    size_t len = strnlen(name, TSHM_NAME_MAX + 1);
    if (len < 2 || len > TSHM_NAME_MAX)
        return -EINVAL;
    if (strchr(name + 1, '/') != NULL)
        return -EINVAL;
    return 0;
}

/* Fill `buf` with `len` bytes from the kernel's CSPRNG.  getrandom() may
 * return short reads for large requests or be interrupted by a signal. */
static int random_bytes(void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t got = getrandom(p, len, 0);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += got;
        len -= (size_t)got;
    }
    return 0;
}

/* Take the creator's shared lock on a new segment (see tshm.h).  Blocking:
 * whoever holds LOCK_EX is a `tritonshm gc` or `ls` probing the name, which
 * lets go at once. */
static int lock_shared(int fd)
{
    while (flock(fd, LOCK_SH) != 0) {
        if (errno != EINTR)
            return -errno;
    }
    return 0;
}

int tshm_segment_create(size_t nbytes, char *name_out, size_t name_cap, int *fd_out)
{
    if (nbytes == 0 || name_out == NULL || fd_out == NULL)
        return -EINVAL;
    /* ftruncate takes an off_t: refuse what it cannot represent. */
    if (nbytes > (size_t)INT64_MAX)
        return -EFBIG;

    int last = -EEXIST;
    for (int attempt = 0; attempt < TSHM_CREATE_TRIES; attempt++) {
        uint64_t token;
        int rc = random_bytes(&token, sizeof token);
        if (rc != 0)
            return rc;
        int n = snprintf(name_out, name_cap, TSHM_NAME_PREFIX "%ld-%016llx",
                         (long)getpid(), (unsigned long long)token);
        if (n < 0 || (size_t)n >= name_cap)
            return -ENAMETOOLONG;

        int fd = shm_open(name_out, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0) {
            if (errno == EEXIST) {
                last = -EEXIST;
                continue;
            }
            return -errno;
        }
        rc = lock_shared(fd);
        if (rc != 0) {
            shm_unlink(name_out);
            close(fd);
            return rc;
        }
        /* Between shm_open and flock the name was unlocked: a gc in another
         * PID namespace (where our pid looks dead) may have taken its lock
         * and removed the name.  Then the segment is no longer reachable by
         * anyone else: drop it and draw a new name. */
        struct stat st;
        if (fstat(fd, &st) != 0) {
            int err = errno;
            shm_unlink(name_out);
            close(fd);
            return -err;
        }
        if (st.st_nlink == 0) {
            close(fd);
            last = -EAGAIN;
            continue;
        }
        /* 0600 exactly: shm_open's mode is masked by the umask, and a umask
         * that takes the owner's write bit (0377) would leave a segment the
         * server, running as the same user, cannot open to write outputs.
         * Never wider than 0600 whatever the umask. */
        if ((st.st_mode & 07777) != 0600 && fchmod(fd, 0600) != 0) {
            int err = errno;
            shm_unlink(name_out);
            close(fd);
            return -err;
        }
        /* Reserve the pages now rather than ftruncate()'s sparse file: on a
         * full /dev/shm a sparse segment maps fine and then kills the process
         * with SIGBUS on first touch, far from the cause.  Reserving fails
         * here, with ENOSPC, instead.  It costs one pass of page allocation
         * at creation, which pools pay once. */
        int err;
        do
            err = posix_fallocate(fd, 0, (off_t)nbytes);
        while (err == EINTR);
        if (err != 0) {
            shm_unlink(name_out);
            close(fd);
            return -err;
        }
        *fd_out = fd;
        return 0;
    }
    return last;
}

int tshm_segment_open(const char *name, int readonly, int *fd_out, size_t *nbytes_out)
{
    if (fd_out == NULL || nbytes_out == NULL)
        return -EINVAL;
    int rc = tshm_name_check(name);
    if (rc != 0)
        return rc;
    int fd = shm_open(name, (readonly ? O_RDONLY : O_RDWR) | O_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return -err;
    }
    if (st.st_size <= 0) {
        /* A segment whose creator has not sized it yet, or an empty one:
         * nothing we could map. */
        close(fd);
        return -ENODATA;
    }
    *fd_out = fd;
    *nbytes_out = (size_t)st.st_size;
    return 0;
}

int tshm_segment_unlink(const char *name)
{
    int rc = tshm_name_check(name);
    if (rc != 0)
        return rc;
    if (shm_unlink(name) != 0)
        return -errno;
    return 0;
}

int tshm_mapping_new(int fd, size_t nbytes, int readonly, tshm_mapping **out)
{
    if (out == NULL || nbytes == 0)
        return -EINVAL;
    tshm_mapping *m = calloc(1, sizeof *m);
    if (m == NULL)
        return -ENOMEM;
    int prot = readonly ? PROT_READ : (PROT_READ | PROT_WRITE);
    void *addr = mmap(NULL, nbytes, prot, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) {
        int err = errno;
        free(m);
        return -err;
    }
    m->addr = addr;
    m->nbytes = nbytes;
    m->readonly = readonly != 0;
    __atomic_store_n(&m->refs, 1, __ATOMIC_RELEASE);
    *out = m;
    return 0;
}

void tshm_mapping_incref(tshm_mapping *m)
{
    __atomic_add_fetch(&m->refs, 1, __ATOMIC_RELAXED);
}

void tshm_mapping_decref(tshm_mapping *m)
{
    /* Release on the way down and acquire before the unmap, so every write
     * made through another reference happens-before the munmap. */
    if (__atomic_sub_fetch(&m->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    if (m->unmap_hook != NULL)
        m->unmap_hook(m, m->unmap_hook_ctx);
    munmap(m->addr, m->nbytes);
    m->addr = NULL;
    free(m);
}

int tshm_mapping_set_unmap_hook(tshm_mapping *m, tshm_unmap_hook hook, void *ctx)
{
    if (m == NULL || hook == NULL || ctx == NULL)
        return -EINVAL;
    /* Claim the slot with a compare-and-set on the context, so two threads
     * hooking one mapping cannot both win.  The caller holds a reference,
     * so the final decref (acquire) sees the hook stored below. */
    void *expected = NULL;
    if (!__atomic_compare_exchange_n(&m->unmap_hook_ctx, &expected, ctx, 0,
                                     __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return -EALREADY;
    __atomic_store_n(&m->unmap_hook, hook, __ATOMIC_RELEASE);
    return 0;
}

size_t tshm_mapping_refs(const tshm_mapping *m)
{
    return __atomic_load_n(&m->refs, __ATOMIC_ACQUIRE);
}

int tshm_check_range(size_t capacity, size_t offset, size_t len)
{
    /* offset + len may wrap: compare against what is left instead. */
    if (offset > capacity || len > capacity - offset)
        return -ERANGE;
    return 0;
}

int tshm_copy_in(tshm_mapping *m, size_t offset, const void *src, size_t len)
{
    if (m == NULL || (src == NULL && len != 0))
        return -EINVAL;
    if (m->readonly)
        return -EROFS;
    int rc = tshm_check_range(m->nbytes, offset, len);
    if (rc != 0)
        return rc;
    /* memmove: the source may itself be a view of this mapping. */
    if (len != 0)
        memmove(m->addr + offset, src, len);
    return 0;
}

int tshm_copy_out(const tshm_mapping *m, size_t offset, void *dst, size_t len)
{
    if (m == NULL || (dst == NULL && len != 0))
        return -EINVAL;
    int rc = tshm_check_range(m->nbytes, offset, len);
    if (rc != 0)
        return rc;
    if (len != 0)
        memmove(dst, m->addr + offset, len);
    return 0;
}
