/* gguf.c - the GGUF reader: mmap, validation of hostile input, split sets.
 *
 * Layout (ggml/docs/gguf.md): magic "GGUF", u32 version, u64 n_tensors,
 * u64 n_kv; n_kv key/values (string key, u32 value type, value); n_tensors
 * tensor infos (string name, u32 n_dims, u64 ne[n_dims], u32 type, u64
 * offset relative to the data section); padding to general.alignment; the
 * data section.  All integers little-endian.
 *
 * Every count read from the file is checked against the bytes that remain
 * before anything is allocated for it, so the heap used is bounded by the
 * file size: about 1x for real files (vocabularies), under 8x for a file
 * made of nothing but one-byte keys (test_gguf_defects measures both).
 * Parsed structures live in one arena per handle, freed by
 * strata_gguf_close().
 */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Nested arrays deeper than this are refused (the format has no limit; no
 * real file nests at all, and the bound keeps the recursion shallow). */
#define MAX_DEPTH 8
/* Hard bound on n_kv and n_tensors, on top of the file-size bound. */
#define MAX_COUNT (1u << 30)

/* Smallest encodings, used to bound counts by the bytes that remain. */
#define MIN_KV_BYTES (8 + 1 + 4 + 1)             /* key len, 1-byte key, type, u8 */
#define MIN_TENSOR_BYTES (8 + 1 + 4 + 8 + 4 + 8) /* name len, name, n_dims, ne0, type, offset */

/* ---- arena ---------------------------------------------------------- */

struct arena_blk {
    struct arena_blk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

struct arena {
    struct arena_blk *head;
};

static void *arena_alloc(struct arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    struct arena_blk *b = a->head;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        b = malloc(sizeof(*b) + cap);
        if (!b)
            return NULL;
        b->used = 0;
        b->cap = cap;
        b->next = a->head;
        a->head = b;
    }
    void *p = b->data + b->used;
    b->used += n;
    return p;
}

static void arena_free(struct arena *a)
{
    while (a->head) {
        struct arena_blk *n = a->head->next;
        free(a->head);
        a->head = n;
    }
}

