/* SPDX-License-Identifier: Apache-2.0 */
/* test_store_spill.c - the store's spill file: dirty saves spilled and read
 * back, faults in fallocate and pwrite, a spill batch that fails for space
 * (all it reserved given back; on a real small file system where root can
 * loop-mount one), a tmpfs spill directory refused, and kill -9 during a
 * spill. */
#define _GNU_SOURCE
#include "store_common.h"

static int files_in(const char *path)
{
    DIR *dd = opendir(path);
    if (!dd) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dd)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(dd);
    return n;
}

static void test_spill(ferry_ctx *ctx)
{
    ferry_device *d = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:1GiB", &d), 0);
    ferry_file *fa = open_model(ctx, "a.safetensors");
    if (!d || !fa) goto out;
    /* a host budget of 1 byte: dirty tensors must spill */
    ferry_store *s = mk_store(d, 0, 1, 1);
    ferry_model *ma = NULL;
    CHECK_EQ(ferry_store_add(s, "a", &fa, 1, 0, &ma), 0);
    if (!ma) goto free_store;
    CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
    CHECK_EQ(modify(ma, 2, 0x33), 0);
    CHECK_EQ(modify(ma, 3, 0x33 ^ 0x33), 0); /* written with equal bytes: still dirty */

    /* faults while spilling: fallocate (no space) then pwrite (I/O error): nothing is lost */
    int errs[] = {ENOSPC, EIO};
    for (int e = 0; e < 2; e++) {
        for (long nth = 1; nth < 40; nth++) {
            fy_fault_arm(nth, errs[e]);
            int rc = ferry_model_evict(ma, NULL, 0);
            bool fired = fy_fault_fired();
            fy_fault_arm(0, 0);
            if (!fired) {
                CHECK_EQ(rc, 0);
                break;
            }
            CHECK(rc < 0);
            ferry_tensor_state w = {.size = sizeof w};
            ferry_model_tensor_state(ma, 2, &w);
            CHECK_EQ(w.tier, FERRY_TIER_DEVICE); /* the dirty tensor stayed */
            CHECK_EQ(verify(ma, fa, 2, 0x33), 0);
            CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
        }
        ferry_tensor_state w = {.size = sizeof w};
        ferry_model_tensor_state(ma, 2, &w);
        CHECK_EQ(w.tier, FERRY_TIER_SPILL);
        CHECK_EQ(verify(ma, fa, 2, 0x33), 0);
        ferry_store_stats st = {.size = sizeof st};
        ferry_store_get_stats(s, &st);
        CHECK(st.bytes_written >= w.nbytes);
        CHECK(st.spill_file_bytes >= w.nbytes);
        CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0); /* back from the spill file */
        CHECK_EQ(verify(ma, fa, 2, 0x33), 0);
        ferry_store_get_stats(s, &st);
        CHECK(st.spill_file_bytes >= w.nbytes); /* kept allocated for the next spill ... */
        CHECK_EQ(ferry_store_make_room(s, 0, NULL), 0);
        ferry_store_get_stats(s, &st);
        CHECK_EQ(st.spill_file_bytes, 0); /* ... until make_room gives it back: the file is cut */
    }
    CHECK_EQ(files_in(spill_dir), 0); /* the spill file has no name */
    /* a read error while bringing a spilled tensor back: a clean error, the
     * tensor stays in the spill file, nothing allocated stays behind */
    {
        CHECK_EQ(ferry_model_evict(ma, NULL, 0), 0);
        ferry_tensor_state w = {.size = sizeof w};
        ferry_model_tensor_state(ma, 2, &w);
        CHECK_EQ(w.tier, FERRY_TIER_SPILL);
        for (long nth = 1; nth < 200; nth++) {
            fy_fault_arm(nth, EIO);
            int rc = ferry_model_to_device(ma, NULL, 0);
            bool fired = fy_fault_fired();
            fy_fault_arm(0, 0);
            if (!fired) {
                CHECK_EQ(rc, 0);
                break;
            }
            CHECK(rc < 0);
            ferry_model_tensor_state(ma, 2, &w);
            CHECK_EQ(w.tier, FERRY_TIER_SPILL);
            CHECK_EQ(tier_bytes(s, FERRY_TIER_DEVICE), 0);
            CHECK_EQ(verify(ma, fa, 2, 0x33), 0);
        }
        ferry_model_tensor_state(ma, 2, &w);
        CHECK_EQ(w.tier, FERRY_TIER_DEVICE);
        CHECK_EQ(verify(ma, fa, 2, 0x33), 0);
    }
    /* a failed reservation for one tensor must not release another tensor's
     * spilled range (the simulate scenarios reach this too) */
    {
        CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
        CHECK_EQ(ferry_store_make_room(s, 0, NULL), 0);
        CHECK_EQ(modify(ma, 0, 0x0F), 0); /* blk.0.w (already modified 2 stays dirty) */
        int64_t g0 = 0, g1 = 2;
        CHECK_EQ(ferry_model_evict(ma, &g0, 1), 0); /* blk.0 spilled */
        fy_fault_arm(1, ENOSPC);
        CHECK(ferry_model_evict(ma, &g1, 1) < 0); /* blk.1's reservation fails */
        fy_fault_arm(0, 0);
        ferry_tensor_state w = {.size = sizeof w};
        ferry_model_tensor_state(ma, 0, &w);
        CHECK_EQ(w.tier, FERRY_TIER_SPILL);
        uint8_t *a = malloc(w.nbytes), *b = malloc(w.nbytes);
        CHECK_EQ(ferry_model_read(ma, 0, a), 0);
        CHECK_EQ(ferry_file_tensor_read(fa, 0, 0, b, w.nbytes), 0);
        for (uint64_t j = 0; j < w.nbytes; j++) b[j] ^= 0x0F;
        CHECK(memcmp(a, b, w.nbytes) == 0);
        free(a);
        free(b);
        CHECK_EQ(ferry_model_evict(ma, NULL, 0), 0);
        CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
        ferry_model_tensor_state(ma, 0, &w);
        CHECK(w.dirty);
    }
