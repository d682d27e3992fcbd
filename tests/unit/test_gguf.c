/* test_gguf.c - the GGUF reader on every fixture model and vocabulary, its
 * typed getters, and the writer's round trip through the reader. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf.h"
#include "gguf_write.h"
#include "tap.h"

static uint64_t file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

/* Invariants every valid file must satisfy, checked against the file size:
 * data inside the mapping, byte size from the type table, offsets aligned,
 * and (for files with tensors) the padded data section ending at EOF. */
static void check_layout(const char *path, const struct strata_gguf *g, uint64_t want_size)
{
    uint64_t size = strata_gguf_shard_size(g, 0), end = 0, sum = 0;
    const uint8_t *base = strata_gguf_shard_base(g, 0);
    uint32_t al = strata_gguf_alignment(g);
    int bad = 0;
    ok(size == want_size, "%s: mapped size is the file size (%llu)", path,
       (unsigned long long)size);
    for (uint64_t i = 0; i < strata_gguf_n_tensors(g); i++) {
        const struct strata_gguf_tensor *t = strata_gguf_tensor_at(g, i);
        uint64_t rs = strata_ggml_row_size(t->type, t->ne[0]);
        if (t->n_bytes != rs * t->ne[1] * t->ne[2] * t->ne[3] ||
            t->n_elements != t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3] || t->offset % al ||
            (const uint8_t *)t->data != base + t->offset || t->offset + t->n_bytes > size ||
            strata_gguf_find_tensor(g, t->name) != t) {
            if (!bad++)
                diag("%s: tensor '%s' is inconsistent", path, t->name);
        }
        if (t->offset + t->n_bytes > end)
            end = t->offset + t->n_bytes;
        sum += t->n_bytes;
    }
    ok(!bad, "%s: %llu tensors have consistent sizes, offsets and lookups", path,
       (unsigned long long)strata_gguf_n_tensors(g));
    if (strata_gguf_n_tensors(g)) {
        ok(end + (al - end % al) % al == size, "%s: padded data section ends at EOF", path);
        ok(strata_gguf_shard_data_offset(g, 0) + sum <= size, "%s: tensor bytes fit", path);
    }
}

static int has_suffix(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* Largest token id in a llama.cpp vocab test .out file. */
static long max_id(const char *path)
{
    char *s = tap_slurp(path, NULL);
    long m = -1;
    if (!s)
        return -1;
    for (char *p = s, *e; *p; p = e) {
        long v = strtol(p, &e, 10);
        if (e == p) {
            e = p + 1;
            continue;
        }
        if (v > m)
            m = v;
    }
    free(s);
    return m;
}

static void test_dir(const char *sub)
{
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s/%s", tap_fixtures(), sub);
    DIR *d = opendir(dir);
    int n = 0;
    ok(d != NULL, "open fixture dir %s", dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!has_suffix(de->d_name, ".gguf"))
            continue;
        char path[8192];
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        struct strata_err e = {0};
        struct strata_gguf *g = NULL;
        n++;
        if (!ok(strata_gguf_open(&g, path, &e) == 0, "open %s %s", path, e.msg))
            continue;
        const char *arch = NULL;
        ok(strata_gguf_version(g) == 3, "%s: version 3", path);
        ok(strata_gguf_get_str(g, "general.architecture", &arch, &e) == 0 && strlen(arch) > 0,
           "%s: general.architecture = %s", path, arch ? arch : e.msg);
        check_layout(path, g, file_size(path));
        if (strcmp(sub, "vocab") == 0) {
            const struct strata_gguf_arr *tok = NULL;
            char out[8300];
            snprintf(out, sizeof(out), "%s.out", path);
            long m = max_id(out);
            ok(strata_gguf_n_tensors(g) == 0, "%s: vocab-only, no tensors", path);
            ok(strata_gguf_get_arr(g, "tokenizer.ggml.tokens", STRATA_GGUF_STRING, &tok, &e) == 0 &&
                   m > 0 && tok->n > (uint64_t)m,
               "%s: %llu tokens cover the largest expected id %ld", path,
               tok ? (unsigned long long)tok->n : 0ull, m);
            const char *model = NULL;
            ok(strata_gguf_get_str(g, "tokenizer.ggml.model", &model, &e) == 0 &&
                   (strcmp(model, "gpt2") == 0 || strcmp(model, "llama") == 0),
               "%s: tokenizer.ggml.model = %s", path, model ? model : e.msg);
        }
        strata_gguf_close(g);
    }
    closedir(d);
    ok(n >= 7, "%d gguf files in %s", n, dir);
}

