/* test_gguf_split.c - split sets: tinycoder F16 written as 3 shards
 * (NAME-0000K-of-00003.gguf, split.no / split.count / split.tensors.count
 * as gguf-split writes them) opens through any shard as the original; each
 * defect of a set is refused naming the shard at fault. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf.h"
#include "gguf_dump.h"
#include "gguf_write.h"
#include "tap.h"

#define N_SHARDS 3

static struct strata_gguf *src;
static char dir[64];

/* Per-shard overrides of what a correct writer would put. */
struct split_opts {
    int count[N_SHARDS];  /* split.count, 0 = the right value, -1 = omit */
    int no[N_SHARDS];     /* split.no + 1, 0 = the right value, -1 = omit */
    int tcount[N_SHARDS]; /* split.tensors.count, 0 = the right value */
    int dup_tensor;       /* shard 2 also holds shard 1's first tensor */
    const char *prefix;   /* file name prefix in dir, default "tc" */
    int name_n;           /* N in the file names, 0 = N_SHARDS */
};

static void shard_path(char *buf, size_t n, const struct split_opts *o, int k)
{
    snprintf(buf, n, "%s/%s-%05d-of-%05d.gguf", dir, o->prefix ? o->prefix : "tc", k + 1,
             o->name_n ? o->name_n : N_SHARDS);
}

static int write_split(const struct split_opts *o)
{
    struct strata_err e = {0};
    uint64_t nt = strata_gguf_n_tensors(src), per = (nt + N_SHARDS - 1) / N_SHARDS;
    int rc = 0;
    for (int k = 0; k < N_SHARDS && !rc; k++) {
        struct strata_gguf_writer *w = NULL;
        char path[256];
        rc = strata_gguf_writer_create(&w, &e);
        if (k == 0)
            for (uint64_t i = 0; !rc && i < strata_gguf_n_kv(src); i++)
                rc = strata_gguf_writer_add_kv(w, strata_gguf_kv_at(src, i), &e);
        if (!rc && o->no[k] >= 0)
            rc = strata_gguf_writer_add_u16(w, "split.no", (uint16_t)(o->no[k] ? o->no[k] - 1 : k),
                                            &e);
        if (!rc && o->count[k] >= 0)
            rc = strata_gguf_writer_add_u16(w, "split.count",
                                            (uint16_t)(o->count[k] ? o->count[k] : N_SHARDS), &e);
        if (!rc)
            rc = strata_gguf_writer_add_i32(w, "split.tensors.count",
                                            o->tcount[k] ? o->tcount[k] : (int32_t)nt, &e);
        for (uint64_t i = k * per; !rc && i < nt && i < (uint64_t)(k + 1) * per; i++) {
            const struct strata_gguf_tensor *t = strata_gguf_tensor_at(src, i);
            rc = strata_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, &e);
        }
        if (!rc && k == 2 && o->dup_tensor) {
            const struct strata_gguf_tensor *t = strata_gguf_tensor_at(src, per);
            rc = strata_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, &e);
        }
        shard_path(path, sizeof(path), o, k);
        if (!rc)
            rc = strata_gguf_writer_write_file(w, path, &e);
        strata_gguf_writer_free(w);
    }
    if (rc)
        diag("writing the split set: %s", e.msg);
    return rc;
}

static void remove_split(const struct split_opts *o)
{
    for (int k = 0; k < N_SHARDS; k++) {
        char path[256];
        shard_path(path, sizeof(path), o, k);
        unlink(path);
    }
}

