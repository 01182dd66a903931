/* SPDX-License-Identifier: Apache-2.0 */
/* choose.c - the one place a load's route, readers, staging ring and pinning
 * are decided, and the routes' names: ferry_load (and the ring it pins while it allocates),
 * ferry_load_into, ferry_device_prepare and the public query
 * ferry_load_plan_route all ask xf_choose; the pipelines then take the ring
 * it chose through xf_ring_take. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "xfer_impl.h"

FERRY_API const char *ferry_route_name(ferry_route p)
{
    static const char *const names[] = {"auto", "ring", "direct", "register", "cufile", "pageable"};
    return (unsigned)p < FERRY_ROUTE_COUNT ? names[p] : "unknown";
}

FERRY_API int ferry_route_parse(const char *name)
{
    for (int p = 0; p < FERRY_ROUTE_COUNT; p++)
        if (name && strcmp(name, ferry_route_name((ferry_route)p)) == 0) return p;
    return -1;
}

bool xf_ring_pinned(ferry_device *d)
{
    pthread_mutex_lock(&d->ring_lock);
    bool pinned = d->nring > 0;
    pthread_mutex_unlock(&d->ring_lock);
    return pinned;
}

/* Threads and ring size from load options, with the defaults measured on the
 * H200 host (bench/RESULTS.md, ring sweep: 12 threads x 4 MiB buffers beat 8
 * and 16 threads and 8-32 MiB buffers), within ferry's limits. Loads and the
 * spill pipeline ask the same way, so they share one pinned ring. O_DIRECT
 * reads (direct) default to 8 threads of 1 MiB reads, 16 buffers: cold, on
 * the GPU machines' disk, 12 x 4 MiB ran at 1.66-1.99 GB/s and 8 x 1 MiB at
 * 1.91-2.29 in 5 alternated rounds (16 x 512 KiB alike, 1.98-2.40), and
 * through auto 2.08-2.50 against 1.69-1.91 in 4 more. Such a load reads into a ring
 * pinned already when its buffers are at least as large and as many
 * (xf_ring_take), so the ring's default serves both. */
int xf_ring_geometry(ferry_device *d, const ferry_load_opts *o, bool direct, uint32_t *nthreads,
                     uint32_t *nbuf, uint64_t *bufsz)
{
    uint32_t cpus = fy_ncpu(), want = direct ? DIRECT_THREADS : 12;
    *nthreads = o->threads ? o->threads : (cpus < want ? cpus : want);
    if (*nthreads > MAX_THREADS) *nthreads = MAX_THREADS;
    FY_RETURN_IF(
        o->ring_buffer_bytes > (4ull << 30) || o->ring_buffers > 4096, &d->err, FERRY_E_INVAL,
        "ferry_load: a ring of %u buffers of %llu bytes is outside the limits (4096 buffers, 4 GiB each)",
        o->ring_buffers, (unsigned long long)o->ring_buffer_bytes);
    *bufsz = o->ring_buffer_bytes ? page_round(o->ring_buffer_bytes) : direct ? DIRECT_READ : 4ull << 20;
    *nbuf = o->ring_buffers ? o->ring_buffers : 2 * *nthreads;
    if (*nbuf < 2) *nbuf = 2;
    FY_RETURN_IF((uint64_t)*nbuf * *bufsz > (64ull << 30), &d->err, FERRY_E_LIMIT,
                 "ferry_load: a ring of %u x %llu bytes would pin more than 64 GiB", *nbuf,
                 (unsigned long long)*bufsz);
    return 0;
}

/* Without a ring size asked for, a load smaller than the default ring needs
 * only the buffers its bytes fill (a 25 MB file: 7 of 4 MiB; the ring's first
 * pinning was most of a small file's load on the H200, 17 ms for 26 MB). */
static uint32_t ring_fit(const ferry_load_opts *o, uint64_t bytes, uint64_t bufsz, uint32_t nbuf)
{
    if (o->ring_buffers) return nbuf;
    uint64_t need = (bytes + bufsz - 1) / bufsz;
    if (need < 2) need = 2;
    return need < nbuf ? (uint32_t)need : nbuf;
}

