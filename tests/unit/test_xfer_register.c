/* SPDX-License-Identifier: Apache-2.0 */
/* test_xfer_register.c - pre-registration and its budgets, registration
 * in pieces, a file closed while registered, and a registered file cut
 * during a load. */
#define _GNU_SOURCE
#include "xfer_common.h"

/* ---- 3. pre-registration ---- */

static void test_register(ferry_ctx *ctx)
{
    /* a copy-on-write (FERRY_OPEN_PRIVATE) mapping is never page-locked
     * (see fy_map_private); auto and ring still load it */
    {
        char p[512];
        snprintf(p, sizeof p, "%s/odd.safetensors", dir);
        ferry_file *f = NULL;
        ferry_device *d = open_dev(ctx, "sim:256MiB");
        CHECK_EQ(ferry_file_open(ctx, p, FERRY_OPEN_PRIVATE, &f), 0);
        if (f && d) {
            CHECK_EQ(ferry_device_register_file(d, f, 0), FERRY_E_UNSUPPORTED);
            CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "copy-on-write");
            ferry_load_opts o = small_opts(FERRY_ROUTE_REGISTER);
            ferry_loaded *l = NULL;
            CHECK_EQ(ferry_load(d, f, &o, &l, NULL), FERRY_E_UNSUPPORTED);
            CHECK(l == NULL);
            CHECK_EQ(use_of(d).reg, 0);
            CHECK_EQ(use_of(d).dev, 0);
            o = small_opts(FERRY_ROUTE_AUTO);
            ferry_load_stats st = {.size = sizeof st};
            CHECK_EQ(ferry_load(d, f, &o, &l, &st), 0);
            CHECK(st.route != FERRY_ROUTE_REGISTER);
            if (l) CHECK_EQ(verify_loaded(l, f, "private mapping, auto"), 0);
            ferry_loaded_free(l);
        }
        ferry_device_close(d);
        ferry_file_close(f);
    }
    static const char *const files[] = {"odd.safetensors", "sh.safetensors.index.json"};
    for (size_t k = 0; k < 2; k++) {
        ferry_file *f = open_file(ctx, files[k]);
        ferry_device *d = open_dev(ctx, "sim:256MiB");
        if (!f || !d) goto next;
        uint64_t need = file_pages(f);
        CHECK(need > 0);

        /* over budget: refused, nothing registered */
        CHECK_EQ(ferry_device_register_file(d, f, need - 1), FERRY_E_BUDGET);
        CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "pinned budget");
        CHECK_EQ(use_of(d).reg, 0);
        CHECK_EQ(ferry_device_register_file(d, f, 1), FERRY_E_BUDGET);
        CHECK_EQ(use_of(d).reg, 0);
        /* the same budget through a register load */
        ferry_load_opts o = small_opts(FERRY_ROUTE_REGISTER);
        o.pinned_budget = need / 2;
        ferry_loaded *l = NULL;
        CHECK_EQ(ferry_load(d, f, &o, &l, NULL), FERRY_E_BUDGET);
        CHECK(l == NULL);
        CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "pinned budget");
        usage u = use_of(d);
        CHECK_EQ(u.dev, 0);
        CHECK_EQ(u.reg, 0);
        o.pinned_budget = need; /* exactly enough */
        CHECK_EQ(ferry_load(d, f, &o, &l, NULL), 0);
        if (l) CHECK_EQ(verify_loaded(l, f, "register within budget"), 0);
        ferry_loaded_free(l);
        l = NULL;
        CHECK_EQ(use_of(d).reg, 0);

        /* a failed registration of shard 2 undoes shard 1's */
        if (ferry_file_shard_count(f) > 1) {
            fy_gpu_sim_fault(fy_device_gpu(d), FY_OP_HOST_REGISTER, 2);
            CHECK_EQ(ferry_device_register_file(d, f, 0), FERRY_E_DEVICE);
            CHECK_EQ(fy_gpu_sim_fault(fy_device_gpu(d), FY_OP_HOST_REGISTER, 0), 0);
            CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "injected failure");
            CHECK_EQ(use_of(d).reg, 0);
        }

        /* registered: loads use the registration and leave it in place */
        CHECK_EQ(ferry_device_register_file(d, f, need), 0);
        CHECK_EQ(use_of(d).reg, need);
        CHECK_EQ(ferry_device_register_file(d, f, 0), 0); /* again: no change */
        CHECK_EQ(use_of(d).reg, need);
        for (int v = 0; v < 2; v++) {
            ferry_route p = v ? FERRY_ROUTE_AUTO : FERRY_ROUTE_REGISTER;
            o = small_opts(p);
            o.pinned_budget = 1; /* what is registered already does not count again */
            ferry_load_stats st = {.size = sizeof st};
            l = NULL;
            int rc = ferry_load(d, f, &o, &l, &st);
            if (rc < 0) fprintf(stderr, "registered %s: %s\n", ferry_route_name(p), ferry_ctx_errmsg(ctx));
            CHECK_EQ(rc, 0);
            CHECK_EQ(st.route, FERRY_ROUTE_REGISTER);
            if (v) CHECK_STR_HAS(st.why, "registered");
            if (l) CHECK_EQ(verify_loaded(l, f, "registered"), 0);
            ferry_loaded_free(l);
            u = use_of(d);
            CHECK_EQ(u.reg, need);
            CHECK_EQ(u.pinned, 0); /* register needs no ring */
            CHECK_EQ(u.dev, 0);
        }
        /* load_into too */
        {
            fy_gpu *g = fy_device_gpu(d);
            int64_t idx[1] = {ferry_file_tensor_count(f) - 2};
            ferry_tensor_info ti = {.size = sizeof ti};
            const void *want;
            ferry_file_tensor_info(f, idx[0], &ti);
            ferry_file_tensor_data(f, idx[0], &want);
            uint64_t dp[1] = {0};
            CHECK_EQ(g->ops->mem_alloc(g, (size_t)ti.nbytes, &dp[0]), 0);
            o = small_opts(FERRY_ROUTE_AUTO);
            ferry_load_stats st = {.size = sizeof st};
            CHECK_EQ(ferry_load_into(d, f, idx, dp, 1, &o, &st), 0);
            CHECK_EQ(st.route, FERRY_ROUTE_REGISTER);
            uint8_t *buf = malloc((size_t)ti.nbytes);
            CHECK_EQ(dev_read(d, dp[0], buf, (size_t)ti.nbytes), 0);
            CHECK(memcmp(buf, want, (size_t)ti.nbytes) == 0);
            free(buf);
            g->ops->mem_free(g, dp[0]);
        }
        /* a failed load on a registered file keeps the registration */
        fy_gpu_sim_fault(fy_device_gpu(d), FY_OP_COPY, 1);
        o = small_opts(FERRY_ROUTE_AUTO);
        l = NULL;
        CHECK_EQ(ferry_load(d, f, &o, &l, NULL), FERRY_E_DEVICE);
        CHECK_EQ(fy_gpu_sim_fault(fy_device_gpu(d), FY_OP_COPY, 0), 0);
        u = use_of(d);
        CHECK_EQ(u.reg, need);
        CHECK_EQ(u.dev, 0);

        ferry_device_unregister_file(d, f);
        CHECK_EQ(use_of(d).reg, 0);
        ferry_device_unregister_file(d, f); /* twice: nothing */
        ferry_device_unregister_file(d, NULL);
        ferry_device_unregister_file(NULL, f);
        CHECK_EQ(ferry_device_register_file(NULL, f, 0), FERRY_E_INVAL);
        CHECK_EQ(ferry_device_register_file(d, NULL, 0), FERRY_E_INVAL);
        /* no longer registered: auto goes back to the ring */
        ferry_load_stats st = {.size = sizeof st};
        l = NULL;
        CHECK_EQ(ferry_load(d, f, &o, &l, &st), 0);
        CHECK(st.route != FERRY_ROUTE_REGISTER);
        ferry_loaded_free(l);
        CHECK_EQ(use_of(d).reg, 0);
        /* left registered at close: close unregisters (ASan/LSan see the rest) */
        CHECK_EQ(ferry_device_register_file(d, f, 0), 0);
        CHECK_EQ(use_of(d).reg, need);
    next:
        ferry_device_close(d);
        ferry_file_close(f);
    }
}