static void fixture_path(char *buf, size_t n, const char *rel)
{
    snprintf(buf, n, "%s/%s", tap_fixtures(), rel);
}

static int ne_is(const struct strata_gguf_tensor *t, uint32_t n_dims, uint64_t a, uint64_t b,
                 uint64_t c)
{
    return t && t->n_dims == n_dims && t->ne[0] == a && t->ne[1] == b && t->ne[2] == c &&
           t->ne[3] == 1;
}

static void test_tinycoder(void)
{
    char path[4096];
    struct strata_err e = {0};
    struct strata_gguf *g = NULL;
    fixture_path(path, sizeof(path), "models/tinycoder-moe-F16.gguf");
    if (!ok(strata_gguf_open(&g, path, &e) == 0, "open tinycoder F16: %s", e.msg))
        return;
    const char *arch = NULL;
    uint32_t u = 0;
    ok(strata_gguf_get_str(g, "general.architecture", &arch, &e) == 0 &&
           strcmp(arch, "qwen3moe") == 0,
       "general.architecture = qwen3moe");
    struct {
        const char *key;
        uint32_t want;
    } keys[] = {
        {"qwen3moe.expert_count", 16},
        {"qwen3moe.expert_used_count", 4},
        {"qwen3moe.block_count", 4},
        {"qwen3moe.embedding_length", 256},
        {"qwen3moe.attention.head_count", 8},
        {"qwen3moe.attention.head_count_kv", 2},
        {"qwen3moe.expert_feed_forward_length", 256},
    };
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
        ok(strata_gguf_get_u32(g, keys[i].key, &u, &e) == 0 && u == keys[i].want, "%s = %u (%s)",
           keys[i].key, keys[i].want, e.msg);
    ok(strata_gguf_n_tensors(g) == 51, "51 tensors (%llu)",
       (unsigned long long)strata_gguf_n_tensors(g));
    const struct strata_gguf_tensor *t = strata_gguf_find_tensor(g, "blk.0.ffn_down_exps.weight");
    ok(ne_is(t, 3, 256, 256, 16), "blk.0.ffn_down_exps.weight ne = [256, 256, 16]");
    ok(t && t->type == STRATA_TYPE_F16 && t->n_bytes == 256ull * 256 * 16 * 2,
       "ffn_down_exps is F16, 2 MiB");
    /* shapes from the README: hidden 256, 8 heads x 32, 2 kv heads, vocab 4096 */
    ok(ne_is(strata_gguf_find_tensor(g, "token_embd.weight"), 2, 256, 4096, 1),
       "token_embd [256, 4096]");
    ok(ne_is(strata_gguf_find_tensor(g, "blk.3.attn_q.weight"), 2, 256, 256, 1),
       "attn_q [256, 8*32]");
    ok(ne_is(strata_gguf_find_tensor(g, "blk.3.attn_k.weight"), 2, 256, 64, 1),
       "attn_k [256, 2*32]");
    ok(ne_is(strata_gguf_find_tensor(g, "blk.2.ffn_gate_inp.weight"), 2, 256, 16, 1),
       "ffn_gate_inp [256, 16]");
    ok(ne_is(strata_gguf_find_tensor(g, "blk.1.attn_k_norm.weight"), 1, 32, 1, 1),
       "attn_k_norm [32]");
    ok(strata_gguf_find_tensor(g, "blk.4.attn_q.weight") == NULL, "no layer 4");
    ok(strata_gguf_find_tensor(g, "") == NULL, "empty name not found");
    int per_layer[4] = {0};
    for (uint64_t i = 0; i < strata_gguf_n_tensors(g); i++) {
        int l;
        if (sscanf(strata_gguf_tensor_at(g, i)->name, "blk.%d.", &l) == 1 && l >= 0 && l < 4)
            per_layer[l]++;
    }
    ok(per_layer[0] == 12 && per_layer[3] == 12, "12 tensors per layer (%d, %d)", per_layer[0],
       per_layer[3]);
    const struct strata_gguf_arr *tok = NULL;
    ok(strata_gguf_get_arr(g, "tokenizer.ggml.tokens", STRATA_GGUF_STRING, &tok, &e) == 0 &&
           tok->n == 4096,
       "4096 tokens");
    ok(tok && tok->n == 4096 && tok->strs[tok->n - 1].len > 0, "last token text non-empty");

    /* typed getters refuse mismatches with messages naming the key */
    const char *s = NULL;
    ok(strata_gguf_get_u32(g, "general.architecture", &u, &e) == STRATA_E_FORMAT &&
           strstr(e.msg, "key 'general.architecture' is a string, expected u32"),
       "u32 of a string: %s", e.msg);
    ok(strata_gguf_get_str(g, "qwen3moe.expert_count", &s, &e) == STRATA_E_FORMAT &&
           strstr(e.msg, "expected string"),
       "str of an integer: %s", e.msg);
    ok(strata_gguf_get_str(g, "no.such.key", &s, &e) == STRATA_E_NOTFOUND &&
           strstr(e.msg, "key 'no.such.key' not found in"),
       "absent key: %s", e.msg);
    ok(strata_gguf_get_arr(g, "tokenizer.ggml.tokens", STRATA_GGUF_INT32, &tok, &e) ==
               STRATA_E_FORMAT &&
           strstr(e.msg, "is an array of string, expected an array of i32"),
       "array of the wrong element type: %s", e.msg);
    ok(strata_gguf_get_arr(g, "general.architecture", -1, &tok, &e) == STRATA_E_FORMAT &&
           strstr(e.msg, "expected array of any"),
       "array getter on a string: %s", e.msg);
    int b;
    ok(strata_gguf_get_bool(g, "qwen3moe.block_count", &b, &e) == STRATA_E_FORMAT,
       "bool of an integer: %s", e.msg);
    float f = 0;
    ok(strata_gguf_get_f32(g, "qwen3moe.attention.layer_norm_rms_epsilon", &f, &e) == 0 && f > 0 &&
           f < 1e-3f,
       "rms epsilon %g", (double)f);
    ok(strata_gguf_get_f32(g, "qwen3moe.block_count", &f, &e) == 0 && f == 4.0f,
       "f32 getter accepts an integer");
    strata_gguf_close(g);
}

