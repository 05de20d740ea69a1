/*
 * tshm_bench: microbenchmarks of the tritonshm C core (csrc/tshm.c).
 *
 *   1. segment lifecycle vs size: create (shm_open O_EXCL + posix_fallocate)
 *      + mmap + unlink + munmap, and the first write to fresh pages;
 *   2. tshm_copy_in / tshm_copy_out throughput against memcpy between two
 *      page-aligned malloc'ed buffers measured in the same run, and their ratio;
 *   3. the cost of one incref + decref pair, alone and with two threads
 *      hammering the same mapping (as DLPack deleters may).
 *
 * Every figure is the median of several timed runs.  Build and run:
 *   cmake -S . -B build/bench -DTRITONSHM_BUILD_BENCH=ON
 *   cmake --build build/bench --target tshm_bench
 *   build/bench/bench/tshm_bench              # about 7 s
 *   python bench/native_bench.py              # the same, side by side with
 *                                             # multiprocessing.shared_memory
 *
 * Options:
 *   --seconds S   scale every timed loop so the whole run takes about S
 *                 seconds (default: about 7; 1 is enough for a smoke test,
 *                 with medians of fewer runs)
 *   --tsv         machine-readable output instead of tables, one figure per
 *                 line, tab-separated (read by bench/native_bench.py):
 *                   meta       cpus <n> | page_size <n> | seconds <s>
 *                   lifecycle  <bytes> <create+map+unlink+unmap s> <create s>
 *                              <map+unlink+unmap s> <first write s>
 *                              <create+map+first write+unlink+unmap s>
 *                   skipped    <bytes> <bytes available in /dev/shm>
 *                   copy       <bytes> <memcpy GB/s> <copy_in GB/s> <copy_out GB/s>
 *                   refcount   <threads> <ns per incref+decref pair, per thread>
 */
#define _GNU_SOURCE
#include "tshm.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define RUNS 7               /* timed runs per figure; the median is reported */
#define MIN_RUN_SECONDS 0.02 /* each timed run repeats its operation at least this long */
#define DEFAULT_SECONDS 7.0  /* about how long a run with the figures above takes */

/* --seconds S: every timed loop is scaled by S / DEFAULT_SECONDS; below a
 * quarter of the default, figures are medians of QUICK_RUNS runs. */
#define QUICK_RUNS 3
static double scale = 1.0;
static int runs = RUNS;
static int tsv = 0; /* --tsv */

static const size_t SIZES[] = {4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB};
#define NSIZES (sizeof SIZES / sizeof SIZES[0])

