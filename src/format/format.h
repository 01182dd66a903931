/* SPDX-License-Identifier: Apache-2.0 */
/* format.h - parsers turn bytes into a tensor table. They read from memory
 * buffers only (no I/O, no policy), so fuzzers can drive them directly.
 * Depends on common/ only. */
#ifndef FERRY_FORMAT_H
#define FERRY_FORMAT_H

#include "common/common.h"

/* safetensors' rule: a header is at most 100 MB. */
#define FY_ST_MAX_HEADER 100000000ull

typedef struct fy_tensor {
    char *name;
    ferry_dtype dtype;
    int32_t ndim;
    int64_t *shape;
    uint64_t offset; /* absolute, in its file */
    uint64_t nbytes;
    int32_t shard;
    int64_t *strides; /* NULL: contiguous; else ndim element strides (owned) */
    uint32_t flags;   /* FERRY_TENSOR_* */
} fy_tensor;

typedef struct fy_table {
    const ferry_allocator *mem;
    fy_tensor *t;
    int64_t n, cap;
    char **meta_k, **meta_v;
    uint8_t *meta_kind; /* ferry_meta_kind of each value */
    int64_t nmeta, meta_cap;
    /* What the table holds, in bytes asked of mem (the arrays at their
     * capacity, names, shapes, strides, metadata), plus what fy_table_charge
     * added; and the caps on it and on n (0: none), which fy_table_free keeps.
     * Set by ferry_file_open from ferry_ctx_opts' max_header_bytes and
     * max_tensors. */
    uint64_t bytes, max_bytes;
    int64_t max_n;
} fy_table;

void fy_table_init(fy_table *tb, const ferry_allocator *mem);
/* Frees everything; the table is empty again, its caps kept. */
void fy_table_free(fy_table *tb);
/* Append; takes ownership of name, shape and strides on success only.
 * -ENOMEM, or FERRY_E_LIMIT past max_n or max_bytes. */
int fy_table_push(fy_table *tb, const fy_tensor *t);
/* Append a key/value; kind says how to read v (FERRY_META_TEXT: a plain
 * string, FERRY_META_JSON: valid JSON text). -ENOMEM, or FERRY_E_LIMIT past
 * max_bytes. */
int fy_table_push_meta(fy_table *tb, const char *k, size_t klen, const char *v, size_t vlen,
                       ferry_meta_kind kind);
/* Room for n more tensors, so that pushing them does not grow the array
 * (which, doubling, held up to twice the room). -ENOMEM, FERRY_E_LIMIT. */
int fy_table_reserve(fy_table *tb, int64_t n);
/* Count n bytes the table does not hold (a header buffer) against max_bytes
 * until fy_table_uncharge: FERRY_E_LIMIT if that passes the cap. */
int fy_table_charge(fy_table *tb, uint64_t n);
void fy_table_uncharge(fy_table *tb, uint64_t n);
/* The message for a failed push, reserve or charge (rc): for FERRY_E_LIMIT,
 * which cap and its figure ("NAME: holds more than 1000 tensors, the cap
 * (max_tensors)"), else "NAME: out of memory". Returns rc. */
int fy_table_fail(const fy_table *tb, int rc, const char *name, fy_err *err);

/* dtype by safetensors name (none of ggml's block types), FERRY_DTYPE_INVALID
 * if unknown. */
ferry_dtype fy_dtype_parse(const char *name);
/* Byte size of nelem elements; false on overflow or when nelem is not a whole
 * number of the dtype's blocks (ferry_dtype_block: 2 F4 elements per byte, 32
 * Q4_0 elements per 18 bytes). */
bool fy_dtype_nbytes(ferry_dtype dt, uint64_t nelem, uint64_t *nbytes);

/* safetensors. `name` prefixes every message ("model.safetensors: ...").
 * fy_st_header_len checks the 8-byte prefix against the file size and returns
 * the header's length in *hlen. fy_st_parse validates the header (hlen bytes)
 * against the file size and fills tb; on failure tb is left empty.
 * Errors: FERRY_E_CORRUPT, FERRY_E_LIMIT, -ENOMEM. */
int fy_st_header_len(const uint8_t prefix[8], uint64_t file_size, const char *name, uint64_t *hlen,
                     fy_err *err);
int fy_st_parse(const char *name, const uint8_t *hdr, uint64_t hlen, uint64_t file_size, int32_t shard,
                fy_table *tb, fy_err *err);
/* Both steps over a whole file held in memory (tests, fuzzers). */
int fy_st_parse_buffer(const char *name, const uint8_t *buf, size_t n, fy_table *tb, fy_err *err);

/* Writing safetensors (st_write.c): the layout and header only; the caller
 * writes the bytes. fy_st_dtype_ok: whether safetensors has a name for dt
 * (block-quantized GGUF types it has not). fy_st_out_bytes: the bytes t takes
 * in the output (a strided view is gathered into numel x element size). */
bool fy_st_dtype_ok(ferry_dtype dt);
uint64_t fy_st_out_bytes(const fy_tensor *t, ferry_dtype to);

