/* file_impl.h - the inside of ferry_file, shared with xfer/ (which reads the
 * shards' descriptors and mappings). */
#ifndef FERRY_FILE_IMPL_H
#define FERRY_FILE_IMPL_H

#include "common/common.h"
#include "format/format.h"

typedef struct shard {
    char *path;
    int fd;
    uint64_t size;
    void *map;
} shard;

struct ferry_file {
    ferry_ctx *ctx;
    /* this file's messages (also its context's); calls that take a const
     * ferry_file still record their failures here, so it is mutable */
    fy_err err;
    ferry_format fmt;
    int32_t nshards;
    shard *shards;
    fy_table tb;
    int64_t *by_name; /* tensor indices sorted by name */
    uint64_t total;
    bool private_map; /* FERRY_OPEN_PRIVATE: copy-on-write mappings, never registered */
};

#endif
