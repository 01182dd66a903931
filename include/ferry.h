/* SPDX-License-Identifier: Apache-2.0 */
/* ferry.h - the one public header of libferry.
 *
 * ferry moves model weights between disk, host RAM and GPU memory and keeps
 * checkpoints open as zero-copy views of a read-only file mapping.
 *
 * Conventions (they hold for every call below unless its comment says otherwise):
 *  - Fallible calls return int (or int64_t): >= 0 on success, < 0 on failure.
 *    System errors are passed through as -errno (-ENOENT, -ENOMEM, ...); ferry's
 *    own codes (FERRY_E_*) are all below -4096. ferry_strerror() names any code.
 *  - On failure a detailed, one-line message naming the file and the problem is
 *    left on the handle the call was made on (ferry_file_errmsg(),
 *    ferry_device_errmsg(), ferry_store_errmsg(), ferry_model_errmsg()) and on
 *    its context (ferry_ctx_errmsg(): the context's latest, whichever handle).
 *    Pure argument checks (a NULL handle, an index out of range,
 *    ferry_file_find's FERRY_E_NOTFOUND) return the code alone: an earlier
 *    message may remain.
 *  - Nothing here aborts, exits or prints on bad input.
 *  - Destructors accept NULL. Getters given a NULL handle answer the same way
 *    everywhere: counts FERRY_E_INVAL, names and descriptions "", strings that
 *    may be absent (a shard's path, the spill directory, a job's name) NULL,
 *    sizes, addresses and other unsigned figures 0.
 *  - Every struct passed in or filled out (options, statistics, tensor info and
 *    state) starts with `uint32_t size`, which the caller sets to sizeof the
 *    struct it was built with: fields are only ever appended, the library reads
 *    no more than size bytes of an options struct (the rest keep their
 *    defaults) and writes no more than size bytes of a struct it fills, so a
 *    caller built against an older header keeps working. A size below
 *    FERRY_STRUCT_MIN, or an options struct larger than this library knows,
 *    is FERRY_E_INVAL.
 */
#ifndef FERRY_H
#define FERRY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(FERRY_BUILDING) && defined(__GNUC__)
#define FERRY_API __attribute__((visibility("default")))
#else
#define FERRY_API
#endif

#include "ferry_version.h" /* FERRY_VERSION_MAJOR, _MINOR, _PATCH, _STRING */
#define FERRY_VERSION_NUMBER (FERRY_VERSION_MAJOR * 10000 + FERRY_VERSION_MINOR * 100 + FERRY_VERSION_PATCH)

/* Version of the library actually loaded, as FERRY_VERSION_NUMBER. Thread-safe. */
FERRY_API int ferry_version(void);
/* The same as a static string ("major.minor.patch"). Thread-safe. */
FERRY_API const char *ferry_version_string(void);

/* ---- errors ------------------------------------------------------------ */

enum {
    FERRY_E_BASE = -4097,
    FERRY_E_CORRUPT = -4097,     /* the file breaks its format's rules */
    FERRY_E_UNSUPPORTED = -4098, /* valid, but a feature ferry does not read */
    FERRY_E_FORMAT = -4099,      /* not a checkpoint format ferry knows */
    FERRY_E_INVAL = -4100,       /* a bad argument from the caller */
    FERRY_E_NOTFOUND = -4101,    /* no such tensor */
    FERRY_E_BUDGET = -4102,      /* a memory budget would be exceeded */
    FERRY_E_NODEV = -4103,       /* no such device, or no usable driver */
    FERRY_E_DEVICE = -4104,      /* the device driver failed a call */
    FERRY_E_LIMIT = -4105,       /* a size limit of ferry's (e.g. header > 100 MB) */
    FERRY_E_INTERNAL = -4106,    /* a bug in ferry: please report it */
    FERRY_E_BUSY = -4107,        /* in use: a tensor held by ferry_model_hold, a job already open */
    FERRY_E_LAST = -4107
};

/* Static text for any code returned by ferry (including -errno values).
 * Never NULL. Thread-safe. */
FERRY_API const char *ferry_strerror(int code);

/* ---- context ----------------------------------------------------------- */

typedef struct ferry_ctx ferry_ctx;
typedef struct ferry_file ferry_file;
typedef struct ferry_device ferry_device;
typedef struct ferry_store ferry_store;
typedef struct ferry_model ferry_model;

/* Custom allocator (zstd's customMem). All three set, or all three NULL. */
typedef struct ferry_allocator {
    void *(*alloc)(void *opaque, size_t size);
    void *(*realloc)(void *opaque, void *ptr, size_t size);
    void (*free)(void *opaque, void *ptr);
    void *opaque;
} ferry_allocator;

typedef struct ferry_ctx_opts {
    uint32_t size;             /* sizeof(ferry_ctx_opts) */
    uint32_t nthreads;         /* worker threads for hashing/IO; 0 = number of CPUs (max 64) */
    ferry_allocator allocator; /* zeroed = malloc/realloc/free */
    /* Caps for servers that open untrusted files, applied by every
     * ferry_file_open on this context (all shards of a checkpoint together);
     * 0 = no cap beyond the formats' own (a safetensors header or index file is
     * at most 100 MB). A file past a cap fails with FERRY_E_LIMIT before the
     * memory is spent where the format says its size up front, the message
     * naming the file, the figure and the cap. Without caps a 100 MB header
     * of zero-size tensors (1.5 M of them) opens in about 320 MiB of peak RSS,
     * header included (`bench/header_mem.py build/ferry FILE` under
     * /usr/bin/time -v; bench/RESULTS.md, "Header memory"). */
    uint64_t max_header_bytes; /* headers read into memory (a safetensors header, an index file)
                                  plus the tensor table kept (entries, names, shapes, strides,
                                  metadata, in bytes asked of the allocator) */
    uint64_t max_tensors;      /* tensors one opened file may hold */
} ferry_ctx_opts;

/* Create a context. opts may be NULL for defaults. On success *out owns a new
 * context, to be freed with ferry_ctx_free(). Returns 0, -ENOMEM or FERRY_E_INVAL.
 * A context may be used from several threads at once; files opened from it
 * must be closed before it is freed. */
FERRY_API int ferry_ctx_new(const ferry_ctx_opts *opts, ferry_ctx **out);
FERRY_API void ferry_ctx_free(ferry_ctx *ctx);

/* The message of the most recent failing call made with ctx (file opens
 * included). Returns a pointer to a copy owned by the calling thread, valid
 * until that thread's next ferry_ctx_errmsg() call; "" if nothing failed.
 * When several threads fail on one context at once, each may read the other's
 * message; use one context per thread where that matters. ctx may be NULL:
 * then the message of the calling thread's last failed ferry_ctx_new(). */
FERRY_API const char *ferry_ctx_errmsg(ferry_ctx *ctx);
/* The message of the most recent failing call made on a handle (a copy owned
 * by the calling thread, valid until its next *_errmsg call; "" when nothing
 * failed or the handle is NULL). Each handle keeps its own, so threads working
 * on different handles never see each other's. A model's failures also show
 * on its store, a store's and a device's on their context. */
FERRY_API const char *ferry_file_errmsg(ferry_file *f);
FERRY_API const char *ferry_device_errmsg(ferry_device *dev);
FERRY_API const char *ferry_store_errmsg(ferry_store *s);
FERRY_API const char *ferry_model_errmsg(ferry_model *m);

/* The smallest `size` any struct of this header accepts (its size field alone). */
#define FERRY_STRUCT_MIN 4u

/* ---- dtypes ------------------------------------------------------------ */

typedef enum ferry_dtype {
    FERRY_DTYPE_INVALID = 0,
    FERRY_DTYPE_BOOL,
    FERRY_DTYPE_U8,
    FERRY_DTYPE_I8,
    FERRY_DTYPE_U16,
    FERRY_DTYPE_I16,
    FERRY_DTYPE_U32,
    FERRY_DTYPE_I32,
    FERRY_DTYPE_U64,
    FERRY_DTYPE_I64,
    FERRY_DTYPE_F16,
    FERRY_DTYPE_BF16,
    FERRY_DTYPE_F32,
    FERRY_DTYPE_F64,
    FERRY_DTYPE_C64,
    FERRY_DTYPE_F8_E4M3,
    FERRY_DTYPE_F8_E5M2,
    FERRY_DTYPE_F8_E4M3FNUZ,
    FERRY_DTYPE_F8_E5M2FNUZ,
    FERRY_DTYPE_F8_E8M0,
    FERRY_DTYPE_F6_E2M3,
    FERRY_DTYPE_F6_E3M2,
    FERRY_DTYPE_F4,
    /* ggml's block-quantized types (GGUF files): elements come in blocks of a
     * fixed byte size along the innermost dimension (ferry_dtype_block) */
    FERRY_DTYPE_Q4_0,
    FERRY_DTYPE_Q4_1,
    FERRY_DTYPE_Q5_0,
    FERRY_DTYPE_Q5_1,
    FERRY_DTYPE_Q8_0,
    FERRY_DTYPE_Q8_1,
    FERRY_DTYPE_Q2_K,
    FERRY_DTYPE_Q3_K,
    FERRY_DTYPE_Q4_K,
    FERRY_DTYPE_Q5_K,
    FERRY_DTYPE_Q6_K,
    FERRY_DTYPE_Q8_K,
    FERRY_DTYPE_IQ2_XXS,
    FERRY_DTYPE_IQ2_XS,
    FERRY_DTYPE_IQ3_XXS,
    FERRY_DTYPE_IQ1_S,
    FERRY_DTYPE_IQ4_NL,
    FERRY_DTYPE_IQ3_S,
    FERRY_DTYPE_IQ2_S,
    FERRY_DTYPE_IQ4_XS,
    FERRY_DTYPE_IQ1_M,
    FERRY_DTYPE_TQ1_0,
    FERRY_DTYPE_TQ2_0,
    FERRY_DTYPE_MXFP4,
    FERRY_DTYPE_NVFP4,
    FERRY_DTYPE_Q1_0,
    FERRY_DTYPE_Q2_0,
    FERRY_DTYPE_COUNT
} ferry_dtype;