static char *arena_strndup(struct arena *a, const char *s, size_t n)
{
    char *d = arena_alloc(a, n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* ---- hash index (open addressing, FNV-1a) --------------------------- */

struct index {
    uint32_t *slot; /* entry index + 1; 0 = empty */
    uint64_t mask;
};

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static int index_init(struct index *ix, struct arena *a, uint64_t n)
{
    uint64_t cap = 16;
    while (cap < 2 * n)
        cap <<= 1;
    ix->slot = arena_alloc(a, cap * sizeof(uint32_t));
    if (!ix->slot)
        return -1;
    memset(ix->slot, 0, cap * sizeof(uint32_t));
    ix->mask = cap - 1;
    return 0;
}

/* Insert entry i named name; returns -1 if inserted, else the index of the
 * entry already holding that name.  names(ctx, j) gives entry j's name. */
static int64_t index_put(struct index *ix, const char *name, uint32_t i,
                         const char *(*names)(const void *, uint32_t), const void *ctx)
{
    for (uint64_t h = hash_str(name) & ix->mask;; h = (h + 1) & ix->mask) {
        uint32_t s = ix->slot[h];
        if (s == 0) {
            ix->slot[h] = i + 1;
            return -1;
        }
        if (strcmp(names(ctx, s - 1), name) == 0)
            return s - 1;
    }
}

static int64_t index_get(const struct index *ix, const char *name,
                         const char *(*names)(const void *, uint32_t), const void *ctx)
{
    if (!ix->slot)
        return -1;
    for (uint64_t h = hash_str(name) & ix->mask;; h = (h + 1) & ix->mask) {
        uint32_t s = ix->slot[h];
        if (s == 0)
            return -1;
        if (strcmp(names(ctx, s - 1), name) == 0)
            return s - 1;
    }
}

static const char *kv_name(const void *ctx, uint32_t i)
{
    return ((const struct strata_gguf_kv *)ctx)[i].key;
}

static const char *tensor_name(const void *ctx, uint32_t i)
{
    return ((const struct strata_gguf_tensor *)ctx)[i].name;
}

/* ---- one file ------------------------------------------------------- */

struct gfile {
    const char *path;
    const uint8_t *base;
    uint64_t size;
    void *map; /* NULL for an in-memory image */
    dev_t dev;
    ino_t ino;
    uint32_t version, alignment;
    uint64_t n_kv;
    struct strata_gguf_kv *kvs;
    const char **kv_cstr; /* NUL-terminated copies of STRING values */
    struct index kv_ix;
    uint64_t n_tensors;
    struct strata_gguf_tensor *tensors;
    uint64_t data_offset;
};

struct strata_gguf {
    struct arena arena;
    uint32_t n_shards;
    struct gfile *shards;
    uint64_t n_tensors;
    struct strata_gguf_tensor *tensors;
    struct index t_ix;
    const struct strata_gguf_mem_file *mem; /* files already in memory (open_files) */
    uint32_t n_mem;
};

struct cur {
    const uint8_t *base;
    uint64_t size, pos;
    const char *path;
    struct strata_err *err;
};

__attribute__((format(printf, 3, 4))) static int fail(const struct cur *c, int code,
                                                      const char *fmt, ...)
{
    char msg[STRATA_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return strata_err_set(c->err, code, "'%s': %s", c->path, msg);
}

static uint64_t left(const struct cur *c)
{
    return c->size - c->pos;
}

static int need(struct cur *c, uint64_t n, const char *what)
{
    if (n > left(c))
        return fail(c, STRATA_E_FORMAT,
                    "file truncated: %s at offset %llu needs %llu bytes, the file ends at %llu",
                    what, (unsigned long long)c->pos, (unsigned long long)n,
                    (unsigned long long)c->size);
    return 0;
}

static int rd_u32(struct cur *c, uint32_t *v, const char *what)
{
    int rc = need(c, 4, what);
    if (rc)
        return rc;
    memcpy(v, c->base + c->pos, 4);
    c->pos += 4;
    return 0;
}

static int rd_u64(struct cur *c, uint64_t *v, const char *what)
{
    int rc = need(c, 8, what);
    if (rc)
        return rc;
    memcpy(v, c->base + c->pos, 8);
    c->pos += 8;
    return 0;
}

/* A length-prefixed string; what names it in messages. */
static int rd_str(struct cur *c, struct strata_gguf_str *s, const char *what)
{
    uint64_t len;
    int rc = rd_u64(c, &len, what);
    if (rc)
        return rc;
    if (len > left(c))
        return fail(c, STRATA_E_FORMAT,
                    "%s: string length %llu at offset %llu runs past the end of the file "
                    "(size %llu)",
                    what, (unsigned long long)len, (unsigned long long)(c->pos - 8),
                    (unsigned long long)c->size);
    s->ptr = (const char *)c->base + c->pos;
    s->len = len;
    c->pos += len;
    return 0;
}

uint64_t strata_gguf_vtype_size(uint32_t t)
{
    switch (t) {
    case STRATA_GGUF_UINT8:
    case STRATA_GGUF_INT8:
    case STRATA_GGUF_BOOL:
        return 1;
    case STRATA_GGUF_UINT16:
    case STRATA_GGUF_INT16:
        return 2;
    case STRATA_GGUF_UINT32:
    case STRATA_GGUF_INT32:
    case STRATA_GGUF_FLOAT32:
        return 4;
    case STRATA_GGUF_UINT64:
    case STRATA_GGUF_INT64:
    case STRATA_GGUF_FLOAT64:
        return 8;
    default:
        return 0;
    }
}

const char *strata_gguf_vtype_name(uint32_t type)
{
    static const char *const names[STRATA_GGUF_VTYPE_COUNT] = {
        "u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
        "bool", "string", "array", "u64", "i64", "f64",
    };
    return type < STRATA_GGUF_VTYPE_COUNT ? names[type] : "unknown";
}

static int parse_arr(struct cur *c, struct arena *a, const char *key, struct strata_gguf_arr *out,
                     int depth)
{
    uint32_t t;
    uint64_t n;
    char what[STRATA_ERR_MSG_MAX / 4];
    snprintf(what, sizeof(what), "array header of key '%s'", key);
    int rc = rd_u32(c, &t, what);
    if (!rc)
        rc = rd_u64(c, &n, what);
    if (rc)
        return rc;
    if (t >= STRATA_GGUF_VTYPE_COUNT)
        return fail(c, STRATA_E_FORMAT, "key '%s': array element type %u is not a gguf value type",
                    key, t);
    if (t == STRATA_GGUF_ARRAY && depth + 1 >= MAX_DEPTH)
        return fail(c, STRATA_E_FORMAT, "key '%s': arrays nested more than %d deep", key,
                    MAX_DEPTH);
    uint64_t esz = strata_gguf_vtype_size(t);
    uint64_t emin = esz ? esz : t == STRATA_GGUF_STRING ? 8 : 12;
    if (n > left(c) / emin)
        return fail(c, STRATA_E_FORMAT,
                    "key '%s': array of %llu %s elements at offset %llu runs past the end of "
                    "the file (size %llu)",
                    key, (unsigned long long)n, strata_gguf_vtype_name(t),
                    (unsigned long long)c->pos, (unsigned long long)c->size);
    out->type = t;
    out->n = n;
    out->data = NULL;
    out->strs = NULL;
    out->arrs = NULL;
    if (esz) {
        out->data = c->base + c->pos;
        if (t == STRATA_GGUF_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (c->base[c->pos + i] > 1)
                    return fail(c, STRATA_E_FORMAT,
                                "key '%s': bool element %llu has value %u (must be 0 or 1)", key,
                                (unsigned long long)i, c->base[c->pos + i]);
        c->pos += n * esz;
        return 0;
    }
    if (t == STRATA_GGUF_STRING) {
        struct strata_gguf_str *s = arena_alloc(a, n * sizeof(*s));
        if (!s)
            return fail(c, STRATA_E_NOMEM, "key '%s': out of memory", key);
        for (uint64_t i = 0; i < n; i++) {
            snprintf(what, sizeof(what), "key '%s' element %llu", key, (unsigned long long)i);
            if ((rc = rd_str(c, &s[i], what)))
                return rc;
        }
        out->strs = s;
        return 0;
    }
    struct strata_gguf_arr *sub = arena_alloc(a, n * sizeof(*sub));
    if (!sub)
        return fail(c, STRATA_E_NOMEM, "key '%s': out of memory", key);
    for (uint64_t i = 0; i < n; i++)
        if ((rc = parse_arr(c, a, key, &sub[i], depth + 1)))
            return rc;
    out->arrs = sub;
    return 0;
}

static int parse_value(struct cur *c, struct arena *a, struct strata_gguf_kv *kv)
{
    uint64_t esz = strata_gguf_vtype_size(kv->type);
    const uint8_t *p = c->base + c->pos;
    char what[STRATA_ERR_MSG_MAX / 4];
    int rc;
    snprintf(what, sizeof(what), "value of key '%s'", kv->key);
    if (esz) {
        if ((rc = need(c, esz, what)))
            return rc;
        c->pos += esz;
    }
    switch (kv->type) {
    case STRATA_GGUF_UINT8:
        kv->v.u = p[0];
        return 0;
    case STRATA_GGUF_INT8:
        kv->v.i = (int8_t)p[0];
        return 0;
    case STRATA_GGUF_UINT16: {
        uint16_t x;
        memcpy(&x, p, 2);
        kv->v.u = x;
        return 0;
    }
    case STRATA_GGUF_INT16: {
        int16_t x;
        memcpy(&x, p, 2);
        kv->v.i = x;
        return 0;
    }
    case STRATA_GGUF_UINT32: {
        uint32_t x;
        memcpy(&x, p, 4);
        kv->v.u = x;
        return 0;
    }
    case STRATA_GGUF_INT32: {
        int32_t x;
        memcpy(&x, p, 4);
        kv->v.i = x;
        return 0;
    }
    case STRATA_GGUF_UINT64: {
        uint64_t x;
        memcpy(&x, p, 8);
        kv->v.u = x;
        return 0;
    }
    case STRATA_GGUF_INT64: {
        int64_t x;
        memcpy(&x, p, 8);
        kv->v.i = x;
        return 0;
    }
    case STRATA_GGUF_FLOAT32: {
        float x;
        memcpy(&x, p, 4);
        kv->v.f = x;
        return 0;
    }
    case STRATA_GGUF_FLOAT64: {
        double x;
        memcpy(&x, p, 8);
        kv->v.f = x;
        return 0;
    }
    case STRATA_GGUF_BOOL:
        if (p[0] > 1)
            return fail(c, STRATA_E_FORMAT, "key '%s': bool value %u is not 0 or 1", kv->key, p[0]);
        kv->v.b = p[0];
        return 0;
    case STRATA_GGUF_STRING:
        return rd_str(c, &kv->v.str, what);
    case STRATA_GGUF_ARRAY:
        return parse_arr(c, a, kv->key, &kv->v.arr, 0);
    default:
        return fail(c, STRATA_E_FORMAT, "key '%s': value type %u is not a gguf value type", kv->key,
                    kv->type);
    }
}

/* Key or tensor name: non-empty, no NUL bytes; copied NUL-terminated. */
static int rd_name(struct cur *c, struct arena *a, const char *what, uint64_t i, const char **out)
{
    struct strata_gguf_str s;
    char label[64];
    snprintf(label, sizeof(label), "%s #%llu", what, (unsigned long long)i);
    int rc = rd_str(c, &s, label);
    if (rc)
        return rc;
    if (s.len == 0)
        return fail(c, STRATA_E_FORMAT, "%s has an empty name", label);
    if (memchr(s.ptr, 0, s.len))
        return fail(c, STRATA_E_FORMAT, "%s: name contains a nul byte", label);
    if (!(*out = arena_strndup(a, s.ptr, s.len)))
        return fail(c, STRATA_E_NOMEM, "out of memory");
    return 0;
}

/* general.alignment: an integer that is a non-zero power of two. */
static int read_alignment(struct cur *c, struct gfile *f)
{
    f->alignment = STRATA_GGUF_DEFAULT_ALIGNMENT;
    int64_t i = index_get(&f->kv_ix, "general.alignment", kv_name, f->kvs);
    if (i < 0)
        return 0;
    const struct strata_gguf_kv *kv = &f->kvs[i];
    uint64_t v;
    switch (kv->type) {
    case STRATA_GGUF_UINT8:
    case STRATA_GGUF_UINT16:
    case STRATA_GGUF_UINT32:
    case STRATA_GGUF_UINT64:
        v = kv->v.u;
        break;
    case STRATA_GGUF_INT8:
    case STRATA_GGUF_INT16:
    case STRATA_GGUF_INT32:
    case STRATA_GGUF_INT64:
        if (kv->v.i < 0)
            return fail(c, STRATA_E_FORMAT, "general.alignment %lld is negative",
                        (long long)kv->v.i);
        v = (uint64_t)kv->v.i;
        break;
    default:
        return fail(c, STRATA_E_FORMAT, "general.alignment is a %s, expected u32",
                    strata_gguf_vtype_name(kv->type));
    }
    if (v == 0)
        return fail(c, STRATA_E_FORMAT, "general.alignment is 0");
    if (v & (v - 1))
        return fail(c, STRATA_E_FORMAT, "general.alignment %llu is not a power of two",
                    (unsigned long long)v);
    if (v > UINT32_MAX)
        return fail(c, STRATA_E_FORMAT, "general.alignment %llu does not fit u32",
                    (unsigned long long)v);
    f->alignment = (uint32_t)v;
    return 0;
}

static int parse_tensor_info(struct cur *c, struct arena *a, uint64_t i,
                             struct strata_gguf_tensor *t)
{
    int rc = rd_name(c, a, "tensor", i, &t->name);
    if (rc)
        return rc;
    char what[64];
    snprintf(what, sizeof(what), "n_dims of tensor #%llu", (unsigned long long)i);
    if ((rc = rd_u32(c, &t->n_dims, what)))
        return rc;
    if (t->n_dims == 0)
        return fail(c, STRATA_E_FORMAT, "tensor '%s': n_dims is 0 (must be 1 to 4)", t->name);
    if (t->n_dims > 4)
        return fail(c, STRATA_E_FORMAT, "tensor '%s': n_dims %u is more than 4", t->name,
                    t->n_dims);
    for (uint32_t d = 0; d < 4; d++) {
        t->ne[d] = 1;
        if (d < t->n_dims) {
            snprintf(what, sizeof(what), "ne[%u] of tensor #%llu", d, (unsigned long long)i);
            if ((rc = rd_u64(c, &t->ne[d], what)))
                return rc;
        }
    }
    snprintf(what, sizeof(what), "type of tensor #%llu", (unsigned long long)i);
    if ((rc = rd_u32(c, &t->type, what)))
        return rc;
    snprintf(what, sizeof(what), "offset of tensor #%llu", (unsigned long long)i);
    if ((rc = rd_u64(c, &t->offset, what)))
        return rc;

    uint64_t n = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (t->ne[d] == 0)
            return fail(c, STRATA_E_FORMAT, "tensor '%s': ne[%u] is 0", t->name, d);
        if (t->ne[d] > (uint64_t)INT64_MAX)
            return fail(c, STRATA_E_FORMAT, "tensor '%s': ne[%u] = %llu is larger than 2^63-1",
                        t->name, d, (unsigned long long)t->ne[d]);
        if (n > (uint64_t)INT64_MAX / t->ne[d])
            return fail(c, STRATA_E_FORMAT,
                        "tensor '%s': element count overflows (ne = [%llu, %llu, %llu, %llu])",
                        t->name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                        (unsigned long long)t->ne[2], (unsigned long long)t->ne[3]);
        n *= t->ne[d];
    }
    t->n_elements = n;
    if (!strata_ggml_type_known(t->type))
        return fail(c, STRATA_E_UNSUPPORTED, "tensor '%s' has unknown type id %u", t->name,
                    t->type);
    uint64_t bs = strata_ggml_blck_size(t->type), ts = strata_ggml_type_size(t->type);
    if (t->ne[0] % bs)
        return fail(c, STRATA_E_FORMAT,
                    "tensor '%s': ne[0] = %llu is not a multiple of the %s block size %llu",
                    t->name, (unsigned long long)t->ne[0], strata_ggml_type_name(t->type),
                    (unsigned long long)bs);
    uint64_t bytes = t->ne[0] / bs;
    if (bytes > UINT64_MAX / ts)
        goto overflow;
    bytes *= ts;
    for (uint32_t d = 1; d < 4; d++) {
        if (bytes > UINT64_MAX / t->ne[d])
            goto overflow;
        bytes *= t->ne[d];
    }
    t->n_bytes = bytes;
    return 0;
overflow:
    return fail(c, STRATA_E_FORMAT, "tensor '%s': byte size of %llu %s elements overflows", t->name,
                (unsigned long long)n, strata_ggml_type_name(t->type));
}

struct span {
    uint64_t start, end;
    uint64_t i;
};

static int span_cmp(const void *pa, const void *pb)
{
    const struct span *a = pa, *b = pb;
    if (a->start != b->start)
        return a->start < b->start ? -1 : 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

/* Data offsets: aligned, inside the file, not overlapping. */
static int check_tensor_data(struct cur *c, struct gfile *f)
{
    struct span *sp = NULL;
    int rc = 0;
    if (f->n_tensors == 0)
        return 0;
    sp = malloc(f->n_tensors * sizeof(*sp));
    if (!sp)
        return fail(c, STRATA_E_NOMEM, "out of memory for %llu tensors",
                    (unsigned long long)f->n_tensors);
    uint64_t avail = f->size - f->data_offset;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        struct strata_gguf_tensor *t = &f->tensors[i];
        if (t->offset % f->alignment) {
            rc = fail(c, STRATA_E_FORMAT,
                      "tensor '%s': data offset %llu is not a multiple of the alignment %u",
                      t->name, (unsigned long long)t->offset, f->alignment);
            goto out;
        }
        if (t->offset > avail || t->n_bytes > avail - t->offset) {
            rc = fail(c, STRATA_E_FORMAT,
                      "tensor '%s': data at offset %llu (%llu bytes) runs past the end of the "
                      "file (data section of %llu bytes at %llu)",
                      t->name, (unsigned long long)t->offset, (unsigned long long)t->n_bytes,
                      (unsigned long long)avail, (unsigned long long)f->data_offset);
            goto out;
        }
        t->offset += f->data_offset;
        t->data = f->base + t->offset;
        sp[i] = (struct span){t->offset, t->offset + t->n_bytes, i};
    }
    qsort(sp, f->n_tensors, sizeof(*sp), span_cmp);
    for (uint64_t k = 1; k < f->n_tensors; k++)
        if (sp[k].start < sp[k - 1].end) {
            rc = fail(c, STRATA_E_FORMAT, "tensor '%s' overlaps tensor '%s'",
                      f->tensors[sp[k].i].name, f->tensors[sp[k - 1].i].name);
            goto out;
        }
out:
    free(sp);
    return rc;
}

static int parse_file(struct gfile *f, struct arena *a, struct strata_err *err)
{
    struct cur c = {f->base, f->size, 0, f->path, err};
    uint32_t version;
    uint64_t n_tensors, n_kv;
    int rc;

    if (f->size < 4 || memcmp(f->base, "GGUF", 4) != 0)
        return fail(&c, STRATA_E_FORMAT, "not a gguf file (%s)",
                    f->size < 4 ? "shorter than the 4-byte magic" : "no 'GGUF' magic");
    c.pos = 4;
    if ((rc = rd_u32(&c, &version, "version")))
        return rc;
    if (version == 1)
        return fail(&c, STRATA_E_UNSUPPORTED,
                    "gguf version 1 is not supported (only versions 2 and 3)");
    if (version == 0x02000000u || version == 0x03000000u)
        return fail(&c, STRATA_E_UNSUPPORTED, "big-endian gguf files are not supported");
    if (version != 2 && version != 3)
        return fail(&c, STRATA_E_UNSUPPORTED, "unknown gguf version %u (only 2 and 3)", version);
    f->version = version;
    if ((rc = rd_u64(&c, &n_tensors, "n_tensors")) || (rc = rd_u64(&c, &n_kv, "n_kv")))
        return rc;
    if (n_kv > MAX_COUNT || n_kv > left(&c) / MIN_KV_BYTES)
        return fail(&c, STRATA_E_FORMAT, "n_kv %llu is more than the file can hold (%llu bytes)",
                    (unsigned long long)n_kv, (unsigned long long)f->size);
    if (n_tensors > MAX_COUNT || n_tensors > left(&c) / MIN_TENSOR_BYTES)
        return fail(&c, STRATA_E_FORMAT,
                    "n_tensors %llu is more than the file can hold (%llu bytes)",
                    (unsigned long long)n_tensors, (unsigned long long)f->size);

    f->n_kv = n_kv;
    f->kvs = arena_alloc(a, (n_kv ? n_kv : 1) * sizeof(*f->kvs));
    f->kv_cstr = arena_alloc(a, (n_kv ? n_kv : 1) * sizeof(*f->kv_cstr));
    if (!f->kvs || !f->kv_cstr || index_init(&f->kv_ix, a, n_kv))
        return fail(&c, STRATA_E_NOMEM, "out of memory for %llu keys", (unsigned long long)n_kv);
    for (uint64_t i = 0; i < n_kv; i++) {
        struct strata_gguf_kv *kv = &f->kvs[i];
        char what[64];
        memset(kv, 0, sizeof(*kv));
        f->kv_cstr[i] = NULL;
        if ((rc = rd_name(&c, a, "key", i, &kv->key)))
            return rc;
        int64_t dup = index_put(&f->kv_ix, kv->key, (uint32_t)i, kv_name, f->kvs);
        if (dup >= 0)
            return fail(&c, STRATA_E_FORMAT, "duplicate key '%s' (#%lld and #%llu)", kv->key,
                        (long long)dup, (unsigned long long)i);
        snprintf(what, sizeof(what), "value type of key #%llu", (unsigned long long)i);
        if ((rc = rd_u32(&c, &kv->type, what)))
            return rc;
        if (kv->type >= STRATA_GGUF_VTYPE_COUNT)
            return fail(&c, STRATA_E_FORMAT, "key '%s': value type %u is not a gguf value type",
                        kv->key, kv->type);
        if ((rc = parse_value(&c, a, kv)))
            return rc;
        if (kv->type == STRATA_GGUF_STRING &&
            !(f->kv_cstr[i] = arena_strndup(a, kv->v.str.ptr, kv->v.str.len)))
            return fail(&c, STRATA_E_NOMEM, "out of memory");
    }
    if ((rc = read_alignment(&c, f)))
        return rc;

    /* bound again now that the key/values are consumed */
    if (n_tensors > left(&c) / MIN_TENSOR_BYTES)
        return fail(&c, STRATA_E_FORMAT,
                    "n_tensors %llu is more than the %llu bytes after the key/values can hold",
                    (unsigned long long)n_tensors, (unsigned long long)left(&c));
    f->n_tensors = n_tensors;
    f->tensors = arena_alloc(a, (n_tensors ? n_tensors : 1) * sizeof(*f->tensors));
    if (!f->tensors)
        return fail(&c, STRATA_E_NOMEM, "out of memory for %llu tensors",
                    (unsigned long long)n_tensors);
    struct index tix;
    if (index_init(&tix, a, n_tensors))
        return fail(&c, STRATA_E_NOMEM, "out of memory");
    for (uint64_t i = 0; i < n_tensors; i++) {
        struct strata_gguf_tensor *t = &f->tensors[i];
        memset(t, 0, sizeof(*t));
        if ((rc = parse_tensor_info(&c, a, i, t)))
            return rc;
        int64_t dup = index_put(&tix, t->name, (uint32_t)i, tensor_name, f->tensors);
        if (dup >= 0)
            return fail(&c, STRATA_E_FORMAT, "duplicate tensor name '%s' (#%lld and #%llu)",
                        t->name, (long long)dup, (unsigned long long)i);
    }
    uint64_t al = f->alignment, pos = c.pos;
    uint64_t data = pos % al ? pos + (al - pos % al) : pos;
    if (data < pos || data > f->size) {
        if (n_tensors)
            return fail(&c, STRATA_E_FORMAT,
                        "tensor data section starts at %llu, past the end of the file (size %llu)",
                        (unsigned long long)data, (unsigned long long)f->size);
        data = f->size; /* no tensors: an empty data section may be left unpadded */
    }
    f->data_offset = data;
    return check_tensor_data(&c, f);
}

/* ---- opening -------------------------------------------------------- */

static void unmap_file(struct gfile *f)
{
    if (f->map)
        munmap(f->map, f->size);
    f->map = NULL;
}

static int map_file(struct gfile *f, struct arena *a, const char *path, struct strata_err *err)
{
    int fd = -1, rc = 0;
    struct stat st;
    memset(f, 0, sizeof(*f));
    if (!(f->path = arena_strndup(a, path, strlen(path))))
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = strata_err_set(err, errno == ENOENT ? STRATA_E_NOTFOUND : STRATA_E_IO,
                            "cannot open '%s': %s", path, strerror(errno));
        goto out;
    }
    if (fstat(fd, &st) != 0) {
        rc = strata_err_set(err, STRATA_E_IO, "cannot stat '%s': %s", path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = strata_err_set(err, STRATA_E_IO, "'%s' is not a regular file", path);
        goto out;
    }
    f->dev = st.st_dev;
    f->ino = st.st_ino;
    f->size = (uint64_t)st.st_size;
    if (f->size == 0) {
        rc = strata_err_set(err, STRATA_E_FORMAT, "'%s': not a gguf file (empty)", path);
        goto out;
    }
    if (f->size > SIZE_MAX) {
        rc = strata_err_set(err, STRATA_E_IO, "'%s' is too large to map", path);
        goto out;
    }
    /* shared, read-only: the page cache's own pages.  A GPU backend registers the
     * routed experts' pages for DMA; registering pages of a private mapping makes the
     * kernel give the process copies of its own (unsharing them for the long-term pin),
     * a second copy of every expert in anonymous memory (measured: 4.64 GB anonymous
     * for 4.39 GB of experts), which a shared mapping avoids */
    f->map = mmap(NULL, (size_t)f->size, PROT_READ, MAP_SHARED, fd, 0);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        rc = strata_err_set(err, STRATA_E_IO, "cannot map '%s': %s", path, strerror(errno));
        goto out;
    }
    f->base = f->map;
out:
    if (fd >= 0)
        close(fd);
    return rc;
}

/* The in-memory copy of path given to strata_gguf_open_files: the entry
 * with the same path, else the only one with the same base name. */
static const struct strata_gguf_mem_file *find_mem(const struct strata_gguf *g, const char *path)
{
    const struct strata_gguf_mem_file *hit = NULL;
    const char *b = strrchr(path, '/');
    int n = 0;
    b = b ? b + 1 : path;
    for (uint32_t i = 0; i < g->n_mem; i++)
        if (strcmp(g->mem[i].path, path) == 0)
            return &g->mem[i];
    for (uint32_t i = 0; i < g->n_mem; i++) {
        const char *mb = strrchr(g->mem[i].path, '/');
        if (strcmp(mb ? mb + 1 : g->mem[i].path, b) == 0) {
            hit = &g->mem[i];
            n++;
        }
    }
    return n == 1 ? hit : NULL;
}

static int open_file(const struct strata_gguf *g, struct gfile *f, struct arena *a,
                     const char *path, struct strata_err *err)
{
    const struct strata_gguf_mem_file *m = find_mem(g, path);
    int rc = 0;
    if (m) {
        memset(f, 0, sizeof(*f));
        if (!(f->path = arena_strndup(a, path, strlen(path))))
            return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        f->base = m->base;
        f->size = m->size;
        if (f->size == 0)
            return strata_err_set(err, STRATA_E_FORMAT, "'%s': not a gguf file (empty)", path);
    } else {
        rc = map_file(f, a, path, err);
    }
    if (!rc)
        rc = parse_file(f, a, err);
    return rc;
}

/* Build the combined tensor index; names the shard of a duplicate. */
static int build_tensor_index(struct strata_gguf *g, struct strata_err *err)
{
    if (index_init(&g->t_ix, &g->arena, g->n_tensors))
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        int64_t d = index_put(&g->t_ix, g->tensors[i].name, (uint32_t)i, tensor_name, g->tensors);
        if (d >= 0)
            return strata_err_set(err, STRATA_E_FORMAT,
                                  "duplicate tensor name '%s' in shard '%s' (also in '%s')",
                                  g->tensors[i].name, g->shards[g->tensors[i].shard].path,
                                  g->shards[g->tensors[d].shard].path);
    }
    return 0;
}

/* An integer key of a shard (split.* are u16/i32 as gguf-split writes them). */
static int shard_int(const struct gfile *f, const char *key, int64_t *out)
{
    int64_t i = index_get(&f->kv_ix, key, kv_name, f->kvs);
    if (i < 0)
        return 0;
    const struct strata_gguf_kv *kv = &f->kvs[i];
    switch (kv->type) {
    case STRATA_GGUF_UINT8:
    case STRATA_GGUF_UINT16:
    case STRATA_GGUF_UINT32:
    case STRATA_GGUF_UINT64:
        *out = kv->v.u > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)kv->v.u;
        return 1;
    case STRATA_GGUF_INT8:
    case STRATA_GGUF_INT16:
    case STRATA_GGUF_INT32:
    case STRATA_GGUF_INT64:
        *out = kv->v.i;
        return 1;
    default:
        return -1;
    }
}

