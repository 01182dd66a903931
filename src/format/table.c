/* SPDX-License-Identifier: Apache-2.0 */
/* table.c - the tensor table every parser fills, and the dtype catalogue. */
#include "format.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

/* Every dtype as the smallest group of elements that fills whole bytes:
 * `block` elements take `bytes` bytes. safetensors' dtypes are whole bytes per
 * element except F4 (2 in a byte) and F6_* (4 in 3 bytes); ggml's quantized
 * types are blocks of 32 to 256 elements (sizes from ggml-common.h's block_*
 * structs). `st` marks the dtypes safetensors may name. */
static const struct {
    const char *name;
    int bits; /* per element; 0 when not a whole number */
    int block, bytes;
    bool st;
} dtypes[FERRY_DTYPE_COUNT] = {
    [FERRY_DTYPE_INVALID] = {"INVALID", 0, 0, 0, false},
    [FERRY_DTYPE_BOOL] = {"BOOL", 8, 1, 1, true},
    [FERRY_DTYPE_U8] = {"U8", 8, 1, 1, true},
    [FERRY_DTYPE_I8] = {"I8", 8, 1, 1, true},
    [FERRY_DTYPE_U16] = {"U16", 16, 1, 2, true},
    [FERRY_DTYPE_I16] = {"I16", 16, 1, 2, true},
    [FERRY_DTYPE_U32] = {"U32", 32, 1, 4, true},
    [FERRY_DTYPE_I32] = {"I32", 32, 1, 4, true},
    [FERRY_DTYPE_U64] = {"U64", 64, 1, 8, true},
    [FERRY_DTYPE_I64] = {"I64", 64, 1, 8, true},
    [FERRY_DTYPE_F16] = {"F16", 16, 1, 2, true},
    [FERRY_DTYPE_BF16] = {"BF16", 16, 1, 2, true},
    [FERRY_DTYPE_F32] = {"F32", 32, 1, 4, true},
    [FERRY_DTYPE_F64] = {"F64", 64, 1, 8, true},
    [FERRY_DTYPE_C64] = {"C64", 64, 1, 8, true},
    [FERRY_DTYPE_F8_E4M3] = {"F8_E4M3", 8, 1, 1, true},
    [FERRY_DTYPE_F8_E5M2] = {"F8_E5M2", 8, 1, 1, true},
    [FERRY_DTYPE_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8, 1, 1, true},
    [FERRY_DTYPE_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8, 1, 1, true},
    [FERRY_DTYPE_F8_E8M0] = {"F8_E8M0", 8, 1, 1, true},
    [FERRY_DTYPE_F6_E2M3] = {"F6_E2M3", 6, 4, 3, true},
    [FERRY_DTYPE_F6_E3M2] = {"F6_E3M2", 6, 4, 3, true},
    [FERRY_DTYPE_F4] = {"F4", 4, 2, 1, true},
    [FERRY_DTYPE_Q4_0] = {"Q4_0", 0, 32, 18, false},
    [FERRY_DTYPE_Q4_1] = {"Q4_1", 0, 32, 20, false},
    [FERRY_DTYPE_Q5_0] = {"Q5_0", 0, 32, 22, false},
    [FERRY_DTYPE_Q5_1] = {"Q5_1", 0, 32, 24, false},
    [FERRY_DTYPE_Q8_0] = {"Q8_0", 0, 32, 34, false},
    [FERRY_DTYPE_Q8_1] = {"Q8_1", 0, 32, 36, false},
    [FERRY_DTYPE_Q2_K] = {"Q2_K", 0, 256, 84, false},
    [FERRY_DTYPE_Q3_K] = {"Q3_K", 0, 256, 110, false},
    [FERRY_DTYPE_Q4_K] = {"Q4_K", 0, 256, 144, false},
    [FERRY_DTYPE_Q5_K] = {"Q5_K", 0, 256, 176, false},
    [FERRY_DTYPE_Q6_K] = {"Q6_K", 0, 256, 210, false},
    [FERRY_DTYPE_Q8_K] = {"Q8_K", 0, 256, 292, false},
    [FERRY_DTYPE_IQ2_XXS] = {"IQ2_XXS", 0, 256, 66, false},
    [FERRY_DTYPE_IQ2_XS] = {"IQ2_XS", 0, 256, 74, false},
    [FERRY_DTYPE_IQ3_XXS] = {"IQ3_XXS", 0, 256, 98, false},
    [FERRY_DTYPE_IQ1_S] = {"IQ1_S", 0, 256, 50, false},
    [FERRY_DTYPE_IQ4_NL] = {"IQ4_NL", 0, 32, 18, false},
    [FERRY_DTYPE_IQ3_S] = {"IQ3_S", 0, 256, 110, false},
    [FERRY_DTYPE_IQ2_S] = {"IQ2_S", 0, 256, 82, false},
    [FERRY_DTYPE_IQ4_XS] = {"IQ4_XS", 0, 256, 136, false},
    [FERRY_DTYPE_IQ1_M] = {"IQ1_M", 0, 256, 56, false},
    [FERRY_DTYPE_TQ1_0] = {"TQ1_0", 0, 256, 54, false},
    [FERRY_DTYPE_TQ2_0] = {"TQ2_0", 0, 256, 66, false},
    [FERRY_DTYPE_MXFP4] = {"MXFP4", 0, 32, 17, false},
    [FERRY_DTYPE_NVFP4] = {"NVFP4", 0, 64, 36, false},
    [FERRY_DTYPE_Q1_0] = {"Q1_0", 0, 128, 18, false},
    [FERRY_DTYPE_Q2_0] = {"Q2_0", 0, 64, 18, false},
};