/* The dtype's name as safetensors spells it ("BF16"), as ggml does for its
 * block-quantized types ("Q4_K", "IQ2_XXS"), or "INVALID". Thread-safe. */
FERRY_API const char *ferry_dtype_name(ferry_dtype dt);
/* Bits per element (4 for F4, 6 for F6_*); 0 for an invalid dtype and for the
 * block-quantized types, whose elements are not a whole number of bits each
 * (Q4_0: 18 bytes per 32 elements): see ferry_dtype_block(). Thread-safe. */
FERRY_API int ferry_dtype_bits(ferry_dtype dt);
/* The smallest group of elements that fills whole bytes: *block_elems elements
 * take *block_bytes bytes (F32: 1 and 4; F4: 2 and 1; F6_E2M3: 4 and 3; Q4_0:
 * 32 and 18; Q4_K: 256 and 144). A tensor's byte size is nelem / block_elems *
 * block_bytes, and for the block-quantized types each row (the innermost
 * dimension) holds whole blocks. Either pointer may be NULL. Returns 0, or
 * FERRY_E_INVAL for an invalid dtype. Thread-safe. */
FERRY_API int ferry_dtype_block(ferry_dtype dt, int *block_elems, int *block_bytes);

/* ---- files (checkpoints) ----------------------------------------------- */


typedef enum ferry_format {
    FERRY_FORMAT_UNKNOWN = 0,
    FERRY_FORMAT_SAFETENSORS = 1,
    FERRY_FORMAT_SAFETENSORS_INDEX = 2, /* a sharded checkpoint's *.index.json */
    FERRY_FORMAT_GGUF = 3,              /* GGUF v2/v3 (llama.cpp, quantized diffusion models) */
    FERRY_FORMAT_PYTORCH = 4            /* torch.save zip checkpoint (.pt, .pth, .ckpt, .bin) */
} ferry_format;

/* Name of a format ("safetensors", "safetensors-index"). Thread-safe. */
FERRY_API const char *ferry_format_name(ferry_format fmt);

/* Open a checkpoint: a .safetensors file, a GGUF file (versions 2 and 3,
 * little-endian; known by its "GGUF" magic whatever its name; tensors report
 * their shape outermost-first, i.e. GGUF's ne reversed, and ggml's
 * block-quantized types as FERRY_DTYPE_Q4_K etc.), or a sharded checkpoint's
 * *.safetensors.index.json whose weight_map names the shard files (resolved
 * relative to the index's folder). The header is read and validated
 * completely; each file is then mapped MAP_SHARED, PROT_READ. No tensor data is
 * read. flags: 0, or FERRY_OPEN_PRIVATE.
 *
 * A PyTorch checkpoint (torch.save since 1.6: a zip archive, known by its
 * "PK\3\4" magic) is read by a restricted unpickler that runs nothing: besides
 * plain values, only tensors, storages, dtypes and OrderedDict are accepted,
 * and any other global is refused (FERRY_E_UNSUPPORTED, naming it). Nested
 * dicts, lists and tuples name the tensors with dots ("state_dict.layer.0.w",
 * list items by index); other values (epoch, hyper-parameters) are skipped.
 * Each tensor is a view into its storage's zip entry, which must be stored
 * (not compressed); a view that is not row-major keeps its strides and flags
 * FERRY_TENSOR_NONCONTIGUOUS, views of one storage flag
 * FERRY_TENSOR_SHARED_STORAGE.
 *
 * Returns 0 and a handle in *out, or a negative code with a message on ctx:
 * -errno for system errors (-ENOENT, -EACCES, ...), FERRY_E_CORRUPT for a file
 * that breaks the format, FERRY_E_FORMAT for a file that is not safetensors at
 * all (no JSON object after the 8-byte length), FERRY_E_LIMIT for a header over
 * 100 MB or a file past a cap of the context's (ferry_ctx_opts: max_tensors,
 * max_header_bytes), FERRY_E_UNSUPPORTED for legacy (pre-1.6, non-zip) PyTorch files,
 * compressed zip entries, refused pickle globals or opcodes (the message names
 * them), and for GGUF versions other than 2 and 3, big-endian GGUF and ggml
 * types ferry does not know (the message names the version or type number).
 * The handle is immutable: any number of threads may read it at once. It must
 * be closed before ctx is freed. */
FERRY_API int ferry_file_open(ferry_ctx *ctx, const char *path, uint32_t flags, ferry_file **out);
/* ferry_file_open flags */
/* map the files MAP_PRIVATE, PROT_READ | PROT_WRITE: the
 * views of ferry_file_tensor_data may be written, and a write
 * lands in a private copy of the touched page (copy-on-write):
 * the file never changes and other processes never see it.
 * Such a file cannot be page-locked: FERRY_ROUTE_REGISTER and
 * ferry_device_register_file refuse it (FERRY_E_UNSUPPORTED). */
#define FERRY_OPEN_PRIVATE 0x1u
/* Close a file: unmaps it. Every pointer obtained from it becomes invalid.
 * A registration still held on a device (ferry_device_register_file) is
 * dropped first, as ferry_device_unregister_file would. Not while a load
 * reads f, nor while another thread closes a device f is registered on. */
FERRY_API void ferry_file_close(ferry_file *f);

FERRY_API ferry_format ferry_file_format(const ferry_file *f);
/* Number of tensors (>= 0; FERRY_E_INVAL for NULL, as for the counts below). */
FERRY_API int64_t ferry_file_tensor_count(const ferry_file *f);
/* Sum of all tensors' byte sizes. */
FERRY_API uint64_t ferry_file_total_bytes(const ferry_file *f);
/* Number of files behind f (1, or the number of shards). */
FERRY_API int ferry_file_shard_count(const ferry_file *f);
/* Path of shard i as opened, or NULL when i is out of range. Valid while f is open. */
FERRY_API const char *ferry_file_shard_path(const ferry_file *f, int i);

/* Metadata: string -> string pairs (safetensors `__metadata__`, or the index's
 * `metadata`, whose non-string values are given as their JSON text, or GGUF's
 * key/values as text: strings as they are, integers in decimal, booleans as
 * true/false, floats with the fewest digits that read back the same (NaN,
 * Infinity, -Infinity), arrays of up to 16 items as compact JSON, longer ones
 * as "[TYPE x N]", e.g. "[STRING x 151936]" for a vocabulary).
 * Pointers stay valid while f is open. Returns 0, or FERRY_E_INVAL if i is out
 * of range. */
FERRY_API int64_t ferry_file_metadata_count(const ferry_file *f);
FERRY_API int ferry_file_metadata(const ferry_file *f, int64_t i, const char **key, const char **value);

/* How to read metadata value i (ferry_file_metadata_kind). */
typedef enum ferry_meta_kind {
    FERRY_META_TEXT = 0, /* a plain string: safetensors __metadata__ values, index
                            metadata strings, GGUF strings, and the GGUF values JSON
                            cannot hold (NaN, Infinity, -Infinity, a "[TYPE x N]"
                            summary, or an array holding one of those) */
    FERRY_META_JSON = 1, /* valid JSON text (RFC 8259) of a number, boolean, null,
                            array or object: index metadata that is not a string,
                            GGUF integers, finite floats, booleans and shown arrays.
                            Integers keep all their digits, up to UINT64_MAX and
                            INT64_MIN, which some JSON readers cannot hold exactly. */
} ferry_meta_kind;
/* The kind of metadata value i (ferry_file_metadata's value): FERRY_META_TEXT
 * or FERRY_META_JSON, or FERRY_E_INVAL if f is NULL or i is out of range.
 * Kinds may be added: treat any other value as FERRY_META_TEXT. */
FERRY_API int ferry_file_metadata_kind(const ferry_file *f, int64_t i);

typedef struct ferry_tensor_info {
    uint32_t size;    /* sizeof(ferry_tensor_info), set by the caller */
    const char *name; /* NUL-terminated UTF-8, valid while the file is open */
    ferry_dtype dtype;
    int32_t ndim;           /* 0 for a scalar */
    const int64_t *shape;   /* ndim entries, valid while the file is open */
    uint64_t nbytes;        /* byte size of the data */
    uint64_t offset;        /* absolute byte offset of the data in its file */
    int32_t shard;          /* which file holds it (ferry_file_shard_path) */
    const int64_t *strides; /* ndim element strides, or NULL when contiguous (row-major) */
    uint32_t flags;         /* FERRY_TENSOR_* */
} ferry_tensor_info;