/* Keeps the compiler from dropping copies whose result is never read. */
static volatile unsigned char sink;
#define CLOBBER() __asm__ volatile("" ::: "memory")

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void check(int rc, const char *what)
{
    if (rc != 0) {
        fprintf(stderr, "tshm_bench: %s: %s\n", what, strerror(-rc));
        exit(1);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

static const char *size_str(size_t n, char *buf, size_t cap)
{
    if (n >= MiB)
        snprintf(buf, cap, "%zu MiB", n / MiB);
    else
        snprintf(buf, cap, "%zu KiB", n / KiB);
    return buf;
}

/* Whether a segment of n bytes fits in /dev/shm now, with room to spare
 * (Docker's default /dev/shm is 64 MB); says so when it does not. */
static int fits_in_dev_shm(size_t n)
{
    struct statvfs vfs;
    if (statvfs("/dev/shm", &vfs) != 0 || vfs.f_blocks == 0)
        return 1; /* unknown or unlimited: try */
    double avail = (double)vfs.f_bavail * (double)vfs.f_frsize;
    if ((double)n <= avail * 0.9)
        return 1;
    if (tsv)
        printf("skipped\t%zu\t%.0f\n", n, avail);
    else
        printf("  %8zu MiB  skipped: /dev/shm has %.0f MiB available\n", n / MiB, avail / (double)MiB);
    return 0;
}

/* A new mapped segment of n bytes whose name is already unlinked: nothing
 * to clean up but the mapping, even if the benchmark is interrupted. */
static tshm_mapping *anonymous_segment(size_t n)
{
    char name[TSHM_NAME_MAX + 1];
    int fd;
    tshm_mapping *m;
    check(tshm_segment_create(n, name, sizeof name, &fd), "create");
    int rc = tshm_mapping_new(fd, n, 0, &m);
    close(fd);
    check(tshm_segment_unlink(name), "unlink");
    check(rc, "map");
    return m;
}

/* ---- 1. lifecycle ---------------------------------------------------- */

struct lifecycle {
    double create, map_unlink_unmap, first_write;
};

static struct lifecycle lifecycle_once(size_t n, int touch)
{
    char name[TSHM_NAME_MAX + 1];
    int fd;
    tshm_mapping *m;
    struct lifecycle t = {0, 0, 0};

    double t0 = now();
    check(tshm_segment_create(n, name, sizeof name, &fd), "create");
    double t1 = now();
    int rc = tshm_mapping_new(fd, n, 0, &m);
    close(fd);
    check(rc, "map");
    double t2 = now();
    if (touch) {
        memset(m->addr, 0x5a, n); /* page faults on fresh shared pages */
        CLOBBER();
    }
    double t3 = now();
    check(tshm_segment_unlink(name), "unlink");
    tshm_mapping_decref(m); /* the last reference: munmap */
    double t4 = now();

    t.create = t1 - t0;
    t.map_unlink_unmap = (t2 - t1) + (t4 - t3);
    t.first_write = t3 - t2;
    return t;
}

static void bench_lifecycle(void)
{
    if (!tsv) {
        printf("Segment lifecycle (median of runs; create = shm_open O_EXCL + posix_fallocate)\n");
        /* unmap frees the segment's pages: the name is gone and this was the last mapping. */
        printf("  %8s %12s %12s %18s %16s\n", "size", "total us", "create us", "map+unlink+unmap",
               "first write GB/s");
    }
    for (size_t i = 0; i < NSIZES; i++) {
        size_t n = SIZES[i];
        if (!fits_in_dev_shm(n))
            continue;
        /* About 0.3 s per size (scaled), at least `runs` cycles. */
        struct lifecycle probe = lifecycle_once(n, 1);
        double one = probe.create + probe.map_unlink_unmap + probe.first_write;
        int cycles = (int)(0.3 * scale / one);
        if (cycles < runs)
            cycles = runs;
        if (cycles > 2000)
            cycles = 2000;
        double *total = malloc(sizeof(double) * (size_t)cycles);
        double *create = malloc(sizeof(double) * (size_t)cycles);
        double *rest = malloc(sizeof(double) * (size_t)cycles);
        double *touch = malloc(sizeof(double) * (size_t)cycles);
        double *ready = malloc(sizeof(double) * (size_t)cycles);
        if (!total || !create || !rest || !touch || !ready) {
            fprintf(stderr, "tshm_bench: out of memory\n");
            exit(1);
        }
        for (int r = 0; r < cycles; r++) {
            /* Lifecycle without touching the pages, then a separate cycle
             * to time the first write alone (and the whole of that cycle:
             * a segment made ready to use). */
            struct lifecycle t = lifecycle_once(n, 0);
            total[r] = t.create + t.map_unlink_unmap;
            create[r] = t.create;
            rest[r] = t.map_unlink_unmap;
            struct lifecycle w = lifecycle_once(n, 1);
            touch[r] = w.first_write;
            ready[r] = w.create + w.map_unlink_unmap + w.first_write;
        }
        char sz[32];
        if (tsv)
            printf("lifecycle\t%zu\t%.9g\t%.9g\t%.9g\t%.9g\t%.9g\n", n, median(total, cycles),
                   median(create, cycles), median(rest, cycles), median(touch, cycles), median(ready, cycles));
        else
            printf("  %8s %12.1f %12.1f %18.1f %16.2f\n", size_str(n, sz, sizeof sz), median(total, cycles) * 1e6,
                   median(create, cycles) * 1e6, median(rest, cycles) * 1e6,
                   (double)n / median(touch, cycles) / 1e9);
        free(total);
        free(create);
        free(rest);
        free(touch);
        free(ready);
    }
    if (!tsv)
        printf("\n");
}

/* ---- 2. copies ------------------------------------------------------- */

enum copy_kind { MEMCPY, COPY_IN, COPY_OUT };

/* Seconds per copy of n bytes, averaged over one timed run. */
static double time_copy(enum copy_kind kind, tshm_mapping *m, unsigned char *src, unsigned char *dst, size_t n)
{
    long iters = 0;
    double start = now(), elapsed;
    do {
        for (int k = 0; k < 8; k++) {
            switch (kind) {
            case MEMCPY:
                memcpy(dst, src, n);
                break;
            case COPY_IN:
                check(tshm_copy_in(m, 0, src, n), "copy_in");
                break;
            case COPY_OUT:
                check(tshm_copy_out(m, 0, dst, n), "copy_out");
                break;
            }
            CLOBBER();
        }
        iters += 8;
        elapsed = now() - start;
    } while (elapsed < MIN_RUN_SECONDS * scale);
    sink ^= dst[n / 2];
    return elapsed / (double)iters;
}

static void bench_copies(void)
{
    if (!tsv) {
        printf("Copies, GB/s (median of %d runs; memcpy = between two page-aligned malloc'ed buffers, same run)\n",
               runs);
        printf("  %8s %10s %10s %8s %10s %8s\n", "size", "memcpy", "copy_in", "ratio", "copy_out", "ratio");
    }
    for (size_t i = 0; i < NSIZES; i++) {
        size_t n = SIZES[i];
        if (!fits_in_dev_shm(n))
            continue;
        /* Page-aligned like a mapping, so alignment favours neither side. */
        unsigned char *src = aligned_alloc(4 * KiB, n), *dst = aligned_alloc(4 * KiB, n);
        if (src == NULL || dst == NULL) {
            fprintf(stderr, "tshm_bench: out of memory\n");
            exit(1);
        }
        for (size_t j = 0; j < n; j++)
            src[j] = (unsigned char)(j * 131u);
        memset(dst, 0, n); /* fault every page in before timing */
        tshm_mapping *m = anonymous_segment(n);
        memset(m->addr, 0, n);

        double base[RUNS], in[RUNS], out[RUNS];
        for (int r = 0; r < runs; r++) { /* interleaved: drifts hit all three alike */
            base[r] = time_copy(MEMCPY, m, src, dst, n);
            in[r] = time_copy(COPY_IN, m, src, dst, n);
            out[r] = time_copy(COPY_OUT, m, src, dst, n);
        }
        double gb_base = (double)n / median(base, runs) / 1e9;
        double gb_in = (double)n / median(in, runs) / 1e9;
        double gb_out = (double)n / median(out, runs) / 1e9;
        char sz[32];
        if (tsv)
            printf("copy\t%zu\t%.6g\t%.6g\t%.6g\n", n, gb_base, gb_in, gb_out);
        else
            printf("  %8s %10.2f %10.2f %8.2f %10.2f %8.2f\n", size_str(n, sz, sizeof sz), gb_base, gb_in,
                   gb_in / gb_base, gb_out, gb_out / gb_base);
        if (memcmp(dst, src, n) != 0) {
            fprintf(stderr, "tshm_bench: copy_out returned different bytes\n");
            exit(1);
        }
        tshm_mapping_decref(m);
        free(src);
        free(dst);
    }
    if (!tsv)
        printf("\n");
}

/* ---- 3. reference counting ------------------------------------------- */

#define REF_PAIRS 5000000L
static long ref_pairs = REF_PAIRS; /* scaled by --seconds */

struct ref_args {
    tshm_mapping *m;
    pthread_barrier_t *start;
    double seconds;
};

static void *ref_worker(void *p)
{
    struct ref_args *a = p;
    pthread_barrier_wait(a->start);
    double t0 = now();
    for (long i = 0; i < ref_pairs; i++) {
        tshm_mapping_incref(a->m);
        tshm_mapping_decref(a->m);
    }
    a->seconds = now() - t0;
    return NULL;
}

/* Nanoseconds per incref+decref pair, each of `threads` threads doing
 * ref_pairs pairs on the same mapping at once. */
static double ref_pair_ns(tshm_mapping *m, int threads)
{
    pthread_t tid[2];
    struct ref_args args[2];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)threads);
    for (int t = 0; t < threads; t++) {
        args[t] = (struct ref_args){m, &start, 0};
        pthread_create(&tid[t], NULL, ref_worker, &args[t]);
    }
    double worst = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(tid[t], NULL);
        if (args[t].seconds > worst)
            worst = args[t].seconds;
    }
    pthread_barrier_destroy(&start);
    return worst / (double)ref_pairs * 1e9;
}