/* ---- 3b. registration in pieces ---- */

/* Pieces of piece bytes f's registration takes (xfer_impl.h, REG_PIECE). */
static int64_t pieces_of(const ferry_file *f, uint64_t piece)
{
    int64_t n = 0;
    for (int s = 0; s < ferry_file_shard_count(f); s++) {
        struct stat st;
        if (stat(ferry_file_shard_path(f, s), &st) == 0)
            n += (int64_t)((page_round((uint64_t)st.st_size) + piece - 1) / piece);
    }
    return n;
}

/* Tensors whose bytes straddle a piece boundary: the copies the register
 * path must split (the sim refuses a copy that crosses a registration). */
static int straddlers(const ferry_file *f, uint64_t piece)
{
    int n = 0;
    for (int64_t i = 0; i < ferry_file_tensor_count(f); i++) {
        ferry_tensor_info ti = {.size = sizeof ti};
        ferry_file_tensor_info(f, i, &ti);
        if (ti.nbytes && ti.offset / piece != (ti.offset + ti.nbytes - 1) / piece) n++;
    }
    return n;
}

/* A register load registers the file piece by piece (a small piece here, so
 * the test files have tensors across piece boundaries) while it copies:
 * bit-identical results; a fault in the Nth registration fails the load
 * cleanly, naming the file, with nothing left registered; a load with
 * FERRY_LOAD_KEEP_REGISTRATION leaves the registration for the next load,
 * which says it reused it. */
