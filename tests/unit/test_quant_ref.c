/* test_quant_ref.c - reference decoders against gguf-py's dequantisations of
 * real tensors (fixtures/ref/dequant/), and the i-quant tables against the
 * fixture JSON they were generated from. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "iq_tables.h"
#include "quant.h"
#include "tap.h"

static void *read_at(const char *path, long off, size_t n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    void *buf = malloc(n);
    if (buf && (fseek(f, off, SEEK_SET) != 0 || fread(buf, 1, n, f) != n)) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

/* Distance in units in the last place between two finite floats. */
static int64_t ulp_diff(float a, float b)
{
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    if (ia < 0)
        ia = INT32_MIN - ia;
    if (ib < 0)
        ib = INT32_MIN - ib;
    return llabs((int64_t)ia - (int64_t)ib);
}

static void test_fixtures(const char *fx)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/ref/dequant/index.json", fx);
    char *text = tap_slurp(path, NULL);
    if (!ok(text != NULL, "read %s", path))
        return;
    cJSON *root = cJSON_Parse(text);
    cJSON *cases = cJSON_GetObjectItem(root, "cases");
    int n_cases = 0;
    cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const char *model = cJSON_GetStringValue(cJSON_GetObjectItem(c, "model"));
        const char *tname = cJSON_GetStringValue(cJSON_GetObjectItem(c, "tensor"));
        const char *type = cJSON_GetStringValue(cJSON_GetObjectItem(c, "type"));
        const char *file = cJSON_GetStringValue(cJSON_GetObjectItem(c, "file"));
        int rows = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(c, "rows"));
        int64_t row_len = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(c, "row_len"));
        long off = (long)cJSON_GetNumberValue(cJSON_GetObjectItem(c, "tensor_data_offset_in_file"));
        int t = strata_ggml_type_from_name(type);
        n_cases++;
        if (!ok(t >= 0 && strata_quant_supported((uint32_t)t), "%s: type %s supported", file, type))
            continue;
        int64_t n = rows * row_len;
        size_t nbytes = strata_ggml_row_size((uint32_t)t, (uint64_t)row_len) * (size_t)rows;
        snprintf(path, sizeof(path), "%s/%s", fx, model);
        void *raw = read_at(path, off, nbytes);
        snprintf(path, sizeof(path), "%s/ref/dequant/%s", fx, file);
        size_t flen = 0;
        float *want = (float *)tap_slurp(path, &flen);
        float *got = malloc((size_t)n * sizeof(float));
        if (!ok(raw && want && got && flen == (size_t)n * 4, "%s: inputs read", file))
            goto next;
        struct strata_err err = {0};
        int rc = strata_quant_dequant_ref((uint32_t)t, raw, got, n, &err);
        ok(rc == 0, "%s: dequant_ref rc %d %s", file, rc, err.msg);
        int64_t worst = 0, exact = 0, at = -1;
        for (int64_t i = 0; i < n; i++) {
            int64_t u = ulp_diff(got[i], want[i]);
            if (u == 0)
                exact++;
            if (u > worst) {
                worst = u;
                at = i;
            }
        }
        ok(worst <= 1, "%s (%s %s): %lld/%lld exact, worst %lld ulp at %lld (%.9g vs %.9g)",
           file, tname, type, (long long)exact, (long long)n, (long long)worst, (long long)at,
           at >= 0 ? got[at] : 0.0, at >= 0 ? want[at] : 0.0);
        /* the fast row decoder must be bit-identical to the reference */
        float *fast = malloc((size_t)n * sizeof(float));
        if (fast) {
            strata_quant_dequant_row((uint32_t)t, raw, fast, n);
            ok(memcmp(fast, got, (size_t)n * 4) == 0, "%s: dequant_row == dequant_ref", file);
            free(fast);
        }
    next:
        free(raw);
        free(want);
        free(got);
    }
    ok(n_cases >= 10, "index.json lists %d cases", n_cases);
    cJSON_Delete(root);
    free(text);
}

