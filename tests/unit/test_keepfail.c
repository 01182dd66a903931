/* SPDX-License-Identifier: Apache-2.0 */
/* test_keepfail.c - the residency store when its keeper fails, on the sim
 * device with the keeper in a forked child (keepstore.h): killed between
 * moves and at random moments during another thread's moves (GETs, feeds),
 * every move lands with the file's bytes and the store connects to the next
 * keeper; a keeper that stops answering costs a move one timeout and is
 * tried again less and less often; every counted system call of a served
 * and of a fed move failed in turn. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>

#include "io/io.h"
#include "keepstore.h"

/* A thread moving the model on and off the device until told to stop. */
typedef struct mover {
    ferry_model *m;
    ferry_file *f;
    atomic_int stop, rounds, failed;
} mover;

static void *move_loop(void *arg)
{
    mover *v = arg;
    while (!atomic_load(&v->stop)) {
        int rc = ferry_model_to_device(v->m, NULL, 0);
        if (rc < 0 || differ(v->m, v->f) != 0) {
            fprintf(stderr, "move_loop: %d %s\n", rc, ferry_model_errmsg(v->m));
            atomic_fetch_add(&v->failed, 1);
        }
        if (ferry_model_evict(v->m, NULL, 0) < 0) atomic_fetch_add(&v->failed, 1);
        atomic_fetch_add(&v->rounds, 1);
    }
    return NULL;
}

static void test_killed(void)
{
    kcase c;
    bool ok = kcase_open(&c, "kstore-killed", true, true);
    ferry_device *d = c.d;
    ferry_file *f = c.f;
    ferry_store *s = c.s;
    ferry_model *m = c.m;
    if (!ok) goto out;
    CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0);
    CHECK(ferry_model_evict(m, NULL, 0) >= 0);
    /* killed between moves: the next reads the checkpoint */
    kill(c.kp, SIGKILL);
    waitpid(c.kp, NULL, 0);
    c.kp = -1;
    CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0);
    CHECK_EQ(differ(m, f), 0);
    CHECK_EQ(sstats(s).bytes_read, 2 * TOTAL);
    ferry_store_keeper_stats k = kstats(s);
    CHECK(k.errors >= 1);
    CHECK_EQ(k.connected, 0);
    CHECK_STR_HAS(k.last_error, sock);
    /* a new keeper: connected again at a move a second later, and fed */
    c.kp = kc_start(sock, logpath, 64 << 20, false);
    CHECK(c.kp > 0);
    usleep(1100 * 1000);
    CHECK(ferry_model_evict(m, NULL, 0) >= 0);
    CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0);
    k = kstats(s);
    CHECK_EQ(k.connected, 1);
    CHECK_EQ(k.connects, 2);
    CHECK_EQ(k.bytes_fed, 2 * TOTAL);
    CHECK_EQ(keeper_holds(NULL), NT);
    /* killed at random points while another thread moves the model on and
     * off: every move lands whole, with the file's bytes */
    mover v = {.m = m, .f = f};
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, move_loop, &v), 0);
    srand(7);
    int served_rounds = 0;
    uint64_t c0 = kstats(s).connects - 1; /* (connected to the keeper running now) */
    for (int round = 0; round < 6; round++) {
        if (c.kp <= 0) c.kp = kc_start(sock, logpath, 64 << 20, false);
        /* once the store is connected to this keeper (a second after its
         * last error), a random moment into its moves: mid-GET, mid-feed,
         * between them */
        for (double t0 = kc_now(); kstats(s).connects == c0 && kc_now() - t0 < 5;) usleep(2000);
        served_rounds += kstats(s).connects > c0;
        usleep((useconds_t)(rand() % 60000));
        if (c.kp > 0) {
            kill(c.kp, SIGKILL);
            waitpid(c.kp, NULL, 0);
            c.kp = -1;
        }
        c0 = kstats(s).connects;
        int r0 = atomic_load(&v.rounds);
        while (atomic_load(&v.rounds) < r0 + 2) usleep(1000);
    }
    CHECK_EQ(served_rounds, 6);
    atomic_store(&v.stop, 1);
    pthread_join(th, NULL);
    CHECK_EQ(atomic_load(&v.failed), 0);
    CHECK(kstats(s).errors >= 6);
    fprintf(stderr,
            "killed: %d moves, keeper stats: %" PRIu64 " hits, %" PRIu64 " errors, %" PRIu64 " connects\n",
            atomic_load(&v.rounds), kstats(s).hits, kstats(s).errors, kstats(s).connects);
    /* whatever a killed keeper left, a new one serves whole bytes */
    c.kp = kc_start(sock, logpath, 64 << 20, false);
    CHECK(c.kp > 0);
    check_serves_whole(d);
    /* (this keeper was forked from a process with threads: under
     * ThreadSanitizer its SIGTERM exit did not finish; a clean stop is
     * test_keep's to show) */
    if (c.kp > 0) {
        kill(c.kp, SIGKILL);
        waitpid(c.kp, NULL, 0);
        c.kp = -1;
    }