FERRY_API const char *ferry_dtype_name(ferry_dtype dt)
{
    if ((unsigned)dt >= FERRY_DTYPE_COUNT) return "INVALID";
    return dtypes[dt].name;
}

FERRY_API int ferry_dtype_bits(ferry_dtype dt)
{
    if ((unsigned)dt >= FERRY_DTYPE_COUNT) return 0;
    return dtypes[dt].bits;
}

FERRY_API int ferry_dtype_block(ferry_dtype dt, int *block_elems, int *block_bytes)
{
    if ((unsigned)dt >= FERRY_DTYPE_COUNT || dt == FERRY_DTYPE_INVALID) return FERRY_E_INVAL;
    if (block_elems) *block_elems = dtypes[dt].block;
    if (block_bytes) *block_bytes = dtypes[dt].bytes;
    return 0;
}

ferry_dtype fy_dtype_parse(const char *name)
{
    for (int i = 1; i < FERRY_DTYPE_COUNT; i++)
        if (dtypes[i].st && strcmp(dtypes[i].name, name) == 0) return (ferry_dtype)i;
    return FERRY_DTYPE_INVALID;
}

bool fy_dtype_nbytes(ferry_dtype dt, uint64_t nelem, uint64_t *nbytes)
{
    /* whole blocks only; no intermediate product larger than the result */
    if ((unsigned)dt >= FERRY_DTYPE_COUNT || dtypes[dt].block == 0) return false;
    uint64_t per = (uint64_t)dtypes[dt].block;
    if (nelem % per) return false;
    return !fy_mul_ovf(nelem / per, (uint64_t)dtypes[dt].bytes, nbytes);
}

void fy_table_init(fy_table *tb, const ferry_allocator *mem)
{
    memset(tb, 0, sizeof *tb);
    tb->mem = mem;
}

void fy_table_free(fy_table *tb)
{
    for (int64_t i = 0; i < tb->n; i++) {
        fy_free(tb->mem, tb->t[i].name);
        fy_free(tb->mem, tb->t[i].shape);
        fy_free(tb->mem, tb->t[i].strides);
    }
    fy_free(tb->mem, tb->t);
    for (int64_t i = 0; i < tb->nmeta; i++) {
        fy_free(tb->mem, tb->meta_k[i]);
        fy_free(tb->mem, tb->meta_v[i]);
    }
    fy_free(tb->mem, tb->meta_k);
    fy_free(tb->mem, tb->meta_v);
    fy_free(tb->mem, tb->meta_kind);
    const ferry_allocator *m = tb->mem;
    uint64_t max_bytes = tb->max_bytes;
    int64_t max_n = tb->max_n;
    fy_table_init(tb, m);
    tb->max_bytes = max_bytes;
    tb->max_n = max_n;
}

/* Whether add more bytes stay within the cap. */
static bool fits(const fy_table *tb, uint64_t add)
{
    uint64_t total;
    return !tb->max_bytes || (!fy_add_ovf(tb->bytes, add, &total) && total <= tb->max_bytes);
}