/* ferry_tensor_info.flags */
/* strides are not row-major: nbytes spans the elements'
 * extent in the storage, not numel x size */
#define FERRY_TENSOR_NONCONTIGUOUS 0x1u
#define FERRY_TENSOR_SHARED_STORAGE 0x2u /* another tensor views the same storage (PyTorch) */

/* Tensors are numbered 0..count-1 in the order their data lies in the file(s)
 * (shard by shard). Returns 0, or FERRY_E_INVAL when i is out of range. */
FERRY_API int ferry_file_tensor_info(const ferry_file *f, int64_t i, ferry_tensor_info *out);
/* Index of the tensor called name, or FERRY_E_NOTFOUND. O(log n). */
FERRY_API int64_t ferry_file_find(const ferry_file *f, const char *name);
/* Zero-copy view of tensor i's bytes inside the file mapping: *out points at
 * nbytes readable bytes, valid while f is open, writable only when f was opened
 * with FERRY_OPEN_PRIVATE (copy-on-write). Touching
 * them reads the file through the page cache, and raises SIGBUS where the file
 * was cut below them after it was opened (the one read ferry cannot guard:
 * README, "Truncated checkpoints"; ferry_file_tensor_read cannot fault).
 * Returns 0 or FERRY_E_INVAL. */
FERRY_API int ferry_file_tensor_data(const ferry_file *f, int64_t i, const void **out);
/* Copy len bytes of tensor i starting at byte off into buf with pread (no
 * SIGBUS if the file shrank since it was opened). Returns 0, FERRY_E_INVAL for
 * a range outside the tensor, -errno of a failed read, or FERRY_E_CORRUPT when
 * the file ends early. Thread-safe. Errors go to the ctx f was opened with. */
FERRY_API int ferry_file_tensor_read(const ferry_file *f, int64_t i, uint64_t off, void *buf, size_t len);

/* Tensor i's elements in row-major order, as ferry_file_convert writes them.
 * For a contiguous tensor they are its bytes: ferry_file_tensor_gathered_bytes
 * is nbytes and ferry_file_tensor_gather is ferry_file_tensor_read. For a
 * strided PyTorch view (strides set, FERRY_TENSOR_NONCONTIGUOUS), whose nbytes
 * is its span in the storage, they are its numel x element-size bytes
 * gathered from the span (W.t() gives W's elements transposed; a column of
 * 50 floats gives 200 bytes).
 * ferry_file_tensor_gathered_bytes returns that count (>= 0), FERRY_E_INVAL for
 * a bad i, or FERRY_E_UNSUPPORTED for a strided view whose elements are not
 * whole bytes. ferry_file_tensor_gather copies len of those bytes, starting at
 * byte off, into buf, reading with pread like ferry_file_tensor_read (no
 * SIGBUS); a strided view is read through a window of up to 256 MiB of its
 * span at a time. Returns 0, FERRY_E_INVAL for a range outside them,
 * FERRY_E_UNSUPPORTED, -ENOMEM, or ferry_file_tensor_read's errors.
 * Thread-safe; errors go to the ctx f was opened with. */
FERRY_API int64_t ferry_file_tensor_gathered_bytes(const ferry_file *f, int64_t i);
FERRY_API int ferry_file_tensor_gather(const ferry_file *f, int64_t i, uint64_t off, void *buf, size_t len);

/* Parse a byte count: "4096", "16MiB"/"16M" (binary), "1.5GB" (decimal), units
 * case-insensitive. Returns 0, or FERRY_E_INVAL for anything else (negative,
 * garbage, over 2^64-1). Thread-safe. */
FERRY_API int ferry_parse_size(const char *s, uint64_t *out);

/* Write f as a safetensors file at out_path, streaming (one 8 MiB buffer).
 * The data section starts at a multiple of align (a power of two up to 1 MiB;
 * 0 = 8) because the header is padded with spaces, and tensors whose size is a
 * multiple of align come first so that each of them starts aligned too. Strided
 * tensors are written contiguous. f's string metadata becomes __metadata__.
 * The file is written beside out_path and renamed into place once complete and
 * synced: out_path is never left half-written. Errors: FERRY_E_UNSUPPORTED (a
 * dtype safetensors lacks, e.g. GGUF Q4_K), FERRY_E_INVAL, -errno of a failed
 * write (e.g. -ENOSPC). progress as in ferry_file_hash. */
FERRY_API int ferry_file_convert(ferry_ctx *ctx, const ferry_file *f, const char *out_path, uint64_t align,
                                 void (*progress)(void *opaque, uint64_t done, uint64_t total), void *opaque);

/* ferry_file_convert with options. */
typedef struct ferry_convert_opts {
    uint32_t size; /* sizeof(ferry_convert_opts) */
    /* FERRY_DTYPE_INVALID (0): every tensor keeps its dtype and bytes. F16,
     * BF16 or F32: every F16, BF16, F32 and F64 tensor is cast to it (IEEE 754
     * round to nearest, ties to even; a magnitude past the target's largest
     * finite value becomes Inf, one below half its smallest subnormal a signed
     * zero; Inf stays Inf; a NaN stays a NaN of its sign, the top bits of its
     * payload kept and made quiet, as x86's conversion instructions do; note
     * that PyTorch's .to() writes one canonical NaN instead). Integers, BOOL,
     * C64 and the 8-, 6- and 4-bit float types (FP8 weights come with scales
     * a cast would ignore) are copied unchanged. Any other dtype is
     * FERRY_E_INVAL. */
    ferry_dtype dtype;
    uint64_t align; /* as ferry_file_convert's align; 0 = 8 */
} ferry_convert_opts;
/* ferry_file_convert with opts (NULL: all defaults): the same output, errors
 * and guarantees, the tensors cast as opts->dtype says. */
FERRY_API int ferry_file_convert_with(ferry_ctx *ctx, const ferry_file *f, const char *out_path,
                                      const ferry_convert_opts *opts,
                                      void (*progress)(void *opaque, uint64_t done, uint64_t total),
                                      void *opaque);

/* ---- hashing ----------------------------------------------------------- */

/* XXH3-64 (seed 0) of every tensor's bytes, into per_tensor[count] (may be NULL;
 * a strided view's bytes are its elements in row-major order, those of
 * ferry_file_tensor_gather, so it hashes as its ferry_file_convert copy does),
 * and a model hash into *model (may be NULL): XXH3-64 over, for each tensor in
 * name order, its name, NUL, dtype name, NUL, ndim and shape as little-endian
 * int64, and its data hash as little-endian uint64. The model hash therefore
 * depends on the tensors only, not on their layout or sharding.
 * Uses the context's threads (tensors are spread over them), reading with
 * pread rather than through the mapping so that an I/O error or a file
 * truncated under us is an error (-EIO, FERRY_E_CORRUPT), not a SIGBUS.
 * progress, if set, is called from worker threads with the bytes hashed so far
 * and the total; it must be thread-safe and quick.
 * Returns 0, -ENOMEM, -errno of a failed read, or FERRY_E_CORRUPT. */
FERRY_API int ferry_file_hash(ferry_ctx *ctx, const ferry_file *f, uint64_t *per_tensor, uint64_t *model,
                              void (*progress)(void *opaque, uint64_t done, uint64_t total), void *opaque);

/* XXH3-64 (seed 0) of a buffer: the same checksum as `xxhsum -H3`. Thread-safe. */
FERRY_API uint64_t ferry_xxh3(const void *data, size_t len);


/* ---- devices ----------------------------------------------------------- */


/* Open a device: "cpu" (pageable host memory; loads read straight into it,
 * paths ring/auto only), "cuda:N" (the CUDA driver is loaded with dlopen at run time;
 * ferry uses the device's primary context, so it shares memory and streams'
 * device with PyTorch in the same process), or "sim:SIZE" ("sim:24GiB"), a GPU
 * emulated on host memory with that capacity (tests, capacity planning).
 * Errors: FERRY_E_NODEV (no driver, no GPU, no such device: the message says
 * why), FERRY_E_INVAL (bad spec), -ENOMEM. A device may be used from several
 * threads; close it after every load that uses it has returned. */
FERRY_API int ferry_device_open(ferry_ctx *ctx, const char *spec, ferry_device **out);
FERRY_API void ferry_device_close(ferry_device *dev);
/* "NVIDIA H200 (cuda:0, 139.8 GiB)". Valid while dev is open. */
FERRY_API const char *ferry_device_desc(const ferry_device *dev);
FERRY_API int ferry_device_mem_info(ferry_device *dev, uint64_t *free_bytes, uint64_t *total_bytes);

/* ---- loading ------------------------------------------------------------ */

