/* test_pack.c - packs from the tinycoder GGUF: build native and repacked,
 * open, expert placement against the GGUF bytes, verify catching a flipped
 * byte, a missing shard, an injected full disk, commit and --force rules. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf.h"
#include "gguf_write.h"
#include "pack.h"
#include "sha256.h"
#include "tap.h"

static char tmp[256];

static int copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    char buf[1 << 16];
    size_t n;
    int rc = a && b ? 0 : -1;
    while (!rc && (n = fread(buf, 1, sizeof(buf), a)) > 0)
        if (fwrite(buf, 1, n, b) != n)
            rc = -1;
    if (a)
        fclose(a);
    if (b && fclose(b))
        rc = -1;
    return rc;
}

static void flip_byte(const char *path, long off)
{
    int fd = open(path, O_RDWR);
    unsigned char c = 0;
    if (fd < 0)
        return;
    if (pread(fd, &c, 1, off) == 1) {
        c ^= 1;
        if (pwrite(fd, &c, 1, off) != 1)
            diag("cannot flip a byte of %s", path);
    }
    close(fd);
}

/* Every expert part of every layer equals the GGUF slice it came from. */
static int experts_match(const struct strata_pack *p, const struct strata_gguf *ref)
{
    struct strata_err err = {0};
    int layers = 0;
    for (uint32_t il = 0; il < 64; il++) {
        const struct strata_pack_layer *L = strata_pack_layer(p, il);
        if (!L)
            continue;
        layers++;
        for (uint32_t ie = 0; ie < L->n_expert; ie++) {
            struct strata_pack_expert x;
            if (strata_pack_expert(p, il, ie, &x, &err))
                return 0;
            for (uint32_t k = 0; k < L->n_parts; k++) {
                const struct strata_gguf_tensor *t =
                    strata_gguf_find_tensor(ref, L->part[k].tensor);
                if (!t || memcmp(x.part[k], (const char *)t->data + ie * L->part[k].n_bytes,
                                 L->part[k].n_bytes)) {
                    diag("layer %u expert %u part %s differs", il, ie, L->part[k].tensor);
                    return 0;
                }
            }
        }
    }
    return layers;
}

static int exists(const char *dir, const char *name)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

static int make_split(const char *in, unsigned n, const char *prefix)
{
    struct strata_err err = {0};
    struct strata_gguf *g = NULL;
    int rc = -1;
    if (strata_gguf_open(&g, in, &err))
        return -1;
    uint64_t nt = strata_gguf_n_tensors(g);
    for (unsigned k = 0; k < n; k++) {
        struct strata_gguf_writer *w = NULL;
        char path[1100];
        if (strata_gguf_writer_create(&w, &err))
            goto out;
        for (uint64_t i = 0; k == 0 && i < strata_gguf_n_kv(g); i++)
            strata_gguf_writer_add_kv(w, strata_gguf_kv_at(g, i), &err);
        strata_gguf_writer_add_u16(w, "split.no", (uint16_t)k, &err);
        strata_gguf_writer_add_u16(w, "split.count", (uint16_t)n, &err);
        strata_gguf_writer_add_i32(w, "split.tensors.count", (int32_t)nt, &err);
        for (uint64_t i = nt * k / n; i < nt * (k + 1) / n; i++) {
            const struct strata_gguf_tensor *t = strata_gguf_tensor_at(g, i);
            strata_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, &err);
        }
        snprintf(path, sizeof(path), "%s-%05u-of-%05u.gguf", prefix, (k + 1) % 100000, n % 100000);
        int wr = strata_gguf_writer_write_file(w, path, &err);
        strata_gguf_writer_free(w);
        if (wr)
            goto out;
    }
    rc = 0;
out:
    if (rc)
        diag("split: %s", err.msg);
    strata_gguf_close(g);
    return rc;
}

