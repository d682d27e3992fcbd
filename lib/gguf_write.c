/* gguf_write.c - the GGUF writer: key/values encoded as added, tensors laid
 * out at write time (ggml/docs/gguf.md). */
#include "gguf_write.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct wtensor {
    char *name;
    uint32_t type, n_dims;
    uint64_t ne[4];
    uint64_t n_bytes;
    const void *data;
};

struct buf {
    uint8_t *p;
    size_t len, cap;
    int oom;
};

struct strata_gguf_writer {
    uint32_t version, alignment;
    struct buf meta; /* encoded key/values */
    char **keys;     /* added keys, for duplicate checks */
    uint64_t n_kv, cap_kv;
    size_t align_pos; /* offset in meta of general.alignment's value; 0 = absent */
    struct wtensor *tensors;
    uint64_t n_tensors, cap_tensors;
};

static void buf_put(struct buf *b, const void *p, size_t n)
{
    if (b->oom)
        return;
    if (b->cap - b->len < n) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->len < n) {
            if (cap > SIZE_MAX / 2) {
                b->oom = 1;
                return;
            }
            cap *= 2;
        }
        uint8_t *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->len, p, n);
    b->len += n;
}

static void buf_u32(struct buf *b, uint32_t v)
{
    buf_put(b, &v, 4);
}

static void buf_u64(struct buf *b, uint64_t v)
{
    buf_put(b, &v, 8);
}

static void buf_str(struct buf *b, const char *s, uint64_t len)
{
    buf_u64(b, len);
    buf_put(b, s, len);
}

int strata_gguf_writer_create(struct strata_gguf_writer **out, struct strata_err *err)
{
    struct strata_gguf_writer *w = calloc(1, sizeof(*w));
    *out = NULL;
    if (!w)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    w->version = 3;
    w->alignment = STRATA_GGUF_DEFAULT_ALIGNMENT;
    *out = w;
    return 0;
}

void strata_gguf_writer_free(struct strata_gguf_writer *w)
{
    if (!w)
        return;
    for (uint64_t i = 0; i < w->n_kv; i++)
        free(w->keys[i]);
    free(w->keys);
    for (uint64_t i = 0; i < w->n_tensors; i++)
        free(w->tensors[i].name);
    free(w->tensors);
    free(w->meta.p);
    free(w);
}

void strata_gguf_writer_set_version(struct strata_gguf_writer *w, uint32_t version)
{
    w->version = version;
}

uint64_t strata_gguf_writer_n_kv(const struct strata_gguf_writer *w)
{
    return w->n_kv;
}

uint64_t strata_gguf_writer_n_tensors(const struct strata_gguf_writer *w)
{
    return w->n_tensors;
}

int strata_gguf_writer_has_key(const struct strata_gguf_writer *w, const char *key)
{
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->keys[i], key) == 0)
            return 1;
    return 0;
}

/* Check and record key, then encode it and its type. */
static int begin_kv(struct strata_gguf_writer *w, const char *key, uint32_t type,
                    struct strata_err *err)
{
    if (!key || !*key)
        return strata_err_set(err, STRATA_E_INVALID, "gguf writer: empty key");
    if (strata_gguf_writer_has_key(w, key))
        return strata_err_set(err, STRATA_E_INVALID, "gguf writer: duplicate key '%s'", key);
    if (w->n_kv == w->cap_kv) {
        uint64_t cap = w->cap_kv ? 2 * w->cap_kv : 32;
        char **k = realloc(w->keys, cap * sizeof(*k));
        if (!k)
            return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        w->keys = k;
        w->cap_kv = cap;
    }
    if (!(w->keys[w->n_kv] = strdup(key)))
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    w->n_kv++;
    buf_str(&w->meta, key, strlen(key));
    buf_u32(&w->meta, type);
    return 0;
}

static int end_kv(struct strata_gguf_writer *w, const char *key, struct strata_err *err)
{
    if (w->meta.oom)
        return strata_err_set(err, STRATA_E_NOMEM, "gguf writer: out of memory at key '%s'", key);
    return 0;
}

static int add_fixed(struct strata_gguf_writer *w, const char *key, uint32_t type, const void *v,
                     size_t n, struct strata_err *err)
{
    int rc = begin_kv(w, key, type, err);
    if (rc)
        return rc;
    buf_put(&w->meta, v, n);
    return end_kv(w, key, err);
}

static int is_pow2(uint64_t a)
{
    return a && !(a & (a - 1));
}

int strata_gguf_writer_set_alignment(struct strata_gguf_writer *w, uint32_t alignment,
                                     struct strata_err *err)
{
    if (!is_pow2(alignment))
        return strata_err_set(err, STRATA_E_INVALID,
                              "gguf writer: alignment %u is not a power of two", alignment);
    w->alignment = alignment;
    if (w->align_pos) {
        memcpy(w->meta.p + w->align_pos, &alignment, 4);
        return 0;
    }
    int rc = add_fixed(w, "general.alignment", STRATA_GGUF_UINT32, &alignment, 4, err);
    if (!rc)
        w->align_pos = w->meta.len - 4;
    return rc;
}