/* The generated C tables hold exactly the JSON's values. */
static void test_tables(const char *fx)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/ref/gguf-quant-tables.json", fx);
    char *text = tap_slurp(path, NULL);
    if (!ok(text != NULL, "read %s", path))
        return;
    cJSON *root = cJSON_Parse(text);
    struct {
        const char *name;
        const void *tab;
        int elem; /* bytes: 1 (int8/uint8 by sign flag), 4, 8 */
        int is_signed;
        int n;
    } tabs[] = {
        {"kmask_iq2xs", strata_kmask_iq2xs, 1, 0, 8},
        {"ksigns_iq2xs", strata_ksigns_iq2xs, 1, 0, 128},
        {"ksigns64", strata_ksigns64, 8, 0, 128},
        {"iq2xxs_grid", strata_iq2xxs_grid, 8, 0, 256},
        {"iq2xs_grid", strata_iq2xs_grid, 8, 0, 512},
        {"iq2s_grid", strata_iq2s_grid, 8, 0, 1024},
        {"iq3xxs_grid", strata_iq3xxs_grid, 4, 0, 256},
        {"iq3s_grid", strata_iq3s_grid, 4, 0, 512},
        {"kvalues_iq4nl", strata_kvalues_iq4nl, 1, 1, 16},
        {"kvalues_fp4", strata_kvalues_mxfp4, 1, 1, 16},
        {"iq1s_grid", strata_iq1s_grid, 8, 0, 2048},
        {"iq1s_grid_gpu", strata_iq1s_grid_gpu, 4, 0, 2048},
    };
    for (size_t k = 0; k < sizeof(tabs) / sizeof(tabs[0]); k++) {
        cJSON *vals = cJSON_GetObjectItem(cJSON_GetObjectItem(root, tabs[k].name), "values");
        int n_json = cJSON_GetArraySize(vals), n = 0, bad = -1;
        /* cJSON keeps numbers as doubles, which cannot hold every 64-bit grid
         * entry: read the values exactly from the text of the array */
        char key[64];
        snprintf(key, sizeof(key), "\"%s\"", tabs[k].name);
        const char *p = strstr(text, key);
        p = p ? strstr(p, "\"values\"") : NULL;
        p = p ? strchr(p, '[') : NULL;
        while (p && *p != ']') {
            p++;
            while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')
                p++;
            if (*p == ']')
                break;
            char *end;
            unsigned long long want = *p == '-' ? (unsigned long long)strtoll(p, &end, 10)
                                                : strtoull(p, &end, 10);
            p = end;
            while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')
                p++;
            unsigned long long got = 0;
            if (n < tabs[k].n) {
                if (tabs[k].elem == 1)
                    got = tabs[k].is_signed
                              ? (unsigned long long)(long long)((const int8_t *)tabs[k].tab)[n]
                              : ((const uint8_t *)tabs[k].tab)[n];
                else if (tabs[k].elem == 4)
                    got = ((const uint32_t *)tabs[k].tab)[n];
                else
                    got = ((const uint64_t *)tabs[k].tab)[n];
            }
            if (got != want && bad < 0)
                bad = n;
            n++;
        }
        if (n != n_json && bad < 0)
            bad = n;
        ok(n == tabs[k].n && bad < 0, "table %s: %d values, first mismatch %d", tabs[k].name, n,
           bad);
    }
    cJSON_Delete(root);
    free(text);
}

int main(void)
{
    const char *fx = tap_fixtures();
    test_tables(fx);
    test_fixtures(fx);
    struct strata_err err = {0};
    float y[32];
    ok(strata_quant_dequant_ref(STRATA_TYPE_Q8_1, y, y, 32, &err) == STRATA_E_UNSUPPORTED &&
           strstr(err.msg, "Q8_1") != NULL,
       "Q8_1 refused: %s", err.msg);
    ok(strata_quant_dequant_ref(STRATA_TYPE_Q4_0, y, y, 31, &err) == STRATA_E_INVALID,
       "31 elements of Q4_0 refused: %s", err.msg);
    return tap_done();
}
