/* SPDX-License-Identifier: Apache-2.0 */
/* kept.c - a move's clean tensors through the keeper (execution, below
 * fetch.c, on keeper.h): before the checkpoint reads, the keeper is asked
 * for every tensor of the move still in its checkpoint (tier SOURCE, never
 * a dirty one: those are in other tiers); what it holds is copied from its
 * memory, attached read-only, to the device by one DMA (or into the pinned
 * cache buffer a streamed block is filling), then released; after the
 * reads, what was read is fed to it. All of it runs in the move's transfers,
 * with the store's lock dropped: the tensors are the op's (marked moving). */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>

#include "store_impl.h"

uint64_t rs_kept_fetch(ferry_store *s, ferry_op *op)
{
    op->kr = NULL;
    op->nkr = 0;
    if (!rs_keeper_used(&s->keeper)) return 0;
    ferry_model *m = op->m;
    int64_t n = 0;
    for (int64_t k = 0; k < op->nt; k++) {
        const rtensor *t = &m->t[op->ti[k]];
        n += t->tier == FERRY_TIER_SOURCE && !t->dirty && t->nbytes;
    }
    rs_kreq *r = n ? fy_calloc(s->m, (size_t)n, sizeof *r) : NULL;
    fy_hostrange *hr = n ? fy_calloc(s->m, (size_t)n, sizeof *hr) : NULL;
    if (!r || !hr) { /* (nothing asked, or no memory: this move reads its checkpoints alone) */
        fy_free(s->m, r);
        fy_free(s->m, hr);
        return 0;
    }
    n = 0;
    for (int64_t k = 0; k < op->nt; k++) {
        const rtensor *t = &m->t[op->ti[k]];
        if (t->tier != FERRY_TIER_SOURCE || t->dirty || !t->nbytes) continue;
        r[n++] = (rs_kreq){.kf = &m->kf[m->kf_at[t->file] + t->shard],
                           .f = m->files[t->file],
                           .shard = t->shard,
                           .name = t->name,
                           .index = (uint32_t)t->idx,
                           .nbytes = t->nbytes,
                           .tag = op->ti[k]};
    }
    op->kr = r;
    op->nkr = n;
    uint64_t bytes = 0;
    if (rs_keeper_get(&s->keeper, r, n) > 0) {
        int64_t nh = 0;
        for (int64_t i = 0; i < n; i++) {
            if (r[i].kind != RS_KV_HOST) continue;
            rtensor *t = &m->t[r[i].tag];
            if (t->caching) {
                memcpy(t->host, r[i].host, (size_t)t->nbytes); /* its pinned copy, then DMA'd with the rest */
            } else {
                hr[nh++] = (fy_hostrange){(void *)(uintptr_t)r[i].host, t->dptr, t->nbytes};
                bytes += t->nbytes;
            }
        }
        int rc = nh ? fy_xfer_host_to_device(s->dev, hr, nh, NULL) : 0; /* (waited: the mappings go next) */
        if (rc < 0) {
            rs_op_fail(op, s, rc);
            bytes = 0;
        }
        for (int64_t i = 0; i < n && rc == 0; i++)
            if (r[i].kind == RS_KV_HOST) m->t[r[i].tag].kept = true;
        rs_keeper_detach(&s->keeper, r, n, rc == 0);
    }
    fy_free(s->m, hr);
    return bytes;
}

/* r's bytes for the keeper: the pinned copy a move just read, else the
 * checkpoint again (pread; just read, so mostly from the page cache). */
static int fill(void *arg, const rs_kreq *r, void *dst)
{
    const ferry_model *m = arg;
    const rtensor *t = &m->t[r->tag];
    if (t->caching) {
        memcpy(dst, t->host, (size_t)t->nbytes);
        return 0;
    }
    return ferry_file_tensor_read(m->files[t->file], t->idx, 0, dst, (size_t)t->nbytes);
}

void rs_kept_finish(ferry_store *s, ferry_op *op)
{
    if (!op->kr) return;
    ferry_model *m = op->m;
    if (op->rc == 0) rs_keeper_feed(&s->keeper, op->kr, op->nkr, fill, m);
    for (int64_t i = 0; i < op->nkr; i++) m->t[op->kr[i].tag].kept = false;
    fy_free(s->m, op->kr);
    op->kr = NULL;
    op->nkr = 0;
}