static void test_build(const char *gguf, const struct strata_gguf *ref, int repack,
                       const char *label)
{
    struct strata_err err = {0};
    struct strata_pack *p = NULL;
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/%s.strata.partial", tmp, label);
    mkdir(dir, 0755);
    struct strata_pack_build_opts o = {
        .dir = dir, .gguf = gguf, .name = label, .repack = repack, .n_ctx = 2048,
        .low_ram = 0,
    };
    int rc = strata_pack_build(&o, &err);
    ok(rc == 0, "%s: build (%s)", label, err.msg);
    ok(exists(dir, "pack.json") && exists(dir, "experts.bin") == repack &&
           !exists(dir, "pack.json.tmp") && !exists(dir, "experts.bin.tmp"),
       "%s: pack.json%s written, no temporaries left", label, repack ? " and experts.bin" : "");
    rc = strata_pack_open(&p, dir, &err);
    ok(rc == 0, "%s: open (%s)", label, err.msg);
    if (rc)
        return;
    ok(strata_pack_mode(p) == (repack ? STRATA_PACK_REPACKED : STRATA_PACK_NATIVE),
       "%s: mode recorded", label);
    ok(strata_gguf_n_tensors(strata_pack_gguf(p)) == strata_gguf_n_tensors(ref),
       "%s: every tensor visible", label);
    ok(experts_match(p, ref) == 4, "%s: 4 MoE layers, every expert's bytes equal the GGUF's",
       label);
    struct strata_pack_info in;
    strata_pack_get_info(p, 0, &in);
    ok(in.n_ctx == 2048 && in.n_expert == 16 && in.n_expert_used == 4 && in.n_layer == 4 &&
           in.n_moe_layers == 4 && in.n_embd == 256,
       "%s: hparams (n_ctx %u, n_expert %u, n_layer %u)", label, in.n_ctx, in.n_expert,
       in.n_layer);
    /* 2 kv heads x (32 + 32) x 4 layers x 2 bytes */
    ok(in.kv_bytes_per_token == 2 * 64 * 4 * 2, "%s: kv bytes per token %llu", label,
       (unsigned long long)in.kv_bytes_per_token);
    ok(in.dense_bytes + in.expert_bytes == in.total_bytes && in.expert_bytes > in.dense_bytes &&
           in.vram_min == in.dense_bytes + in.kv_bytes_per_token * 2048 + in.scratch_bytes,
       "%s: memory figures add up", label);
    if (repack) {
        const struct strata_pack_layer *L = strata_pack_layer(p, 1);
        struct strata_pack_expert x;
        strata_pack_expert(p, 1, 3, &x, &err);
        ok(L && x.record_offset % STRATA_PACK_RECORD_ALIGN == 0 && x.fd >= 0 &&
               x.record_size >= L->part[0].n_bytes * 3 && strstr(L->part[0].tensor, "gate") &&
               strstr(L->part[1].tensor, "up") && strstr(L->part[2].tensor, "down"),
           "%s: records aligned, gate/up/down in order", label);
    }
    {
        const void *d = NULL;
        size_t stride = 0;
        const struct strata_gguf_tensor *t =
            strata_gguf_find_tensor(ref, "blk.2.ffn_down_exps.weight");
        int r = strata_pack_expert_tensor(p, "blk.2.ffn_down_exps.weight", &d, &stride, &err);
        ok(r == 0 && t && !memcmp((const char *)d + 5 * stride,
                                  (const char *)t->data + 5 * (t->n_bytes / 16), t->n_bytes / 16),
           "%s: expert tensor view (data, stride %zu) reaches expert 5's down bytes", label,
           stride);
        ok(strata_pack_expert_tensor(p, "blk.2.attn_q.weight", &d, &stride, &err) ==
               STRATA_E_NOTFOUND,
           "%s: a dense tensor has no expert view", label);
    }
    struct strata_pack_expert x;
    ok(strata_pack_expert(p, 0, 16, &x, &err) == STRATA_E_INVALID && strstr(err.msg, "16"),
       "%s: expert out of range refused: %s", label, err.msg);
    strata_pack_close(p);
    ok(strata_pack_verify(dir, NULL, NULL, &err) == 0, "%s: verify (%s)", label, err.msg);
}