static void test_stories(void)
{
    char path[4096];
    struct strata_err e = {0};
    struct strata_gguf *g = NULL;
    fixture_path(path, sizeof(path), "models/stories260K.gguf");
    if (!ok(strata_gguf_open(&g, path, &e) == 0, "open stories260K: %s", e.msg))
        return;
    uint32_t u = 0;
    /* README: 5 layers, dim 64, 8 heads / 4 kv heads, vocabulary of 512, F32 */
    ok(strata_gguf_get_u32(g, "llama.block_count", &u, &e) == 0 && u == 5, "5 layers");
    ok(strata_gguf_get_u32(g, "llama.embedding_length", &u, &e) == 0 && u == 64, "dim 64");
    ok(strata_gguf_get_u32(g, "llama.attention.head_count", &u, &e) == 0 && u == 8, "8 heads");
    ok(strata_gguf_get_u32(g, "llama.attention.head_count_kv", &u, &e) == 0 && u == 4,
       "4 kv heads");
    const struct strata_gguf_arr *tok = NULL, *scores = NULL;
    ok(strata_gguf_get_arr(g, "tokenizer.ggml.tokens", STRATA_GGUF_STRING, &tok, &e) == 0 &&
           tok->n == 512,
       "512 tokens");
    ok(strata_gguf_get_arr(g, "tokenizer.ggml.scores", STRATA_GGUF_FLOAT32, &scores, &e) == 0 &&
           scores->n == 512 && isfinite(strata_gguf_arr_f64(scores, 300)),
       "512 float scores");
    ok(ne_is(strata_gguf_find_tensor(g, "token_embd.weight"), 2, 64, 512, 1),
       "token_embd [64, 512]");
    int all_f32 = 1;
    for (uint64_t i = 0; i < strata_gguf_n_tensors(g); i++)
        all_f32 &= strata_gguf_tensor_at(g, i)->type == STRATA_TYPE_F32;
    ok(all_f32, "all tensors F32");
    /* the first blocks' norms are trained weights, not zeros */
    const struct strata_gguf_tensor *t = strata_gguf_find_tensor(g, "blk.0.attn_norm.weight");
    float w0 = 0;
    if (t)
        memcpy(&w0, t->data, 4);
    ok(t && isfinite(w0) && w0 != 0, "attn_norm[0] = %g", (double)w0);
    strata_gguf_close(g);
}