static void test_good(void)
{
    struct split_opts o = {0};
    if (!ok(write_split(&o) == 0, "3-shard split set written"))
        return;
    for (int k = 0; k < N_SHARDS; k++) {
        char path[256];
        struct strata_err e = {0};
        struct strata_gguf *g = NULL;
        shard_path(path, sizeof(path), &o, k);
        if (!ok(strata_gguf_open(&g, path, &e) == 0, "open through shard %d: %s", k + 1, e.msg))
            continue;
        const char *arch = NULL;
        ok(strata_gguf_n_shards(g) == N_SHARDS, "3 shards");
        ok(strata_gguf_get_str(g, "general.architecture", &arch, &e) == 0 &&
               strcmp(arch, "qwen3moe") == 0,
           "metadata of the first shard");
        ok(strata_gguf_n_tensors(g) == strata_gguf_n_tensors(src), "51 tensors in one index");
        int same = 0, shards_seen = 0;
        for (uint64_t i = 0; i < strata_gguf_n_tensors(src); i++) {
            const struct strata_gguf_tensor *a = strata_gguf_tensor_at(src, i);
            const struct strata_gguf_tensor *b = strata_gguf_find_tensor(g, a->name);
            if (b && b == strata_gguf_tensor_at(g, i) && b->type == a->type &&
                b->n_bytes == a->n_bytes && memcmp(b->ne, a->ne, sizeof(a->ne)) == 0 &&
                memcmp(a->data, b->data, a->n_bytes) == 0 &&
                (const char *)b->data ==
                    (const char *)strata_gguf_shard_base(g, b->shard) + b->offset)
                same++;
            shards_seen |= b ? 1 << b->shard : 0;
        }
        ok(same == (int)strata_gguf_n_tensors(src), "every tensor equal to the original (%d)",
           same);
        ok(shards_seen == 7, "tensors come from all three shards");
        ok(strstr(strata_gguf_shard_path(g, 2), "tc-00003-of-00003.gguf") != NULL,
           "shard 3 path %s", strata_gguf_shard_path(g, 2));
        if (k == 1) {
            char *text = NULL;
            size_t n = 0;
            FILE *f = open_memstream(&text, &n);
            int rc = f ? strata_gguf_dump_text(g, f, NULL, &e) : -1;
            if (f)
                fclose(f);
            ok(rc == 0 && strstr(text, "shards: 3\n") && strstr(text, "tensors: 51\n") &&
                   strstr(text, "tc-00003-of-00003.gguf (") &&
                   strstr(text, ": output_norm.weight F32 [256] 1024 bytes @ ") &&
                   strstr(text, " (shard 2)\n"),
               "the split set dumps as one model");
            free(text);
        }
        strata_gguf_close(g);
    }
    remove_split(&o);
}

/* Write o's set, optionally damage it, open shard `via`, expect code and msg. */
static void expect(const char *what, const struct split_opts *o, int via, int code, const char *msg,
                   void (*damage)(const struct split_opts *))
{
    char path[256];
    struct strata_err e = {0};
    struct strata_gguf *g = NULL;
    if (write_split(o) != 0) {
        ok(0, "%s: writing", what);
        return;
    }
    if (damage)
        damage(o);
    shard_path(path, sizeof(path), o, via);
    int rc = strata_gguf_open(&g, path, &e);
    ok(rc == code && !g && strstr(e.msg, msg), "%s: %s", what, e.msg);
    strata_gguf_close(g);
    remove_split(o);
}

static void rm_third(const struct split_opts *o)
{
    char p[256];
    shard_path(p, sizeof(p), o, 2);
    unlink(p);
}

static void copy_first_to_second(const struct split_opts *o)
{
    char a[256], b[256], cmd[600];
    shard_path(a, sizeof(a), o, 0);
    shard_path(b, sizeof(b), o, 1);
    snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", a, b);
    if (system(cmd) != 0)
        diag("cp failed");
}

static void link_second_to_first(const struct split_opts *o)
{
    char a[256], b[256];
    shard_path(a, sizeof(a), o, 0);
    shard_path(b, sizeof(b), o, 1);
    unlink(b);
    if (symlink(a, b) != 0)
        diag("symlink failed");
}

static void truncate_second(const struct split_opts *o)
{
    char b[256];
    shard_path(b, sizeof(b), o, 1);
    if (truncate(b, 100000) != 0)
        diag("truncate failed");
}

