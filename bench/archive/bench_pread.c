/* bench_pread.c - how fast do threads read a file that is in the page cache?
 *
 *   bench_pread FILE [THREADS] [CHUNK_MIB] [MODE] [REPEAT]
 *
 * THREADS (default 12, as ferry's ring) each pread CHUNK_MIB (default 4, the
 * ring's buffer size) pieces, taken round-robin over the file, into their own
 * buffer, which is written once before the clock starts. No GPU: this isolates
 * what the kernel costs from what the copy engines cost. MODE:
 *   normal   plain pread
 *   noreuse  posix_fadvise(POSIX_FADV_NOREUSE) on the descriptor first
 *   mmap     memcpy from a MAP_SHARED, PROT_READ mapping of the file
 *   mmapdrop the same, each piece unmapped (MADV_DONTNEED) after its copy,
 *            so the process's RSS stays at the pieces in flight
 *   populate the same, each piece faulted in with MADV_POPULATE_READ first
 *   runs     pread, but each thread opens the file itself (its own readahead
 *            state) and takes runs of 16 consecutive pieces (ferry's ring
 *            for buffered reads)
 * REPEAT (default 1) passes in the same process. One JSON line per pass, with
 * the file's share in the page cache and the system's Active(file) and
 * Inactive(file) before the pass, so "first read after a fresh read" shows.
 * bench/archive/gpu_session3.sh runs it after dropping and re-reading the cache. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct job {
    int fd;
    const unsigned char *map;
    int drop, populate;
    unsigned run;
    uint64_t size, chunk;
    unsigned k, nthreads;
    int err;
} job;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static long meminfo_kib(const char *key)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    long v = -1;
    size_t n = strlen(key);
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0 && line[n] == ':') {
            v = strtol(line + n + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

static double vmhwm_mib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double v = -1;
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0) v = (double)strtol(line + 6, NULL, 10) / 1024;
    fclose(f);
    return v;
}

static double cached_share(int fd, uint64_t size)
{
    long pg = sysconf(_SC_PAGESIZE);
    void *m = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) return -1;
    uint64_t np = (size + (uint64_t)pg - 1) / (uint64_t)pg, in = 0;
    unsigned char *v = malloc(np);
    double r = -1;
    if (v && mincore(m, size, v) == 0) {
        for (uint64_t i = 0; i < np; i++) in += v[i] & 1;
        r = (double)in / (double)np;
    }
    free(v);
    munmap(m, size);
    return r;
}

static void *worker(void *arg)
{
    job *j = arg;
    unsigned char *buf = aligned_alloc(4096, j->chunk);
    if (!buf) {
        j->err = ENOMEM;
        return NULL;
    }
    memset(buf, 1, j->chunk);
    uint64_t n = (j->size + j->chunk - 1) / j->chunk;
    unsigned run = j->run ? j->run : 1;
    for (uint64_t i = (uint64_t)j->k * run; i < n && !j->err; i += (i % run == run - 1) ? (uint64_t)(j->nthreads - 1) * run + 1 : 1) {
        uint64_t off = i * j->chunk, len = j->size - off < j->chunk ? j->size - off : j->chunk;
        if (j->map) {
            void *p = (void *)(uintptr_t)(j->map + off);
            if (j->populate && madvise(p, len, 22 /* MADV_POPULATE_READ */) != 0) {
                j->err = errno;
                break;
            }
            memcpy(buf, j->map + off, len);
            if (j->drop) madvise(p, len, MADV_DONTNEED);
            continue;
        }
        uint64_t got = 0;
        while (got < len) {
            ssize_t r = pread(j->fd, buf + got, len - got, (off_t)(off + got));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
                j->err = r < 0 ? errno : EIO;
                break;
            }
            got += (uint64_t)r;
        }
    }
    free(buf);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_pread FILE [THREADS] [CHUNK_MIB] [normal|noreuse|mmap] [REPEAT]\n");
        return 2;
    }
    unsigned nthreads = argc > 2 ? (unsigned)atoi(argv[2]) : 12;
    uint64_t chunk = (argc > 3 ? (uint64_t)atoi(argv[3]) : 4) << 20;
    const char *mode = argc > 4 ? argv[4] : "normal";
    int repeat = argc > 5 ? atoi(argv[5]) : 1;
    if (nthreads < 1 || nthreads > 256 || chunk == 0 || repeat < 1) {
        fprintf(stderr, "bench_pread: bad THREADS, CHUNK_MIB or REPEAT\n");
        return 2;
    }
    int fd = open(argv[1], O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        fprintf(stderr, "bench_pread: %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    uint64_t size = (uint64_t)sb.st_size;
    const unsigned char *map = NULL;
    if (strcmp(mode, "noreuse") == 0) {
        int e = posix_fadvise(fd, 0, 0, POSIX_FADV_NOREUSE);
        if (e) fprintf(stderr, "bench_pread: POSIX_FADV_NOREUSE: %s\n", strerror(e));
    } else if (strcmp(mode, "mmap") == 0 || strcmp(mode, "mmapdrop") == 0 || strcmp(mode, "populate") == 0) {
        void *m = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            fprintf(stderr, "bench_pread: mmap %s: %s\n", argv[1], strerror(errno));
            return 1;
        }
        map = m;
    } else if (strcmp(mode, "normal") != 0 && strcmp(mode, "runs") != 0) {
        fprintf(stderr, "bench_pread: unknown mode %s\n", mode);
        return 2;
    }
    for (int r = 0; r < repeat; r++) {
        double share = cached_share(fd, size);
        long act = meminfo_kib("Active(file)"), inact = meminfo_kib("Inactive(file)");
        job jobs[256];
        pthread_t th[256];
        double t0 = now();
        for (unsigned k = 0; k < nthreads; k++) {
            jobs[k] = (job){fd, map, strcmp(mode, "mmap") != 0, strcmp(mode, "populate") == 0, 0, size, chunk, k,
                            nthreads, 0};
            if (strcmp(mode, "runs") == 0) {
                jobs[k].run = 16;
                jobs[k].fd = open(argv[1], O_RDONLY | O_CLOEXEC);
                if (jobs[k].fd < 0) {
                    fprintf(stderr, "bench_pread: %s: %s\n", argv[1], strerror(errno));
                    return 1;
                }
            }
            pthread_create(&th[k], NULL, worker, &jobs[k]);
        }
        int err = 0;
        for (unsigned k = 0; k < nthreads; k++) {
            pthread_join(th[k], NULL);
            if (jobs[k].err) err = jobs[k].err;
        }
        double s = now() - t0;
        for (unsigned k = 0; k < nthreads; k++)
            if (jobs[k].fd != fd) close(jobs[k].fd);
        if (err) {
            fprintf(stderr, "bench_pread: reading %s: %s\n", argv[1], strerror(err));
            return 1;
        }
        printf("{\"mode\": \"%s\", \"pass\": %d, \"threads\": %u, \"chunk_mib\": %llu, \"seconds\": %.4f, "
               "\"gbps\": %.2f, \"cached_share_before\": %.3f, \"active_file_gib\": %.2f, "
               "\"inactive_file_gib\": %.2f, \"vmhwm_mib\": %.1f}\n",
               mode, r + 1, nthreads, (unsigned long long)(chunk >> 20), s, (double)size / s / 1e9, share,
               (double)act / (1 << 20), (double)inact / (1 << 20), vmhwm_mib());
        fflush(stdout);
    }
    return 0;
}
