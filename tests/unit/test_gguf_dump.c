/* test_gguf_dump.c - the inspect dumps: exact text for a small written file,
 * JSON that parses and holds exact integers, escaped and sanitised strings,
 * summarised arrays. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "gguf_dump.h"
#include "gguf_write.h"
#include "tap.h"

static const char *const expected_text =
    "file: small.gguf\n"
    "version: 3\n"
    "alignment: 32\n"
    "shards: 1\n"
    "  shard 0: small.gguf (SIZE bytes, data at DATA)\n"
    "metadata: 8 keys\n"
    "  general.architecture: string = 'llama'\n"
    "  t.big: u64 = 18446744073709551615\n"
    "  t.neg: i32 = -7\n"
    "  t.f: f32 = 0.5\n"
    "  t.esc: string = 'a\\nb\\'c\\x01'\n"
    "  t.long: string = 'xxxxxxxx'... (10 bytes)\n"
    "  t.ints: array[i32; 5] = [1, 2, 3, ... (2 more)]\n"
    "  t.nest: array[array; 2] = [array[string; 1] ['s'], array[bool; 2] [true, false]]\n"
    "tensors: 2\n"
    "  0: a F32 [4, 2] 32 bytes @ DATA (shard 0)\n"
    "  1: b Q8_0 [32] 34 bytes @ DATA+32 (shard 0)\n";

static int build(void **buf, size_t *len)
{
    struct strata_err e = {0};
    struct strata_gguf_writer *w = NULL;
    int32_t ints[5] = {1, 2, 3, 4, 5};
    uint8_t bools[2] = {1, 0};
    struct strata_gguf_str s = {"s", 1};
    struct strata_gguf_arr inner[2] = {{STRATA_GGUF_STRING, 1, NULL, &s, NULL},
                                       {STRATA_GGUF_BOOL, 2, bools, NULL, NULL}};
    struct strata_gguf_arr nest = {STRATA_GGUF_ARRAY, 2, NULL, NULL, inner};
    int rc = strata_gguf_writer_create(&w, &e);
    rc = rc ? rc : strata_gguf_writer_add_str(w, "general.architecture", "llama", &e);
    rc = rc ? rc : strata_gguf_writer_add_u64(w, "t.big", UINT64_MAX, &e);
    rc = rc ? rc : strata_gguf_writer_add_i32(w, "t.neg", -7, &e);
    rc = rc ? rc : strata_gguf_writer_add_f32(w, "t.f", 0.5f, &e);
    rc = rc ? rc : strata_gguf_writer_add_str(w, "t.esc", "a\nb'c\x01", &e);
    rc = rc ? rc : strata_gguf_writer_add_str(w, "t.long", "xxxxxxxxxx", &e);
    rc = rc ? rc : strata_gguf_writer_add_arr(w, "t.ints", STRATA_GGUF_INT32, ints, 5, &e);
    rc = rc ? rc : strata_gguf_writer_add_arr_value(w, "t.nest", &nest, &e);
    rc = rc ? rc
            : strata_gguf_writer_add_tensor(w, "a", STRATA_TYPE_F32, 2, (uint64_t[]){4, 2}, NULL,
                                            &e);
    rc =
        rc ? rc
           : strata_gguf_writer_add_tensor(w, "b", STRATA_TYPE_Q8_0, 1, (uint64_t[]){32}, NULL, &e);
    rc = rc ? rc : strata_gguf_writer_write_mem(w, buf, len, &e);
    if (rc)
        diag("build: %s", e.msg);
    strata_gguf_writer_free(w);
    return rc;
}

/* expected_text with SIZE, DATA and DATA+32 filled in */
static void expand(char *out, size_t n, uint64_t size, uint64_t data)
{
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s", expected_text);
    struct {
        const char *tok;
        uint64_t v;
    } subs[] = {{"DATA+32", data + 32}, {"SIZE", size}, {"DATA", data}};
    for (size_t s = 0; s < 3; s++) {
        char *p;
        while ((p = strstr(tmp, subs[s].tok))) {
            char rest[4096];
            snprintf(rest, sizeof(rest), "%s", p + strlen(subs[s].tok));
            snprintf(p, sizeof(tmp) - (size_t)(p - tmp), "%llu%s", (unsigned long long)subs[s].v,
                     rest);
        }
    }
    snprintf(out, n, "%s", tmp);
}

static void test_text(const struct strata_gguf *g, size_t len)
{
    char *buf = NULL, want[4096];
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    struct strata_gguf_dump_opts o = {3, 8};
    struct strata_err e = {0};
    ok(f && strata_gguf_dump_text(g, f, &o, &e) == 0, "text dump written");
    if (f)
        fclose(f);
    expand(want, sizeof(want), len, strata_gguf_shard_data_offset(g, 0));
    ok(buf && strcmp(buf, want) == 0, "text dump as documented");
    if (buf && strcmp(buf, want) != 0)
        diag("got:\n%s\nwant:\n%s", buf, want);
    free(buf);
}