/* How a load's bytes travel from the file to the device. */
typedef enum ferry_route {
    FERRY_ROUTE_AUTO = 0, /* choose: register if registered, ring if mostly cached (pageable for
                             a small one while no ring is pinned), else direct.
                             It never registers a file itself: a registered mapping is read by
                             the device, where a truncation is not an error ferry can give
                             (README, "Truncated checkpoints"), so that is the caller's choice */
    FERRY_ROUTE_RING,     /* threaded pread into a ring of pinned buffers, async copies (a file
                             in tmpfs/ramfs: copied out of a mapping, FERRY_LOAD_PREAD) */
    FERRY_ROUTE_DIRECT,   /* the same ring filled with O_DIRECT reads (cold files) */
    FERRY_ROUTE_REGISTER, /* page-lock the read-only file mapping, copy from it directly
                             (registered shard by shard while the registered ones are copied,
                             unregistered after the load unless registered already or kept:
                             FERRY_LOAD_KEEP_REGISTRATION) */
    FERRY_ROUTE_CUFILE,   /* reserved, not a route: a load or ferry_device_prepare asking for it
                             fails with FERRY_E_UNSUPPORTED and auto never takes it. GPUDirect
                             Storage is a probe (ferry_device_probe_cufile) */
    FERRY_ROUTE_PAGEABLE, /* copy straight from the file mapping, unpinned: the driver stages
                             the bytes through its own pinned buffers (8.1 GB/s on the H200, a
                             sixth of the ring) but nothing is pinned first. auto takes it for a
                             cached load of at most FERRY_PAGEABLE_MAX bytes while the device
                             has no ring pinned: pinning one for a 26 MB file cost 5-6 ms, more
                             than its whole pageable copy (3.5-5 ms; first loads of
                             `ferry load` with auto against --path ring on an H200,
                             bench/RESULTS.md) */
    FERRY_ROUTE_COUNT
} ferry_route;

/* auto's limit for FERRY_ROUTE_PAGEABLE, in bytes (32 MiB) */
#define FERRY_PAGEABLE_MAX (32ull << 20)

/* "auto", "ring", "direct", "register", "cufile", "pageable"; and back (-1 if unknown). */
FERRY_API const char *ferry_route_name(ferry_route p);
FERRY_API int ferry_route_parse(const char *name);

typedef struct ferry_load_opts {
    uint32_t size;              /* sizeof(ferry_load_opts) */
    ferry_route route;          /* how the bytes travel; FERRY_ROUTE_AUTO by default */
    uint32_t threads;           /* reader threads; 0 = default (min(12, CPUs); DIRECT: min(8, CPUs)) */
    uint32_t streams;           /* copy streams; 0 = default (4), at least 2 are used */
    uint32_t ring_buffers;      /* pinned staging buffers; 0 = default (2 x threads) */
    uint64_t ring_buffer_bytes; /* bytes per staging buffer; 0 = default (4 MiB; DIRECT: 1 MiB
                                   reads, into the device's ring when one at least that large
                                   is pinned and neither ring option is set) */
    uint64_t pinned_budget;     /* most bytes one REGISTER load may page-lock; 0 = no limit */
    /* progress(opaque, bytes done, bytes total), from worker threads, one call
     * at a time, done never decreasing and ending at total */
    void (*progress)(void *opaque, uint64_t done, uint64_t total);
    void *opaque;
    uint32_t flags; /* FERRY_LOAD_* below; 0 by default */
} ferry_load_opts;

/* ferry_load_opts.flags */
enum ferry_load_flag {
    /* A REGISTER load that succeeds keeps the registration it made, as
     * ferry_device_register_file would have (held until
     * ferry_device_unregister_file, ferry_file_close or ferry_device_close),
     * so the file's later loads on this device (auto included) reuse it at no
     * registration cost. The pages stay locked meanwhile: pinned_budget is
     * checked as for any REGISTER load, and the caller decides how many files
     * it keeps registered at once. A load that fails keeps nothing. Ignored
     * by the other routes. */
    FERRY_LOAD_KEEP_REGISTRATION = 1u << 0,
    /* RING: read a checkpoint in tmpfs or ramfs with pread like any other.
     * Without it the ring copies such a file out of a mapping of the load's
     * own (on the H200: 45 GB/s from a fresh /dev/shm copy, against 22-24
     * for a first pread pass), unmapped after the load on a thread of its
     * own, in 64 MiB pieces so the process's own mmap calls do not wait for
     * all of it. A caller that cannot afford a truncation during a copy
     * faulting (README, "Truncated checkpoints") asks for pread. */
    FERRY_LOAD_PREAD = 1u << 1
    /* 1u << 2 is reserved: ignored when set, and never to be given a
     * meaning (programs built against 0.x headers may set it) */
};

/* How a REGISTER load came by its registration (ferry_load_stats.registration). */
typedef enum ferry_registration {
    FERRY_REGISTRATION_NONE = 0, /* not a REGISTER load */
    FERRY_REGISTRATION_NEW,      /* this load page-locked (some of) the file */
    FERRY_REGISTRATION_REUSED    /* all of it was registered already (ferry_device_register_file,
                                    FERRY_LOAD_KEEP_REGISTRATION, or a load running alongside) */
} ferry_registration;

typedef struct ferry_load_stats {
    uint32_t size;                   /* sizeof(ferry_load_stats), set by the caller */
    ferry_route route;               /* the route actually taken */
    uint64_t bytes;                  /* tensor bytes moved */
    double seconds;                  /* wall time of the call (ferry_load: its device allocation included) */
    double resident;                 /* fraction of the data in the page cache before the load,
                                        estimated from 64 runs of 64 pages spread over the files (measured
                                        for FERRY_ROUTE_AUTO only; -1 otherwise; see
                                        ferry_file_resident for an exact count) */
    const char *why;                 /* why that path (auto's reasoning, or "asked for"): static
                                        text, valid for the life of the library */
    ferry_registration registration; /* REGISTER loads: registered now or reused */
    double register_seconds;         /* REGISTER loads: time spent page-locking the mapping's pieces
                                        (part of seconds; the copies queued before a piece run while
                                        it registers); 0 when reused */
    /* Where a load's time goes before its first read (all part of seconds):
     * setup_seconds from the call to the first batch handed to the readers
     * (ferry_load's device allocation, the path choice, the plan, streams,
     * the ring); alloc_seconds of it the device memory ferry_load allocates
     * (0 for ferry_load_into: the caller's); pin_seconds the ring's pinning
     * (0 when the ring of an earlier load was reused, and for REGISTER and
     * PAGEABLE). ferry_load pins a ring it needs while it allocates, on a
     * helper thread: its pin_seconds then overlap alloc_seconds. */
    double setup_seconds;
    double alloc_seconds;
    double pin_seconds;
} ferry_load_stats;

typedef struct ferry_loaded ferry_loaded;

/* Pin now the staging ring that a load of `bytes` with opts (NULL: defaults)
 * would pin, unless one that serves it is pinned already. For a caller that
 * knows a load is coming and has work of its own before it (allocating the
 * destinations): called on another thread, the pinning (~5 ms for the
 * default ring on the H200) overlaps that work, and a load that starts meanwhile waits for it.
 * The ring is the device's, kept for its later loads (ferry_load). Nothing to
 * do for the register and pageable routes and the cpu device. Note
 * that auto takes FERRY_ROUTE_PAGEABLE only while no ring is pinned: a small
 * load (<= FERRY_PAGEABLE_MAX) gains nothing from this (ferry_load_plan_route
 * says whether a load would pin). 0 or an error (-ENOMEM and the CUDA error
 * when pinning fails; FERRY_E_UNSUPPORTED for FERRY_ROUTE_CUFILE). */
FERRY_API int ferry_device_prepare(ferry_device *dev, const ferry_load_opts *opts, uint64_t bytes);

/* What a load would do: the route, the readers and staging ring it would use
 * and whether it would pin that ring first, as ferry_load, ferry_load_into
 * and ferry_device_prepare decide it (one function decides for all three). */
typedef struct ferry_route_choice {
    uint32_t size;         /* sizeof(ferry_route_choice), set by the caller */
    ferry_route route;     /* the route a load would take now (never AUTO or CUFILE) */
    uint32_t threads;      /* reader threads (at most: a load starts no more than it has batches) */
    uint32_t buffers;      /* staging buffers its reads use (0: the route reads into no ring) */
    uint64_t buffer_bytes; /* bytes per staging buffer (0: no ring) */
    int32_t pins;          /* 1: no ring pinned on the device serves it, so the load (or
                              ferry_device_prepare) pins one first; 0 otherwise */
    double resident;       /* auto with a file: the sampled page-cache fraction it went by;
                              -1 otherwise */
    const char *why;       /* why that route: static text, valid for the life of the library */
} ferry_route_choice;

/* Decide, without loading, how a load of `bytes` of f (0: all of f's tensor
 * bytes) with opts (NULL: defaults) on dev would travel, into *out. f may be
 * NULL: auto then cannot look at the file and answers what
 * ferry_device_prepare would pin for it (the ring's geometry). The device's
 * state (a ring pinned, files registered) and the page cache may change
 * before the load, which decides again. Errors: FERRY_E_INVAL (bad
 * arguments or options), FERRY_E_UNSUPPORTED (FERRY_ROUTE_CUFILE, or a route
 * the cpu device cannot take), FERRY_E_LIMIT (a ring over ferry's limits);
 * the message is on dev. */
FERRY_API int ferry_load_plan_route(ferry_device *dev, const ferry_file *f, const ferry_load_opts *opts,
                                    uint64_t bytes, ferry_route_choice *out);