/* The tensor array at cap entries. */
static int resize(fy_table *tb, int64_t cap)
{
    uint64_t bytes;
    if (fy_mul_ovf((uint64_t)cap, sizeof(fy_tensor), &bytes) || bytes > SIZE_MAX) return -ENOMEM;
    uint64_t old = (uint64_t)tb->cap * sizeof(fy_tensor);
    if (bytes > old && !fits(tb, bytes - old)) return FERRY_E_LIMIT;
    fy_tensor *nt = fy_realloc(tb->mem, tb->t, (size_t)bytes);
    if (!nt) return -ENOMEM;
    tb->t = nt;
    tb->cap = cap;
    tb->bytes = tb->bytes - old + bytes;
    return 0;
}

int fy_table_reserve(fy_table *tb, int64_t n)
{
    int64_t want;
    if (n < 0 || __builtin_add_overflow(tb->n, n, &want)) return -ENOMEM;
    if (tb->max_n && want > tb->max_n) return FERRY_E_LIMIT;
    return want > tb->cap ? resize(tb, want) : 0;
}

int fy_table_push(fy_table *tb, const fy_tensor *t)
{
    if (tb->max_n && tb->n >= tb->max_n) return FERRY_E_LIMIT;
    uint64_t own = strlen(t->name) + 1 + (uint64_t)t->ndim * sizeof(int64_t) * (t->strides ? 2 : 1);
    if (!fits(tb, own)) return FERRY_E_LIMIT;
    if (tb->n == tb->cap) {
        int64_t cap = tb->cap ? tb->cap * 2 : 64;
        if (tb->max_n && cap > tb->max_n) cap = tb->max_n;
        FY_TRY(resize(tb, cap));
        if (!fits(tb, own)) return FERRY_E_LIMIT;
    }
    tb->t[tb->n++] = *t;
    tb->bytes += own;
    return 0;
}

int fy_table_push_meta(fy_table *tb, const char *k, size_t klen, const char *v, size_t vlen,
                       ferry_meta_kind kind)
{
    uint64_t own = (uint64_t)klen + 1 + (uint64_t)vlen + 1;
    if (!fits(tb, own)) return FERRY_E_LIMIT;
    if (tb->nmeta == tb->meta_cap) {
        int64_t cap = tb->meta_cap ? tb->meta_cap * 2 : 16;
        uint64_t grow = (uint64_t)(cap - tb->meta_cap) * (2 * sizeof(char *) + 1);
        if (!fits(tb, grow + own)) return FERRY_E_LIMIT;
        char **nk = fy_realloc(tb->mem, tb->meta_k, (size_t)cap * sizeof(char *));
        if (!nk) return -ENOMEM;
        tb->meta_k = nk;
        char **nv = fy_realloc(tb->mem, tb->meta_v, (size_t)cap * sizeof(char *));
        if (!nv) return -ENOMEM;
        tb->meta_v = nv;
        uint8_t *nkd = fy_realloc(tb->mem, tb->meta_kind, (size_t)cap);
        if (!nkd) return -ENOMEM;
        tb->meta_kind = nkd;
        tb->meta_cap = cap;
        tb->bytes += grow;
    }
    char *dk = fy_strndup(tb->mem, k, klen);
    char *dv = fy_strndup(tb->mem, v, vlen);
    if (!dk || !dv) {
        fy_free(tb->mem, dk);
        fy_free(tb->mem, dv);
        return -ENOMEM;
    }
    tb->meta_k[tb->nmeta] = dk;
    tb->meta_v[tb->nmeta] = dv;
    tb->meta_kind[tb->nmeta] = (uint8_t)kind;
    tb->nmeta++;
    tb->bytes += own;
    return 0;
}

int fy_table_charge(fy_table *tb, uint64_t n)
{
    if (!fits(tb, n)) return FERRY_E_LIMIT;
    tb->bytes += n;
    return 0;
}

void fy_table_uncharge(fy_table *tb, uint64_t n)
{
    tb->bytes = n < tb->bytes ? tb->bytes - n : 0;
}

int fy_table_fail(const fy_table *tb, int rc, const char *name, fy_err *err)
{
    if (rc != FERRY_E_LIMIT) return fy_seterr(err, rc, "%s: out of memory", name);
    if (tb->max_n && tb->n >= tb->max_n)
        return fy_seterr(err, rc, "%s: holds more than %" PRId64 " tensors, the cap (max_tensors)", name,
                         tb->max_n);
    return fy_seterr(
        err, rc,
        "%s: the header and the tensor table built from it would take more than the cap of %" PRIu64
        " bytes (max_header_bytes), at %" PRId64 " tensors and %" PRId64 " metadata entries",
        name, tb->max_bytes, tb->n, tb->nmeta);
}