/* Types, shapes and absolute data offsets of the dequantisation references
 * (computed by gguf-py, an independent reader). */
static void test_dequant_index(void)
{
    char path[4096];
    fixture_path(path, sizeof(path), "ref/dequant/index.json");
    char *js = tap_slurp(path, NULL);
    cJSON *root = js ? cJSON_Parse(js) : NULL;
    cJSON *cases = cJSON_GetObjectItem(root, "cases"), *c;
    int n = 0, good = 0;
    ok(cJSON_IsArray(cases), "dequant index parsed");
    cJSON_ArrayForEach(c, cases)
    {
        const char *model = cJSON_GetStringValue(cJSON_GetObjectItem(c, "model"));
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(c, "tensor"));
        const char *type = cJSON_GetStringValue(cJSON_GetObjectItem(c, "type"));
        cJSON *shape = cJSON_GetObjectItem(c, "shape_gguf_ne");
        double off = cJSON_GetNumberValue(cJSON_GetObjectItem(c, "tensor_data_offset_in_file"));
        if (!model || !name || !type)
            continue;
        n++;
        char mp[4096];
        struct strata_err e = {0};
        struct strata_gguf *g = NULL;
        fixture_path(mp, sizeof(mp), model);
        if (strata_gguf_open(&g, mp, &e) != 0) {
            diag("%s: %s", mp, e.msg);
            continue;
        }
        const struct strata_gguf_tensor *t = strata_gguf_find_tensor(g, name);
        int same = t && strcmp(strata_ggml_type_name(t->type), type) == 0 &&
                   (double)t->offset == off && cJSON_GetArraySize(shape) == (int)t->n_dims;
        for (uint32_t d = 0; same && d < t->n_dims; d++)
            same = cJSON_GetNumberValue(cJSON_GetArrayItem(shape, (int)d)) == (double)t->ne[d];
        if (same)
            good++;
        else
            diag("%s %s: type/offset/shape differ from the reference", model, name);
        strata_gguf_close(g);
    }
    ok(n >= 5 && good == n, "%d/%d tensors match gguf-py's type, shape and offset", good, n);
    cJSON_Delete(root);
    free(js);
}

static void test_quant_mix(void)
{
    char path[4096];
    struct strata_err e = {0};
    struct strata_gguf *g = NULL;
    fixture_path(path, sizeof(path), "models/tinycoder-moe-IQ1_M.gguf");
    if (!ok(strata_gguf_open(&g, path, &e) == 0, "open IQ1_M: %s", e.msg))
        return;
    int seen[STRATA_TYPE_COUNT] = {0}, kinds = 0;
    for (uint64_t i = 0; i < strata_gguf_n_tensors(g); i++)
        seen[strata_gguf_tensor_at(g, i)->type]++;
    for (int i = 0; i < STRATA_TYPE_COUNT; i++)
        kinds += seen[i] > 0;
    ok(seen[STRATA_TYPE_IQ1_M] > 0 && kinds >= 3, "IQ1_M file mixes %d block types", kinds);
    strata_gguf_close(g);
}

/* ---- writer round trip ---------------------------------------------- */