/* Whether GPUDirect Storage (cuFile) could read f (NULL: whether its driver
 * opens at all) for dev: 0 when it could, FERRY_E_NODEV when not, with the
 * reason in why (len bytes, NUL-terminated; why may be NULL). A probe only:
 * ferry has no cuFile route (FERRY_ROUTE_CUFILE is reserved). Loads
 * libcufile with dlopen on first use. */
FERRY_API int ferry_device_probe_cufile(ferry_device *dev, const ferry_file *f, char *why, size_t len);

/* Load every tensor of f into device memory that ferry allocates (one block per
 * shard, tensors laid out as in the file). The call returns when all copies are
 * complete. *out owns the memory until ferry_loaded_free(); dev and f must stay
 * open until then. stats may be NULL. Errors: any of ferry_load_into's;
 * -ENOMEM when the device lacks room (nothing stays allocated). */
FERRY_API int ferry_load(ferry_device *dev, const ferry_file *f, const ferry_load_opts *opts,
                         ferry_loaded **out, ferry_load_stats *stats);
/* Device address of tensor i (0 when out of range). */
FERRY_API uint64_t ferry_loaded_ptr(const ferry_loaded *l, int64_t i);
/* Copy tensor i back from the device into buf (its nbytes). Synchronous. */
FERRY_API int ferry_loaded_read(ferry_loaded *l, int64_t i, void *buf);
FERRY_API void ferry_loaded_free(ferry_loaded *l);

/* Fill caller-owned device memory: tensor idx[k] of f goes to dptrs[k] (each
 * at least that tensor's nbytes, e.g. allocated by PyTorch), k < n. Returns when
 * the copies are complete. Errors: FERRY_E_INVAL, FERRY_E_DEVICE, -errno of a failed read,
 * FERRY_E_CORRUPT for a file that ended early (cut after it was opened: the
 * message names the file and a tensor; every route, register included, says
 * so rather than fault, see README "Truncated checkpoints"); on failure the
 * destination contents are unspecified and nothing stays registered or
 * allocated; FERRY_E_UNSUPPORTED for a route the device cannot take (cpu:
 * direct/register/pageable; FERRY_ROUTE_CUFILE on any device). Thread-safe for
 * distinct destinations. */
FERRY_API int ferry_load_into(ferry_device *dev, const ferry_file *f, const int64_t *idx,
                              const uint64_t *dptrs, int64_t n, const ferry_load_opts *opts,
                              ferry_load_stats *stats);

/* Page-lock f's read-only mappings for dev (cuMemHostRegister READ_ONLY: a
 * host-memory registration with the CUDA driver, unrelated to cuFile) so
 * that loads with FERRY_ROUTE_REGISTER (and auto) copy from the page cache with
 * no CPU copy and no registration cost. Registered pages cannot be reclaimed:
 * they count against pinned_budget (this file alone; 0 = no limit;
 * FERRY_E_BUDGET if over). A file that shrank since it was opened is refused
 * (FERRY_E_CORRUPT); rewrite checkpoints by rename, never in place, while
 * they are registered (README, "Truncated checkpoints").
 * ferry_device_unregister_file, ferry_file_close(f) or ferry_device_close()
 * (whichever comes first) unregisters it, as it does a registration kept by a
 * load with FERRY_LOAD_KEEP_REGISTRATION. */
FERRY_API int ferry_device_register_file(ferry_device *dev, const ferry_file *f, uint64_t pinned_budget);
FERRY_API void ferry_device_unregister_file(ferry_device *dev, const ferry_file *f);

/* The device's copy limits: bytes moved host->device and back through pinned
 * memory (a 256 MiB buffer, or half of bytes where that is less, repeated),
 * on 2 streams. Either rate may be NULL (that direction is not measured).
 * Allocates and frees its buffers. */
FERRY_API int ferry_device_copy_rate(ferry_device *dev, uint64_t bytes, double *htod_gbps, double *dtoh_gbps);

/* Fraction (0..1) of f's files now in the page cache (mincore), or -1 when it
 * cannot be measured (no memory for the page vector). */
FERRY_API double ferry_file_resident(const ferry_file *f);

/* ---- residency store ------------------------------------------------------
 * Keeps several models in play across the tiers of one device under budgets.
 * A model is a group of tensors (every tensor of one or more checkpoints).
 * Each tensor's bytes live in one tier at a time:
 *   DEVICE  device memory (its source or saved copy may also remain)
 *   PINNED  page-locked host RAM (a dirty tensor evicted from the device)
 *   HOST    pageable host RAM (the same, when the pinned budget is spent)
 *   SOURCE  only in the checkpoint (a clean tensor not on the device)
 *   SPILL   in the store's unnamed spill file (a dirty tensor, host RAM short)
 * Clean tensors leaving the device are dropped (nothing is written); dirty ones
 * go to PINNED/HOST while the host budget and the host's real free memory
 * allow, else to the spill file. Every call is thread-safe (one lock per store;
 * moves to the device drop it during their transfers, the saves of evicted
 * tensors run under it). A model's tensors are numbered file by file, each
 * file in its own order (ferry_file_tensor_info). */


typedef enum ferry_tier {
    FERRY_TIER_DEVICE = 0,
    FERRY_TIER_PINNED,
    FERRY_TIER_HOST,
    FERRY_TIER_SOURCE,
    FERRY_TIER_SPILL,
    FERRY_TIER_COUNT
} ferry_tier;

/* "device", "pinned", "host", "source", "spill". Thread-safe. */
FERRY_API const char *ferry_tier_name(ferry_tier t);

typedef struct ferry_store_opts {
    uint32_t size;               /* sizeof(ferry_store_opts) */
    uint64_t device_budget;      /* device bytes the store may hold; 0 = the device's free
                                    memory when the store is made, minus device_reserve */
    uint64_t device_reserve;     /* 0 = 512 MiB */
    uint64_t host_budget;        /* host RAM (pinned + pageable) for dirty tensors; 0 = what the
                                    system allows now (the cgroup's limit when the process is in
                                    a limited cgroup v2, else MemAvailable) minus host_reserve */
    uint64_t pinned_budget;      /* the pinned part of host_budget; 0 = a quarter of it */
    uint64_t host_reserve;       /* 0 = 1 GiB */
    uint64_t spill_below;        /* dirty evictions spill to disk while the host's available
                                    memory is below this (0 = 2 x host_reserve) ... */
    uint64_t spill_above;        /* ... and go back to RAM once it is above this again
                                    (hysteresis; 0 = spill_below + 1 GiB) */
    const char *spill_dir;       /* where the unnamed spill file lives (NULL: /var/tmp; the CLI
                                    and the binding pass $FERRY_SPILL_DIR); tmpfs and ramfs are
                                    refused. Copied: need not outlive the call */
    const ferry_load_opts *load; /* ring geometry for every move (NULL = defaults); copied */
    uint64_t pinned_reserve;     /* pin this much of the pool ahead, on a thread of the store's own
                                    that starts in ferry_store_new (capped at pinned_budget; 0 =
                                    none: the pool is pinned as evictions need it). Pinning runs at
                                    about 7 GB/s, so a first dirty eviction into a pool pinned on
                                    demand runs at that rate, not the copy's; pinned ahead, it runs
                                    at the copy's. It pins 256 MiB pieces between the store's
                                    transfers (an eviction that needs a piece meanwhile waits for
                                    the next; a tensor larger than a piece is pinned on demand).
                                    The reserved part stays pinned while the store lives
                                    (make_room does not unpin it) */
} ferry_store_opts;

/* Make a store on dev (which must outlive it). The spill file is created only
 * when the first spill happens. Errors: FERRY_E_INVAL, -ENOMEM, the device's. */
FERRY_API int ferry_store_new(ferry_device *dev, const ferry_store_opts *opts, ferry_store **out);
/* Free every byte the store holds (device, pinned, host); the spill file
 * vanishes. Files added must be closed after this. */
FERRY_API void ferry_store_free(ferry_store *s);

/* Add a model called name (unique) holding every tensor of files[0..nfiles-1],
 * all starting in SOURCE (clean). Tensors of one module (names equal up to the
 * last '.') form a group that always moves together, like a quantized weight
 * and its scales; ferry_model_group() adds groups. Higher priority models are
 * evicted later. The files must stay open while the model exists. */
FERRY_API int ferry_store_add(ferry_store *s, const char *name, ferry_file *const *files, int nfiles,
                              int priority, ferry_model **out);
/* Remove a model: frees whatever it holds, and m itself. FERRY_E_BUSY (nothing
 * changes) while a tensor is held, a queued move was not waited for, or a
 * reference from ferry_store_find has not been put back. The pointer from
 * ferry_store_add is the adder's: only one thread removes a model, once; a
 * thread that found it must not remove it. Threads that use a model they did
 * not add get it from ferry_store_find, so a remove cannot free it under
 * them. */
FERRY_API int ferry_store_remove(ferry_model *m);
/* The model called name, or NULL. Takes a reference: m stays valid (and
 * ferry_store_remove(m) fails with FERRY_E_BUSY) until the caller gives it back
 * with ferry_model_put(m), once per successful find. ferry_store_free frees
 * every model, referenced or not. Thread-safe. */
FERRY_API ferry_model *ferry_store_find(ferry_store *s, const char *name);
/* Give back a reference taken by ferry_store_find; m may be removed (and
 * freed) by its owner as soon as this returns, so do not use it after.
 * NULL: nothing. Thread-safe. */