static void test_register_pieces(ferry_ctx *ctx)
{
    static const struct {
        const char *file, *named;
        uint64_t piece;
    } cases[] = {
        {"odd.safetensors", "/odd.safetensors: ", 12 * KiB},              /* not a power of two */
        {"sh.safetensors.index.json", "-of-00002.safetensors: ", 4 * KiB} /* every page its own */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        uint64_t piece = cases[c].piece;
        ferry_file *f = open_file(ctx, cases[c].file);
        ferry_device *d = open_dev(ctx, "sim:256MiB");
        if (!f || !d) goto next;
        fy_device_set_reg_piece(d, piece);
        int64_t np = pieces_of(f, piece);
        uint64_t need = file_pages(f);
        CHECK(np > 2);
        CHECK(straddlers(f, piece) > 0);
        char what[160];
        snprintf(what, sizeof what, "%s in %llu-byte pieces", cases[c].file, (unsigned long long)piece);

        /* registered for the load only, then gone */
        ferry_load_opts o = small_opts(FERRY_ROUTE_REGISTER);
        ferry_load_stats st = {.size = sizeof st};
        ferry_loaded *l = NULL;
        int rc = ferry_load(d, f, &o, &l, &st);
        if (rc < 0) fprintf(stderr, "%s: %s\n", what, ferry_ctx_errmsg(ctx));
        CHECK_EQ(rc, 0);
        CHECK_EQ(st.registration, FERRY_REGISTRATION_NEW);
        CHECK(st.register_seconds > 0);
        if (l) CHECK_EQ(verify_loaded(l, f, what), 0);
        ferry_loaded_free(l);
        CHECK_EQ(use_of(d).reg, 0);
        /* one registration per piece: the (np+1)th never comes */
        CHECK(fy_gpu_sim_fault(fy_device_gpu(d), FY_OP_HOST_REGISTER, np + 1) >= 0);
        l = NULL;
        CHECK_EQ(ferry_load(d, f, &o, &l, NULL), 0);
        CHECK_EQ(fy_gpu_sim_fault(fy_device_gpu(d), FY_OP_HOST_REGISTER, 0), 1); /* one call still to go */
        ferry_loaded_free(l);

        /* the Nth registration fails: a clean error, nothing registered or
         * allocated, and the device still loads */
        for (int64_t n = 1; n <= np; n++) {
            if (n > 3 && n < np - 1 && n % 7) continue; /* the first, the last and a spread between */
            CHECK(fy_gpu_sim_fault(fy_device_gpu(d), FY_OP_HOST_REGISTER, n) >= 0);
            l = NULL;
            o.flags = n % 2 ? FERRY_LOAD_KEEP_REGISTRATION : 0; /* a failed load keeps nothing */
            rc = ferry_load(d, f, &o, &l, NULL);
            CHECK_EQ(fy_gpu_sim_fault(fy_device_gpu(d), FY_OP_HOST_REGISTER, 0), 0);
            CHECK_EQ(rc, FERRY_E_DEVICE);
            CHECK(l == NULL);
            const char *msg = ferry_ctx_errmsg(ctx);
            CHECK_STR_HAS(msg, cases[c].named); /* the file whose registration failed */
            CHECK_STR_HAS(msg, "page-locking bytes");
            CHECK_STR_HAS(msg, "injected failure");
            usage u = use_of(d);
            CHECK_EQ(u.reg, 0);
            CHECK_EQ(u.dev, 0);
            l = NULL;
            CHECK_EQ(ferry_load(d, f, &o, &l, NULL), 0);
            if (l) CHECK_EQ(verify_loaded(l, f, what), 0);
            ferry_loaded_free(l);
            CHECK_EQ(use_of(d).reg, o.flags ? need : 0);
            ferry_device_unregister_file(d, f); /* what the load just kept */
            CHECK_EQ(use_of(d).reg, 0);
        }

        /* kept: the next loads (register and auto) reuse it at no cost */
        o = small_opts(FERRY_ROUTE_REGISTER);
        o.flags = FERRY_LOAD_KEEP_REGISTRATION;
        o.pinned_budget = need - 1; /* kept or not, a registration within the budget */
        CHECK_EQ(ferry_load(d, f, &o, &l, NULL), FERRY_E_BUDGET);
        CHECK_EQ(use_of(d).reg, 0);
        o.pinned_budget = need;
        l = NULL;
        CHECK_EQ(ferry_load(d, f, &o, &l, &st), 0);
        CHECK_EQ(st.registration, FERRY_REGISTRATION_NEW);
        ferry_loaded_free(l);
        CHECK_EQ(use_of(d).reg, need);
        for (int v = 0; v < 2; v++) {
            o = small_opts(v ? FERRY_ROUTE_AUTO : FERRY_ROUTE_REGISTER);
            st = (ferry_load_stats){.size = sizeof st};
            CHECK(fy_gpu_sim_fault(fy_device_gpu(d), FY_OP_HOST_REGISTER, 1) >=
                  0); /* no registration happens */
            l = NULL;
            CHECK_EQ(ferry_load(d, f, &o, &l, &st), 0);
            CHECK_EQ(fy_gpu_sim_fault(fy_device_gpu(d), FY_OP_HOST_REGISTER, 0), 1);
            CHECK_EQ(st.route, FERRY_ROUTE_REGISTER);
            CHECK_EQ(st.registration, FERRY_REGISTRATION_REUSED);
            CHECK(st.register_seconds == 0);
            if (l) CHECK_EQ(verify_loaded(l, f, what), 0);
            ferry_loaded_free(l);
            CHECK_EQ(use_of(d).reg, need);
        }
        /* a load that fails on a kept registration keeps it */
        o = small_opts(FERRY_ROUTE_REGISTER);
        CHECK(fy_gpu_sim_fault(fy_device_gpu(d), FY_OP_COPY, 2) >= 0);
        l = NULL;
        CHECK_EQ(ferry_load(d, f, &o, &l, NULL), FERRY_E_DEVICE);
        fy_gpu_sim_fault(fy_device_gpu(d), FY_OP_COPY, 0);
        CHECK_EQ(use_of(d).reg, need);
        /* the ring path is unaffected, and the kept registration goes with the file */
        o = small_opts(FERRY_ROUTE_RING);
        st = (ferry_load_stats){.size = sizeof st};
        CHECK_EQ(ferry_load(d, f, &o, &l, &st), 0);
        CHECK_EQ(st.registration, FERRY_REGISTRATION_NONE);
        ferry_loaded_free(l);
        ferry_file_close(f);
        f = NULL;
        CHECK_EQ(use_of(d).reg, 0);
    next:
        ferry_device_close(d);
        ferry_file_close(f);
    }
}

