/* gguf_dump.c - text and JSON dumps of a GGUF's metadata and tensors. */
#include "gguf_dump.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static const struct strata_gguf_dump_opts default_opts = STRATA_GGUF_DUMP_OPTS_DEFAULT;

/* ---- text ----------------------------------------------------------- */

static void put_str(FILE *f, const char *s, uint64_t len, uint64_t max)
{
    uint64_t n = max && len > max ? max : len;
    fputc('\'', f);
    for (uint64_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '\n':
            fputs("\\n", f);
            break;
        case '\t':
            fputs("\\t", f);
            break;
        case '\r':
            fputs("\\r", f);
            break;
        case '\\':
            fputs("\\\\", f);
            break;
        case '\'':
            fputs("\\'", f);
            break;
        default:
            if (c < 0x20 || c == 0x7f)
                fprintf(f, "\\x%02x", c);
            else
                fputc(c, f);
        }
    }
    fputc('\'', f);
    if (n < len)
        fprintf(f, "... (%" PRIu64 " bytes)", len);
}

static void put_elem(FILE *f, const struct strata_gguf_arr *a, uint64_t i,
                     const struct strata_gguf_dump_opts *o);

static void put_arr(FILE *f, const struct strata_gguf_arr *a, const struct strata_gguf_dump_opts *o)
{
    uint64_t n = o->max_array_items && a->n > o->max_array_items ? o->max_array_items : a->n;
    fputc('[', f);
    for (uint64_t i = 0; i < n; i++) {
        if (i)
            fputs(", ", f);
        put_elem(f, a, i, o);
    }
    if (n < a->n)
        fprintf(f, "%s... (%" PRIu64 " more)", n ? ", " : "", a->n - n);
    fputc(']', f);
}

static void put_elem(FILE *f, const struct strata_gguf_arr *a, uint64_t i,
                     const struct strata_gguf_dump_opts *o)
{
    switch (a->type) {
    case STRATA_GGUF_STRING:
        put_str(f, a->strs[i].ptr, a->strs[i].len, o->max_str_bytes);
        break;
    case STRATA_GGUF_ARRAY:
        fprintf(f, "array[%s; %" PRIu64 "] ", strata_gguf_vtype_name(a->arrs[i].type),
                a->arrs[i].n);
        put_arr(f, &a->arrs[i], o);
        break;
    case STRATA_GGUF_BOOL:
        fputs(strata_gguf_arr_i64(a, i) ? "true" : "false", f);
        break;
    case STRATA_GGUF_FLOAT32:
        fprintf(f, "%.9g", strata_gguf_arr_f64(a, i));
        break;
    case STRATA_GGUF_FLOAT64:
        fprintf(f, "%.17g", strata_gguf_arr_f64(a, i));
        break;
    case STRATA_GGUF_UINT64: {
        uint64_t v;
        memcpy(&v, (const char *)a->data + i * 8, 8);
        fprintf(f, "%" PRIu64, v);
        break;
    }
    default:
        fprintf(f, "%" PRId64, strata_gguf_arr_i64(a, i));
        break;
    }
}

static void put_value(FILE *f, const struct strata_gguf_kv *kv,
                      const struct strata_gguf_dump_opts *o)
{
    switch (kv->type) {
    case STRATA_GGUF_UINT8:
    case STRATA_GGUF_UINT16:
    case STRATA_GGUF_UINT32:
    case STRATA_GGUF_UINT64:
        fprintf(f, "%" PRIu64, kv->v.u);
        break;
    case STRATA_GGUF_INT8:
    case STRATA_GGUF_INT16:
    case STRATA_GGUF_INT32:
    case STRATA_GGUF_INT64:
        fprintf(f, "%" PRId64, kv->v.i);
        break;
    case STRATA_GGUF_FLOAT32:
        fprintf(f, "%.9g", kv->v.f);
        break;
    case STRATA_GGUF_FLOAT64:
        fprintf(f, "%.17g", kv->v.f);
        break;
    case STRATA_GGUF_BOOL:
        fputs(kv->v.b ? "true" : "false", f);
        break;
    case STRATA_GGUF_STRING:
        put_str(f, kv->v.str.ptr, kv->v.str.len, o->max_str_bytes);
        break;
    case STRATA_GGUF_ARRAY:
        put_arr(f, &kv->v.arr, o);
        break;
    default:
        fputs("?", f);
        break;
    }
}