#define ADD_SCALAR(suffix, ctype, vtype)                                                           \
    int strata_gguf_writer_add_##suffix(struct strata_gguf_writer *w, const char *key, ctype v,    \
                                        struct strata_err *err)                                    \
    {                                                                                              \
        return add_fixed(w, key, vtype, &v, sizeof(v), err);                                       \
    }

ADD_SCALAR(u8, uint8_t, STRATA_GGUF_UINT8)
ADD_SCALAR(i8, int8_t, STRATA_GGUF_INT8)
ADD_SCALAR(u16, uint16_t, STRATA_GGUF_UINT16)
ADD_SCALAR(i16, int16_t, STRATA_GGUF_INT16)
ADD_SCALAR(i32, int32_t, STRATA_GGUF_INT32)
ADD_SCALAR(u64, uint64_t, STRATA_GGUF_UINT64)
ADD_SCALAR(i64, int64_t, STRATA_GGUF_INT64)
ADD_SCALAR(f32, float, STRATA_GGUF_FLOAT32)
ADD_SCALAR(f64, double, STRATA_GGUF_FLOAT64)

int strata_gguf_writer_add_u32(struct strata_gguf_writer *w, const char *key, uint32_t v,
                               struct strata_err *err)
{
    if (key && strcmp(key, "general.alignment") == 0)
        return strata_gguf_writer_set_alignment(w, v, err);
    return add_fixed(w, key, STRATA_GGUF_UINT32, &v, 4, err);
}

int strata_gguf_writer_add_bool(struct strata_gguf_writer *w, const char *key, int v,
                                struct strata_err *err)
{
    uint8_t b = v != 0;
    return add_fixed(w, key, STRATA_GGUF_BOOL, &b, 1, err);
}

int strata_gguf_writer_add_strn(struct strata_gguf_writer *w, const char *key, const char *s,
                                uint64_t len, struct strata_err *err)
{
    int rc = begin_kv(w, key, STRATA_GGUF_STRING, err);
    if (rc)
        return rc;
    buf_str(&w->meta, s, len);
    return end_kv(w, key, err);
}

int strata_gguf_writer_add_str(struct strata_gguf_writer *w, const char *key, const char *s,
                               struct strata_err *err)
{
    return strata_gguf_writer_add_strn(w, key, s, strlen(s), err);
}

int strata_gguf_writer_add_arr(struct strata_gguf_writer *w, const char *key, uint32_t elem_type,
                               const void *data, uint64_t n, struct strata_err *err)
{
    uint64_t es = strata_gguf_vtype_size(elem_type);
    if (!es)
        return strata_err_set(err, STRATA_E_INVALID,
                              "gguf writer: key '%s': element type %s is not a fixed-size type",
                              key ? key : "", strata_gguf_vtype_name(elem_type));
    if (n > SIZE_MAX / es)
        return strata_err_set(err, STRATA_E_NOMEM, "gguf writer: key '%s': array too large",
                              key ? key : "");
    int rc = begin_kv(w, key, STRATA_GGUF_ARRAY, err);
    if (rc)
        return rc;
    buf_u32(&w->meta, elem_type);
    buf_u64(&w->meta, n);
    buf_put(&w->meta, data, (size_t)(n * es));
    return end_kv(w, key, err);
}

int strata_gguf_writer_add_arr_str(struct strata_gguf_writer *w, const char *key,
                                   const char *const *strs, uint64_t n, struct strata_err *err)
{
    int rc = begin_kv(w, key, STRATA_GGUF_ARRAY, err);
    if (rc)
        return rc;
    buf_u32(&w->meta, STRATA_GGUF_STRING);
    buf_u64(&w->meta, n);
    for (uint64_t i = 0; i < n; i++)
        buf_str(&w->meta, strs[i], strlen(strs[i]));
    return end_kv(w, key, err);
}