out:
    kcase_close(&c);
}

/* A keeper that stops answering (SIGSTOP): a move waits one timeout, reads
 * the checkpoint, and later moves try it again a second after, then twice
 * as late: each try is one more error, none in between. */
static void test_hung(void)
{
    kcase c;
    bool ok = kcase_open(&c, "kstore-hung", true, false);
    ferry_file *f = c.f;
    ferry_store *s = c.s;
    ferry_model *m = c.m;
    if (!ok || ferry_store_use_keeper(s, sock, 300) != 0) goto out;
    CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0);
    CHECK(ferry_model_evict(m, NULL, 0) >= 0);
    kill(c.kp, SIGSTOP);
    double t0 = kc_now();
    CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0);
    CHECK(kc_now() - t0 < 3); /* one 300 ms wait, not the default 5 s, nor one per tensor */
    CHECK_EQ(differ(m, f), 0);
    ferry_store_keeper_stats k = kstats(s);
    CHECK_EQ(k.errors, 1);
    CHECK_EQ(k.connected, 0);
    CHECK_STR_HAS(k.last_error, "no answer from the keeper in 300 ms");
    uint64_t read = sstats(s).bytes_read;
    CHECK_EQ(read, 2 * TOTAL);
    const double waits[] = {0, 1.1, 1.1, 1.1}; /* after the waits so far: 0, 1.1, 2.2, 3.3 s */
    const uint64_t errors[] = {1, 2, 2, 3};    /* tried at 1 s (fails: 2 s on), then at 3 s */
    for (int i = 0; i < 4; i++) {
        usleep((useconds_t)(waits[i] * 1e6));
        CHECK(ferry_model_evict(m, NULL, 0) >= 0);
        CHECK_EQ(ferry_model_to_device(m, NULL, 0), 0);
        CHECK_EQ(kstats(s).errors, errors[i]);
    }
    CHECK_EQ(differ(m, f), 0);
    CHECK_EQ(kstats(s).connects, 1);
    kill(c.kp, SIGCONT);
out:
    kcase_close(&c);
}

/* Every counted system call of a served move and of a fed one, failed in
 * turn: each move ends in success with the file's bytes or in a clean
 * error, and the keeper stays whole. */
static void test_faults(void)
{
    kcase c;
    if (!kcase_open(&c, "kstore-faults", false, false)) goto out;
    ferry_device *d = c.d;
    for (int fed = 0; fed < 2; fed++) {
        int runs = 0, ok = 0;
        for (long n = 1; n < 400; n++) {
            ferry_file *f = open_ckpt();
            ferry_store *s = f ? mk_store(d, true) : NULL;
            ferry_model *m = NULL;
            if (!s || ferry_store_add(s, "m", &f, 1, 0, &m) != 0) {
                ferry_store_free(s);
                ferry_file_close(f);
                break;
            }
            if (fed == 0) { /* the keeper empty: this move feeds it */
                ferry_keep *k = NULL;
                char err[1400];
                if (ferry_keep_connect(sock, 3000, &k, err, sizeof err) == 0)
                    ferry_keep_drop(k, FERRY_KEEP_DROP_ALL, NULL);
                ferry_keep_close(k);
            }
            fy_fault_arm(n, EIO);
            int rc = ferry_model_to_device(m, NULL, 0);
            bool fired = fy_fault_fired();
            fy_fault_arm(0, 0);
            if (rc == 0) {
                CHECK_EQ(differ(m, f), 0);
                ok++;
            }
            runs++;
            ferry_store_free(s);
            ferry_file_close(f);
            if (!fired) break;
        }
        fprintf(stderr, "faults (%s): %d runs, %d of them moved\n", fed ? "served" : "fed", runs, ok);
        CHECK(runs > 3);
        CHECK(ok >= 1);
        check_serves_whole(d); /* what is left in the keeper is whole */
    }
out:
    kcase_close(&c);
}

#define CASES(CASE)             \
    CASE(killed, test_killed()) \
    CASE(hung, test_hung())     \
    CASE(faults, test_faults())
CHECK_CASES(CASES)

int main(int argc, char **argv)
{
    return kmain(argc, argv, check_cases, check_ncases);
}