static void put_shape(FILE *f, const struct strata_gguf_tensor *t)
{
    fputc('[', f);
    for (uint32_t d = 0; d < t->n_dims; d++)
        fprintf(f, "%s%" PRIu64, d ? ", " : "", t->ne[d]);
    fputc(']', f);
}

int strata_gguf_dump_text(const struct strata_gguf *g, FILE *out,
                          const struct strata_gguf_dump_opts *opts, struct strata_err *err)
{
    const struct strata_gguf_dump_opts *o = opts ? opts : &default_opts;
    fprintf(out, "file: %s\n", strata_gguf_shard_path(g, 0));
    fprintf(out, "version: %u\n", strata_gguf_version(g));
    fprintf(out, "alignment: %u\n", strata_gguf_alignment(g));
    fprintf(out, "shards: %u\n", strata_gguf_n_shards(g));
    for (uint32_t i = 0; i < strata_gguf_n_shards(g); i++)
        fprintf(out, "  shard %u: %s (%" PRIu64 " bytes, data at %" PRIu64 ")\n", i,
                strata_gguf_shard_path(g, i), strata_gguf_shard_size(g, i),
                strata_gguf_shard_data_offset(g, i));
    fprintf(out, "metadata: %" PRIu64 " keys\n", strata_gguf_n_kv(g));
    for (uint64_t i = 0; i < strata_gguf_n_kv(g); i++) {
        const struct strata_gguf_kv *kv = strata_gguf_kv_at(g, i);
        fprintf(out, "  %s: ", kv->key);
        if (kv->type == STRATA_GGUF_ARRAY)
            fprintf(out, "array[%s; %" PRIu64 "]", strata_gguf_vtype_name(kv->v.arr.type),
                    kv->v.arr.n);
        else
            fputs(strata_gguf_vtype_name(kv->type), out);
        fputs(" = ", out);
        put_value(out, kv, o);
        fputc('\n', out);
    }
    fprintf(out, "tensors: %" PRIu64 "\n", strata_gguf_n_tensors(g));
    for (uint64_t i = 0; i < strata_gguf_n_tensors(g); i++) {
        const struct strata_gguf_tensor *t = strata_gguf_tensor_at(g, i);
        fprintf(out, "  %" PRIu64 ": %s %s ", i, t->name, strata_ggml_type_name(t->type));
        put_shape(out, t);
        fprintf(out, " %" PRIu64 " bytes @ %" PRIu64 " (shard %u)\n", t->n_bytes, t->offset,
                t->shard);
    }
    if (fflush(out) != 0 || ferror(out))
        return strata_err_set(err, STRATA_E_IO, "cannot write the dump of '%s'",
                              strata_gguf_shard_path(g, 0));
    return 0;
}

/* ---- JSON ----------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s (n bytes left), or 0. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    size_t len;
    uint32_t cp;
    if (s[0] < 0x80)
        return s[0] ? 1 : 0;
    if ((s[0] & 0xe0) == 0xc0) {
        len = 2;
        cp = s[0] & 0x1f;
    } else if ((s[0] & 0xf0) == 0xe0) {
        len = 3;
        cp = s[0] & 0x0f;
    } else if ((s[0] & 0xf8) == 0xf0) {
        len = 4;
        cp = s[0] & 0x07;
    } else {
        return 0;
    }
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

/* A JSON string of the bytes: invalid UTF-8 and NUL bytes become U+FFFD
 * (JSON text must be UTF-8, and cJSON strings end at NUL). */