free_store:
    ferry_store_free(s);
out:
    ferry_file_close(fa);
    ferry_device_close(d);
}

static void test_refused_tmpfs(ferry_ctx *ctx)
{
    if (access("/dev/shm", W_OK) != 0) return;
    ferry_device *d = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:1GiB", &d), 0);
    ferry_file *fa = open_model(ctx, "a.safetensors");
    ferry_store_opts o = {.size = sizeof o,
                          .host_budget = 1,
                          .pinned_budget = 1,
                          .spill_dir = "/dev/shm",
                          .spill_below = 1,
                          .spill_above = 2};
    ferry_store *s = NULL;
    ferry_model *ma = NULL;
    if (d && fa && ferry_store_new(d, &o, &s) == 0 && ferry_store_add(s, "a", &fa, 1, 0, &ma) == 0) {
        CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
        CHECK_EQ(modify(ma, 0, 0x11), 0);
        CHECK(ferry_model_evict(ma, NULL, 0) < 0);
        CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "tmpfs");
        ferry_tensor_state w = {.size = sizeof w};
        ferry_model_tensor_state(ma, 0, &w);
        CHECK_EQ(w.tier, FERRY_TIER_DEVICE);
        CHECK_EQ(verify(ma, fa, 0, 0x11), 0);
    }
    ferry_store_free(s);
    ferry_file_close(fa);
    ferry_device_close(d);
}

/* ---- a spill batch that fails for space ---- */

/* The store's spill file: this process's descriptor whose link is in sd (an
 * O_TMPFILE shows as "sd/#ino (deleted)"), or -1. */
static int spill_fd_in(const char *sd)
{
    DIR *dd = opendir("/proc/self/fd");
    if (!dd) return -1;
    int fd = -1;
    size_t n = strlen(sd);
    struct dirent *e;
    while (fd < 0 && (e = readdir(dd))) {
        char link[300], target[1024];
        snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
        ssize_t k = readlink(link, target, sizeof target - 1);
        if (k <= 0) continue;
        target[k] = '\0';
        if (strncmp(target, sd, n) == 0 && target[n] == '/') fd = atoi(e->d_name);
    }
    closedir(dd);
    return fd;
}