static void bench_refcount(void)
{
    tshm_mapping *m = anonymous_segment(4 * KiB);
    double one[RUNS], two[RUNS];
    for (int r = 0; r < runs; r++) {
        one[r] = ref_pair_ns(m, 1);
        two[r] = ref_pair_ns(m, 2);
    }
    if (tshm_mapping_refs(m) != 1) {
        fprintf(stderr, "tshm_bench: reference count drifted to %zu\n", tshm_mapping_refs(m));
        exit(1);
    }
    if (tsv) {
        printf("refcount\t1\t%.6g\n", median(one, runs));
        printf("refcount\t2\t%.6g\n", median(two, runs));
    } else {
        printf("Reference counting (median of %d runs of %ld pairs)\n", runs, ref_pairs);
        printf("  incref+decref, 1 thread:                   %6.1f ns/pair\n", median(one, runs));
        printf("  incref+decref, 2 threads on one mapping:   %6.1f ns/pair (per thread)\n", median(two, runs));
    }
    tshm_mapping_decref(m);
}

static void usage(FILE *to)
{
    fprintf(to, "usage: tshm_bench [--seconds S] [--tsv]\n"
                "  --seconds S  scale the timed loops so the run takes about S seconds (default about %.0f)\n"
                "  --tsv        tab-separated figures instead of tables (see the top of tshm_bench.c)\n",
            DEFAULT_SECONDS);
}

