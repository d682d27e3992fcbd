/* test_vocab_suite.c - every string of every tokenizer suite in
 * $STRATA_FIXTURES/vocab (ggml-vocab-NAME.gguf, .inp strings separated by
 * "\n__ggml_vocab_test__\n", .out one line of ids per string, no BOS) must
 * tokenize to exactly the expected ids, and decode back to the input. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "tap.h"
#include "vocab.h"

#define SEP "\n__ggml_vocab_test__\n"

static int is_nfc_sensitive(const char *pre)
{
    return strcmp(pre, "qwen2") == 0 || strcmp(pre, "mpt") == 0;
}

static void run_suite(const char *dir, const char *name)
{
    char path[4096], ipath[4200], opath[4200];
    struct strata_err err = { 0 };
    struct strata_gguf *g = NULL;
    struct strata_vocab *v = NULL;
    char *inp = NULL, *outs = NULL;
    size_t ilen, olen;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    snprintf(ipath, sizeof(ipath), "%s.inp", path);
    snprintf(opath, sizeof(opath), "%s.out", path);
    inp = tap_slurp(ipath, &ilen);
    outs = tap_slurp(opath, &olen);
    if (!inp || !outs) {
        diag("%s: no .inp/.out, skipped", name);
        goto out;
    }
    if (!ok(strata_gguf_open(&g, path, &err) == 0, "%s: open (%s)", name, err.msg))
        goto out;
    if (!ok(strata_vocab_load(&v, g, &err) == 0, "%s: load vocab (%s)", name, err.msg))
        goto out;

    /* split the expected lines */
    size_t n_lines = 0;
    char **lines = NULL;
    for (char *p = outs; *p;) {
        char *e = strchr(p, '\n');
        char **nl = realloc(lines, (n_lines + 1) * sizeof(*lines));
        if (!nl)
            break;
        lines = nl;
        lines[n_lines++] = p;
        if (!e)
            break;
        *e = 0;
        p = e + 1;
    }

    size_t k = 0, fails = 0, rt_fails = 0;
    char *p = inp, *end = inp + ilen;
    while (k < n_lines && p <= end) {
        char *e = strstr(p, SEP);
        size_t len = e ? (size_t)(e - p) : (size_t)(end - p);
        int32_t *ids = NULL;
        size_t n_ids = 0;
        int rc = strata_vocab_tokenize(v, p, len, 0, 1, &ids, &n_ids, &err);
        /* compare with the expected ids */
        int same = rc == 0;
        char *q = lines[k];
        size_t j = 0;
        while (same) {
            while (*q == ' ')
                q++;
            if (!*q)
                break;
            long want = strtol(q, &q, 10);
            if (j >= n_ids || ids[j] != want)
                same = 0;
            j++;
        }
        if (same && j != n_ids)
            same = 0;
        if (!same) {
            fails++;
            printf("# %s: string %zu '%.*s'\n#   want: %s\n#   got: ", name, k,
                   (int)(len > 80 ? 80 : len), p, lines[k]);
            for (size_t i = 0; i < n_ids; i++)
                printf(" %d", ids[i]);
            printf("\n");
        } else if (!is_nfc_sensitive(strata_vocab_pre(v))) {
            char *text = NULL;
            size_t tl = 0;
            if (strata_vocab_detokenize(v, ids, n_ids, 0, &text, &tl, &err) != 0 || tl != len ||
                memcmp(text, p, len) != 0) {
                rt_fails++;
                printf("# %s: string %zu '%.*s' decodes to '%s'\n", name, k,
                       (int)(len > 80 ? 80 : len), p, text ? text : "(error)");
            }
            free(text);
        }
        free(ids);
        k++;
        if (!e)
            break;
        p = e + strlen(SEP);
    }
    ok(fails == 0 && k == n_lines, "%s: %zu of %zu strings tokenize as expected", name,
       k - fails, n_lines);
    ok(rt_fails == 0, "%s: ids decode back to the input (%zu failures)", name, rt_fails);
    free(lines);
out:
    strata_vocab_free(v);
    strata_gguf_close(g);
    free(inp);
    free(outs);
}

int main(int argc, char **argv)
{
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s/vocab", tap_fixtures());
    if (argc > 1) {
        for (int i = 1; i < argc; i++)
            run_suite(dir, argv[i]);
        return tap_done();
    }
    DIR *d = opendir(dir);
    if (!ok(d != NULL, "open %s", dir))
        return tap_done();
    struct dirent *de;
    char *names[256];
    int n = 0;
    while ((de = readdir(d)) && n < 256) {
        size_t l = strlen(de->d_name);
        if (l > 5 && strcmp(de->d_name + l - 5, ".gguf") == 0)
            names[n++] = strdup(de->d_name);
    }
    closedir(d);
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (strcmp(names[j], names[i]) < 0) {
                char *t = names[i];
                names[i] = names[j];
                names[j] = t;
            }
    ok(n >= 8, "found %d vocabulary suites", n);
    for (int i = 0; i < n; i++) {
        run_suite(dir, names[i]);
        free(names[i]);
    }
    return tap_done();
}