/* A file closed while still registered: the close drops the
 * registration on every device that holds one, so nothing stays page-locked
 * and a later file, even one allocated at the freed file's address, is not
 * taken for registered. A device closed first, or a file unregistered first,
 * leaves no watch behind that a later close would call (ASan sees a stale one). */
static void test_closed_registered(ferry_ctx *ctx)
{
    static const char *const files[] = {"odd.safetensors", "sh.safetensors.index.json"};
    for (size_t k = 0; k < 2; k++) {
        ferry_device *d = open_dev(ctx, "sim:256MiB"), *d2 = open_dev(ctx, "sim:256MiB");
        ferry_file *f = open_file(ctx, files[k]);
        if (!d || !d2 || !f) {
            ferry_file_close(f);
            goto next;
        }
        uint64_t need = file_pages(f);
        CHECK_EQ(ferry_device_register_file(d, f, 0), 0);
        CHECK_EQ(ferry_device_register_file(d, f, 0), 0); /* twice: one watch */
        CHECK_EQ(ferry_device_register_file(d2, f, 0), 0);
        CHECK_EQ(use_of(d).reg, need);
        CHECK_EQ(use_of(d2).reg, need);
        const void *old = f;
        ferry_file_close(f); /* never unregistered */
        CHECK_EQ(use_of(d).reg, 0);
        CHECK_EQ(use_of(d2).reg, 0);

        /* another file, perhaps at the same address: a load does not find it registered */
        f = open_file(ctx, files[k]);
        if (!f) goto next;
        if ((const void *)f == old)
            fprintf(stderr, "closed_registered: the new file reuses the old address\n");
        ferry_load_opts o = small_opts(FERRY_ROUTE_AUTO);
        ferry_load_stats st = {.size = sizeof st};
        ferry_loaded *l = NULL;
        CHECK_EQ(ferry_load(d, f, &o, &l, &st), 0);
        CHECK(st.route != FERRY_ROUTE_REGISTER);
        if (l) CHECK_EQ(verify_loaded(l, f, "after a registered file was closed"), 0);
        ferry_loaded_free(l);
        CHECK_EQ(use_of(d).reg, 0);

        /* unregistered, then the device closed, then the file: no call into the closed device */
        CHECK_EQ(ferry_device_register_file(d2, f, 0), 0);
        ferry_device_unregister_file(d2, f);
        ferry_device_close(d2);
        d2 = NULL;
        /* registered, device closed first: the device dropped its watch */
        CHECK_EQ(ferry_device_register_file(d, f, 0), 0);
        ferry_device_close(d);
        d = NULL;
        ferry_file_close(f);

        /* a failed registration leaves no watch either */
        d = open_dev(ctx, "sim:256MiB");
        f = open_file(ctx, files[k]);
        if (!d || !f) {
            ferry_file_close(f);
            goto next;
        }
        CHECK_EQ(ferry_device_register_file(d, f, 1), FERRY_E_BUDGET); /* refused before watching */
        fy_gpu_sim_fault(fy_device_gpu(d), FY_OP_HOST_REGISTER, 1);
        CHECK_EQ(ferry_device_register_file(d, f, 0), FERRY_E_DEVICE);
        CHECK_EQ(fy_gpu_sim_fault(fy_device_gpu(d), FY_OP_HOST_REGISTER, 0), 0);
        CHECK_EQ(use_of(d).reg, 0);
        ferry_device_close(d);
        d = NULL;
        ferry_file_close(f);
    next:
        ferry_device_close(d);
        ferry_device_close(d2);
    }
}

