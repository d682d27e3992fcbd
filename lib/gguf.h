/* gguf.h - read-only GGUF files (versions 2 and 3), single or split.
 *
 * Format: ggml/docs/gguf.md.  The file is mmap'ed; every count, length,
 * dimension and offset is validated against the file size with
 * overflow-safe arithmetic before use, so a hostile file gets an error
 * naming what is wrong and never a crash, a hang, or an allocation larger
 * than the file.
 *
 * Split models ("NAME-0000K-of-0000N.gguf", keys split.count / split.no /
 * split.tensors.count) are opened through any shard's name and present one
 * metadata set (the first shard's) and one tensor index over all shards.
 *
 * All pointers returned point into memory owned by the struct strata_gguf
 * and stay valid until strata_gguf_close().
 */
#ifndef STRATA_GGUF_H
#define STRATA_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "ggml_types.h"

/* Metadata value types (gguf_metadata_value_type). */
enum strata_gguf_vtype {
    STRATA_GGUF_UINT8 = 0,
    STRATA_GGUF_INT8 = 1,
    STRATA_GGUF_UINT16 = 2,
    STRATA_GGUF_INT16 = 3,
    STRATA_GGUF_UINT32 = 4,
    STRATA_GGUF_INT32 = 5,
    STRATA_GGUF_FLOAT32 = 6,
    STRATA_GGUF_BOOL = 7,
    STRATA_GGUF_STRING = 8,
    STRATA_GGUF_ARRAY = 9,
    STRATA_GGUF_UINT64 = 10,
    STRATA_GGUF_INT64 = 11,
    STRATA_GGUF_FLOAT64 = 12,
    STRATA_GGUF_VTYPE_COUNT,
};

#define STRATA_GGUF_DEFAULT_ALIGNMENT 32

/* A GGUF string: NOT NUL-terminated (points into the file). */
struct strata_gguf_str {
    const char *ptr;
    uint64_t len;
};

/* An array value.  Exactly one of data/strs/arrs is used, by elem type. */
struct strata_gguf_arr {
    uint32_t type; /* element type, enum strata_gguf_vtype */
    uint64_t n;    /* element count */
    const void *data;                    /* numeric/bool: n packed little-endian
                                            elements in the file (maybe unaligned) */
    const struct strata_gguf_str *strs;  /* STRING: n strings */
    const struct strata_gguf_arr *arrs;  /* ARRAY: n nested arrays */
};

struct strata_gguf_kv {
    const char *key; /* NUL-terminated copy */
    uint32_t type;   /* enum strata_gguf_vtype */
    union {
        uint64_t u;                 /* UINT8/16/32/64 */
        int64_t i;                  /* INT8/16/32/64 */
        double f;                   /* FLOAT32/64 */
        int b;                      /* BOOL (0 or 1) */
        struct strata_gguf_str str; /* STRING (see also strata_gguf_get_str) */
        struct strata_gguf_arr arr; /* ARRAY */
    } v;
};

struct strata_gguf_tensor {
    const char *name;  /* NUL-terminated copy */
    uint32_t type;     /* enum strata_ggml_type */
    uint32_t n_dims;   /* 1..4 */
    uint64_t ne[4];    /* ne[0] is the contiguous dimension, as GGUF stores it;
                          dims past n_dims are 1.  e.g. ffn_down_exps:
                          [n_ff_exp, n_embd, n_expert] */
    uint64_t n_elements;
    uint64_t n_bytes;  /* strata_ggml_row_size(type, ne[0]) * ne[1] * ne[2] * ne[3] */
    uint32_t shard;    /* index of the file holding the data */
    uint64_t offset;   /* absolute byte offset of the data in that file */
    const void *data;  /* the data, inside the mmap */
};

struct strata_gguf;

/* Open a GGUF file, or a split set through any shard's name.
 * Returns 0, or STRATA_E_IO (cannot open/map; message quotes the path),
 * STRATA_E_FORMAT (malformed; message names file, key or tensor and what is
 * wrong), STRATA_E_UNSUPPORTED (unknown version or tensor type id),
 * STRATA_E_NOTFOUND (a shard of a split set is missing; names it). */
int strata_gguf_open(struct strata_gguf **out, const char *path, struct strata_err *err);

/* A file whose bytes are already in memory (e.g. a resident image of a pack,
 * lib/resident.h): opened in place of the file at path. */
struct strata_gguf_mem_file {
    const char *path;
    const void *base;
    uint64_t size;
};

/* strata_gguf_open, except that a file (the one named or a shard of its split
 * set) whose path equals files[i].path - or, failing that, whose base name
 * equals exactly one entry's - is parsed from files[i]'s bytes instead of
 * being mapped.  files and the memory must outlive the handle.  Errors as
 * strata_gguf_open. */
