/* table.c - the tensor table every parser fills, and the dtype catalogue. */
#include "format.h"

#include <errno.h>
#include <string.h>

static const struct {
    const char *name;
    int bits;
} dtypes[FERRY_DTYPE_COUNT] = {
    [FERRY_DTYPE_INVALID] = {"INVALID", 0},
    [FERRY_DTYPE_BOOL] = {"BOOL", 8},
    [FERRY_DTYPE_U8] = {"U8", 8},
    [FERRY_DTYPE_I8] = {"I8", 8},
    [FERRY_DTYPE_U16] = {"U16", 16},
    [FERRY_DTYPE_I16] = {"I16", 16},
    [FERRY_DTYPE_U32] = {"U32", 32},
    [FERRY_DTYPE_I32] = {"I32", 32},
    [FERRY_DTYPE_U64] = {"U64", 64},
    [FERRY_DTYPE_I64] = {"I64", 64},
    [FERRY_DTYPE_F16] = {"F16", 16},
    [FERRY_DTYPE_BF16] = {"BF16", 16},
    [FERRY_DTYPE_F32] = {"F32", 32},
    [FERRY_DTYPE_F64] = {"F64", 64},
    [FERRY_DTYPE_C64] = {"C64", 64},
    [FERRY_DTYPE_F8_E4M3] = {"F8_E4M3", 8},
    [FERRY_DTYPE_F8_E5M2] = {"F8_E5M2", 8},
    [FERRY_DTYPE_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8},
    [FERRY_DTYPE_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8},
    [FERRY_DTYPE_F8_E8M0] = {"F8_E8M0", 8},
    [FERRY_DTYPE_F6_E2M3] = {"F6_E2M3", 6},
    [FERRY_DTYPE_F6_E3M2] = {"F6_E3M2", 6},
    [FERRY_DTYPE_F4] = {"F4", 4},
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

ferry_dtype fy_dtype_parse(const char *name)
{
    for (int i = 1; i < FERRY_DTYPE_COUNT; i++)
        if (strcmp(dtypes[i].name, name) == 0) return (ferry_dtype)i;
    return FERRY_DTYPE_INVALID;
}

bool fy_dtype_nbytes(ferry_dtype dt, uint64_t nelem, uint64_t *nbytes)
{
    /* b bits per element: elements come in groups of 8/g that fill b/g whole
     * bytes (g = gcd(b, 8)), so no intermediate count of bits can overflow. */
    uint64_t b = (uint64_t)ferry_dtype_bits(dt);
    if (b == 0) return false;
    uint64_t g = b % 8 == 0 ? 8 : b % 4 == 0 ? 4 : b % 2 == 0 ? 2 : 1;
    uint64_t per = 8 / g;
    if (nelem % per) return false;
    return !fy_mul_ovf(nelem / per, b / g, nbytes);
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
    const ferry_allocator *m = tb->mem;
    fy_table_init(tb, m);
}

int fy_table_push(fy_table *tb, const fy_tensor *t)
{
    if (tb->n == tb->cap) {
        int64_t cap = tb->cap ? tb->cap * 2 : 64;
        uint64_t bytes;
        if (fy_mul_ovf((uint64_t)cap, sizeof(fy_tensor), &bytes) || bytes > SIZE_MAX) return -ENOMEM;
        fy_tensor *nt = fy_realloc(tb->mem, tb->t, (size_t)bytes);
        if (!nt) return -ENOMEM;
        tb->t = nt;
        tb->cap = cap;
    }
    tb->t[tb->n++] = *t;
    return 0;
}

int fy_table_push_meta(fy_table *tb, const char *k, size_t klen, const char *v, size_t vlen)
{
    if (tb->nmeta == tb->meta_cap) {
        int64_t cap = tb->meta_cap ? tb->meta_cap * 2 : 16;
        char **nk = fy_realloc(tb->mem, tb->meta_k, (size_t)cap * sizeof(char *));
        if (!nk) return -ENOMEM;
        tb->meta_k = nk;
        char **nv = fy_realloc(tb->mem, tb->meta_v, (size_t)cap * sizeof(char *));
        if (!nv) return -ENOMEM;
        tb->meta_v = nv;
        tb->meta_cap = cap;
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
    tb->nmeta++;
    return 0;
}