int main(void)
{
    struct strata_err err = {0};
    struct strata_gguf *ref = NULL;
    char src[512], split_prefix[512], path[600], dir[512], fin[512];
    snprintf(tmp, sizeof(tmp), "/tmp/strata-test-pack-XXXXXX");
    if (!mkdtemp(tmp))
        return 1;
    snprintf(path, sizeof(path), "%s/models/tinycoder-moe-F16.gguf", tap_fixtures());
    snprintf(src, sizeof(src), "%s/tinycoder-moe-F16.gguf", tmp);
    if (copy_file(path, src) || strata_gguf_open(&ref, src, &err)) {
        ok(0, "fixture %s: %s", path, err.msg);
        return tap_done();
    }

    test_build(src, ref, 0, "native");
    test_build(src, ref, 1, "repacked");

    /* a bare GGUF opens as a native pack */
    struct strata_pack *p = NULL;
    ok(strata_pack_open(&p, src, &err) == 0 && strata_pack_dir(p) == NULL &&
           experts_match(p, ref) == 4,
       "bare GGUF opens with an in-memory expert index");
    strata_pack_close(p);

    /* split set of 3 shards */
    snprintf(split_prefix, sizeof(split_prefix), "%s/tc", tmp);
    ok(make_split(src, 3, split_prefix) == 0, "3-shard split set written");
    snprintf(path, sizeof(path), "%s-00001-of-00003.gguf", split_prefix);
    test_build(path, ref, 1, "split");

    /* verify names the file with one flipped byte */
    snprintf(dir, sizeof(dir), "%s/repacked.strata.partial", tmp);
    snprintf(path, sizeof(path), "%s/experts.bin", dir);
    flip_byte(path, 12345);
    int rc = strata_pack_verify(dir, NULL, NULL, &err);
    ok(rc == STRATA_E_CHECKSUM && strstr(err.msg, "experts.bin"),
       "verify names experts.bin: %s", err.msg);
    flip_byte(path, 12345);
    snprintf(path, sizeof(path), "%s-00002-of-00003.gguf", split_prefix);
    flip_byte(path, 5000000);
    snprintf(dir, sizeof(dir), "%s/split.strata.partial", tmp);
    rc = strata_pack_verify(dir, NULL, NULL, &err);
    ok(rc == STRATA_E_CHECKSUM && strstr(err.msg, "-00002-of-00003.gguf"),
       "verify names the shard: %s", err.msg);
    flip_byte(path, 5000000);
    ok(strata_pack_verify(dir, NULL, NULL, &err) == 0, "verify passes again after restoring");

    /* missing shard: open names it */
    char moved[700];
    snprintf(moved, sizeof(moved), "%s.away", path);
    rename(path, moved);
    rc = strata_pack_open(&p, dir, &err);
    ok(rc == STRATA_E_NOTFOUND && strstr(err.msg, "-00002-of-00003.gguf"),
       "missing shard named: %s", err.msg);
    rename(moved, path);

    /* truncated experts.bin */
    snprintf(dir, sizeof(dir), "%s/repacked.strata.partial", tmp);
    snprintf(path, sizeof(path), "%s/experts.bin", dir);
    struct stat st;
    stat(path, &st);
    ok(truncate(path, st.st_size - 4096) == 0, "truncate experts.bin");
    rc = strata_pack_open(&p, dir, &err);
    ok(rc == STRATA_E_FORMAT && strstr(err.msg, "experts.bin") && strstr(err.msg, "truncated"),
       "truncated experts.bin refused: %s", err.msg);

    /* full disk while writing experts.bin */
    snprintf(dir, sizeof(dir), "%s/full.strata.partial", tmp);
    mkdir(dir, 0755);
    setenv("STRATA_FAULT_ENOSPC_AT", "1000000", 1);
    struct strata_pack_build_opts o = {.dir = dir, .gguf = src, .name = "full", .repack = 1};
    rc = strata_pack_build(&o, &err);
    unsetenv("STRATA_FAULT_ENOSPC_AT");
    ok(rc == STRATA_E_IO && strstr(err.msg, "No space left") && strstr(err.msg, "experts.bin"),
       "full disk: %s", err.msg);
    ok(!exists(dir, "pack.json") && !exists(dir, "experts.bin") &&
           !exists(dir, "experts.bin.tmp"),
       "full disk leaves no pack.json or experts.bin");

    /* commit: rename, refuse to overwrite, --force replaces */
    snprintf(dir, sizeof(dir), "%s/native.strata.partial", tmp);
    snprintf(fin, sizeof(fin), "%s/native.strata", tmp);
    ok(strata_pack_commit(dir, fin, 0, &err) == 0 && exists(fin, "pack.json") &&
           access(dir, F_OK) != 0,
       "commit renames the partial directory");
    mkdir(dir, 0755);
    rc = strata_pack_commit(dir, fin, 0, &err);
    ok(rc == STRATA_E_INVALID && strstr(err.msg, "already exists") && exists(fin, "pack.json"),
       "existing pack kept without force: %s", err.msg);
    ok(strata_pack_commit(dir, fin, 1, &err) == 0 && !exists(fin, "pack.json"),
       "force replaces it");

    /* a hostile pack.json */
    snprintf(dir, sizeof(dir), "%s/bad.strata", tmp);
    mkdir(dir, 0755);
    snprintf(path, sizeof(path), "%s/pack.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"format\":\"strata-pack\",\"version\":99,\"mode\":\"native\"}", f);
    fclose(f);
    rc = strata_pack_open(&p, dir, &err);
    ok(rc == STRATA_E_UNSUPPORTED && strstr(err.msg, "99"), "newer version refused: %s", err.msg);
    f = fopen(path, "w");
    fputs("{\"format\":\"strata-pack\",\"version\":1,\"mode\":\"native\",\"sources\":[{}]}", f);
    fclose(f);
    rc = strata_pack_open(&p, dir, &err);
    ok(rc == STRATA_E_FORMAT && strstr(err.msg, "sources"), "bad sources refused: %s", err.msg);

    strata_gguf_close(ref);
    ok(strata_pack_remove_tree(tmp, &err) == 0 && access(tmp, F_OK) != 0, "cleanup");
    return tap_done();
}
