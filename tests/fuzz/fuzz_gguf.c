/* fuzz_gguf.c - libFuzzer target: the GGUF reader, its getters and the
 * inspect dumps on arbitrary bytes.  Built and run by `make fuzz`. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "gguf.h"
#include "gguf_dump.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void walk(const struct strata_gguf *g)
{
    static FILE *null;
    if (!null)
        null = fopen("/dev/null", "w");
    for (uint64_t i = 0; i < strata_gguf_n_kv(g); i++) {
        const struct strata_gguf_kv *kv = strata_gguf_kv_at(g, i);
        uint32_t u;
        int32_t s;
        uint64_t u64;
        float f;
        int b;
        const char *str;
        const struct strata_gguf_arr *a;
        if (strata_gguf_find_kv(g, kv->key) != kv)
            __builtin_trap(); /* the index must find what the file holds */
        strata_gguf_get_u32(g, kv->key, &u, NULL);
        strata_gguf_get_i32(g, kv->key, &s, NULL);
        strata_gguf_get_u64(g, kv->key, &u64, NULL);
        strata_gguf_get_f32(g, kv->key, &f, NULL);
        strata_gguf_get_bool(g, kv->key, &b, NULL);
        if (strata_gguf_get_str(g, kv->key, &str, NULL) == 0)
            (void)strlen(str);
        if (strata_gguf_get_arr(g, kv->key, -1, &a, NULL) == 0 && a->n) {
            (void)strata_gguf_arr_f64(a, a->n - 1);
            (void)strata_gguf_arr_i64(a, 0);
        }
    }
    for (uint64_t i = 0; i < strata_gguf_n_tensors(g); i++) {
        const struct strata_gguf_tensor *t = strata_gguf_tensor_at(g, i);
        if (strata_gguf_find_tensor(g, t->name) != t)
            __builtin_trap();
        volatile uint8_t x = ((const uint8_t *)t->data)[0];
        x = ((const uint8_t *)t->data)[t->n_bytes - 1];
        (void)x;
    }
    if (null)
        strata_gguf_dump_text(g, null, NULL, NULL);
    cJSON *doc = NULL;
    if (strata_gguf_dump_json(g, NULL, &doc, NULL) == 0) {
        char *s = cJSON_PrintUnformatted(doc);
        cJSON_free(s);
        cJSON_Delete(doc);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct strata_err err = {0};
    struct strata_gguf *g = NULL;
    if (strata_gguf_open_mem(&g, data, size, "fuzz.gguf", &err) == 0)
        walk(g);
    else if (!err.msg[0])
        __builtin_trap(); /* every refusal carries a message */
    strata_gguf_close(g);
    return 0;
}