/* Encode an array value (type, count, elements), recursing into nested ones. */
static int put_arr(struct buf *b, const struct strata_gguf_arr *a, int depth, const char *key,
                   struct strata_err *err)
{
    if (depth > 64)
        return strata_err_set(err, STRATA_E_INVALID, "gguf writer: key '%s' nests too deep", key);
    buf_u32(b, a->type);
    buf_u64(b, a->n);
    uint64_t es = strata_gguf_vtype_size(a->type);
    if (es) {
        if (a->n > SIZE_MAX / es)
            return strata_err_set(err, STRATA_E_NOMEM, "gguf writer: key '%s' too large", key);
        buf_put(b, a->data, (size_t)(a->n * es));
        return 0;
    }
    if (a->type == STRATA_GGUF_STRING) {
        for (uint64_t i = 0; i < a->n; i++)
            buf_str(b, a->strs[i].ptr, a->strs[i].len);
        return 0;
    }
    if (a->type == STRATA_GGUF_ARRAY) {
        for (uint64_t i = 0; i < a->n; i++) {
            int rc = put_arr(b, &a->arrs[i], depth + 1, key, err);
            if (rc)
                return rc;
        }
        return 0;
    }
    return strata_err_set(err, STRATA_E_INVALID, "gguf writer: key '%s': element type %u unknown",
                          key, a->type);
}

int strata_gguf_writer_add_arr_value(struct strata_gguf_writer *w, const char *key,
                                     const struct strata_gguf_arr *arr, struct strata_err *err)
{
    int rc = begin_kv(w, key, STRATA_GGUF_ARRAY, err);
    if (rc)
        return rc;
    if ((rc = put_arr(&w->meta, arr, 0, key, err)))
        return rc;
    return end_kv(w, key, err);
}

int strata_gguf_writer_add_kv(struct strata_gguf_writer *w, const struct strata_gguf_kv *kv,
                              struct strata_err *err)
{
    switch (kv->type) {
    case STRATA_GGUF_UINT8:
        return strata_gguf_writer_add_u8(w, kv->key, (uint8_t)kv->v.u, err);
    case STRATA_GGUF_INT8:
        return strata_gguf_writer_add_i8(w, kv->key, (int8_t)kv->v.i, err);
    case STRATA_GGUF_UINT16:
        return strata_gguf_writer_add_u16(w, kv->key, (uint16_t)kv->v.u, err);
    case STRATA_GGUF_INT16:
        return strata_gguf_writer_add_i16(w, kv->key, (int16_t)kv->v.i, err);
    case STRATA_GGUF_UINT32:
        return strata_gguf_writer_add_u32(w, kv->key, (uint32_t)kv->v.u, err);
    case STRATA_GGUF_INT32:
        return strata_gguf_writer_add_i32(w, kv->key, (int32_t)kv->v.i, err);
    case STRATA_GGUF_UINT64:
        return strata_gguf_writer_add_u64(w, kv->key, kv->v.u, err);
    case STRATA_GGUF_INT64:
        return strata_gguf_writer_add_i64(w, kv->key, kv->v.i, err);
    case STRATA_GGUF_FLOAT32:
        return strata_gguf_writer_add_f32(w, kv->key, (float)kv->v.f, err);
    case STRATA_GGUF_FLOAT64:
        return strata_gguf_writer_add_f64(w, kv->key, kv->v.f, err);
    case STRATA_GGUF_BOOL:
        return strata_gguf_writer_add_bool(w, kv->key, kv->v.b, err);
    case STRATA_GGUF_STRING:
        return strata_gguf_writer_add_strn(w, kv->key, kv->v.str.ptr, kv->v.str.len, err);
    case STRATA_GGUF_ARRAY:
        return strata_gguf_writer_add_arr_value(w, kv->key, &kv->v.arr, err);
    default:
        return strata_err_set(err, STRATA_E_INVALID, "gguf writer: key '%s': value type %u unknown",
                              kv->key, kv->type);
    }
}

