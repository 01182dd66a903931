/* SPDX-License-Identifier: Apache-2.0 */
/* fences.c - see fences.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>

#include "fences.h"

void rs_fences_init(rs_fences *fs, ferry_device *dev, const ferry_allocator *m)
{
    *fs = (rs_fences){.dev = dev, .m = m};
}

int rs_fences_add(rs_fences *fs, uint64_t cu_stream, void *item, bool *device)
{
    *device = false;
    rs_fence *x = fy_calloc(fs->m, 1, sizeof *x);
    if (!x) return -ENOMEM;
    int rc = fy_xfer_fence_new(fs->dev, cu_stream, &x->f);
    if (rc < 0) {
        fy_free(fs->m, x);
        *device = true;
        return rc;
    }
    x->item = item;
    x->next = fs->pending;
    fs->pending = x;
    return 0;
}

int64_t rs_fences_pending(const rs_fences *fs, const void *item)
{
    int64_t n = 0;
    for (const rs_fence *x = fs->pending; x; x = x->next) n += x->item == item;
    return n;
}

/* Free the entries of a list whose fences are done (wait: after waiting for
 * each), calling done for each that still has an item. The items let go. */
static int64_t reap_list(rs_fences *fs, rs_fence **head, bool wait, void (*done)(void *, void *), void *arg)
{
    int64_t n = 0;
    for (rs_fence **p = head; *p;) {
        rs_fence *r = *p;
        int q = fy_xfer_fence_query(r->f);
        if (q == 0 && wait) {
            q = fy_xfer_fence_wait(r->f) < 0 ? -1 : 1;
            fs->waits++;
        }
        if (q == 0) {
            p = &r->next;
            continue;
        }
        /* done, or the fence failed: a failed event says nothing more will
         * come of it, so the item goes either way rather than forever */
        if (r->item) {
            if (done) done(r->item, arg);
            n++;
        }
        *p = r->next;
        fy_xfer_fence_free(r->f);
        fy_free(fs->m, r);
    }
    return n;
}

int64_t rs_fences_reap(rs_fences *fs, bool wait, void (*done)(void *item, void *arg), void *arg)
{
    int64_t n = reap_list(fs, &fs->pending, wait, done, arg);
    if (fs->reuse) reap_list(fs, &fs->reuse, false, NULL, NULL);
    return n;
}

int64_t rs_fences_defer(rs_fences *fs, bool (*early)(void *item, void *arg), void *arg)
{
    int64_t n = 0;
    for (rs_fence **p = &fs->pending; *p;) {
        rs_fence *r = *p;
        if (!early(r->item, arg)) {
            p = &r->next;
            continue;
        }
        *p = r->next;
        r->item = NULL;
        r->laned = false;
        r->next = fs->reuse;
        fs->reuse = r;
        n++;
    }
    return n;
}

void rs_fences_wait_all(rs_fences *fs)
{
    reap_list(fs, &fs->reuse, true, NULL, NULL);
}

int rs_fences_order(rs_fences *fs, bool lane)
{
    reap_list(fs, &fs->reuse, !lane, NULL, NULL);
    for (rs_fence *r = fs->reuse; r && lane; r = r->next) {
        if (r->laned) continue;
        int rc = fy_xfer_lane_wait(fs->dev, r->f);
        if (rc < 0) { /* the host waits instead */
            reap_list(fs, &fs->reuse, true, NULL, NULL);
            return rc;
        }
        r->laned = true;
        fs->orders++;
    }
    return 0;
}

void rs_fences_destroy(rs_fences *fs)
{
    reap_list(fs, &fs->pending, true, NULL, NULL);
    reap_list(fs, &fs->reuse, true, NULL, NULL);
}