/* "PREFIX-0000K-of-0000N.gguf": fills the prefix length, k and n. */
static int split_name(const char *path, size_t *prefix_len, unsigned *k, unsigned *n)
{
    static const char pat[] = "-#####-of-#####.gguf";
    size_t len = strlen(path), pl = sizeof(pat) - 1;
    if (len <= pl)
        return 0;
    const char *s = path + len - pl;
    unsigned a = 0, b = 0;
    for (size_t i = 0; i < pl; i++) {
        if (pat[i] == '#') {
            if (s[i] < '0' || s[i] > '9')
                return 0;
            if (i < 7)
                a = a * 10 + (unsigned)(s[i] - '0');
            else
                b = b * 10 + (unsigned)(s[i] - '0');
        } else if (s[i] != pat[i]) {
            return 0;
        }
    }
    if (a == 0 || b == 0 || a > b)
        return 0;
    *prefix_len = len - pl;
    *k = a;
    *n = b;
    return 1;
}

static int open_split(struct strata_gguf *g, const char *path, uint64_t count,
                      struct strata_err *err)
{
    struct arena *a = &g->arena;
    struct gfile *first = &g->shards[0];
    size_t pl;
    unsigned k, n;
    int64_t v;
    int rc = 0;

    if (!split_name(path, &pl, &k, &n))
        return strata_err_set(err, STRATA_E_FORMAT,
                              "'%s': split.count is %llu but the name is not "
                              "NAME-0000K-of-0000N.gguf",
                              path, (unsigned long long)count);
    if (count != n)
        return strata_err_set(err, STRATA_E_FORMAT,
                              "'%s': split.count is %llu but the name says %u shards", path,
                              (unsigned long long)count, n);
    struct gfile opened = *first;
    struct gfile *sh = arena_alloc(a, n * sizeof(*sh));
    if (!sh)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    memset(sh, 0, n * sizeof(*sh));
    sh[k - 1] = opened;
    g->shards = sh;
    g->n_shards = n;
    char *p = malloc(pl + 32);
    if (!p)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    for (unsigned i = 0; i < n && !rc; i++) {
        if (i == k - 1)
            continue;
        snprintf(p, pl + 32, "%.*s-%05u-of-%05u.gguf", (int)pl, path, i + 1, n);
        rc = open_file(g, &sh[i], a, p, err);
        if (rc == STRATA_E_NOTFOUND)
            strata_err_set(err, rc, "shard %u of %u '%s' is missing", i + 1, n, p);
    }
    free(p);
    if (rc)
        return rc;

