/* gguf_craft.h - build GGUF byte images by hand, valid or deliberately not.
 *
 * The library's writer only produces well-formed files; hostile ones are
 * spelled out here field by field (ggml/docs/gguf.md), so each crafted
 * defect reads as the bytes it puts in the file.  Used by the defect tests
 * and to seed the fuzzer's corpus.
 */
#ifndef STRATA_GGUF_CRAFT_H
#define STRATA_GGUF_CRAFT_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct craft {
    uint8_t *p;
    size_t len, cap;
};

static inline void cr_put(struct craft *b, const void *p, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *q = realloc(b->p, cap);
        if (!q)
            abort(); /* test-only code: out of memory is a test failure */
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
}

static inline void cr_u8(struct craft *b, uint8_t v)
{
    cr_put(b, &v, 1);
}
static inline void cr_u32(struct craft *b, uint32_t v)
{
    cr_put(b, &v, 4);
}
static inline void cr_u64(struct craft *b, uint64_t v)
{
    cr_put(b, &v, 8);
}

/* gguf_string: u64 length then the bytes (no NUL). */
static inline void cr_str(struct craft *b, const char *s)
{
    cr_u64(b, strlen(s));
    cr_put(b, s, strlen(s));
}

/* Header: magic, version, n_tensors, n_kv. */
static inline void cr_hdr(struct craft *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    cr_put(b, "GGUF", 4);
    cr_u32(b, version);
    cr_u64(b, n_tensors);
    cr_u64(b, n_kv);
}

/* Key and value type; the caller appends the value. */
static inline void cr_key(struct craft *b, const char *key, uint32_t type)
{
    cr_str(b, key);
    cr_u32(b, type);
}

static inline void cr_kv_u32(struct craft *b, const char *key, uint32_t v)
{
    cr_key(b, key, 4 /* UINT32 */);
    cr_u32(b, v);
}

static inline void cr_kv_str(struct craft *b, const char *key, const char *v)
{
    cr_key(b, key, 8 /* STRING */);
    cr_str(b, v);
}

/* Tensor info: name, n_dims, ne[n_dims], type, offset in the data section. */
static inline void cr_tensor(struct craft *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                             uint32_t type, uint64_t offset)
{
    cr_str(b, name);
    cr_u32(b, n_dims);
    for (uint32_t i = 0; i < n_dims; i++)
        cr_u64(b, ne[i]);
    cr_u32(b, type);
    cr_u64(b, offset);
}

/* Zero bytes up to a multiple of align. */
static inline void cr_pad(struct craft *b, size_t align)
{
    while (b->len % align)
        cr_u8(b, 0);
}

static inline void cr_zeros(struct craft *b, size_t n)
{
    while (n--)
        cr_u8(b, 0);
}

#endif
