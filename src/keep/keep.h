/* SPDX-License-Identifier: Apache-2.0 */
/* keep.h - the keeper's internals shared by its daemon and client (and the
 * unit tests): the socket's private directory and the same-user rule. */
#ifndef FERRY_KEEP_H
#define FERRY_KEEP_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* The keeper serves only its own user: a connection whose SO_PEERCRED uid is
 * not the keeper's is closed. */
bool fk_peer_allowed(uid_t peer, uid_t self);

/* The socket path's directory is private: ours (uid self) and no access for
 * group or others (mode & 077 == 0), a real directory (not a symlink). When
 * it does not exist and create is set, it is made 0700 (its parent must
 * exist). 0, or -errno (-EPERM: another owner or wider mode) with the reason
 * in err[0..n-1]. */
int fk_private_dir(const char *socket_path, bool create, uid_t self, char *err, size_t n);

/* The longest socket address (sockaddr_un's sun_path less its NUL). */
#define FK_SUN_MAX 107

/* The longest socket path the keeper and its client take (PATH_MAX less its
 * NUL): a path longer than FK_SUN_MAX is reached through its directory. */
#define FK_SOCK_PATH_MAX 4095

struct sockaddr_un;

/* The address to bind or connect for the socket at path. A path of at most
 * FK_SUN_MAX bytes is its own address (*dirfd = -1). A longer one is reached
 * through a descriptor of its directory, opened O_PATH (into *dirfd; the
 * caller closes it after its bind or connect), as "/proc/self/fd/N/NAME":
 * nothing process-wide (the working directory) changes, so threads may do
 * this at once. 0, or -ENAMETOOLONG (even that address does not fit: the
 * message names path and the limit) or -errno (the directory cannot be
 * opened), with the reason in err[0..n-1]. */
int fk_sock_addr(const char *path, struct sockaddr_un *a, int *dirfd, char *err, size_t n);

#endif