    uint64_t total = 0;
    int64_t want_tensors = -1;
    for (unsigned i = 0; i < n; i++) {
        struct gfile *f = &sh[i];
        for (unsigned j = 0; j < i; j++)
            if (sh[j].map && f->map && sh[j].dev == f->dev && sh[j].ino == f->ino)
                return strata_err_set(err, STRATA_E_FORMAT,
                                      "shard '%s' is the same file as shard '%s'", f->path,
                                      sh[j].path);
        int r = shard_int(f, "split.count", &v);
        if (r <= 0)
            return strata_err_set(err, STRATA_E_FORMAT, "shard '%s' has %s split.count", f->path,
                                  r < 0 ? "a non-integer" : "no");
        if (v != (int64_t)n)
            return strata_err_set(err, STRATA_E_FORMAT,
                                  "shard '%s' has split.count %lld, expected %u", f->path,
                                  (long long)v, n);
        r = shard_int(f, "split.no", &v);
        if (r <= 0)
            return strata_err_set(err, STRATA_E_FORMAT, "shard '%s' has %s split.no", f->path,
                                  r < 0 ? "a non-integer" : "no");
        if (v != (int64_t)i)
            return strata_err_set(err, STRATA_E_FORMAT,
                                  "shard '%s' has split.no %lld, expected %u (a duplicated or "
                                  "misnamed shard?)",
                                  f->path, (long long)v, i);
        r = shard_int(f, "split.tensors.count", &v);
        if (r < 0)
            return strata_err_set(err, STRATA_E_FORMAT,
                                  "shard '%s' has a non-integer split.tensors.count", f->path);
        if (r > 0) {
            if (want_tensors >= 0 && v != want_tensors)
                return strata_err_set(err, STRATA_E_FORMAT,
                                      "shard '%s' has split.tensors.count %lld, shard '%s' has "
                                      "%lld",
                                      f->path, (long long)v, sh[0].path, (long long)want_tensors);
            want_tensors = v;
        }
        total += f->n_tensors;
    }
    if (want_tensors >= 0 && (uint64_t)want_tensors != total)
        return strata_err_set(err, STRATA_E_FORMAT,
                              "'%s': split.tensors.count is %lld but the %u shards hold %llu "
                              "tensors",
                              sh[0].path, (long long)want_tensors, n, (unsigned long long)total);
    if (total > MAX_COUNT)
        return strata_err_set(err, STRATA_E_FORMAT, "'%s': %llu tensors in the split set",
                              sh[0].path, (unsigned long long)total);
    g->n_tensors = total;
    g->tensors = arena_alloc(a, (total ? total : 1) * sizeof(*g->tensors));
    if (!g->tensors)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    uint64_t m = 0;
    for (unsigned i = 0; i < n; i++)
        for (uint64_t j = 0; j < sh[i].n_tensors; j++) {
            g->tensors[m] = sh[i].tensors[j];
            g->tensors[m++].shard = i;
        }
    return build_tensor_index(g, err);
}