static void test_json(const struct strata_gguf *g)
{
    struct strata_err e = {0};
    struct strata_gguf_dump_opts o = {3, 4};
    cJSON *doc = NULL, *back = NULL;
    char *s = NULL;
    ok(strata_gguf_dump_json(g, &o, &doc, &e) == 0, "json built");
    s = doc ? cJSON_PrintUnformatted(doc) : NULL;
    back = s ? cJSON_Parse(s) : NULL;
    ok(back != NULL, "json printed and parsed back");
    ok(s && strstr(s, "\"value\":18446744073709551615") != NULL, "u64 max printed exactly");
    cJSON *meta = cJSON_GetObjectItem(back, "metadata");
    cJSON *tensors = cJSON_GetObjectItem(back, "tensors");
    ok(cJSON_GetArraySize(meta) == 8 && cJSON_GetArraySize(tensors) == 2, "8 keys, 2 tensors");
    cJSON *esc = cJSON_GetArrayItem(meta, 4);
    ok(strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(esc, "value")), "a\nb'c\x01") == 0,
       "json strings are complete and exact");
    cJSON *ints = cJSON_GetArrayItem(meta, 6);
    ok(cJSON_GetNumberValue(cJSON_GetObjectItem(ints, "n")) == 5 &&
           cJSON_GetArraySize(cJSON_GetObjectItem(ints, "value")) == 3 &&
           cJSON_IsTrue(cJSON_GetObjectItem(ints, "truncated")) &&
           strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(ints, "elem_type")), "i32") == 0,
       "long array: n 5, 3 items, truncated");
    cJSON *nest = cJSON_GetArrayItem(meta, 7);
    cJSON *v = cJSON_GetObjectItem(nest, "value");
    cJSON *second = cJSON_GetArrayItem(v, 1);
    ok(cJSON_GetArraySize(v) == 2 &&
           strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(second, "elem_type")), "bool") == 0 &&
           cJSON_IsFalse(cJSON_GetArrayItem(cJSON_GetObjectItem(second, "value"), 1)) &&
           cJSON_IsFalse(cJSON_GetObjectItem(second, "truncated")),
       "nested arrays as nested objects");
    cJSON *b = cJSON_GetArrayItem(tensors, 1);
    ok(strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(b, "type")), "Q8_0") == 0 &&
           cJSON_GetNumberValue(cJSON_GetObjectItem(b, "n_bytes")) == 34 &&
           cJSON_GetNumberValue(cJSON_GetArrayItem(cJSON_GetObjectItem(b, "shape"), 0)) == 32 &&
           cJSON_GetNumberValue(cJSON_GetObjectItem(b, "offset")) ==
               (double)strata_gguf_shard_data_offset(g, 0) + 32,
       "tensor b: Q8_0 [32], 34 bytes, second aligned slot");
    cJSON_Delete(back);
    cJSON_free(s);
    cJSON_Delete(doc);
}

/* Invalid UTF-8 and NUL bytes become U+FFFD; valid multi-byte text stays. */
static void test_utf8(void)
{
    struct strata_err e = {0};
    struct strata_gguf_writer *w = NULL;
    struct strata_gguf *g = NULL;
    void *buf = NULL;
    size_t len = 0;
    cJSON *doc = NULL;
    int rc = strata_gguf_writer_create(&w, &e);
    rc = rc ? rc
            : strata_gguf_writer_add_strn(w, "bad",
                                          "a\xff"
                                          "b\0c\xc3",
                                          6, &e);
    rc = rc ? rc
            : strata_gguf_writer_add_str(w, "good", "h\xc3\xa9\xe2\x82\xac\xf0\x9f\x99\x82", &e);
    rc = rc ? rc : strata_gguf_writer_add_str(w, "overlong", "\xc0\xaf\xed\xa0\x80", &e);
    rc = rc ? rc : strata_gguf_writer_write_mem(w, &buf, &len, &e);
    rc = rc ? rc : strata_gguf_open_mem(&g, buf, len, "utf8", &e);
    rc = rc ? rc : strata_gguf_dump_json(g, NULL, &doc, &e);
    ok(rc == 0, "utf8 file dumped: %s", e.msg);
    if (!rc) {
        cJSON *m = cJSON_GetObjectItem(doc, "metadata");
        const char *bad =
            cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(m, 0), "value"));
        const char *good =
            cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(m, 1), "value"));
        const char *ol =
            cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(m, 2), "value"));
        ok(bad && strcmp(bad, "a\xef\xbf\xbd"
                              "b\xef\xbf\xbd"
                              "c\xef\xbf\xbd") == 0,
           "invalid bytes and NUL replaced by U+FFFD");
        ok(good && strcmp(good, "h\xc3\xa9\xe2\x82\xac\xf0\x9f\x99\x82") == 0, "valid UTF-8 kept");
        ok(ol && strcmp(ol, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd") == 0,
           "overlong and surrogate encodings replaced");
    }
    cJSON_Delete(doc);
    strata_gguf_close(g);
    free(buf);
    strata_gguf_writer_free(w);
}

int main(void)
{
    void *buf = NULL;
    size_t len = 0;
    struct strata_err e = {0};
    struct strata_gguf *g = NULL;
    if (ok(build(&buf, &len) == 0, "small file written") &&
        ok(strata_gguf_open_mem(&g, buf, len, "small.gguf", &e) == 0, "opened: %s", e.msg)) {
        test_text(g, len);
        test_json(g);
    }
    strata_gguf_close(g);
    free(buf);
    test_utf8();
    return tap_done();
}