FERRY_API void ferry_model_put(ferry_model *m);

FERRY_API const char *ferry_model_name(const ferry_model *m);
FERRY_API int64_t ferry_model_tensor_count(const ferry_model *m);
/* Index of the tensor called name, or FERRY_E_NOTFOUND (the first file that has it). */
FERRY_API int64_t ferry_model_find(const ferry_model *m, const char *name);
/* Join tensors[0..n-1] (and the groups they are in) into one group. */
FERRY_API int ferry_model_group(ferry_model *m, const int64_t *tensors, int64_t n);
FERRY_API int ferry_model_set_priority(ferry_model *m, int priority);
/* on = 1: from now on, every clean tensor of m read from its checkpoint keeps
 * a copy in the pinned pool beside its device copy, as room allows (within
 * pinned_budget and host_budget, and above the host's spill_below), so once
 * m leaves the device, bringing it back costs one DMA from pinned RAM (a
 * model swap) instead of a read of the checkpoint. The copies are clean:
 * they give way, first, to dirty tensors' saves when the host is short, and
 * mark_dirty/write drop a tensor's. on = 0: no new copies, and the copies m
 * has (not of a tensor being moved) go now. Streamed blocks of a plan follow
 * the plan's pinned_cache instead. */
FERRY_API int ferry_model_set_pinned_cache(ferry_model *m, int on);

/* Bring tensors[0..n-1] (tensors NULL: all) and their groups to the device,
 * first making room by evicting others as the policy decides (least recently
 * used, lowest priority first, never a held tensor, never one of these).
 * Marks the model used now. When even evicting everything allowed cannot make
 * room: FERRY_E_BUDGET, with the bytes needed and the bytes that could be
 * freed in the message, and nothing evicted or moved. */
FERRY_API int ferry_model_to_device(ferry_model *m, const int64_t *tensors, int64_t n);
/* Queued moves. ferry_model_to_device_async does what ferry_model_to_device
 * does (room first, by the same policy, then the moves), but returns once the
 * moves are queued: copies from pinned RAM run on ferry's copy stream while
 * the caller goes on; moves that read files (the checkpoint, the spill file)
 * are read by the store's mover thread, one move after another in the order
 * queued (ferry_model_to_device reads in the call). The store's lock is not held across any
 * transfer, so other threads may prefetch, release or evict meanwhile. Until
 * the op has landed its tensors keep their old copies and cannot be evicted,
 * read or written; a later call that needs them lands the op first.
 * *op (on success) must be given to ferry_op_wait exactly once, before the
 * store is freed. Errors of the queueing itself as for ferry_model_to_device
 * (nothing moved, *op NULL); errors of the copies come from ferry_op_wait,
 * which then leaves every tensor where it was. Thread-safe. */
typedef struct ferry_op ferry_op;
FERRY_API int ferry_model_to_device_async(ferry_model *m, const int64_t *tensors, int64_t n, ferry_op **op);
/* Wait on the host until the op's moves have landed, then free it: 0, or the
 * first error of its copies (the message on its model). NULL: FERRY_E_INVAL. */
FERRY_API int ferry_op_wait(ferry_op *op);
/* 1 when the op's copies are done (ferry_op_wait will not block), 0 if not yet,
 * < 0 on failure. Does not block. */
FERRY_API int ferry_op_query(ferry_op *op);
/* Order a CUDA stream of the caller's (a CUstream as an integer, e.g.
 * torch.cuda.current_stream().cuda_stream; 0 the legacy default stream)
 * after the op's copies, without a host sync for the copies: kernels queued on
 * it afterwards read the landed bytes. While the op's file reads still run on
 * the mover (and so the reads of every move queued before it), or another
 * thread is landing it, the call waits on the host for them first. The device
 * addresses are ferry_model_tensor_state's dptr once the call that queued the
 * op returned. ferry_op_wait is still owed.
 * On a sim device the stream is a sim stream, 0 the caller's thread (waits). */
FERRY_API int ferry_op_stream_wait(ferry_op *op, uint64_t cu_stream);
/* Release a hold (ferry_model_hold) of tensor t (t < 0: all) once the work
 * already queued on cu_stream has run: until an event recorded there now has
 * completed, the tensor's device memory is not written, read back or given
 * to the driver. The host does not wait; the store drops such holds as their
 * events complete. When it needs the room before then, a clean tensor's hold
 * (every tensor of its group clean) drops at once and the store's copies into
 * its memory are ordered after the event on the device (copies from pinned or
 * pageable RAM) or after the host waited for it (file reads, read-backs,
 * memory going back to the driver); a dirty group's hold waits for its event.
 * (So ferry_model_tensor_state's holds may count it released before the
 * stream ran.) FERRY_E_INVAL for a tensor not held. */
FERRY_API int ferry_model_release_after(ferry_model *m, int64_t t, uint64_t cu_stream);

/* ---- streaming a model larger than its budget ----
 * A model whose weights do not fit runs block by block (the repeated
 * transformer blocks of a DiT): a plan splits its blocks into a stable
 * resident set, which stays on the device from pass to pass, and streamed
 * blocks, which pass through a window of device memory while other blocks
 * compute. The eviction order then is: models by (priority, last use) as
 * always; within the model being used, its streamed blocks first (least
 * recently used first), its resident blocks and the tensors outside blocks
 * only when the budget itself no longer holds them (a room request waits for
 * pending releases of streamed blocks before it takes a resident one). So a
 * cyclic pass over the blocks never thrashes: each pass moves exactly the
 * streamed blocks. Clean copies of streamed blocks stay in the pinned pool
 * (within pinned_budget, host_budget and the host's available memory) so that
 * a pass after the first costs only DMA; without room there they stream from
 * the checkpoint through the ring every pass. Dirty blocks are saved as
 * ferry_model_evict saves them and stream from wherever that put them.
 * Pinned cache copies give way to dirty tensors' saves when the host budget
 * is short. */
typedef struct ferry_plan_opts {
    uint32_t size;         /* sizeof(ferry_plan_opts) */
    const int64_t *blocks; /* one tensor of each block, in the order a pass runs them; a
                              block is that tensor's group (ferry_model_group), and no two
                              blocks may share one. Copied */
    int64_t nblocks;
    int64_t window;   /* blocks the window holds: the one computing and those in flight
                         (0 = 3) */
    uint64_t budget;  /* device bytes this model may plan for; 0 = the store's device
                         budget, re-planned whenever ferry_store_set_device_budget
                         changes it */
    uint64_t reserve; /* of them, left free for the caller (activations) */
    int pinned_cache; /* 0 = keep streamed blocks' clean copies in pinned RAM as room
                         allows; -1 = never */
    int64_t dry_run;  /* 1 = only say what this plan would be (out): nothing is marked
                         and the model keeps the plan it had (choosing a window). 64 bits:
                         the struct grows, so a caller built before it (size 56, padding
                         where an int would go) never asks for one */
} ferry_plan_opts;

typedef struct ferry_plan {
    uint32_t size;           /* sizeof(ferry_plan), set by the caller */
    int64_t blocks;          /* blocks planned */
    int64_t resident_blocks; /* of which stay on the device */
    int64_t streamed_blocks; /* of which stream every pass */
    uint64_t fixed_bytes;    /* the model's tensors outside every block (stay resident) */
    uint64_t resident_bytes; /* fixed_bytes + the resident blocks' */
    uint64_t window_bytes;   /* device memory the window needs (its largest streamed blocks) */
    uint64_t streamed_bytes; /* bytes moved to the device per pass */
    uint64_t budget;         /* the device bytes planned for (budget - reserve) */
    int64_t window;          /* blocks the window holds: the one asked for, or fewer when the
                                budget holds no more beside the tensors outside the blocks */
    uint64_t minimum_bytes;  /* the least budget that streams at all: the tensors outside the
                                blocks + the largest block + the reserve */
} ferry_plan;

/* Plan how model m runs pass after pass within its budget: chooses the
 * resident blocks (as many as the budget holds beside the fixed tensors and
 * the window; the streamed ones spread evenly over the pass so their copies
 * overlap the resident blocks' compute) and marks them. Nothing moves now:
 * moves and evictions follow the plan from the next call on. A model that
 * fits is planned with every block resident. A window that does not fit
 * beside the fixed tensors shrinks (out->window says to what), down to one
 * block. FERRY_E_BUDGET when even the fixed tensors, the largest block and the
 * reserve do not fit (the message names that minimum and the budget);
 * FERRY_E_INVAL for a bad block list. A new plan replaces the old one;
 * nblocks 0 removes it. out may be NULL. */
FERRY_API int ferry_model_plan(ferry_model *m, const ferry_plan_opts *o, ferry_plan *out);
/* The model's current plan (after any re-plan); FERRY_E_NOTFOUND without one. */
FERRY_API int ferry_model_get_plan(ferry_model *m, ferry_plan *out);
/* 1 when block k (0 .. nblocks-1, as planned) streams, 0 when it stays resident, < 0 on error. */
FERRY_API int ferry_model_block_streams(ferry_model *m, int64_t k);
/* Change the store's device budget at run time (another model arrived,
 * activations need room, or room came back): models planned against the
 * store's budget are re-planned, and when the store now holds more than the
 * budget the excess is evicted at once by the order above (nothing dirty is
 * lost), and then more, until the device memory the store holds (its
 * tensors and the free pieces of its segments) is at most 1/16 past the
 * budget or nothing more can go. The new budget stands even when that
 * eviction fails (held tensors: FERRY_E_BUDGET; the rest leaves as soon as
 * it can). */