static void test_writer_roundtrip(void)
{
    struct strata_err e = {0};
    struct strata_gguf_writer *w = NULL;
    int rc = strata_gguf_writer_create(&w, &e);
    ok(rc == 0, "writer created");
    if (rc)
        return;
    rc |= strata_gguf_writer_add_u8(w, "t.u8", 200, &e);
    rc |= strata_gguf_writer_add_i8(w, "t.i8", -100, &e);
    rc |= strata_gguf_writer_add_u16(w, "t.u16", 60000, &e);
    rc |= strata_gguf_writer_add_i16(w, "t.i16", -30000, &e);
    rc |= strata_gguf_writer_add_u32(w, "t.u32", 4000000000u, &e);
    rc |= strata_gguf_writer_add_i32(w, "t.i32", -2000000000, &e);
    rc |= strata_gguf_writer_add_u64(w, "t.u64", 18000000000000000000ull, &e);
    rc |= strata_gguf_writer_add_i64(w, "t.i64", -9000000000000000000ll, &e);
    rc |= strata_gguf_writer_add_f32(w, "t.f32", 0.25f, &e);
    rc |= strata_gguf_writer_add_f64(w, "t.f64", -1e300, &e);
    rc |= strata_gguf_writer_add_bool(w, "t.bool", 1, &e);
    rc |= strata_gguf_writer_add_str(w, "t.str", "héllo", &e);
    rc |= strata_gguf_writer_add_strn(w, "t.nul", "a\0b", 3, &e);
    rc |= strata_gguf_writer_add_str(w, "t.empty", "", &e);
    int32_t ints[5] = {1, -2, 3, -4, 5};
    uint8_t bools[3] = {1, 0, 1};
    rc |= strata_gguf_writer_add_arr(w, "t.ints", STRATA_GGUF_INT32, ints, 5, &e);
    rc |= strata_gguf_writer_add_arr(w, "t.bools", STRATA_GGUF_BOOL, bools, 3, &e);
    rc |= strata_gguf_writer_add_arr(w, "t.none", STRATA_GGUF_FLOAT64, NULL, 0, &e);
    const char *strs[3] = {"x", "", "zz"};
    rc |= strata_gguf_writer_add_arr_str(w, "t.strs", strs, 3, &e);
    /* [[1.5, 2.5], [["x", "", "zz"]], []] */
    float fl[2] = {1.5f, 2.5f};
    struct strata_gguf_str ss[3] = {{"x", 1}, {"", 0}, {"zz", 2}};
    struct strata_gguf_arr inner2[1] = {{STRATA_GGUF_STRING, 3, NULL, ss, NULL}};
    struct strata_gguf_arr mid[3] = {
        {STRATA_GGUF_FLOAT32, 2, fl, NULL, NULL},
        {STRATA_GGUF_ARRAY, 1, NULL, NULL, inner2},
        {STRATA_GGUF_UINT8, 0, NULL, NULL, NULL},
    };
    struct strata_gguf_arr top = {STRATA_GGUF_ARRAY, 3, NULL, NULL, mid};
    rc |= strata_gguf_writer_add_arr_value(w, "t.nested", &top, &e);
    rc |= strata_gguf_writer_set_alignment(w, 64, &e);
    ok(rc == 0, "every key type added: %s", e.msg);
    ok(strata_gguf_writer_add_u8(w, "t.u8", 1, &e) == STRATA_E_INVALID &&
           strstr(e.msg, "duplicate key 't.u8'"),
       "writer refuses a duplicate key");
    ok(strata_gguf_writer_set_alignment(w, 48, &e) == STRATA_E_INVALID, "writer refuses 48");

    float a[64 * 3];
    for (int i = 0; i < 64 * 3; i++)
        a[i] = (float)i * 0.5f;
    uint8_t q[144 * 2];
    for (int i = 0; i < 144 * 2; i++)
        q[i] = (uint8_t)(i * 7);
    rc = strata_gguf_writer_add_tensor(w, "a", STRATA_TYPE_F32, 2, (uint64_t[]){64, 3}, a, &e);
    rc |= strata_gguf_writer_add_tensor(w, "q", STRATA_TYPE_Q4_K, 2, (uint64_t[]){256, 2}, q, &e);
    rc |= strata_gguf_writer_add_tensor(w, "z", STRATA_TYPE_F16, 1, (uint64_t[]){3}, NULL, &e);
    ok(rc == 0, "tensors added: %s", e.msg);
    ok(strata_gguf_writer_add_tensor(w, "bad", STRATA_TYPE_Q4_K, 1, (uint64_t[]){100}, q, &e) ==
           STRATA_E_INVALID,
       "writer refuses ne[0] not a multiple of the block size");
    ok(strata_gguf_writer_add_tensor(w, "u", 77, 1, (uint64_t[]){1}, q, &e) == STRATA_E_UNSUPPORTED,
       "writer refuses an unknown type");

    void *buf = NULL;
    size_t len = 0;
    struct strata_gguf *g = NULL;
    rc = strata_gguf_writer_write_mem(w, &buf, &len, &e);
    ok(rc == 0 && len % 64 == 0, "written to memory, %zu bytes, padded to 64", len);
    rc = rc ? rc : strata_gguf_open_mem(&g, buf, len, "mem.gguf", &e);
    ok(rc == 0, "read back: %s", e.msg);
    if (!rc) {
        uint32_t u;
        int32_t i32;
        uint64_t u64;
        float f;
        int b;
        const char *s;
        const struct strata_gguf_kv *kv;
        ok(strata_gguf_n_kv(g) == 20, "20 keys, general.alignment included (%llu)",
           (unsigned long long)strata_gguf_n_kv(g));
        ok(strata_gguf_alignment(g) == 64, "alignment 64 read back");
        ok(strata_gguf_get_u32(g, "t.u8", &u, &e) == 0 && u == 200, "u8");
        ok((kv = strata_gguf_find_kv(g, "t.i8")) && kv->type == STRATA_GGUF_INT8 && kv->v.i == -100,
           "i8");
        ok(strata_gguf_get_u32(g, "t.u16", &u, &e) == 0 && u == 60000, "u16");
        ok((kv = strata_gguf_find_kv(g, "t.i16")) && kv->v.i == -30000, "i16");
        ok(strata_gguf_get_u32(g, "t.u32", &u, &e) == 0 && u == 4000000000u, "u32");
        ok(strata_gguf_get_i32(g, "t.u32", &i32, &e) == STRATA_E_FORMAT &&
               strstr(e.msg, "does not fit i32"),
           "u32 4e9 does not fit i32: %s", e.msg);
        ok(strata_gguf_get_i32(g, "t.i32", &i32, &e) == 0 && i32 == -2000000000, "i32");
        ok(strata_gguf_get_u32(g, "t.i32", &u, &e) == STRATA_E_FORMAT, "negative not u32");
        ok(strata_gguf_get_u64(g, "t.u64", &u64, &e) == 0 && u64 == 18000000000000000000ull, "u64");
        ok((kv = strata_gguf_find_kv(g, "t.i64")) && kv->v.i == -9000000000000000000ll, "i64");
        ok(strata_gguf_get_f32(g, "t.f32", &f, &e) == 0 && f == 0.25f, "f32");
        ok((kv = strata_gguf_find_kv(g, "t.f64")) && kv->v.f == -1e300, "f64");
        ok(strata_gguf_get_bool(g, "t.bool", &b, &e) == 0 && b == 1, "bool");
        ok(strata_gguf_get_str(g, "t.str", &s, &e) == 0 && strcmp(s, "héllo") == 0, "string");
        ok((kv = strata_gguf_find_kv(g, "t.nul")) && kv->v.str.len == 3 &&
               memcmp(kv->v.str.ptr, "a\0b", 3) == 0,
           "string with a nul byte kept exactly");
        ok(strata_gguf_get_str(g, "t.empty", &s, &e) == 0 && *s == 0, "empty string");
        const struct strata_gguf_arr *ar = NULL;
        ok(strata_gguf_get_arr(g, "t.ints", STRATA_GGUF_INT32, &ar, &e) == 0 && ar->n == 5 &&
               strata_gguf_arr_i64(ar, 3) == -4 && strata_gguf_arr_f64(ar, 4) == 5.0 &&
               strata_gguf_arr_i64(ar, 5) == 0,
           "i32 array");
        ok(strata_gguf_get_arr(g, "t.bools", STRATA_GGUF_BOOL, &ar, &e) == 0 && ar->n == 3 &&
               strata_gguf_arr_i64(ar, 1) == 0 && strata_gguf_arr_i64(ar, 2) == 1,
           "bool array");
        ok(strata_gguf_get_arr(g, "t.none", -1, &ar, &e) == 0 && ar->n == 0 &&
               ar->type == STRATA_GGUF_FLOAT64,
           "empty array");
        ok(strata_gguf_get_arr(g, "t.strs", STRATA_GGUF_STRING, &ar, &e) == 0 && ar->n == 3 &&
               ar->strs[2].len == 2 && memcmp(ar->strs[2].ptr, "zz", 2) == 0 &&
               ar->strs[1].len == 0,
           "string array");
        ok(strata_gguf_get_arr(g, "t.nested", STRATA_GGUF_ARRAY, &ar, &e) == 0 && ar->n == 3 &&
               ar->arrs[0].type == STRATA_GGUF_FLOAT32 &&
               strata_gguf_arr_f64(&ar->arrs[0], 1) == 2.5 &&
               ar->arrs[1].type == STRATA_GGUF_ARRAY && ar->arrs[1].n == 1 &&
               ar->arrs[1].arrs[0].type == STRATA_GGUF_STRING && ar->arrs[1].arrs[0].n == 3 &&
               ar->arrs[1].arrs[0].strs[2].len == 2 && ar->arrs[2].n == 0,
           "nested arrays, arrays of strings inside");
        ok(strata_gguf_n_tensors(g) == 3, "3 tensors");
        const struct strata_gguf_tensor *ta = strata_gguf_find_tensor(g, "a");
        const struct strata_gguf_tensor *tq = strata_gguf_find_tensor(g, "q");
        const struct strata_gguf_tensor *tz = strata_gguf_find_tensor(g, "z");
        ok(ta && ta->n_bytes == sizeof(a) && memcmp(ta->data, a, sizeof(a)) == 0 &&
               ta->offset % 64 == 0,
           "F32 tensor data round trip");
        ok(tq && tq->type == STRATA_TYPE_Q4_K && tq->n_bytes == sizeof(q) &&
               memcmp(tq->data, q, sizeof(q)) == 0 && tq->offset % 64 == 0,
           "Q4_K tensor data round trip");
        ok(tz && tz->n_bytes == 6 && memcmp(tz->data, "\0\0\0\0\0\0", 6) == 0,
           "NULL data written as zeros");
        check_layout("mem.gguf", g, len);
    }
    strata_gguf_close(g);

    /* the same bytes through a file */
    char tmp[] = "/tmp/strata-gguf-XXXXXX";
    int fd = mkstemp(tmp);
    close(fd);
    rc = strata_gguf_writer_write_file(w, tmp, &e);
    size_t flen = 0;
    char *fb = rc ? NULL : tap_slurp(tmp, &flen);
    ok(fb && flen == len && memcmp(fb, buf, len) == 0, "file output equals memory output");
    free(fb);
    g = NULL;
    ok(strata_gguf_open(&g, tmp, &e) == 0 && strata_gguf_n_tensors(g) == 3, "file opens: %s",
       e.msg);
    strata_gguf_close(g);
    unlink(tmp);
    ok(strata_gguf_writer_write_file(w, "/nonexistent-dir/x.gguf", &e) == STRATA_E_IO &&
           strstr(e.msg, "/nonexistent-dir/x.gguf"),
       "unwritable path: %s", e.msg);
    free(buf);
    strata_gguf_writer_free(w);
}