int strata_gguf_open_files(struct strata_gguf **out, const char *path,
                           const struct strata_gguf_mem_file *files, uint32_t n_files,
                           struct strata_err *err);

/* Parse a GGUF image held in memory (not copied; must outlive the handle).
 * name is used in messages.  No split handling.  For tests and fuzzing. */
int strata_gguf_open_mem(struct strata_gguf **out, const void *buf, size_t size,
                         const char *name, struct strata_err *err);

void strata_gguf_close(struct strata_gguf *g);

uint32_t strata_gguf_version(const struct strata_gguf *g);
uint32_t strata_gguf_alignment(const struct strata_gguf *g); /* general.alignment or 32 */

/* Shards: 1 for a plain file. */
uint32_t strata_gguf_n_shards(const struct strata_gguf *g);
const char *strata_gguf_shard_path(const struct strata_gguf *g, uint32_t i);
uint64_t strata_gguf_shard_size(const struct strata_gguf *g, uint32_t i);
/* Start of the tensor data section of shard i (absolute file offset). */
uint64_t strata_gguf_shard_data_offset(const struct strata_gguf *g, uint32_t i);
/* The mapped bytes of shard i (size strata_gguf_shard_size). */
const void *strata_gguf_shard_base(const struct strata_gguf *g, uint32_t i);

/* Drop this process's pages of [p, p + n) when the range lies inside a shard that is
 * mapped from its file (not an in-memory image): the whole pages inside the range
 * leave the resident set (madvise MADV_DONTNEED on the read-only shared mapping);
 * a later read faults them in again from the page cache or the file, with the same
 * bytes.  For callers that copied tensors elsewhere (a GPU's VRAM) and will not read
 * them on the host again soon.  Returns the bytes dropped (0: not file-mapped, too
 * small, or the call failed; nothing changes then). */
size_t strata_gguf_drop_pages(const struct strata_gguf *g, const void *p, size_t n);

/* Metadata, in file order. */
uint64_t strata_gguf_n_kv(const struct strata_gguf *g);
const struct strata_gguf_kv *strata_gguf_kv_at(const struct strata_gguf *g, uint64_t i);
/* NULL when the key does not exist. */
const struct strata_gguf_kv *strata_gguf_find_kv(const struct strata_gguf *g, const char *key);

/* Typed getters.  Return 0, STRATA_E_NOTFOUND when the key is absent
 * ("key 'x' not found in 'file'"), or STRATA_E_FORMAT on a type mismatch
 * ("key 'x' is a string, expected u32").  Integer getters accept any
 * integer type whose value fits the target; float getters accept FLOAT32,
 * FLOAT64 and integers; get_bool accepts BOOL only. */
int strata_gguf_get_u32(const struct strata_gguf *g, const char *key, uint32_t *out,
                        struct strata_err *err);
int strata_gguf_get_i32(const struct strata_gguf *g, const char *key, int32_t *out,
                        struct strata_err *err);
int strata_gguf_get_u64(const struct strata_gguf *g, const char *key, uint64_t *out,
                        struct strata_err *err);
int strata_gguf_get_f32(const struct strata_gguf *g, const char *key, float *out,
                        struct strata_err *err);
int strata_gguf_get_bool(const struct strata_gguf *g, const char *key, int *out,
                         struct strata_err *err);
/* *out is a NUL-terminated copy owned by g (an embedded NUL truncates it;
 * use the kv's v.str for the exact bytes). */
int strata_gguf_get_str(const struct strata_gguf *g, const char *key, const char **out,
                        struct strata_err *err);
/* want_type: required element type, or -1 for any. */
int strata_gguf_get_arr(const struct strata_gguf *g, const char *key, int want_type,
                        const struct strata_gguf_arr **out, struct strata_err *err);

/* Numeric array element i converted to double / int64 (bool as 0/1);
 * 0 for non-numeric element types or i out of range. */
double strata_gguf_arr_f64(const struct strata_gguf_arr *a, uint64_t i);
int64_t strata_gguf_arr_i64(const struct strata_gguf_arr *a, uint64_t i);

/* Name of a value type ("u32", "string", "array"...). */
const char *strata_gguf_vtype_name(uint32_t type);
/* Bytes of one element of a fixed-size value type (1 for u8/i8/bool, 2, 4
 * or 8); 0 for string, array and unknown type ids. */
uint64_t strata_gguf_vtype_size(uint32_t type);

/* Tensors, in file order (shard 0 first). */
uint64_t strata_gguf_n_tensors(const struct strata_gguf *g);
const struct strata_gguf_tensor *strata_gguf_tensor_at(const struct strata_gguf *g, uint64_t i);
/* NULL when absent. */
const struct strata_gguf_tensor *strata_gguf_find_tensor(const struct strata_gguf *g,
                                                         const char *name);

#endif