FERRY_API int ferry_store_set_device_budget(ferry_store *s, uint64_t bytes);

/* ---- the streaming engine: one pass after another over a model's blocks ----
 * The caller runs the blocks (a framework's hooks, a C engine's loop) and
 * says when each runs; the engine owns the rest of the pass: the plan
 * (ferry_model_plan: resident set and window), the moves queued ahead
 * (prefetch), ordering the caller's stream after each move
 * (ferry_op_stream_wait: no host sync), releasing each block after that
 * stream ran (ferry_model_release_after), retries, and statistics.
 *
 *   ferry_streamer_pass_begin(st, S);          the tensors outside the blocks
 *   for each block k the pass runs:              come to the device and are held
 *       ferry_streamer_block_begin(st, k, S);   k is on the device, S ordered after
 *       ... kernels of block k on stream S ...  its copy; ferry_model_device_addrs
 *       ferry_streamer_block_end(st, k, S);     gives its addresses
 *   ferry_streamer_pass_end(st, S);
 *
 * S is a CUstream as an integer (0: the legacy default stream; on a sim
 * device the caller's thread). The first pass learns the order the blocks
 * really run in and plans with it after.
 *
 * A pass never fails for room while the minimum fits (the tensors outside the
 * blocks + the largest block + the reserve): when a move fails for room
 * (another model took it, the allocator is fragmented, the device is short),
 * the engine cancels the moves queued ahead, then plans a smaller window,
 * then a smaller resident set (releasing its blocks), makes room and tries
 * again; below the minimum it fails with FERRY_E_BUDGET naming the minimum
 * and the budget. Shrinking is counted in the statistics, and the plan grows
 * back once passes have run without it (after 2 passes, then 4, 8, ... up to
 * 64 while it keeps shrinking again).
 *
 * Not thread-safe per streamer: one thread (or the caller's lock) drives a
 * pass. The model must outlive the streamer. */
typedef struct ferry_streamer ferry_streamer;

/* Where streamed blocks come from after the first pass. */
typedef enum ferry_stream_copies {
    FERRY_STREAM_COPIES_AUTO = 0,   /* pinned copies when every streamed block's copy fits the store's
                                       pinned budget, host budget and the host's available memory
                                       (less the spill threshold); else the checkpoint through the
                                       ring. Decided at each plan */
    FERRY_STREAM_COPIES_PINNED = 1, /* pinned copies for as many blocks as those budgets hold */
    FERRY_STREAM_COPIES_RING = 2,   /* none: every pass reads the checkpoint through the pinned ring
                                       (host memory: the ring alone) */
} ferry_stream_copies;

typedef struct ferry_streamer_opts {
    uint32_t size;         /* sizeof(ferry_streamer_opts) */
    const int64_t *blocks; /* one tensor of each block (the block is that tensor's group:
                              ferry_model_group), in the order the caller expects them to run;
                              block k below is blocks[k]. Copied */
    int64_t nblocks;
    int64_t prefetch; /* moves queued ahead of the block computing (the window holds
                         prefetch + 1 blocks); 0 = 2; -1 = none (each block is moved
                         when it is about to run) */
    uint64_t budget;  /* device bytes to plan for; 0 = the store's device budget */
    uint64_t reserve; /* of them, left free for the caller (activations) */
    int copies;       /* ferry_stream_copies */
    /* The tensors outside the blocks that each pass brings to the device and
     * holds (a module's own, where its checkpoint has more: a tokenizer, an
     * unused head); the plan counts them and no other tensor outside the
     * blocks. NULL: every tensor outside the blocks. Copied; each must be in
     * range and outside every block (FERRY_E_INVAL). */
    const int64_t *fixed;
    int64_t nfixed;
} ferry_streamer_opts;

typedef struct ferry_streamer_stats {
    uint32_t size;           /* sizeof(ferry_streamer_stats), set by the caller */
    int64_t passes;          /* passes ended */
    int64_t blocks;          /* blocks of the model */
    int64_t resident_blocks; /* of which the plan keeps on the device now */
    int64_t streamed_blocks; /* of which stream every pass */
    int64_t prefetch;        /* moves queued ahead now (after shrinking) */
    int64_t prefetch_asked;  /* what the options asked for */
    uint64_t budget;         /* device bytes planned for now (after shrinking) */
    uint64_t budget_asked;   /* what the options or ferry_streamer_set_budget asked for */
    uint64_t minimum_bytes;  /* fixed + largest block + reserve: below it no pass runs */
    uint64_t fixed_bytes, resident_bytes, window_bytes, streamed_bytes; /* as ferry_plan */
    int pinned_copies;         /* 1 when streamed blocks keep pinned copies (see copies) */
    uint64_t pass_htod;        /* bytes moved to the device by the last pass */
    uint64_t pass_read;        /* of them, read from checkpoints and the spill file */
    double pass_seconds;       /* host time from the last pass_begin to its pass_end */
    uint64_t shrinks;          /* times a failed move shrank the window or the resident set */
    uint64_t grows;            /* times the plan grew back to what was asked */
    uint64_t retries;          /* moves tried again after a failure for room */
    uint64_t prefetch_skipped; /* moves ahead not queued for want of room (queued later, when
                                  their block runs) */
} ferry_streamer_stats;

/* Make a streamer for model m and plan it (nothing moves yet). Groups each
 * block's tensors are not made here: the blocks must be groups already
 * (ferry_model_group). FERRY_E_INVAL for a bad block list; FERRY_E_BUDGET when
 * the minimum does not fit the budget (the message names both). *out is freed
 * with ferry_streamer_free. */
FERRY_API int ferry_streamer_new(ferry_model *m, const ferry_streamer_opts *o, ferry_streamer **out);
/* Land every queued move, drop every hold the streamer took and remove the
 * model's plan. NULL: nothing. */
FERRY_API void ferry_streamer_free(ferry_streamer *st);
/* A pass starts: the tensors outside the blocks come to the device and are
 * held until pass_end; after the first pass the resident blocks are held too
 * and the first moves of the pass are queued. A pass not ended is ended
 * first (its holds dropped at once: call it only after the stream ran). */
FERRY_API int ferry_streamer_pass_begin(ferry_streamer *st, uint64_t cu_stream);
/* Block k is about to run on cu_stream: its move is queued (unless a
 * prefetch queued it), it is held, and cu_stream is ordered after the move.
 * On return ferry_model_device_addrs gives its tensors' addresses. */
FERRY_API int ferry_streamer_block_begin(ferry_streamer *st, int64_t k, uint64_t cu_stream);
/* Block k's kernels are queued on cu_stream: it is released after them and
 * the next blocks of the pass (cyclically) are queued ahead. */
FERRY_API int ferry_streamer_block_end(ferry_streamer *st, int64_t k, uint64_t cu_stream);
/* The pass's kernels are queued on cu_stream: the tensors outside the blocks
 * and the resident blocks are released after them; after the first pass the
 * plan is made again with the order the blocks ran in. */
FERRY_API int ferry_streamer_pass_end(ferry_streamer *st, uint64_t cu_stream);
/* Land every move queued ahead and drop its hold (before the caller moves,
 * evicts or removes the model); blocks between block_begin and block_end
 * keep theirs. */
FERRY_API int ferry_streamer_drain(ferry_streamer *st);
/* Plan for budget device bytes with reserve of them left free (budget 0: the
 * store's device budget), e.g. once the caller measured what its own
 * allocations need. Takes effect now when no pass runs, else at the next
 * pass_begin. FERRY_E_BUDGET (nothing changes) below the minimum. */
FERRY_API int ferry_streamer_set_budget(ferry_streamer *st, uint64_t budget, uint64_t reserve);
/* Block k's place in the pass as learned (0 = runs first), or FERRY_E_INVAL. */
FERRY_API int64_t ferry_streamer_block_position(ferry_streamer *st, int64_t k);
/* 1 when block k streams under the current plan, 0 when it stays resident. */
FERRY_API int ferry_streamer_block_streams(ferry_streamer *st, int64_t k);
FERRY_API int ferry_streamer_get_stats(ferry_streamer *st, ferry_streamer_stats *out);

/* Take tensors[0..n-1] (NULL: all) and their groups off the device: clean
 * ones are dropped (0 bytes written), dirty ones saved to PINNED, HOST or
 * SPILL. On failure (spill file full, I/O error) the tensors that could not
 * be saved stay on the device; nothing is lost. Held tensors: FERRY_E_BUSY. */
FERRY_API int ferry_model_evict(ferry_model *m, const int64_t *tensors, int64_t n);
/* The caller changed tensor t on the device: from now on it is dirty and is
 * saved, not dropped, when it leaves. FERRY_E_INVAL unless t is on the device. */
FERRY_API int ferry_model_mark_dirty(ferry_model *m, int64_t t);
/* Hold tensor t (t < 0: all) in its tier while it is in use (e.g. a kernel
 * reads it): it is never evicted until released. Holds count: release as
 * often as held. Releasing a tensor not held: FERRY_E_INVAL. (A hold keeps
 * a tensor where it is; it does not page-lock anything.) */