static int new_handle(struct strata_gguf **out, struct strata_err *err)
{
    struct strata_gguf *g = calloc(1, sizeof(*g));
    if (!g)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    g->shards = arena_alloc(&g->arena, sizeof(*g->shards));
    if (!g->shards) {
        free(g);
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    }
    memset(g->shards, 0, sizeof(*g->shards));
    g->n_shards = 1;
    *out = g;
    return 0;
}

size_t strata_gguf_drop_pages(const struct strata_gguf *g, const void *p, size_t n)
{
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t a = (uintptr_t)p, b = a + n;
    for (uint32_t i = 0; g && p && pg && i < g->n_shards; i++) {
        const struct gfile *f = &g->shards[i];
        const uintptr_t lo = (uintptr_t)f->map, hi = lo + (uintptr_t)f->size;
        if (!f->map || a < lo || b > hi || b < a)
            continue;
        const uintptr_t x = (a + pg - 1) / pg * pg, y = b / pg * pg;
        if (y <= x || madvise((void *)x, y - x, MADV_DONTNEED) != 0)
            return 0;
        return y - x;
    }
    return 0;
}

int strata_gguf_open(struct strata_gguf **out, const char *path, struct strata_err *err)
{
    return strata_gguf_open_files(out, path, NULL, 0, err);
}