/* Bytes of data the spill file in sd has allocated, 0 when there is none:
 * its extents (FIEMAP), so that the file system's own metadata is not
 * counted (ext4 keeps an extent-tree block once a file had more than four
 * extents, after a truncate too); st_blocks where FIEMAP is missing. With
 * FIEMAP, st_blocks is checked to be within two blocks of metadata of it. */
static uint64_t spill_blocks_in(const char *sd)
{
    int fd = spill_fd_in(sd);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) return 0;
    const uint64_t blocks = (uint64_t)st.st_blocks * 512;
    union {
        struct fiemap f;
        char b[sizeof(struct fiemap) + 64 * sizeof(struct fiemap_extent)];
    } u;
    uint64_t data = 0, start = 0;
    for (;;) {
        memset(&u, 0, sizeof u);
        u.f.fm_start = start;
        u.f.fm_length = FIEMAP_MAX_OFFSET;
        u.f.fm_flags = FIEMAP_FLAG_SYNC;
        u.f.fm_extent_count = 64;
        if (ioctl(fd, FS_IOC_FIEMAP, &u.f) < 0) return blocks;
        if (u.f.fm_mapped_extents == 0) break;
        const struct fiemap_extent *e = u.f.fm_extents;
        for (uint32_t i = 0; i < u.f.fm_mapped_extents; i++) data += e[i].fe_length;
        const struct fiemap_extent *last = &e[u.f.fm_mapped_extents - 1];
        if (last->fe_flags & FIEMAP_EXTENT_LAST) break;
        start = last->fe_logical + last->fe_length;
    }
    CHECK(blocks >= data && blocks <= data + 2 * (uint64_t)st.st_blksize);
    return data;
}

static uint64_t spill_file_bytes(ferry_store *s)
{
    ferry_store_stats st = {.size = sizeof st};
    ferry_store_get_stats(s, &st);
    return st.spill_file_bytes;
}

/* fallocate through the table: reservations (mode 0) counted, the
 * falloc_fail_at-th of them failing with ENOSPC (0: none); punches pass. */
static atomic_int falloc_calls, falloc_fail_at;
static int nth_fallocate(int fd, int mode, off_t off, off_t len)
{
    if (mode == 0 && atomic_fetch_add(&falloc_calls, 1) + 1 == atomic_load(&falloc_fail_at)) {
        errno = ENOSPC;
        return -1;
    }
    return fallocate(fd, mode, off, len);
}

/* fstatfs through the table: the real answer, with fake_free bytes free when
 * fake_free is set, or fake_extra bytes more than the real free space. */
static _Atomic uint64_t fake_free, fake_extra;
static int fake_fstatfs(int fd, struct statfs *sf)
{
    if (fstatfs(fd, sf) < 0) return -1;
    uint64_t f = atomic_load(&fake_free);
    sf->f_bavail +=
        (fsblkcnt_t)(atomic_load(&fake_extra) / (uint64_t)(sf->f_frsize ? sf->f_frsize : sf->f_bsize));
    if (f) {
        sf->f_frsize = 4096;
        sf->f_bavail = (fsblkcnt_t)(f / 4096);
    }
    return 0;
}

/* Every tensor of m makes its file's bytes XOR x; and, as tensors < nb
 * (every one when nb < 0), it is in tier t. */
static int check_xor(ferry_model *m, ferry_file *f, uint8_t x, int64_t nb, ferry_tier t)
{
    int bad = 0;
    for (int64_t i = 0; i < ferry_model_tensor_count(m); i++) {
        ferry_tensor_state st = {.size = sizeof st};
        ferry_model_tensor_state(m, i, &st);
        uint8_t *a = malloc(st.nbytes + 1), *b = malloc(st.nbytes + 1);
        int r1 = ferry_model_read(m, i, a), r2 = ferry_file_tensor_read(f, i, 0, b, st.nbytes);
        for (uint64_t j = 0; j < st.nbytes; j++) b[j] ^= x;
        if (r1 || r2 || memcmp(a, b, st.nbytes) != 0 || ((nb < 0 || i < nb) && st.tier != t)) {
            fprintf(stderr, "check_xor: %s (tier %s) differs (%d %d)\n", st.name, ferry_tier_name(st.tier),
                    r1, r2);
            bad++;
        }
        free(a);
        free(b);
    }
    return bad;
}

