/* SPDX-License-Identifier: Apache-2.0 */
/* devmem.c - a tensor's device memory: taken from and given back to the
 * device arena (arena.h), and the group's place in its model's device index
 * (the make-room candidates, lru.h) kept with it, so the index never needs
 * a walk over the model's tensors. Under the store's lock. */
#define _GNU_SOURCE
#include <stdlib.h>

#include "store_impl.h"

/* t's model (the store's own pointer, const for the tensor's readers) */
static ferry_model *owner(rtensor *t)
{
    return (ferry_model *)(uintptr_t)t->owner;
}

int rs_dev_alloc(ferry_store *s, rtensor *t, bool strict)
{
    bool had = t->dptr != 0;
    int rc = rs_arena_alloc(&s->arena, t->nbytes, t->streams, strict, &t->dptr, &t->dsize);
    if (rc == 0 && !had && t->dptr) {
        ferry_model *m = owner(t);
        rs_lru_ref(&m->dev, t->group, m->t[t->group].streams, m->t[t->group].use);
    }
    return rc;
}

void rs_dev_free(ferry_store *s, rtensor *t)
{
    if (t->dptr) rs_lru_unref(&owner(t)->dev, t->group);
    rs_arena_free(&s->arena, t->dptr, t->dsize, t->nbytes);
    t->dptr = 0;
    t->dsize = 0;
}