static void test_defects(void)
{
    struct split_opts o = {0};
    expect("missing shard", &o, 0, STRATA_E_NOTFOUND, "shard 3 of 3 '", rm_third);
    expect("missing shard named", &o, 1, STRATA_E_NOTFOUND, "tc-00003-of-00003.gguf' is missing",
           rm_third);
    expect("duplicated shard", &o, 0, STRATA_E_FORMAT,
           "tc-00002-of-00003.gguf' has split.no 0, expected 1", copy_first_to_second);
    expect("same file twice", &o, 2, STRATA_E_FORMAT,
           "tc-00002-of-00003.gguf' is the same file as shard", link_second_to_first);
    expect("truncated shard", &o, 0, STRATA_E_FORMAT, "tc-00002-of-00003.gguf': tensor '",
           truncate_second);

    o = (struct split_opts){.count = {0, 0, 4}};
    expect("split.count mismatch", &o, 0, STRATA_E_FORMAT,
           "tc-00003-of-00003.gguf' has split.count 4, expected 3", NULL);
    o = (struct split_opts){.no = {0, 0, 2}};
    expect("split.no mismatch", &o, 0, STRATA_E_FORMAT,
           "tc-00003-of-00003.gguf' has split.no 1, expected 2", NULL);
    o = (struct split_opts){.no = {0, -1, 0}};
    expect("split.no missing", &o, 0, STRATA_E_FORMAT, "tc-00002-of-00003.gguf' has no split.no",
           NULL);
    o = (struct split_opts){.count = {0, -1, 0}};
    expect("split.count missing", &o, 0, STRATA_E_FORMAT,
           "tc-00002-of-00003.gguf' has no split.count", NULL);
    o = (struct split_opts){.tcount = {0, 50, 0}};
    expect("split.tensors.count differs", &o, 0, STRATA_E_FORMAT,
           "tc-00002-of-00003.gguf' has split.tensors.count 50", NULL);
    o = (struct split_opts){.tcount = {52, 52, 52}};
    expect("split.tensors.count wrong", &o, 0, STRATA_E_FORMAT,
           "split.tensors.count is 52 but the 3 shards hold 51 tensors", NULL);
    o = (struct split_opts){.tcount = {52, 52, 52}, .dup_tensor = 1};
    expect("tensor in two shards", &o, 0, STRATA_E_FORMAT, "in shard '", NULL);
    o = (struct split_opts){.name_n = 4};
    expect("name says 4 shards", &o, 0, STRATA_E_FORMAT,
           "split.count is 3 but the name says 4 shards", NULL);

    /* a shard renamed so the name no longer follows the pattern */
    o = (struct split_opts){0};
    if (write_split(&o) == 0) {
        char a[256], b[256];
        struct strata_err e = {0};
        struct strata_gguf *g = NULL;
        shard_path(a, sizeof(a), &o, 0);
        snprintf(b, sizeof(b), "%s/renamed.gguf", dir);
        ok(rename(a, b) == 0 && strata_gguf_open(&g, b, &e) == STRATA_E_FORMAT &&
               strstr(e.msg, "renamed.gguf': split.count is 3 but the name is not NAME-"),
           "renamed shard: %s", e.msg);
        strata_gguf_close(g);
        unlink(b);
        remove_split(&o);
    }
    /* a plain file named like a shard */
    {
        char a[256];
        struct strata_err e = {0};
        struct strata_gguf *g = NULL;
        struct strata_gguf_writer *w = NULL;
        snprintf(a, sizeof(a), "%s/plain-00001-of-00002.gguf", dir);
        int rc = strata_gguf_writer_create(&w, &e);
        rc = rc ? rc : strata_gguf_writer_add_str(w, "general.architecture", "llama", &e);
        rc = rc ? rc : strata_gguf_writer_write_file(w, a, &e);
        strata_gguf_writer_free(w);
        ok(rc == 0 && strata_gguf_open(&g, a, &e) == STRATA_E_FORMAT &&
               strstr(e.msg, "is named as shard 1 of 2 but has no split.count"),
           "shard name without split keys: %s", e.msg);
        strata_gguf_close(g);
        unlink(a);
    }
}

int main(void)
{
    char path[4096];
    struct strata_err e = {0};
    snprintf(path, sizeof(path), "%s/models/tinycoder-moe-F16.gguf", tap_fixtures());
    snprintf(dir, sizeof(dir), "/tmp/strata-split-XXXXXX");
    if (!ok(mkdtemp(dir) != NULL, "temp dir") ||
        !ok(strata_gguf_open(&src, path, &e) == 0, "open %s: %s", path, e.msg))
        return tap_done();
    test_good();
    test_defects();
    strata_gguf_close(src);
    rmdir(dir);
    return tap_done();
}