/* Mark every tensor of m dirty by changing it (XOR x); returns the bytes its
 * spill needs (each tensor rounded up to the spill file's 4 KiB). */
static uint64_t dirty_all(ferry_model *m, uint8_t x)
{
    uint64_t need = 0;
    for (int64_t i = 0; i < ferry_model_tensor_count(m); i++) {
        ferry_tensor_state st = {.size = sizeof st};
        ferry_model_tensor_state(m, i, &st);
        CHECK_EQ(modify(m, i, x), 0);
        need += (st.nbytes + 4095) / 4096 * 4096;
    }
    return need;
}

/* The N-th reservation of a batch fails with ENOSPC, for every N: the batch
 * gives back all it reserved before returning (the spill file's blocks as
 * before; while freed ranges were held for reuse, those go back too), every
 * tensor stays on the device with its bytes, another model's spilled tensor is
 * untouched, and the message gives the batch's total. */
static void test_spill_batch_enospc(ferry_ctx *ctx)
{
    ferry_device *d = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:1GiB", &d), 0);
    ferry_file *fa = open_model(ctx, "a.safetensors"), *fb = open_model(ctx, "b.safetensors");
    ferry_store *s = d ? mk_store(d, 0, 1, 1) : NULL;
    ferry_model *ma = NULL, *mb = NULL;
    if (!s || !fa || !fb) goto out;
    CHECK_EQ(ferry_store_add(s, "a", &fa, 1, 0, &ma), 0);
    CHECK_EQ(ferry_store_add(s, "b", &fb, 1, 0, &mb), 0);
    if (!ma || !mb) goto out;
    CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
    CHECK_EQ(ferry_model_to_device(mb, NULL, 0), 0);
    /* b's first weight is spilled first: the batch reserves around it */
    CHECK_EQ(modify(mb, 0, 0x77), 0);
    int64_t g0 = 0;
    CHECK_EQ(ferry_model_evict(mb, &g0, 1), 0);
    const uint64_t b_bytes = spill_file_bytes(s), b_blocks = spill_blocks_in(spill_dir);
    CHECK_EQ(b_bytes, (130001 + 4095) / 4096 * 4096);
    CHECK(b_blocks >= b_bytes);
    uint8_t x = 0x5A;
    const uint64_t total = dirty_all(ma, x);
    const int64_t nt = ferry_model_tensor_count(ma);
    char want[64];
    snprintf(want, sizeof want, "%" PRId64 " dirty tensors (%" PRIu64 " bytes", nt, total);
    CHECK_EQ(fy_sys_set("fallocate", (fy_sys_fn)nth_fallocate), 0);
    for (int held = 0; held < 2; held++) {
        int nth;
        for (nth = 1; nth < 64; nth++) {
            if (held) { /* a spilled and back: its ranges are free, their blocks kept for the next spill */
                atomic_store(&falloc_fail_at, 0);
                CHECK_EQ(ferry_model_evict(ma, NULL, 0), 0);
                CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
                CHECK_EQ(spill_file_bytes(s), b_bytes + total);
                CHECK(spill_blocks_in(spill_dir) >= b_bytes + total);
            }
            const uint64_t blocks0 = spill_blocks_in(spill_dir), bytes0 = spill_file_bytes(s);
            atomic_store(&falloc_calls, 0);
            atomic_store(&falloc_fail_at, nth);
            int rc = ferry_model_evict(ma, NULL, 0);
            atomic_store(&falloc_fail_at, 0);
            if (atomic_load(&falloc_calls) < nth) { /* no reservation failed */
                CHECK_EQ(rc, 0);
                CHECK_EQ(check_xor(ma, fa, x, -1, FERRY_TIER_SPILL), 0);
                CHECK_EQ(spill_file_bytes(s), b_bytes + total);
                CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
                break;
            }
            CHECK_EQ(rc, -ENOSPC);
            const char *m = ferry_ctx_errmsg(ctx);
            CHECK_STR_HAS(m, want); /* the batch's total, not what was left */
            CHECK_STR_HAS(m, spill_dir);
            CHECK_STR_HAS(m, "stay on the device");
            /* everything the batch reserved is given back; held ranges too */
            CHECK_EQ(spill_blocks_in(spill_dir), held ? b_blocks : blocks0);
            CHECK_EQ(spill_file_bytes(s), held ? b_bytes : bytes0);
            CHECK_EQ(tier_bytes(s, FERRY_TIER_SPILL), 130001);
            CHECK_EQ(check_xor(ma, fa, x, -1, FERRY_TIER_DEVICE), 0);
            CHECK_EQ(verify(mb, fb, 0, 0x77), 0);
        }
        CHECK_EQ(nth, nt + 1); /* one reservation a tensor */
    }
    fy_sys_reset();
    CHECK_EQ(ferry_model_evict(ma, NULL, 0), 0);
    CHECK_EQ(check_xor(ma, fa, x, -1, FERRY_TIER_SPILL), 0);
    CHECK_EQ(verify(mb, fb, 0, 0x77), 0);
out:
    fy_sys_reset();
    ferry_store_free(s);
    ferry_file_close(fa);
    ferry_file_close(fb);
    ferry_device_close(d);
}