int strata_gguf_open_files(struct strata_gguf **out, const char *path,
                           const struct strata_gguf_mem_file *files, uint32_t n_files,
                           struct strata_err *err)
{
    struct strata_gguf *g = NULL;
    size_t pl;
    unsigned k, n;
    int64_t count = 0;
    int rc;

    *out = NULL;
    if ((rc = new_handle(&g, err)))
        return rc;
    g->mem = files;
    g->n_mem = n_files;
    if ((rc = open_file(g, &g->shards[0], &g->arena, path, err))) {
        if (rc == STRATA_E_NOTFOUND) { /* a file that cannot be opened is an i/o error */
            rc = STRATA_E_IO;
            if (err)
                err->code = rc;
        }
        goto out;
    }
    int r = shard_int(&g->shards[0], "split.count", &count);
    if (r < 0) {
        rc = strata_err_set(err, STRATA_E_FORMAT, "'%s': split.count is not an integer", path);
        goto out;
    }
    if (r > 0 && count < 1) {
        rc = strata_err_set(err, STRATA_E_FORMAT, "'%s': split.count is %lld", path,
                            (long long)count);
        goto out;
    }
    if (count > 1) {
        rc = open_split(g, path, (uint64_t)count, err);
        goto out;
    }
    if (split_name(path, &pl, &k, &n) && n > 1) {
        rc = strata_err_set(err, STRATA_E_FORMAT,
                            "'%s' is named as shard %u of %u but has no split.count > 1", path, k,
                            n);
        goto out;
    }
    g->n_tensors = g->shards[0].n_tensors;
    g->tensors = g->shards[0].tensors;
    rc = build_tensor_index(g, err);
out:
    if (rc)
        strata_gguf_close(g);
    else
        *out = g;
    return rc;
}