/* A ring already pinned with at least nbuf buffers of bufsz is used as it
 * is; then whether it serves a load that wants nbuf buffers of bufsz bytes:
 * that very ring, or, for O_DIRECT reads with no ring option set, any at
 * least as large in both (the default ring, pinned ahead for auto before it
 * knows the load is cold: the load uses nbuf of its buffers). Called with
 * d->ring_lock held. */
static bool ring_serves(const ferry_device *d, const ferry_load_opts *o, bool direct, uint32_t *nbuf,
                        uint64_t bufsz)
{
    if (!o->ring_buffers && d->nring >= *nbuf && d->ring_bytes == bufsz) *nbuf = d->nring;
    if (d->nring == *nbuf && d->ring_bytes == bufsz) return true;
    return direct && !o->ring_buffers && !o->ring_buffer_bytes && d->nring >= *nbuf && d->ring_bytes >= bufsz;
}

int xf_ring_take(ferry_device *d, const ferry_load_opts *o, const xf_choice *c, bool ahead, uint32_t *nbuf,
                 double *pin_seconds)
{
    uint32_t n = ahead ? c->pin_nbuf : c->fit_nbuf;
    uint64_t bytes = ahead ? c->pin_bufsz : c->bufsz;
    bool direct = ahead ? c->pin_direct : c->route == FERRY_ROUTE_DIRECT;
    bool served = ring_serves(d, o, direct, &n, bytes);
    double t = fy_now();
    int rc = served ? 0 : xf_ring_get(d, n, bytes);
    if (pin_seconds) *pin_seconds = served ? 0 : fy_now() - t;
    if (nbuf) *nbuf = n;
    return rc;
}

/* The route itself: asked for, or auto's choice (registered, the sampled
 * page-cache residency, a small cached load with no ring pinned). */
static int choose_route(ferry_device *d, const ferry_file *f, const ferry_load_opts *o, uint64_t bytes,
                        const char *who, xf_choice *c)
{
    ferry_route want = o->route;
    c->resident = -1; /* measured only when auto needs it: mincore over 10 GB is not free */
    if (want == FERRY_ROUTE_CUFILE)
        return fy_seterr(&d->err, FERRY_E_UNSUPPORTED,
                         "%s%s%s: cufile is not a route (GPUDirect Storage is only probed: "
                         "ferry_device_probe_cufile, `ferry bench`): use auto",
                         f ? f->shards[0].path : "", f ? ": " : "", who);
    if (d->g->host_visible) {
        FY_RETURN_IF(want != FERRY_ROUTE_AUTO && want != FERRY_ROUTE_RING, &d->err, FERRY_E_UNSUPPORTED,
                     "%s%s%s: the cpu device reads straight into host memory: use route ring or auto, not %s",
                     f ? f->shards[0].path : "", f ? ": " : "", who, ferry_route_name(want));
        c->why = "host memory: threaded pread straight into the destination";
        return FERRY_ROUTE_RING;
    }
    if (want != FERRY_ROUTE_AUTO) {
        c->why = "asked for";
        return (int)want;
    }
    if (!f) {
        c->why = "no file to look at: auto's ring";
        return FERRY_ROUTE_RING;
    }
    if (!f->private_map && xf_is_registered(d, f)) {
        c->why = "the file is registered with the device";
        return FERRY_ROUTE_REGISTER;
    }
    c->resident = xf_resident_sampled(f);
    if (c->resident < 0) {
        c->why = "page-cache residency unknown (mincore failed): ring";
        return FERRY_ROUTE_RING;
    }
    if (c->resident < 0.5) {
        c->why = "most of the data is not in the page cache (sampled): O_DIRECT reads";
        return FERRY_ROUTE_DIRECT;
    }
    /* small, no ring asked for and none pinned yet, so that pinning one would
     * cost more than the copy (FERRY_ROUTE_PAGEABLE) */
    if (bytes <= FERRY_PAGEABLE_MAX && !o->ring_buffers && !o->ring_buffer_bytes && !xf_ring_pinned(d)) {
        c->why =
            "a small load, mostly in the page cache, and no ring pinned yet (pinning one costs more than the "
            "copy): pageable copies from the mapping";
        return FERRY_ROUTE_PAGEABLE;
    }
    c->why = "most of the data is in the page cache (sampled)";
    return FERRY_ROUTE_RING;
}

