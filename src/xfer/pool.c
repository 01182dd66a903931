/* SPDX-License-Identifier: Apache-2.0 */
/* pool.c - the device's reader pool: threads made on first use, as many as
 * the loads running at once ask for (never more than POOL_MAX), kept idle
 * between loads and joined by ferry_device_close. The ring's and the cpu
 * device's readers, ferry_load's ring pinned ahead and the unmapping of a
 * tmpfs load's mapping run on it, so a load starts no thread once the pool
 * has grown to its size.
 *
 * A group's tasks are queued at once; the caller that waits for the group
 * runs those of them no worker took yet, so a group always completes, even
 * where no thread could be made (the caller then runs them one after the
 * other, which the readers allow: none waits for a reader that has not
 * started). A child of fork() makes workers of its own (lock). */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "xfer_impl.h"

void xf_pool_init(xf_pool *p)
{
    memset(p, 0, sizeof *p);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->done, NULL);
    p->pid = getpid();
}

/* A child of fork() has none of its parent's workers, and its copies of the
 * lock and conditions may count their waiters: it starts afresh (what was
 * queued then runs on its own workers). Before the lock is taken: the
 * child's first use of the pool is its only thread there. */
static void lock(xf_pool *p)
{
    pid_t now = getpid();
    if (p->pid != now) {
        pthread_mutex_init(&p->lock, NULL);
        pthread_cond_init(&p->work, NULL);
        pthread_cond_init(&p->done, NULL);
        p->pid = now;
        p->nth = p->idle = 0;
    }
    pthread_mutex_lock(&p->lock);
}

/* Take the oldest queued task of group g (NULL: of any group), or task
 * `only` itself when given; under lock. */
static xf_task *take_one(xf_pool *p, const xf_group *g, const xf_task *only)
{
    for (xf_task **tp = &p->head; *tp; tp = &(*tp)->next) {
        xf_task *t = *tp;
        if ((g && t->grp != g) || (only && t != only)) continue;
        *tp = t->next;
        if (p->tail == t) {
            p->tail = NULL;
            for (xf_task *x = p->head; x; x = x->next) p->tail = x;
        }
        t->next = NULL;
        p->queued--;
        return t;
    }
    return NULL;
}

static xf_task *take(xf_pool *p, const xf_group *g)
{
    return take_one(p, g, NULL);
}

/* Run t (the lock not held), then count it done; under lock on return. */
static void run(xf_pool *p, xf_task *t)
{
    xf_group *g = t->grp;
    pthread_mutex_unlock(&p->lock);
    t->fn(t->arg); /* a detached task may free t itself */
    pthread_mutex_lock(&p->lock);
    if (g && --g->left == 0) pthread_cond_broadcast(&p->done);
}

static void *worker(void *arg)
{
    xf_pool *p = arg;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        xf_task *t = take(p, NULL);
        if (t) {
            p->idle--;
            run(p, t);
            p->idle++;
            continue;
        }
        if (p->stop) break;
        pthread_cond_wait(&p->work, &p->lock);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

/* Queue t and make workers until the idle ones cover what is queued; under lock. */
static void queue(xf_pool *p, xf_task *t)
{
    t->next = NULL;
    if (p->tail) p->tail->next = t;
    else p->head = t;
    p->tail = t;
    p->queued++;
    while (p->idle < p->queued && p->nth < POOL_MAX && !p->stop) {
        if (pthread_create(&p->th[p->nth], NULL, worker, p) != 0) break;
        p->nth++;
        p->idle++;
    }
    pthread_cond_signal(&p->work);
}

void xf_pool_start(xf_pool *p, xf_group *g, xf_task *t, uint32_t n)
{
    lock(p);
    g->left = n;
    for (uint32_t k = 0; k < n; k++) {
        t[k].grp = g;
        queue(p, &t[k]);
    }
    pthread_mutex_unlock(&p->lock);
}

void xf_pool_wait(xf_pool *p, xf_group *g)
{
    lock(p);
    for (xf_task *t; (t = take(p, g));) run(p, t);
    while (g->left) pthread_cond_wait(&p->done, &p->lock);
    pthread_mutex_unlock(&p->lock);
}

bool xf_pool_detach(xf_pool *p, xf_task *t)
{
    lock(p);
    t->grp = NULL;
    bool ok = !p->stop;
    if (ok) {
        queue(p, t);
        /* no worker at all (none could be made): nobody would run it */
        if (p->nth == 0) ok = take_one(p, NULL, t) != t;
    }
    pthread_mutex_unlock(&p->lock);
    return ok;
}

void xf_pool_stop(xf_pool *p)
{
    lock(p);
    p->stop = true;
    pthread_cond_broadcast(&p->work);
    uint32_t n = p->nth;
    pthread_mutex_unlock(&p->lock);
    /* the workers run what is still queued (detached unmapping) first */
    for (uint32_t k = 0; k < n; k++) pthread_join(p->th[k], NULL);
    /* (a forked child with no worker: run what its parent had queued) */
    pthread_mutex_lock(&p->lock);
    for (xf_task *t; (t = take(p, NULL));) run(p, t);
    pthread_mutex_unlock(&p->lock);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->done);
}