/* Copy stories260K key by key and tensor by tensor; the copy is identical. */
static void test_copy(void)
{
    char path[4096];
    struct strata_err e = {0};
    struct strata_gguf *g = NULL, *h = NULL;
    struct strata_gguf_writer *w = NULL;
    void *buf = NULL;
    size_t len = 0;
    int rc;
    fixture_path(path, sizeof(path), "models/stories260K.gguf");
    rc = strata_gguf_open(&g, path, &e);
    if (!rc)
        rc = strata_gguf_writer_create(&w, &e);
    for (uint64_t i = 0; !rc && i < strata_gguf_n_kv(g); i++)
        rc = strata_gguf_writer_add_kv(w, strata_gguf_kv_at(g, i), &e);
    for (uint64_t i = 0; !rc && i < strata_gguf_n_tensors(g); i++) {
        const struct strata_gguf_tensor *t = strata_gguf_tensor_at(g, i);
        rc = strata_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, &e);
    }
    if (!rc)
        rc = strata_gguf_writer_write_mem(w, &buf, &len, &e);
    ok(rc == 0, "stories260K copied: %s", e.msg);
    ok(len == strata_gguf_shard_size(g, 0) && memcmp(buf, strata_gguf_shard_base(g, 0), len) == 0,
       "the copy is byte-identical to the original (%zu bytes)", len);
    if (!rc && strata_gguf_open_mem(&h, buf, len, "copy", &e) == 0) {
        ok(strata_gguf_n_kv(h) == strata_gguf_n_kv(g), "same key count");
        strata_gguf_close(h);
    }
    free(buf);
    strata_gguf_writer_free(w);
    strata_gguf_close(g);
}