/* Casts (cast.c), bit-exact and independent of the FPU's mode: IEEE 754
 * round to nearest, ties to even; overflow to Inf, underflow to (signed)
 * zero through the subnormals; Inf stays Inf; a NaN keeps its sign and the
 * top bits of its payload and is made quiet. fy_cast_is_float: F16, BF16,
 * F32 or F64, the dtypes a cast reads (FP8/FP6/FP4, integers, BOOL, C64 and
 * ggml's block types are never cast). fy_cast_target_ok: F16, BF16 or F32.
 * fy_cast_out_dtype: what src becomes under a cast to `to` (to itself for
 * a float, src otherwise; to INVALID means no cast). fy_cast converts n
 * elements from in to out (which may be in itself only when the element
 * size does not grow): 0, or FERRY_E_INVAL for dtypes outside those sets. */
bool fy_cast_is_float(ferry_dtype dt);
bool fy_cast_target_ok(ferry_dtype dt);
ferry_dtype fy_cast_out_dtype(ferry_dtype src, ferry_dtype to);
int fy_cast(ferry_dtype src, ferry_dtype dst, const void *in, void *out, size_t n);
/* The layout of tb as a safetensors file: order[k] is the tensor (index into
 * tb) stored k-th, the tensors whose size is a multiple of align first (so
 * that every one of them starts aligned), the others after in tb's order;
 * hdr is the file's first hdr_len bytes: the 8-byte length, the JSON header
 * (__metadata__ from tb's metadata, then the tensors in order) and spaces up
 * to where the data starts, aligned. align 0 means 8; else a power of two up
 * to 1 MiB. Errors (the message starts "convert: "): FERRY_E_INVAL (align),
 * FERRY_E_UNSUPPORTED (a dtype safetensors lacks), FERRY_E_CORRUPT (a name
 * twice, or "__metadata__"), -ENOMEM. On failure *out is empty. */
typedef struct fy_st_out {
    int64_t *order; /* tb->n entries */
    uint8_t *hdr;
    size_t hdr_len;
} fy_st_out;
/* to: FERRY_DTYPE_INVALID, or the dtype every floating-point tensor is cast
 * to (fy_cast_out_dtype: its byte size follows). */
int fy_st_layout(const fy_table *tb, uint64_t align, ferry_dtype to, const ferry_allocator *mem,
                 fy_st_out *out, fy_err *err);
void fy_st_layout_free(fy_st_out *out, const ferry_allocator *mem);

/* A sharded checkpoint's index (`*.safetensors.index.json`): fills names[i] ->
 * shard file (files[shard_of[i]]), and the index's metadata into tb's metadata
 * (non-string values as JSON text). Shard names must be plain relative paths
 * (no absolute path, no '..'). Errors: FERRY_E_CORRUPT, -ENOMEM. */
typedef struct fy_index {
    const ferry_allocator *mem;
    char **names; /* n tensor names */
    int32_t *shard_of;
    int64_t n;
    char **files; /* nfiles distinct shard names, in first-seen order */
    int32_t nfiles;
} fy_index;
int fy_index_parse(const char *name, const uint8_t *buf, size_t n, fy_index *ix, fy_table *meta, fy_err *err);
void fy_index_free(fy_index *ix);

/* jansson value v as JSON text (json_dumpb flags; *len bytes, NUL-terminated,
 * from mem), or NULL when out of memory. Not json_dumps: when its buffer
 * cannot grow while it writes an object's key, jansson 2.14 drops the key and
 * carries on (dump.c ignores dump_string's result there), so the text would
 * be wrong, not missing. json_dumpb into a buffer sized by a first pass
 * allocates nothing that way. (index.c) */
struct json_t;
char *fy_json_text(const ferry_allocator *mem, const struct json_t *v, size_t flags, size_t *len);

/* GGUF v2/v3, little-endian. buf holds the whole file (a read-only mapping:
 * only the header is touched). Tensors go into tb in file order with absolute
 * offsets, the shape outermost-first (GGUF's ne reversed), strides NULL, flags
 * 0; metadata key/values become string metadata (strings as they are, numbers
 * and booleans as text, arrays of up to 16 items as compact JSON, longer ones
 * as "[TYPE x N]"). Errors: FERRY_E_CORRUPT, FERRY_E_LIMIT (arrays nested
 * deeper than 32), FERRY_E_UNSUPPORTED (other versions, big-endian files,
 * unknown ggml types), -ENOMEM. On failure tb is empty. */
int fy_gguf_parse(const char *name, const uint8_t *buf, uint64_t size, fy_table *tb, fy_err *err);

/* PyTorch zip checkpoint (torch.save since 1.6). buf holds the whole file (a
 * read-only mapping; the directory, local headers and data.pkl are touched,
 * no tensor data). A restricted unpickler that executes nothing (pickle.h)
 * builds the tensor table from <archive>/data.pkl: tensors are views of the
 * stored (uncompressed) entries <archive>/data/<key> (zip.h) with absolute
 * offsets, checked to lie inside them; nested dicts give dotted names, lists
 * and tuples indices; strides are kept when not row-major (flags
 * FERRY_TENSOR_NONCONTIGUOUS, nbytes = the span from the first to one past the
 * last element); views of one storage get FERRY_TENSOR_SHARED_STORAGE. The
 * table is in offset order (ties: the order the pickle names them); no
 * metadata. Errors: FERRY_E_CORRUPT, FERRY_E_UNSUPPORTED (compressed entries,
 * big-endian data, a global, opcode or call outside the allowed set: the
 * message names it), FERRY_E_LIMIT, -ENOMEM. On failure tb is empty. */
int fy_pt_parse(const char *name, const uint8_t *buf, uint64_t size, fy_table *tb, fy_err *err);

#endif /* FERRY_FORMAT_H */