/* A batch larger than the free space (as fstatfs says) fails before any of it
 * is reserved, with a message naming the directory, the total and the bytes
 * free; one that fits goes through. */
static void test_spill_batch_room(ferry_ctx *ctx)
{
    ferry_device *d = NULL;
    CHECK_EQ(ferry_device_open(ctx, "sim:1GiB", &d), 0);
    ferry_file *fa = open_model(ctx, "a.safetensors");
    ferry_store *s = d ? mk_store(d, 0, 1, 1) : NULL;
    ferry_model *ma = NULL;
    if (!s || !fa) goto out;
    CHECK_EQ(ferry_store_add(s, "a", &fa, 1, 0, &ma), 0);
    if (!ma) goto out;
    CHECK_EQ(ferry_model_to_device(ma, NULL, 0), 0);
    const uint64_t total = dirty_all(ma, 0x21);
    CHECK_EQ(fy_sys_set("fallocate", (fy_sys_fn)nth_fallocate), 0);
    CHECK_EQ(fy_sys_set("fstatfs", (fy_sys_fn)fake_fstatfs), 0);
    atomic_store(&fake_free, total - 4096);
    atomic_store(&falloc_calls, 0);
    CHECK_EQ(ferry_model_evict(ma, NULL, 0), -ENOSPC);
    CHECK_EQ(atomic_load(&falloc_calls), 0); /* nothing reserved */
    const char *m = ferry_ctx_errmsg(ctx);
    char want[96];
    CHECK_STR_HAS(m, spill_dir);
    snprintf(want, sizeof want, "%" PRIu64 " bytes needed, %" PRIu64 " bytes free", total, total - 4096);
    CHECK_STR_HAS(m, want);
    CHECK_STR_HAS(m, "stay on the device");
    CHECK_EQ(spill_blocks_in(spill_dir), 0);
    CHECK_EQ(spill_file_bytes(s), 0);
    CHECK_EQ(check_xor(ma, fa, 0x21, -1, FERRY_TIER_DEVICE), 0);
    /* exactly enough */
    atomic_store(&fake_free, total);
    CHECK_EQ(ferry_model_evict(ma, NULL, 0), 0);
    CHECK_EQ(atomic_load(&falloc_calls), (int)ferry_model_tensor_count(ma));
    CHECK_EQ(check_xor(ma, fa, 0x21, -1, FERRY_TIER_SPILL), 0);
    CHECK_EQ(spill_file_bytes(s), total);
out:
    fy_sys_reset();
    atomic_store(&fake_free, 0);
    ferry_store_free(s);
    ferry_file_close(fa);
    ferry_device_close(d);
}

/* The batch on a real, small file system (the case): a 64 MiB ext4
 * image, loop-mounted in a mount namespace of a child process of its own (it
 * goes when the child ends, however it ends). Needs root, mkfs.ext4 and loop
 * devices; skipped without them. */