/* Many tensors and keys: every name found through the index. */
static void test_many(void)
{
    struct strata_err e = {0};
    struct strata_gguf_writer *w = NULL;
    struct strata_gguf *g = NULL;
    void *buf = NULL;
    size_t len = 0;
    int rc = strata_gguf_writer_create(&w, &e);
    char name[64];
    for (int i = 0; !rc && i < 3000; i++) {
        snprintf(name, sizeof(name), "blk.%d.ffn_up_exps.%d", i / 3, i);
        rc = strata_gguf_writer_add_tensor(w, name, STRATA_TYPE_F32, 1, (uint64_t[]){1}, NULL, &e);
    }
    for (int i = 0; !rc && i < 500; i++) {
        snprintf(name, sizeof(name), "k.%d", i);
        rc = strata_gguf_writer_add_u32(w, name, (uint32_t)i, &e);
    }
    if (!rc)
        rc = strata_gguf_writer_write_mem(w, &buf, &len, &e);
    if (!rc)
        rc = strata_gguf_open_mem(&g, buf, len, "many", &e);
    ok(rc == 0, "3000 tensors, 500 keys: %s", e.msg);
    int found = 0;
    for (int i = 0; !rc && i < 3000; i++) {
        snprintf(name, sizeof(name), "blk.%d.ffn_up_exps.%d", i / 3, i);
        const struct strata_gguf_tensor *t = strata_gguf_find_tensor(g, name);
        found += t && strcmp(t->name, name) == 0 && t == strata_gguf_tensor_at(g, (uint64_t)i);
    }
    ok(found == 3000, "every tensor found by name (%d)", found);
    uint32_t u = 0;
    ok(!rc && strata_gguf_get_u32(g, "k.499", &u, &e) == 0 && u == 499, "key 499 found");
    strata_gguf_close(g);
    free(buf);
    strata_gguf_writer_free(w);
}