static cJSON *json_str(const char *s, uint64_t len)
{
    if (len > SIZE_MAX / 3 - 1)
        return NULL;
    char *buf = malloc((size_t)len * 3 + 1), *p = buf;
    if (!buf)
        return NULL;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        size_t k = utf8_seq(u + i, (size_t)len - i);
        if (k) {
            memcpy(p, u + i, k);
            p += k;
            i += k;
        } else {
            memcpy(p, "\xef\xbf\xbd", 3);
            p += 3;
            i++;
        }
    }
    *p = 0;
    cJSON *j = cJSON_CreateString(buf);
    free(buf);
    return j;
}

static cJSON *json_u64(uint64_t v)
{
    char b[32];
    snprintf(b, sizeof(b), "%" PRIu64, v);
    return cJSON_CreateRaw(b);
}

static cJSON *json_i64(int64_t v)
{
    char b[32];
    snprintf(b, sizeof(b), "%" PRId64, v);
    return cJSON_CreateRaw(b);
}

static cJSON *json_arr(const struct strata_gguf_arr *a, const struct strata_gguf_dump_opts *o);

static cJSON *json_elem(const struct strata_gguf_arr *a, uint64_t i,
                        const struct strata_gguf_dump_opts *o)
{
    switch (a->type) {
    case STRATA_GGUF_STRING:
        return json_str(a->strs[i].ptr, a->strs[i].len);
    case STRATA_GGUF_ARRAY:
        return json_arr(&a->arrs[i], o);
    case STRATA_GGUF_BOOL:
        return cJSON_CreateBool(strata_gguf_arr_i64(a, i) != 0);
    case STRATA_GGUF_FLOAT32:
    case STRATA_GGUF_FLOAT64:
        return cJSON_CreateNumber(strata_gguf_arr_f64(a, i));
    case STRATA_GGUF_UINT64: {
        uint64_t v;
        memcpy(&v, (const char *)a->data + i * 8, 8);
        return json_u64(v);
    }
    default:
        return json_i64(strata_gguf_arr_i64(a, i));
    }
}

/* Add "elem_type", "n", "value": [first items], "truncated" to object j. */
static int json_arr_fields(cJSON *j, const struct strata_gguf_arr *a,
                           const struct strata_gguf_dump_opts *o)
{
    uint64_t n = o->max_array_items && a->n > o->max_array_items ? o->max_array_items : a->n;
    cJSON *items;
    cJSON_AddItemToObject(j, "elem_type", cJSON_CreateString(strata_gguf_vtype_name(a->type)));
    cJSON_AddItemToObject(j, "n", json_u64(a->n));
    if (!(items = cJSON_AddArrayToObject(j, "value")))
        return -1;
    for (uint64_t i = 0; i < n; i++) {
        cJSON *e = json_elem(a, i, o);
        if (!e || !cJSON_AddItemToArray(items, e)) {
            cJSON_Delete(e);
            return -1;
        }
    }
    return cJSON_AddBoolToObject(j, "truncated", n < a->n) ? 0 : -1;
}

static cJSON *json_arr(const struct strata_gguf_arr *a, const struct strata_gguf_dump_opts *o)
{
    cJSON *j = cJSON_CreateObject();
    if (j && json_arr_fields(j, a, o) != 0) {
        cJSON_Delete(j);
        j = NULL;
    }
    return j;
}

static cJSON *json_kv(const struct strata_gguf_kv *kv, const struct strata_gguf_dump_opts *o)
{
    cJSON *j = cJSON_CreateObject(), *v = NULL;
    if (!j)
        return NULL;
    cJSON_AddItemToObject(j, "key", cJSON_CreateString(kv->key));
    cJSON_AddItemToObject(j, "type", cJSON_CreateString(strata_gguf_vtype_name(kv->type)));
    switch (kv->type) {
    case STRATA_GGUF_UINT8:
    case STRATA_GGUF_UINT16:
    case STRATA_GGUF_UINT32:
    case STRATA_GGUF_UINT64:
        v = json_u64(kv->v.u);
        break;
    case STRATA_GGUF_INT8:
    case STRATA_GGUF_INT16:
    case STRATA_GGUF_INT32:
    case STRATA_GGUF_INT64:
        v = json_i64(kv->v.i);
        break;
    case STRATA_GGUF_FLOAT32:
    case STRATA_GGUF_FLOAT64:
        v = cJSON_CreateNumber(kv->v.f);
        break;
    case STRATA_GGUF_BOOL:
        v = cJSON_CreateBool(kv->v.b);
        break;
    case STRATA_GGUF_STRING:
        v = json_str(kv->v.str.ptr, kv->v.str.len);
        break;
    case STRATA_GGUF_ARRAY:
        if (json_arr_fields(j, &kv->v.arr, o) != 0) {
            cJSON_Delete(j);
            return NULL;
        }
        return j;
    }
    if (!v) {
        cJSON_Delete(j);
        return NULL;
    }
    cJSON_AddItemToObject(j, "value", v);
    return j;
}