FERRY_API int ferry_model_hold(ferry_model *m, int64_t t);
FERRY_API int ferry_model_release(ferry_model *m, int64_t t);

typedef struct ferry_tensor_state {
    uint32_t size;    /* sizeof(ferry_tensor_state), set by the caller */
    const char *name; /* valid while the model exists */
    uint64_t nbytes;
    ferry_tier tier;
    int dirty;     /* differs from the checkpoint */
    int holds;     /* ferry_model_hold count: never evicted while > 0 */
    int64_t group; /* tensors with the same group move together */
    uint64_t dptr; /* device address while tier == DEVICE, else 0 */
    int cached;    /* a clean copy is also kept in the pinned pool (a streamed block, or
                      a model with ferry_model_set_pinned_cache on) */
    int streams;   /* its block streams under the model's plan */
} ferry_tensor_state;
FERRY_API int ferry_model_tensor_state(ferry_model *m, int64_t t, ferry_tensor_state *out);
/* The device addresses of tensors[0..n-1] in one call (a framework's hook
 * re-pointing a block's parameters before it runs): out[3k] is tensor k's
 * dptr as ferry_model_tensor_state gives it (0 when not on the device),
 * out[3k + 1] and out[3k + 2] the base and size of the device block of the
 * store's that holds it (a view of the whole block, made once, serves every
 * tensor later carved from it), or 0 and 0. */
FERRY_API int ferry_model_device_addrs(ferry_model *m, const int64_t *tensors, int64_t n, uint64_t *out);

/* Copy tensor t's current bytes (nbytes, from whichever tier holds them) into
 * buf. Synchronous. */
FERRY_API int ferry_model_read(ferry_model *m, int64_t t, void *buf);
/* Overwrite tensor t on the device with buf (nbytes) and mark it dirty; the
 * tensor must be on the device. Synchronous. */
FERRY_API int ferry_model_write(ferry_model *m, int64_t t, const void *buf);

/* Make sure bytes of device memory are free for the caller, if that is
 * possible at all: room now is the smaller of the store's budget minus its
 * tensors' bytes and the device's real free memory (cuMemGetInfo: PyTorch's
 * allocations count) plus the blocks the store keeps for reuse. When that is
 * short, tensors are evicted: least recently used, lowest priority first,
 * whole groups at a time, held tensors never. Returns the tensor bytes
 * evicted (0 when there was room; more than the shortfall when whole groups
 * overshoot). bytes = UINT64_MAX evicts everything evictable. When it is not
 * possible: FERRY_E_BUDGET, nothing evicted, and *could (may be NULL) = the
 * most that could be made free. On success the store's whole free segments
 * are given back to the driver and, where the free pieces of segments that
 * still hold tensors leave the device short of bytes, more tensors are
 * evicted until it has them or nothing more can go, so the room is real;
 * make_room(0) only gives the free segments back. (Evictions by ferry_model_evict and by
 * ferry_model_to_device keep the blocks for the store's own reuse.) Spill-file
 * ranges freed when tensors came back stay allocated for the next spill until
 * then, or until the next spill, which punches out what it did not reuse. The
 * pinned pool's unused chunks are unpinned and freed by it too. */
/* Holds released with ferry_model_release_after count until their stream has
 * run that far; when that leaves too little room, or bytes is UINT64_MAX, the
 * call waits for those streams (and for the kernels of holds dropped early,
 * see ferry_model_release_after, before it frees memory to the driver) and
 * then evicts what they held too. Tensors of a queued move that has not
 * landed are never evicted. */
FERRY_API int64_t ferry_store_make_room(ferry_store *s, uint64_t bytes, uint64_t *could);

typedef struct ferry_store_stats {
    uint32_t size;                         /* sizeof(ferry_store_stats), set by the caller */
    uint64_t tier_bytes[FERRY_TIER_COUNT]; /* bytes of tensors now in each tier */
    uint64_t device_budget, pinned_budget, host_budget;
    uint64_t host_available;         /* the host's available memory now (cgroup-aware) */
    int spilling;                    /* dirty evictions currently go to disk (hysteresis state) */
    uint64_t spill_file_bytes;       /* spill file's allocated size */
    uint64_t bytes_htod, bytes_dtoh; /* moved to / from the device since the store was made */
    double seconds_htod, seconds_dtoh;
    uint64_t bytes_written; /* written to the spill file */
    uint64_t bytes_read;    /* read from checkpoints and the spill file */
    uint64_t evicted;       /* tensors that left the device */
    uint64_t dropped;       /* of which clean (nothing written) */
    int64_t models, tensors;
    uint64_t device_cached;      /* free device memory the store holds for reuse: the free pieces of
                                    its segments (make_room gives whole free segments back) */
    uint64_t pinned_pool_bytes;  /* page-locked host RAM the store holds for dirty tensors
                                    (pinned once, reused; make_room unpins what is unused) */
    uint64_t pinned_cache_bytes; /* of the pool, clean copies (streamed blocks, pinned_cache models) */
    uint64_t device_allocs, device_frees; /* driver calls the store made for device memory
                                             (a steady streamed pass should make none) */
    /* Memory released after a caller's stream (ferry_model_release_after)
     * and needed again before that stream's work had run: fence_orders
     * counts the times the store's copies were ordered after it on the device
     * (the host went on), fence_waits the times the host waited for it
     * (a dirty tensor, a file read, memory going back to the driver). */
    uint64_t fence_waits, fence_orders;
    uint64_t pinned_reserved; /* of pinned_pool_bytes, pinned ahead (opts.pinned_reserve) so far */
    uint64_t pinned_reserve;  /* what the store was asked to pin ahead (capped at pinned_budget) */
} ferry_store_stats;
FERRY_API int ferry_store_get_stats(ferry_store *s, ferry_store_stats *out);
/* Wait until the pool reserved by opts.pinned_reserve is pinned. 0 (at once
 * without a reserve), or the error that stopped the pinning (message on s;
 * the pool is then pinned on demand from where the pinning stopped, and the
 * store works on). Thread-safe. */
FERRY_API int ferry_store_wait_pinned(ferry_store *s);
/* The spill file's directory once the first spill made the file, else NULL.
 * Valid while s exists. */
FERRY_API const char *ferry_store_spill_dir(const ferry_store *s);
/* The host's available memory now, cgroup-aware (what stores budget against),
 * and where the figure came from ("cgroup /a/b: memory.max", "MemAvailable")
 * into source[0..n-1] (may be NULL). 0 or -errno. Thread-safe. */
FERRY_API int ferry_host_available(uint64_t *bytes, char *source, size_t n);

/* Per-job memory statistics: between job_begin and job_end the process's
 * RSS, USS and PSS (/proc/self/smaps_rollup) are sampled (every 10 ms) for
 * their peak, with the cgroup's memory.current/memory.peak where available. */
typedef struct ferry_mem_range {
    uint64_t start, end, peak;
} ferry_mem_range;
typedef struct ferry_job_stats {
    uint32_t size; /* sizeof(ferry_job_stats), set by the caller */
    double seconds;
    ferry_mem_range rss, uss, pss;
    ferry_mem_range cgroup; /* memory.current (peak: memory.peak when the kernel has it,
                               else sampled); all 0 when not in a cgroup v2 */
    uint64_t device_bytes, pinned_bytes, host_bytes, spill_bytes; /* tiers at the end */
    uint64_t bytes_htod, bytes_dtoh, bytes_written, bytes_read;   /* during the job */
    double seconds_htod, seconds_dtoh;
    uint64_t evicted, dropped;
} ferry_job_stats;
/* One job at a time per store: FERRY_E_BUSY if one is open. */
FERRY_API int ferry_store_job_begin(ferry_store *s, const char *name);
/* FERRY_E_INVAL when no job is open. out may be NULL. */
FERRY_API int ferry_store_job_end(ferry_store *s, ferry_job_stats *out);
/* The open job's name, else the last ended one's, else NULL; valid until the
 * next ferry_store_job_begin on s. */
FERRY_API const char *ferry_store_job_name(const ferry_store *s);

/* ---- the ABI by name (for bindings) ---------------------------------------- */

/* The library's view of its public structs and enums, so a binding that
 * mirrors this header (python/ferry) can check its copy at load time instead
 * of trusting it. Thread-safe; FERRY_E_NOTFOUND (or NULL) for unknown names.
 * type: a struct's name as declared here ("ferry_load_opts"). */
FERRY_API int64_t ferry_abi_sizeof(const char *type);
FERRY_API int64_t ferry_abi_offsetof(const char *type, const char *field);
/* The name of field k (0 = the first) of type, or NULL past the last. */
FERRY_API const char *ferry_abi_field(const char *type, int k);
/* Number of values of "ferry_dtype", "ferry_route", "ferry_tier", "ferry_format"
 * (0 .. count-1 have names) or "ferry_error" (FERRY_E_BASE down to FERRY_E_LAST). */
FERRY_API int ferry_abi_enum_count(const char *type);
/* "BUSY" for FERRY_E_BUSY and so on; NULL for anything that is not a FERRY_E_* code. */
FERRY_API const char *ferry_error_name(int code);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_H */