/* Cuts the file to 3000 bytes at its first progress call (at = 0: while
 * batches remain to be checked) or at its last (at = 1: every batch checked,
 * copies still queued behind a slow sim link). */
typedef struct cut_at {
    const char *path;
    int at, cuts;
} cut_at;

static void cut_in_progress(void *opaque, uint64_t done, uint64_t total)
{
    cut_at *c = opaque;
    if (c->cuts == 0 && (c->at == 0 || done == total) && truncate(c->path, 3000) == 0) c->cuts++;
}

/* A register load of a file cut after it was opened: before the load, after
 * registering it, between batches (a sharded checkpoint, its second shard cut
 * once the first was queued), and after the last batch was checked while its
 * copies wait in the sim's streams (a load_into of tensors 0, 2 and 4: three
 * batches on two streams, so the third copy waits behind the first on a slow
 * link, and the sim reads a mapping the file no longer covers). Each is
 * FERRY_E_CORRUPT naming the file and
 * a tensor, never a SIGBUS, and leaves nothing allocated or registered but the
 * caller's own registration. */
static void test_truncated_register(ferry_ctx *ctx)
{
    static const char *const dev[4] = {"sim:64MiB", "sim:64MiB", "sim:64MiB", "sim:64MiB,20KB/s"};
    const char *one = "trunc_reg.safetensors", *sh1 = "treg-00001-of-00002.safetensors",
               *sh2 = "treg-00002-of-00002.safetensors";
    for (int k = 0; k < 4; k++) {
        static const uint64_t EVEN[] = {9000, 9000, 9000, 9000, 9000, 9000};
        tdef *t = defs(k == 2 ? "treg.a" : "treg", k == 3 ? EVEN : SMALL, 6), *t2 = defs("treg.b", SMALL, 6);
        if (k == 2) {
            write_st(sh1, t, 6, 11, 0);
            write_st(sh2, t2, 6, 12, 0);
            write_index("treg.safetensors.index.json", t, 6, sh1, t2, 6, sh2);
        } else {
            write_st(one, t, 6, 11, 0);
        }
        free(t);
        free(t2);
        char p[512], want[600];
        path_of(p, sizeof p, k == 2 ? sh2 : one);
        snprintf(want, sizeof want, "%s: tensor 'treg%s", p, k == 2 ? ".b" : "");
        ferry_file *f = open_file(ctx, k == 2 ? "treg.safetensors.index.json" : one);
        ferry_device *d = open_dev(ctx, dev[k]);
        if (!f || !d) goto next;
        ferry_load_opts o = small_opts(FERRY_ROUTE_REGISTER);
        o.streams = 2;
        cut_at c = {p, k == 3, 0};
        uint64_t held = k == 1 ? file_pages(f) : 0; /* the registration keeps its length */
        if (k == 1) CHECK_EQ(ferry_device_register_file(d, f, 0), 0);
        if (k <= 1) CHECK_EQ(truncate(p, 3000), 0);
        else {
            o.progress = cut_in_progress;
            o.opaque = &c;
        }
        ferry_loaded *l = NULL;
        int rc = 0;
        fy_gpu *g = fy_device_gpu(d);
        fy_dptr dp[3] = {0, 0, 0};
        if (k == 3) {
            int64_t idx[3] = {0, 2, 4};
            uint64_t dst[3];
            for (int i = 0; i < 3; i++) {
                CHECK_EQ(g->ops->mem_alloc(g, 9000, &dp[i]), 0);
                dst[i] = dp[i];
            }
            rc = ferry_load_into(d, f, idx, dst, 3, &o, NULL);
            for (int i = 0; i < 3; i++) CHECK_EQ(g->ops->mem_free(g, dp[i]), 0);
        } else {
            rc = ferry_load(d, f, &o, &l, NULL);
        }
        if (rc != FERRY_E_CORRUPT)
            fprintf(stderr, "truncated_register %d: %d %s\n", k, rc, ferry_ctx_errmsg(ctx));
        CHECK_EQ(rc, FERRY_E_CORRUPT);
        CHECK(l == NULL);
        ferry_loaded_free(l);
        CHECK_STR_HAS(ferry_ctx_errmsg(ctx), want);
        CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "the file is now 3000 bytes");
        CHECK_STR_HAS(ferry_ctx_errmsg(ctx), "truncated after it was opened?");
        if (k >= 2) CHECK_EQ(c.cuts, 1);
        usage u = use_of(d);
        CHECK_EQ(u.dev, 0);
        CHECK_EQ(u.reg, held);
        ferry_device_unregister_file(d, f);
        CHECK_EQ(use_of(d).reg, 0);
    next:
        ferry_device_close(d);
        ferry_file_close(f);
        unlink(p);
        if (k == 2) {
            path_of(p, sizeof p, sh1);
            unlink(p);
            path_of(p, sizeof p, "treg.safetensors.index.json");
            unlink(p);
        }
    }
}

#define CASES(CASE)                                      \
    CASE(register, test_register(ctx))                   \
    CASE(register_pieces, test_register_pieces(ctx))     \
    CASE(closed_registered, test_closed_registered(ctx)) \
    CASE(truncated_register, test_truncated_register(ctx))
CHECK_CASES_MAIN(CASES, xfer_main)