int xf_choose(ferry_device *d, const ferry_file *f, const ferry_load_opts *o, uint64_t bytes, const char *who,
              xf_choice *c)
{
    memset(c, 0, sizeof *c);
    FY_RETURN_IF((unsigned)o->route >= FERRY_ROUTE_COUNT, &d->err, FERRY_E_INVAL, "%s: unknown route %d", who,
                 (int)o->route);
    int rc = choose_route(d, f, o, bytes, who, c);
    if (rc < 0) return rc;
    c->route = (ferry_route)rc;
    bool direct = c->route == FERRY_ROUTE_DIRECT;
    FY_TRY(xf_ring_geometry(d, o, direct, &c->nthreads, &c->nbuf, &c->bufsz));
    c->ring = !d->g->host_visible && (c->route == FERRY_ROUTE_RING || direct);
    if (!c->ring) {
        /* the cpu device's readers read straight into the destination;
         * register and pageable copy out of the mapping on the calling thread */
        if (!d->g->host_visible) c->nthreads = 1;
        c->nbuf = 0;
        return 0;
    }
    c->fit_nbuf = ring_fit(o, bytes, c->bufsz, c->nbuf);
    /* what a ring pinned ahead holds: auto's pinned before it knows the load
     * is cold is the buffered one (an O_DIRECT load reads into part of it) */
    c->pin_direct = direct && o->route != FERRY_ROUTE_AUTO;
    if (direct && !c->pin_direct) {
        uint32_t t, n;
        FY_TRY(xf_ring_geometry(d, o, false, &t, &n, &c->pin_bufsz));
        c->pin_nbuf = ring_fit(o, bytes, c->pin_bufsz, n);
    } else {
        c->pin_nbuf = c->fit_nbuf, c->pin_bufsz = c->bufsz;
    }
    pthread_mutex_lock(&d->ring_lock);
    c->nbuf = c->fit_nbuf;
    c->pins = !ring_serves(d, o, direct, &c->nbuf, c->bufsz);
    pthread_mutex_unlock(&d->ring_lock);
    return 0;
}

FERRY_API int ferry_load_plan_route(ferry_device *d, const ferry_file *f, const ferry_load_opts *opts,
                                    uint64_t bytes, ferry_route_choice *out)
{
    if (!d || !out) return FERRY_E_INVAL;
    FY_RETURN_IF(out->size < FERRY_STRUCT_MIN, &d->err, FERRY_E_INVAL,
                 "ferry_load_plan_route: out->size is %u: set it to sizeof(ferry_route_choice)", out->size);
    ferry_load_opts o;
    FY_TRY(fy_struct_in(&o, sizeof o, opts, &d->err, "ferry_load_plan_route"));
    if (bytes == 0 && f)
        for (int64_t i = 0; i < f->tb.n; i++) bytes += f->tb.t[i].nbytes;
    xf_choice c;
    FY_TRY(xf_choose(d, f, &o, bytes, "ferry_load_plan_route", &c));
    ferry_route_choice r = {.size = sizeof r};
    r.route = c.route;
    r.threads = c.nthreads;
    r.buffers = c.ring ? c.nbuf : 0;
    r.buffer_bytes = c.ring ? c.bufsz : 0;
    r.pins = c.ring && c.pins;
    r.resident = c.resident;
    r.why = c.why;
    fy_struct_out(out, &r, sizeof r);
    return 0;
}
