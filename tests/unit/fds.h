/* SPDX-License-Identifier: Apache-2.0 */
/* fds.h - the unit tests' descriptor count, for "nothing left open" checks:
 * the entries of /proc/self/fd, less the one the count itself opens; -1 when
 * /proc cannot be read. */
#ifndef FERRY_TEST_FDS_H
#define FERRY_TEST_FDS_H

#include <dirent.h>

static inline int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n - 1; /* the DIR's own descriptor */
}

#endif