int main(int argc, char **argv)
{
    double seconds = DEFAULT_SECONDS;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--tsv") == 0) {
            tsv = 1;
        } else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
            char *end;
            seconds = strtod(argv[++i], &end);
            if (*end != '\0' || !(seconds > 0) || seconds > 3600) {
                fprintf(stderr, "tshm_bench: --seconds wants a number of seconds in (0, 3600], not %s\n", argv[i]);
                return 2;
            }
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    scale = seconds / DEFAULT_SECONDS;
    if (scale < 0.25)
        runs = QUICK_RUNS;
    ref_pairs = (long)((double)REF_PAIRS * scale);
    if (ref_pairs < 10000)
        ref_pairs = 10000;

    if (tsv) {
        printf("meta\tcpus\t%ld\n", sysconf(_SC_NPROCESSORS_ONLN));
        printf("meta\tpage_size\t%ld\n", sysconf(_SC_PAGESIZE));
        printf("meta\tseconds\t%g\n", seconds);
    } else {
        printf("tshm_bench: tritonshm C core, %ld online CPUs, page size %ld\n\n", sysconf(_SC_NPROCESSORS_ONLN),
               sysconf(_SC_PAGESIZE));
    }
    bench_lifecycle();
    bench_copies();
    bench_refcount();
    return 0;
}