int strata_gguf_dump_json(const struct strata_gguf *g, const struct strata_gguf_dump_opts *opts,
                          cJSON **out, struct strata_err *err)
{
    const struct strata_gguf_dump_opts *o = opts ? opts : &default_opts;
    cJSON *root = cJSON_CreateObject(), *shards = NULL, *meta = NULL, *tensors = NULL;
    *out = NULL;
    if (!root)
        goto nomem;
    cJSON_AddItemToObject(
        root, "file", json_str(strata_gguf_shard_path(g, 0), strlen(strata_gguf_shard_path(g, 0))));
    cJSON_AddItemToObject(root, "version", json_u64(strata_gguf_version(g)));
    cJSON_AddItemToObject(root, "alignment", json_u64(strata_gguf_alignment(g)));
    if (!(shards = cJSON_AddArrayToObject(root, "shards")))
        goto nomem;
    for (uint32_t i = 0; i < strata_gguf_n_shards(g); i++) {
        cJSON *s = cJSON_CreateObject();
        if (!s || !cJSON_AddItemToArray(shards, s)) {
            cJSON_Delete(s);
            goto nomem;
        }
        const char *p = strata_gguf_shard_path(g, i);
        cJSON_AddItemToObject(s, "path", json_str(p, strlen(p)));
        cJSON_AddItemToObject(s, "size", json_u64(strata_gguf_shard_size(g, i)));
        cJSON_AddItemToObject(s, "data_offset", json_u64(strata_gguf_shard_data_offset(g, i)));
    }
    if (!(meta = cJSON_AddArrayToObject(root, "metadata")))
        goto nomem;
    for (uint64_t i = 0; i < strata_gguf_n_kv(g); i++) {
        cJSON *kv = json_kv(strata_gguf_kv_at(g, i), o);
        if (!kv || !cJSON_AddItemToArray(meta, kv)) {
            cJSON_Delete(kv);
            goto nomem;
        }
    }
    if (!(tensors = cJSON_AddArrayToObject(root, "tensors")))
        goto nomem;
    for (uint64_t i = 0; i < strata_gguf_n_tensors(g); i++) {
        const struct strata_gguf_tensor *t = strata_gguf_tensor_at(g, i);
        cJSON *j = cJSON_CreateObject(), *shape;
        if (!j || !cJSON_AddItemToArray(tensors, j)) {
            cJSON_Delete(j);
            goto nomem;
        }
        cJSON_AddItemToObject(j, "name", json_str(t->name, strlen(t->name)));
        cJSON_AddItemToObject(j, "type", cJSON_CreateString(strata_ggml_type_name(t->type)));
        if (!(shape = cJSON_AddArrayToObject(j, "shape")))
            goto nomem;
        for (uint32_t d = 0; d < t->n_dims; d++)
            cJSON_AddItemToArray(shape, json_u64(t->ne[d]));
        cJSON_AddItemToObject(j, "n_elements", json_u64(t->n_elements));
        cJSON_AddItemToObject(j, "n_bytes", json_u64(t->n_bytes));
        cJSON_AddItemToObject(j, "offset", json_u64(t->offset));
        cJSON_AddItemToObject(j, "shard", json_u64(t->shard));
    }
    *out = root;
    return 0;
nomem:
    cJSON_Delete(root);
    return strata_err_set(err, STRATA_E_NOMEM, "out of memory dumping '%s'",
                          strata_gguf_shard_path(g, 0));
}