int strata_gguf_writer_add_tensor(struct strata_gguf_writer *w, const char *name, uint32_t type,
                                  uint32_t n_dims, const uint64_t *ne, const void *data,
                                  struct strata_err *err)
{
    struct wtensor t = {0};
    if (!name || !*name)
        return strata_err_set(err, STRATA_E_INVALID, "gguf writer: empty tensor name");
    for (uint64_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return strata_err_set(err, STRATA_E_INVALID, "gguf writer: duplicate tensor '%s'",
                                  name);
    if (!strata_ggml_type_known(type))
        return strata_err_set(err, STRATA_E_UNSUPPORTED,
                              "gguf writer: tensor '%s' has unknown type id %u", name, type);
    if (n_dims < 1 || n_dims > 4)
        return strata_err_set(err, STRATA_E_INVALID, "gguf writer: tensor '%s': n_dims %u", name,
                              n_dims);
    uint64_t bs = strata_ggml_blck_size(type), ts = strata_ggml_type_size(type);
    t.n_bytes = 1;
    for (uint32_t d = 0; d < 4; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        uint64_t f = d == 0 ? t.ne[0] / bs * ts : t.ne[d];
        if (t.ne[d] == 0 || t.ne[d] > (uint64_t)INT64_MAX || (d == 0 && t.ne[0] % bs) ||
            (f && t.n_bytes > UINT64_MAX / f))
            return strata_err_set(err, STRATA_E_INVALID,
                                  "gguf writer: tensor '%s': bad ne[%u] = %llu for %s", name, d,
                                  (unsigned long long)t.ne[d], strata_ggml_type_name(type));
        t.n_bytes *= f;
    }
    if (w->n_tensors == w->cap_tensors) {
        uint64_t cap = w->cap_tensors ? 2 * w->cap_tensors : 16;
        struct wtensor *p = realloc(w->tensors, cap * sizeof(*p));
        if (!p)
            return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        w->tensors = p;
        w->cap_tensors = cap;
    }
    if (!(t.name = strdup(name)))
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    t.type = type;
    t.n_dims = n_dims;
    t.data = data;
    w->tensors[w->n_tensors++] = t;
    return 0;
}

/* ---- output --------------------------------------------------------- */

struct sink {
    FILE *f;      /* file output, or */
    struct buf b; /* memory output */
    int failed;
};

static void sink_put(struct sink *s, const void *p, size_t n)
{
    if (s->failed || n == 0)
        return;
    if (s->f) {
        if (fwrite(p, 1, n, s->f) != n)
            s->failed = 1;
    } else {
        buf_put(&s->b, p, n);
        s->failed = s->b.oom;
    }
}

static void sink_zeros(struct sink *s, uint64_t n)
{
    static const uint8_t z[4096];
    while (n && !s->failed) {
        size_t k = n < sizeof(z) ? (size_t)n : sizeof(z);
        sink_put(s, z, k);
        n -= k;
    }
}

static uint64_t pad_to(uint64_t x, uint64_t a)
{
    return (a - x % a) % a;
}

static void emit(const struct strata_gguf_writer *w, struct sink *s)
{
    struct buf hdr = {0};
    buf_put(&hdr, "GGUF", 4);
    buf_u32(&hdr, w->version);
    buf_u64(&hdr, w->n_tensors);
    buf_u64(&hdr, w->n_kv);
    if (hdr.oom)
        s->failed = 1;
    sink_put(s, hdr.p, hdr.len);
    uint64_t pos = hdr.len;
    free(hdr.p);
    sink_put(s, w->meta.p, w->meta.len);
    pos += w->meta.len;

    uint64_t off = 0;
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        const struct wtensor *t = &w->tensors[i];
        struct buf ti = {0};
        buf_str(&ti, t->name, strlen(t->name));
        buf_u32(&ti, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            buf_u64(&ti, t->ne[d]);
        buf_u32(&ti, t->type);
        buf_u64(&ti, off);
        if (ti.oom)
            s->failed = 1;
        sink_put(s, ti.p, ti.len);
        pos += ti.len;
        free(ti.p);
        off += t->n_bytes + pad_to(t->n_bytes, w->alignment);
    }
    sink_zeros(s, pad_to(pos, w->alignment));
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        const struct wtensor *t = &w->tensors[i];
        if (t->data) {
            /* fwrite in pieces: a tensor may exceed what one call takes */
            const uint8_t *p = t->data;
            for (uint64_t k = 0; k < t->n_bytes && !s->failed;) {
                size_t c = t->n_bytes - k > (1u << 30) ? (1u << 30) : (size_t)(t->n_bytes - k);
                sink_put(s, p + k, c);
                k += c;
            }
        } else {
            sink_zeros(s, t->n_bytes);
        }
        sink_zeros(s, pad_to(t->n_bytes, w->alignment));
    }
}

int strata_gguf_writer_write_file(const struct strata_gguf_writer *w, const char *path,
                                  struct strata_err *err)
{
    struct sink s = {0};
    if (w->meta.oom)
        return strata_err_set(err, STRATA_E_NOMEM, "gguf writer: out of memory");
    s.f = fopen(path, "wb");
    if (!s.f)
        return strata_err_set(err, STRATA_E_IO, "cannot create '%s': %s", path, strerror(errno));
    emit(w, &s);
    int e = s.failed ? errno : 0;
    if (fclose(s.f) != 0 && !s.failed) {
        s.failed = 1;
        e = errno;
    }
    if (s.failed) {
        unlink(path);
        return strata_err_set(err, STRATA_E_IO, "cannot write '%s': %s", path,
                              e ? strerror(e) : "write failed");
    }
    return 0;
}

int strata_gguf_writer_write_mem(const struct strata_gguf_writer *w, void **buf, size_t *size,
                                 struct strata_err *err)
{
    struct sink s = {0};
    *buf = NULL;
    *size = 0;
    if (w->meta.oom)
        return strata_err_set(err, STRATA_E_NOMEM, "gguf writer: out of memory");
    emit(w, &s);
    if (s.failed) {
        free(s.b.p);
        return strata_err_set(err, STRATA_E_NOMEM, "gguf writer: out of memory");
    }
    *buf = s.b.p;
    *size = s.b.len;
    return 0;
}