static uint64_t fs_free(const char *path)
{
    struct statvfs sv;
    if (statvfs(path, &sv) != 0) return 0;
    return (uint64_t)sv.f_bavail * sv.f_frsize;
}

static void small_fs_child(const char *mnt)
{
    ferry_ctx *c2 = NULL;
    ferry_device *d = NULL;
    ferry_file *f = NULL;
    ferry_store *s = NULL;
    ferry_model *m = NULL;
    char path[512];
    snprintf(path, sizeof path, "%s/big.safetensors", dir);
    CHECK_EQ(ferry_ctx_new(NULL, &c2), 0);
    CHECK_EQ(ferry_device_open(c2, "sim:1GiB", &d), 0);
    CHECK_EQ(ferry_file_open(c2, path, 0, &f), 0);
    ferry_store_opts o = {.size = sizeof o,
                          .host_budget = 1,
                          .pinned_budget = 1,
                          .spill_dir = mnt,
                          .spill_below = 1,
                          .spill_above = 2};
    CHECK_EQ(ferry_store_new(d, &o, &s), 0);
    if (!s || !f) return;
    CHECK_EQ(ferry_store_add(s, "big", &f, 1, 0, &m), 0);
    if (!m) return;
    CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0);
    const uint64_t total = dirty_all(m, 0x3C), free0 = fs_free(mnt);
    printf("small_fs: %" PRIu64 " bytes to spill, %" PRIu64 " bytes free\n", total, free0);
    CHECK(total > free0);
    CHECK_EQ(fy_sys_set("fallocate", (fy_sys_fn)nth_fallocate), 0);
    /* 1. the free-space check refuses the batch before reserving any of it */
    atomic_store(&falloc_calls, 0);
    CHECK_EQ(ferry_model_evict(m, NULL, 0), -ENOSPC);
    CHECK_EQ(atomic_load(&falloc_calls), 0);
    CHECK_STR_HAS(ferry_ctx_errmsg(c2), mnt);
    char want[64];
    snprintf(want, sizeof want, "%" PRIu64 " bytes needed", total);
    CHECK_STR_HAS(ferry_ctx_errmsg(c2), want);
    CHECK_EQ(fs_free(mnt), free0);
    CHECK_EQ(check_xor(m, f, 0x3C, -1, FERRY_TIER_DEVICE), 0);
    /* 2. a file system that says it has more than it has (or space taken by
     * someone else after the check): the file system's own ENOSPC, part-way */
    atomic_store(&fake_extra, 1ull << 30);
    CHECK_EQ(fy_sys_set("fstatfs", (fy_sys_fn)fake_fstatfs), 0);
    atomic_store(&falloc_calls, 0);
    int rc = ferry_model_evict(m, NULL, 0);
    CHECK_EQ(rc, -ENOSPC);
    printf("small_fs: %d reservations, the last failed: %s\n", atomic_load(&falloc_calls),
           ferry_ctx_errmsg(c2));
    CHECK_STR_HAS(ferry_ctx_errmsg(c2), "cannot reserve"); /* fallocate's own ENOSPC */
    CHECK(atomic_load(&falloc_calls) > 1);
    snprintf(want, sizeof want, "(%" PRIu64 " bytes in the spill file)", total);
    CHECK_STR_HAS(ferry_ctx_errmsg(c2), want);
    uint64_t free1 = fs_free(mnt);
    printf("small_fs: %" PRIu64 " bytes free after the failed batch\n", free1);
    CHECK_EQ(free1, free0);
    CHECK_EQ(spill_blocks_in(mnt), 0);
    CHECK_EQ(check_xor(m, f, 0x3C, -1, FERRY_TIER_DEVICE), 0);
    fy_sys_reset();
    /* 3. half the model fits: spilled, back, and the space returned */
    int64_t half[16];
    for (int i = 0; i < 16; i++) half[i] = i;
    CHECK_EQ(ferry_model_evict(m, half, 16), 0);
    CHECK(fs_free(mnt) < free0 - total / 3);
    CHECK_EQ(check_xor(m, f, 0x3C, 16, FERRY_TIER_SPILL), 0);
    CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0);
    CHECK_EQ(ferry_store_make_room(s, 0, NULL), 0);
    CHECK_EQ(fs_free(mnt), free0);
    CHECK_EQ(check_xor(m, f, 0x3C, -1, FERRY_TIER_DEVICE), 0);
    ferry_store_free(s);
    ferry_file_close(f);
    ferry_device_close(d);
    ferry_ctx_free(c2);
}

