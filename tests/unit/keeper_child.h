/* SPDX-License-Identifier: Apache-2.0 */
/* keeper_child.h - the unit tests' keeper (ferry_keep_serve) in a forked
 * child: started on a socket with its stderr in a log file, waited for,
 * stopped with SIGTERM. Shared by test_keep and test_keepstore. */
#ifndef FERRY_TEST_KEEPER_CHILD_H
#define FERRY_TEST_KEEPER_CHILD_H

#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fds.h"
#include "ferry_experimental.h"

static inline double kc_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Start a keeper on sock with this budget, its stderr appended to log;
 * waits until it answers (at most 5 s). Its pid, or -1. When check_fds is
 * set, the child exits 3 if its descriptors after serving differ from
 * before. */
static inline pid_t kc_start(const char *sock, const char *log, uint64_t budget, bool check_fds)
{
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* (a test that dies, even mid-SIGSTOP, leaves no keeper behind) */
        int lf = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        if (lf >= 0) dup2(lf, 2);
        if (lf > 2) close(lf);
        int before = count_fds();
        ferry_keep_opts o = {
            .socket = sock, .device = "sim", .budget = budget, .stop_fd = -1, .handle_signals = 1};
        char err[1400];
        int rc = ferry_keep_serve(&o, err, sizeof err);
        if (rc < 0) {
            fprintf(stderr, "serve: %s\n", err);
            exit(1);
        }
        if (check_fds && count_fds() != before) {
            fprintf(stderr, "serve left %d descriptors open\n", count_fds() - before);
            exit(3);
        }
        exit(0);
    }
    double t0 = kc_now();
    while (kc_now() - t0 < 5) {
        ferry_keep *k;
        char err[1400];
        if (ferry_keep_connect(sock, 1000, &k, err, sizeof err) == 0) {
            ferry_keep_close(k);
            return pid;
        }
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) return -1;
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

/* Wait for pid at most secs; its wait status, or -1 (then it is killed). */
static inline int kc_wait(pid_t pid, double secs)
{
    double t0 = kc_now();
    int st;
    while (kc_now() - t0 < secs) {
        if (waitpid(pid, &st, WNOHANG) == pid) return st;
        usleep(5000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
}

/* SIGTERM: its exit status after a clean stop, else -1. */
static inline int kc_stop(pid_t pid)
{
    kill(pid, SIGTERM);
    int st = kc_wait(pid, 10);
    return st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#endif
