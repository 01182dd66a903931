/* SPDX-License-Identifier: Apache-2.0 */
/* pickle.h - a restricted unpickler for the data.pkl of torch.save checkpoints.
 * It builds plain values from the opcodes tensor checkpoints use, resolves
 * globals against a fixed allow-list (it never imports, looks up or calls
 * anything), and flattens the result into named tensor views. Internal to
 * format/ (and its fuzzers). */
#ifndef FERRY_FORMAT_PICKLE_H
#define FERRY_FORMAT_PICKLE_H

#include "common/common.h"

/* ferry's limits on a data.pkl (FERRY_E_LIMIT beyond them). */
#define FY_PK_MAX_PICKLE 100000000ull /* bytes, as safetensors' header limit */
#define FY_PK_MAX_STACK (1u << 20)    /* values on the stack at once */
#define FY_PK_MAX_MARKS (1u << 16)    /* MARKs open at once */
#define FY_PK_MAX_DEPTH 256           /* containers nested inside each other */
#define FY_PK_MAX_NDIM 1024           /* dimensions of a tensor */
#define FY_PK_MAX_NAME 65536          /* bytes of one tensor name */

/* A storage named by a persistent id ('storage', type, key, location, numel). */
typedef struct fy_pk_storage {
    const char *key; /* into the pickle bytes: key_len bytes (torch: "0", "1", ...) */
    uint32_t key_len;
    ferry_dtype dtype; /* element type of a typed storage; U8 for torch.UntypedStorage */
    bool untyped;      /* torch.UntypedStorage: numel counts bytes */
    uint64_t numel;    /* elements of dtype, from the persistent id */
    const char *type;  /* "torch.FloatStorage", for messages (static) */
} fy_pk_storage;

/* A tensor: a strided view of a storage. */
typedef struct fy_pk_view {
    int64_t storage;   /* index into storages */
    ferry_dtype dtype; /* the storage's, or _rebuild_tensor_v3's dtype argument */
    uint64_t offset;   /* storage offset, in elements of dtype */
    int32_t ndim;
    int64_t *shape;  /* ndim entries, >= 0 (owned; NULL when ndim == 0) */
    int64_t *stride; /* ndim entries, >= 0, in elements (owned) */
} fy_pk_view;

/* A tensor reached from the root: its dotted name ("state_dict.layer.0.w").
 * Several names may share one view (the same tensor object twice). */
typedef struct fy_pk_named {
    char *name; /* NUL-terminated, valid UTF-8, unique (owned) */
    int64_t view;
} fy_pk_named;

typedef struct fy_pk_result {
    const ferry_allocator *mem;
    fy_pk_storage *st;
    int64_t nst, st_cap;
    fy_pk_view *v;
    int64_t nv, v_cap;
    fy_pk_named *names; /* in the order the walk met them (dict and list order) */
    int64_t nn, nn_cap;
} fy_pk_result;

/* Unpickle p[0, n) (protocol 2 to 5, as torch.save writes it) into out, which
 * is initialised here. Dicts (and OrderedDicts) name their values by key
 * (strings, or integers in decimal), lists and tuples by index, joined with
 * dots; values that are not tensors or containers are skipped. Globals outside
 * the allow-list are refused, naming them. `where` prefixes every message
 * ("model.pt: data.pkl"). On failure out is left empty. Errors:
 * FERRY_E_CORRUPT, FERRY_E_UNSUPPORTED (a refused global, an opcode or call
 * ferry does not read, a dtype without a ferry equivalent), FERRY_E_LIMIT,
 * -ENOMEM. */
int fy_pk_load(const char *where, const uint8_t *p, size_t n, const ferry_allocator *mem, fy_pk_result *out,
               fy_err *err);
void fy_pk_free(fy_pk_result *r);

#endif /* FERRY_FORMAT_PICKLE_H */