static void test_small_fs(void)
{
    if (geteuid() != 0) {
        check_skip("a small real file system needs root (a loop mount)");
        return;
    }
    char img[512], mnt[512], cmd[1200];
    snprintf(img, sizeof img, "%s/small.img", dir);
    snprintf(mnt, sizeof mnt, "%s/small", dir);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(120);
        int fd = open(img, O_CREAT | O_RDWR | O_TRUNC, 0600);
        bool ok = fd >= 0 && ftruncate(fd, 64 << 20) == 0;
        if (fd >= 0) close(fd);
        snprintf(cmd, sizeof cmd, "mkfs.ext4 -q -F '%s' >/dev/null 2>&1", img);
        ok = ok && mkdir(mnt, 0700) == 0 && system(cmd) == 0;
        /* a mount of our own: gone with this process */
        ok = ok && unshare(CLONE_NEWNS) == 0 && mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0;
        snprintf(cmd, sizeof cmd, "mount -o loop '%s' '%s' >/dev/null 2>&1", img, mnt);
        ok = ok && system(cmd) == 0;
        if (!ok) _exit(77);
        int failed0 = check_fail; /* (the cases before this one count too) */
        small_fs_child(mnt);
        fflush(NULL);
        _exit(check_fail > failed0 ? 1 : 0);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    if (WIFEXITED(status) && WEXITSTATUS(status) == 77) check_skip("cannot make a loop-mounted ext4 here");
    else CHECK_EQ(WEXITSTATUS(status), 0);
    unlink(img);
    rmdir(mnt);
}

/* kill -9 in the middle of spilling: no file is left in the spill directory */
static void test_kill9(ferry_ctx *ctx)
{
    (void)ctx;
    int p[2];
    if (pipe(p) != 0) return;
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        ferry_ctx *c2 = NULL;
        ferry_device *d = NULL;
        ferry_file *f = NULL;
        ferry_store *s = NULL;
        ferry_model *m = NULL;
        char path[512];
        snprintf(path, sizeof path, "%s/big.safetensors", dir);
        if (ferry_ctx_new(NULL, &c2) || ferry_device_open(c2, "sim:1GiB", &d) ||
            ferry_file_open(c2, path, 0, &f))
            _exit(3);
        ferry_store_opts o = {.size = sizeof o,
                              .host_budget = 1,
                              .pinned_budget = 1,
                              .spill_dir = spill_dir,
                              .spill_below = 1,
                              .spill_above = 2};
        if (ferry_store_new(d, &o, &s) || ferry_store_add(s, "big", &f, 1, 0, &m)) _exit(3);
        for (int round = 0;; round++) { /* spill and reload until killed */
            if (ferry_model_to_device(m, NULL, 0)) _exit(4);
            for (int64_t i = 0; i < ferry_model_tensor_count(m); i++) ferry_model_mark_dirty(m, i);
            if (round == 1 && write(p[1], "x", 1) != 1) _exit(5);
            if (ferry_model_evict(m, NULL, 0)) _exit(6);
        }
    }
    close(p[1]);
    char x;
    bool started = read(p[0], &x, 1) == 1;
    CHECK(started);
    usleep(20000);
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    close(p[0]);
    CHECK_EQ(files_in(spill_dir), 0);
}

#define CASES(CASE)                                        \
    CASE(spill, test_spill(ctx))                           \
    CASE(spill_batch_enospc, test_spill_batch_enospc(ctx)) \
    CASE(spill_batch_room, test_spill_batch_room(ctx))     \
    CASE(small_fs, test_small_fs())                        \
    CASE(refused_tmpfs, test_refused_tmpfs(ctx))           \
    CASE(kill9, test_kill9(ctx))
CHECK_CASES_MAIN(CASES, store_main)