int strata_gguf_open_mem(struct strata_gguf **out, const void *buf, size_t size, const char *name,
                         struct strata_err *err)
{
    struct strata_gguf *g = NULL;
    int rc;
    *out = NULL;
    if ((rc = new_handle(&g, err)))
        return rc;
    struct gfile *f = &g->shards[0];
    f->path = arena_strndup(&g->arena, name ? name : "(memory)", strlen(name ? name : "(memory)"));
    f->base = buf;
    f->size = size;
    if (!f->path)
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    else if (size == 0)
        rc = strata_err_set(err, STRATA_E_FORMAT, "'%s': not a gguf file (empty)", f->path);
    else
        rc = parse_file(f, &g->arena, err);
    if (!rc) {
        g->n_tensors = f->n_tensors;
        g->tensors = f->tensors;
        rc = build_tensor_index(g, err);
    }
    if (rc)
        strata_gguf_close(g);
    else
        *out = g;
    return rc;
}

void strata_gguf_close(struct strata_gguf *g)
{
    if (!g)
        return;
    for (uint32_t i = 0; i < g->n_shards; i++)
        unmap_file(&g->shards[i]);
    arena_free(&g->arena);
    free(g);
}

/* ---- accessors ------------------------------------------------------ */

uint32_t strata_gguf_version(const struct strata_gguf *g)
{
    return g->shards[0].version;
}

uint32_t strata_gguf_alignment(const struct strata_gguf *g)
{
    return g->shards[0].alignment;
}

uint32_t strata_gguf_n_shards(const struct strata_gguf *g)
{
    return g->n_shards;
}

const char *strata_gguf_shard_path(const struct strata_gguf *g, uint32_t i)
{
    return i < g->n_shards ? g->shards[i].path : NULL;
}

uint64_t strata_gguf_shard_size(const struct strata_gguf *g, uint32_t i)
{
    return i < g->n_shards ? g->shards[i].size : 0;
}

uint64_t strata_gguf_shard_data_offset(const struct strata_gguf *g, uint32_t i)
{
    return i < g->n_shards ? g->shards[i].data_offset : 0;
}

const void *strata_gguf_shard_base(const struct strata_gguf *g, uint32_t i)
{
    return i < g->n_shards ? g->shards[i].base : NULL;
}

uint64_t strata_gguf_n_kv(const struct strata_gguf *g)
{
    return g->shards[0].n_kv;
}

const struct strata_gguf_kv *strata_gguf_kv_at(const struct strata_gguf *g, uint64_t i)
{
    return i < g->shards[0].n_kv ? &g->shards[0].kvs[i] : NULL;
}

const struct strata_gguf_kv *strata_gguf_find_kv(const struct strata_gguf *g, const char *key)
{
    const struct gfile *f = &g->shards[0];
    int64_t i = index_get(&f->kv_ix, key, kv_name, f->kvs);
    return i < 0 ? NULL : &f->kvs[i];
}

uint64_t strata_gguf_n_tensors(const struct strata_gguf *g)
{
    return g->n_tensors;
}

const struct strata_gguf_tensor *strata_gguf_tensor_at(const struct strata_gguf *g, uint64_t i)
{
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const struct strata_gguf_tensor *strata_gguf_find_tensor(const struct strata_gguf *g,
                                                         const char *name)
{
    int64_t i = index_get(&g->t_ix, name, tensor_name, g->tensors);
    return i < 0 ? NULL : &g->tensors[i];
}

/* ---- typed getters -------------------------------------------------- */

static int lookup(const struct strata_gguf *g, const char *key, const struct strata_gguf_kv **kv,
                  struct strata_err *err)
{
    *kv = strata_gguf_find_kv(g, key);
    if (!*kv)
        return strata_err_set(err, STRATA_E_NOTFOUND, "key '%s' not found in '%s'", key,
                              g->shards[0].path);
    return 0;
}

static int mismatch(const struct strata_gguf *g, const struct strata_gguf_kv *kv, const char *want,
                    struct strata_err *err)
{
    const char *tn = strata_gguf_vtype_name(kv->type);
    return strata_err_set(err, STRATA_E_FORMAT, "key '%s' is %s %s, expected %s (in '%s')", kv->key,
                          strchr("aif", tn[0]) ? "an" : "a", tn, want, g->shards[0].path);
}

static int is_uint(uint32_t t)
{
    return t == STRATA_GGUF_UINT8 || t == STRATA_GGUF_UINT16 || t == STRATA_GGUF_UINT32 ||
           t == STRATA_GGUF_UINT64;
}

static int is_sint(uint32_t t)
{
    return t == STRATA_GGUF_INT8 || t == STRATA_GGUF_INT16 || t == STRATA_GGUF_INT32 ||
           t == STRATA_GGUF_INT64;
}

/* Any integer kv whose value lies in [lo, hi]. */
static int get_int(const struct strata_gguf *g, const char *key, int64_t lo, uint64_t hi,
                   const char *want, uint64_t *u, int64_t *s, struct strata_err *err)
{
    const struct strata_gguf_kv *kv;
    int rc = lookup(g, key, &kv, err);
    if (rc)
        return rc;
    if (is_uint(kv->type)) {
        if (kv->v.u > hi)
            return strata_err_set(err, STRATA_E_FORMAT,
                                  "key '%s' value %llu does not fit %s (in '%s')", key,
                                  (unsigned long long)kv->v.u, want, g->shards[0].path);
        *u = kv->v.u;
        *s = kv->v.u > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)kv->v.u;
        return 0;
    }
    if (is_sint(kv->type)) {
        if (kv->v.i < lo || (kv->v.i > 0 && (uint64_t)kv->v.i > hi))
            return strata_err_set(err, STRATA_E_FORMAT,
                                  "key '%s' value %lld does not fit %s (in '%s')", key,
                                  (long long)kv->v.i, want, g->shards[0].path);
        *s = kv->v.i;
        *u = (uint64_t)kv->v.i;
        return 0;
    }
    return mismatch(g, kv, want, err);
}

