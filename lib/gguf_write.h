/* gguf_write.h - write GGUF files (version 3 by default) to a file or memory.
 *
 * Format: ggml/docs/gguf.md.  Key/values are encoded as they are added, in
 * that order; tensors are laid out in the order added, each at an offset
 * that is a multiple of the alignment, and the data section (and the file)
 * is padded to the alignment, as llama.cpp lays files out.
 *
 * Used by the tests (fixtures, split sets, hostile files start from valid
 * ones), the pack writer and the synthetic model generator.
 *
 *   struct strata_gguf_writer *w;
 *   strata_gguf_writer_create(&w, &err);
 *   strata_gguf_writer_add_str(w, "general.architecture", "llama", &err);
 *   strata_gguf_writer_add_tensor(w, "token_embd.weight", STRATA_TYPE_F32, 2,
 *                                 (uint64_t[]){64, 512}, data, &err);
 *   strata_gguf_writer_write_file(w, "m.gguf", &err);
 *   strata_gguf_writer_free(w);
 */
#ifndef STRATA_GGUF_WRITE_H
#define STRATA_GGUF_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "gguf.h"

struct strata_gguf_writer;

/* Returns 0 or STRATA_E_NOMEM.  Free with strata_gguf_writer_free(). */
int strata_gguf_writer_create(struct strata_gguf_writer **out, struct strata_err *err);
void strata_gguf_writer_free(struct strata_gguf_writer *w);

/* Header version (default 3).  Any value is written as given, so tests can
 * produce files the reader must refuse. */
void strata_gguf_writer_set_version(struct strata_gguf_writer *w, uint32_t version);

/* Data alignment in bytes (default 32): a non-zero power of two, else
 * STRATA_E_INVALID.  Stored as the u32 key general.alignment (added at the
 * current position if absent, updated in place if present).  Adding
 * general.alignment as a u32 through strata_gguf_writer_add_u32() does the
 * same.  Change it before adding tensors or at any time: offsets are
 * computed when the file is written. */
int strata_gguf_writer_set_alignment(struct strata_gguf_writer *w, uint32_t alignment,
                                     struct strata_err *err);

/* Scalar key/values.  Each returns 0, STRATA_E_INVALID for an empty key or
 * one already added ("duplicate key 'x'"), or STRATA_E_NOMEM. */
int strata_gguf_writer_add_u8(struct strata_gguf_writer *w, const char *key, uint8_t v,
                              struct strata_err *err);
int strata_gguf_writer_add_i8(struct strata_gguf_writer *w, const char *key, int8_t v,
                              struct strata_err *err);
int strata_gguf_writer_add_u16(struct strata_gguf_writer *w, const char *key, uint16_t v,
                               struct strata_err *err);
int strata_gguf_writer_add_i16(struct strata_gguf_writer *w, const char *key, int16_t v,
                               struct strata_err *err);
int strata_gguf_writer_add_u32(struct strata_gguf_writer *w, const char *key, uint32_t v,
                               struct strata_err *err);
int strata_gguf_writer_add_i32(struct strata_gguf_writer *w, const char *key, int32_t v,
                               struct strata_err *err);
int strata_gguf_writer_add_u64(struct strata_gguf_writer *w, const char *key, uint64_t v,
                               struct strata_err *err);
int strata_gguf_writer_add_i64(struct strata_gguf_writer *w, const char *key, int64_t v,
                               struct strata_err *err);
int strata_gguf_writer_add_f32(struct strata_gguf_writer *w, const char *key, float v,
                               struct strata_err *err);
int strata_gguf_writer_add_f64(struct strata_gguf_writer *w, const char *key, double v,
                               struct strata_err *err);
int strata_gguf_writer_add_bool(struct strata_gguf_writer *w, const char *key, int v,
                                struct strata_err *err);
/* NUL-terminated string value. */
int strata_gguf_writer_add_str(struct strata_gguf_writer *w, const char *key, const char *s,
                               struct strata_err *err);
/* String value of len bytes (may hold NUL bytes). */
int strata_gguf_writer_add_strn(struct strata_gguf_writer *w, const char *key, const char *s,
                                uint64_t len, struct strata_err *err);

/* Array of n fixed-size elements (elem_type u8..f64 or bool, not string or
 * array), data holding them packed in host (little-endian) order; copied.
 * STRATA_E_INVALID for a string/array/unknown elem_type. */
int strata_gguf_writer_add_arr(struct strata_gguf_writer *w, const char *key, uint32_t elem_type,
                               const void *data, uint64_t n, struct strata_err *err);
/* Array of n NUL-terminated strings; copied. */
int strata_gguf_writer_add_arr_str(struct strata_gguf_writer *w, const char *key,
                                   const char *const *strs, uint64_t n, struct strata_err *err);
/* Any array value, including arrays of strings and nested arrays, given in
 * the reader's representation (see struct strata_gguf_arr); deep-copied. */
int strata_gguf_writer_add_arr_value(struct strata_gguf_writer *w, const char *key,
                                     const struct strata_gguf_arr *arr, struct strata_err *err);
/* Copy a key/value of any type, e.g. one read by strata_gguf_kv_at(). */
int strata_gguf_writer_add_kv(struct strata_gguf_writer *w, const struct strata_gguf_kv *kv,
                              struct strata_err *err);
/* 1 when key was already added. */
int strata_gguf_writer_has_key(const struct strata_gguf_writer *w, const char *key);

/* A tensor of type (enum strata_ggml_type) and shape ne[0..n_dims-1]
 * (ne[0] contiguous, n_dims 1..4, every ne > 0, ne[0] a multiple of the
 * type's block size).  Its byte size follows from type and shape.  data is
 * NOT copied: it must stay valid until the file is written; NULL writes
 * zeros.  Returns 0, STRATA_E_INVALID (bad shape, duplicate or empty name;
 * names the tensor), STRATA_E_UNSUPPORTED (unknown type id) or
 * STRATA_E_NOMEM. */
int strata_gguf_writer_add_tensor(struct strata_gguf_writer *w, const char *name, uint32_t type,
                                  uint32_t n_dims, const uint64_t *ne, const void *data,
                                  struct strata_err *err);

uint64_t strata_gguf_writer_n_kv(const struct strata_gguf_writer *w);
uint64_t strata_gguf_writer_n_tensors(const struct strata_gguf_writer *w);

/* Write the file.  Returns 0 or STRATA_E_IO (message quotes the path; a
 * partly written file is removed). */
int strata_gguf_writer_write_file(const struct strata_gguf_writer *w, const char *path,
                                  struct strata_err *err);
/* Write into a malloc'ed buffer (*buf, *size; the caller frees *buf).
 * Returns 0 or STRATA_E_NOMEM. */
int strata_gguf_writer_write_mem(const struct strata_gguf_writer *w, void **buf, size_t *size,
                                 struct strata_err *err);

#endif