/* Version 2 has the same layout as 3 (64-bit counts); both are read. */
/* Element sizes of the value types (GGUF spec, "gguf_metadata_value_type"):
 * used both when reading arrays and when writing them. */
static void test_vtype_size(void)
{
    ok(strata_gguf_vtype_size(STRATA_GGUF_UINT8) == 1 &&
           strata_gguf_vtype_size(STRATA_GGUF_BOOL) == 1 &&
           strata_gguf_vtype_size(STRATA_GGUF_INT16) == 2 &&
           strata_gguf_vtype_size(STRATA_GGUF_FLOAT32) == 4 &&
           strata_gguf_vtype_size(STRATA_GGUF_UINT64) == 8 &&
           strata_gguf_vtype_size(STRATA_GGUF_FLOAT64) == 8,
       "vtype_size: 1, 2, 4, 8 bytes for the fixed-size types");
    ok(strata_gguf_vtype_size(STRATA_GGUF_STRING) == 0 &&
           strata_gguf_vtype_size(STRATA_GGUF_ARRAY) == 0 && strata_gguf_vtype_size(13) == 0,
       "vtype_size: 0 for string, array and an unknown id");
}

static void test_v2(void)
{
    struct strata_err e = {0};
    struct strata_gguf_writer *w = NULL;
    struct strata_gguf *g = NULL;
    void *buf = NULL;
    size_t len = 0;
    int rc = strata_gguf_writer_create(&w, &e);
    if (!rc) {
        strata_gguf_writer_set_version(w, 2);
        rc = strata_gguf_writer_add_u64(w, "general.alignment", 16, &e);
    }
    rc = rc ? rc
            : strata_gguf_writer_add_tensor(w, "t", STRATA_TYPE_F32, 1, (uint64_t[]){3}, NULL, &e);
    rc = rc ? rc : strata_gguf_writer_write_mem(w, &buf, &len, &e);
    /* the writer pads to its own alignment (32): offsets stay multiples of 16 */
    rc = rc ? rc : strata_gguf_open_mem(&g, buf, len, "v2", &e);
    ok(rc == 0 && strata_gguf_version(g) == 2, "version 2 file read: %s", e.msg);
    ok(rc == 0 && strata_gguf_alignment(g) == 16, "general.alignment as u64 accepted");
    strata_gguf_close(g);
    free(buf);
    strata_gguf_writer_free(w);
}

int main(void)
{
    test_dir("models");
    test_dir("vocab");
    test_tinycoder();
    test_stories();
    test_dequant_index();
    test_quant_mix();
    test_writer_roundtrip();
    test_copy();
    test_many();
    test_v2();
    test_vtype_size();
    {
        struct strata_err e = {0};
        struct strata_gguf *g = NULL;
        ok(strata_gguf_open(&g, "/nonexistent/m.gguf", &e) == STRATA_E_IO && !g &&
               strstr(e.msg, "cannot open '/nonexistent/m.gguf'"),
           "missing file: %s", e.msg);
        ok(strata_gguf_open(&g, "/tmp", &e) == STRATA_E_IO && strstr(e.msg, "not a regular file"),
           "directory: %s", e.msg);
    }
    return tap_done();
}