int strata_gguf_get_u32(const struct strata_gguf *g, const char *key, uint32_t *out,
                        struct strata_err *err)
{
    uint64_t u;
    int64_t s;
    int rc = get_int(g, key, 0, UINT32_MAX, "u32", &u, &s, err);
    if (!rc)
        *out = (uint32_t)u;
    return rc;
}

int strata_gguf_get_i32(const struct strata_gguf *g, const char *key, int32_t *out,
                        struct strata_err *err)
{
    uint64_t u;
    int64_t s;
    int rc = get_int(g, key, INT32_MIN, INT32_MAX, "i32", &u, &s, err);
    if (!rc)
        *out = (int32_t)s;
    return rc;
}

int strata_gguf_get_u64(const struct strata_gguf *g, const char *key, uint64_t *out,
                        struct strata_err *err)
{
    uint64_t u;
    int64_t s;
    int rc = get_int(g, key, 0, UINT64_MAX, "u64", &u, &s, err);
    if (!rc)
        *out = u;
    return rc;
}

int strata_gguf_get_f32(const struct strata_gguf *g, const char *key, float *out,
                        struct strata_err *err)
{
    const struct strata_gguf_kv *kv;
    int rc = lookup(g, key, &kv, err);
    if (rc)
        return rc;
    if (kv->type == STRATA_GGUF_FLOAT32 || kv->type == STRATA_GGUF_FLOAT64)
        *out = (float)kv->v.f;
    else if (is_uint(kv->type))
        *out = (float)kv->v.u;
    else if (is_sint(kv->type))
        *out = (float)kv->v.i;
    else
        return mismatch(g, kv, "f32", err);
    return 0;
}

int strata_gguf_get_bool(const struct strata_gguf *g, const char *key, int *out,
                         struct strata_err *err)
{
    const struct strata_gguf_kv *kv;
    int rc = lookup(g, key, &kv, err);
    if (rc)
        return rc;
    if (kv->type != STRATA_GGUF_BOOL)
        return mismatch(g, kv, "bool", err);
    *out = kv->v.b;
    return 0;
}

int strata_gguf_get_str(const struct strata_gguf *g, const char *key, const char **out,
                        struct strata_err *err)
{
    const struct strata_gguf_kv *kv;
    int rc = lookup(g, key, &kv, err);
    if (rc)
        return rc;
    if (kv->type != STRATA_GGUF_STRING)
        return mismatch(g, kv, "string", err);
    *out = g->shards[0].kv_cstr[kv - g->shards[0].kvs];
    return 0;
}

int strata_gguf_get_arr(const struct strata_gguf *g, const char *key, int want_type,
                        const struct strata_gguf_arr **out, struct strata_err *err)
{
    const struct strata_gguf_kv *kv;
    int rc = lookup(g, key, &kv, err);
    if (rc)
        return rc;
    if (kv->type != STRATA_GGUF_ARRAY) {
        char want[48];
        snprintf(want, sizeof(want), "array of %s",
                 want_type < 0 ? "any" : strata_gguf_vtype_name((uint32_t)want_type));
        return mismatch(g, kv, want, err);
    }
    if (want_type >= 0 && kv->v.arr.type != (uint32_t)want_type)
        return strata_err_set(err, STRATA_E_FORMAT,
                              "key '%s' is an array of %s, expected an array of %s (in '%s')", key,
                              strata_gguf_vtype_name(kv->v.arr.type),
                              strata_gguf_vtype_name((uint32_t)want_type), g->shards[0].path);
    *out = &kv->v.arr;
    return 0;
}

/* Saturating, NaN -> 0: a float-to-int cast out of range is undefined. */
static int64_t f2i(double x)
{
    if (!(x == x))
        return 0;
    if (x >= 9223372036854775807.0)
        return INT64_MAX;
    if (x <= -9223372036854775808.0)
        return INT64_MIN;
    return (int64_t)x;
}

double strata_gguf_arr_f64(const struct strata_gguf_arr *a, uint64_t i)
{
    if (!a || i >= a->n)
        return 0;
    switch (a->type) {
    case STRATA_GGUF_FLOAT32: {
        float x;
        memcpy(&x, (const char *)a->data + i * 4, 4);
        return x;
    }
    case STRATA_GGUF_FLOAT64: {
        double x;
        memcpy(&x, (const char *)a->data + i * 8, 8);
        return x;
    }
    case STRATA_GGUF_UINT64: {
        uint64_t x;
        memcpy(&x, (const char *)a->data + i * 8, 8);
        return (double)x;
    }
    default:
        return (double)strata_gguf_arr_i64(a, i);
    }
}

int64_t strata_gguf_arr_i64(const struct strata_gguf_arr *a, uint64_t i)
{
    if (!a || i >= a->n)
        return 0;
    const char *p = a->data;
    switch (a->type) {
    case STRATA_GGUF_UINT8:
    case STRATA_GGUF_BOOL:
        return (uint8_t)p[i];
    case STRATA_GGUF_INT8:
        return (int8_t)p[i];
    case STRATA_GGUF_UINT16: {
        uint16_t x;
        memcpy(&x, p + i * 2, 2);
        return x;
    }
    case STRATA_GGUF_INT16: {
        int16_t x;
        memcpy(&x, p + i * 2, 2);
        return x;
    }
    case STRATA_GGUF_UINT32: {
        uint32_t x;
        memcpy(&x, p + i * 4, 4);
        return x;
    }
    case STRATA_GGUF_INT32: {
        int32_t x;
        memcpy(&x, p + i * 4, 4);
        return x;
    }
    case STRATA_GGUF_UINT64: {
        uint64_t x;
        memcpy(&x, p + i * 8, 8);
        return (int64_t)x;
    }
    case STRATA_GGUF_INT64: {
        int64_t x;
        memcpy(&x, p + i * 8, 8);
        return x;
    }
    case STRATA_GGUF_FLOAT32: {
        float x;
        memcpy(&x, p + i * 4, 4);
        return f2i(x);
    }
    case STRATA_GGUF_FLOAT64: {
        double x;
        memcpy(&x, p + i * 8, 8);
        return f2i(x);
    }
    default:
        return 0;
    }
}
