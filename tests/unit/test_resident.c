/* test_resident.c - resident images: identity, layout, load, attach, stale
 * and checksum handling, list and unload, on small packs of plain files (the
 * image does not parse the GGUF; the shell tests t08xx run real engines). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "gguf.h"
#include "pack.h"
#include "resident.h"
#include "sha256.h"
#include "tap.h"

static char g_tmp[256];

static int write_file(const char *path, const void *buf, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(buf, 1, n, f);
    return fclose(f) || w != n ? -1 : 0;
}

/* A native pack DIR/NAME with one model file of n bytes of seeded content;
 * sha: the hash to record (NULL: the true one).  Returns the pack path. */
static char *make_pack(const char *name, size_t n, unsigned seed, const char *sha,
                       unsigned char **content)
{
    static char dir[512];
    char path[600], hex[STRATA_SHA256_HEX], json[2048];
    unsigned char *buf = malloc(n);
    struct strata_sha256 *h = strata_sha256_new();
    for (size_t i = 0; i < n; i++)
        buf[i] = (unsigned char)((i * 2654435761u + seed * 40503u) >> 11);
    snprintf(dir, sizeof(dir), "%s/%s", g_tmp, name);
    mkdir(dir, 0755);
    snprintf(path, sizeof(path), "%s/model.gguf", dir);
    write_file(path, buf, n);
    strata_sha256_update(h, buf, n);
    strata_sha256_final(h, hex);
    strata_sha256_free(h);
    snprintf(json, sizeof(json),
             "{\"format\":\"strata-pack\",\"version\":1,\"name\":\"%s\",\"mode\":\"native\","
             "\"sources\":[{\"path\":\"model.gguf\",\"role\":\"model\",\"size\":%zu,"
             "\"sha256\":\"%s\"},{\"path\":\"/nonexistent/mmproj.gguf\",\"role\":\"mmproj\","
             "\"size\":1,\"sha256\":\"%064d\"}]}",
             name, n, sha ? sha : hex, 0);
    snprintf(path, sizeof(path), "%s/pack.json", dir);
    write_file(path, json, strlen(json));
    if (content)
        *content = buf;
    else
        free(buf);
    return dir;
}

static int shm_exists(const char *name, const char *ext)
{
    char p[128];
    snprintf(p, sizeof(p), "/dev/shm/%s.%s", name, ext);
    return access(p, F_OK) == 0;
}

/* A repacked pack of the tinycoder fixture (a copy with random bytes after
 * its data, so the image is this run's own): attached, every tensor of the
 * GGUF view and every expert record reads the same bytes as from the files,
 * though the image released the GGUF's routed experts. */
static void test_repacked(unsigned seed)
{
    const char *fx = getenv("STRATA_FIXTURES");
    char src[600], dir[600], cmd[4096];
    struct strata_err err = {0};
    if (!fx) {
        diag("STRATA_FIXTURES not set: repacked image test skipped");
        return;
    }
    snprintf(src, sizeof(src), "%s/tiny.gguf", g_tmp);
    snprintf(dir, sizeof(dir), "%s/rp.strata", g_tmp);
    snprintf(cmd, sizeof(cmd), "cp '%s/models/tinycoder-moe-Q4_K_M.gguf' '%s' && "
             "printf '%%08x' %u >> '%s' && mkdir -p '%s'", fx, src, seed, src, dir);
    if (system(cmd)) {
        ok(0, "copy the fixture");
        return;
    }
    struct strata_pack_build_opts bo = {.dir = dir, .gguf = src, .name = "rp", .repack = 1};
    ok(strata_pack_build(&bo, &err) == 0, "repacked pack built: %s", err.msg);
    struct strata_resident_load_opts lo = {.pack = dir, .direct_io = 1};
    struct strata_resident_image *img = NULL;
    struct strata_resident_load_stats st;
    ok(strata_resident_load(&lo, &img, &st, &err) == 0, "repacked image loaded: %s", err.msg);
    ok(img && st.released_bytes > 0, "routed experts of the GGUF released: %llu bytes",
       (unsigned long long)st.released_bytes);
    struct strata_pack *pa = NULL, *pf = NULL;
    ok(strata_pack_open(&pa, dir, &err) == 0 && strata_pack_resident(pa, NULL),
       "pack attached: %s", err.msg);
    setenv("STRATA_NO_RESIDENT", "1", 1);
    ok(strata_pack_open(&pf, dir, &err) == 0 && !strata_pack_resident(pf, NULL),
       "pack from the files");
    unsetenv("STRATA_NO_RESIDENT");
    if (pa && pf) {
        const struct strata_gguf *ga = strata_pack_gguf(pa), *gf = strata_pack_gguf(pf);
        uint64_t bad = 0, n = strata_gguf_n_tensors(gf);
        for (uint64_t i = 0; i < n; i++) {
            const struct strata_gguf_tensor *a = strata_gguf_tensor_at(ga, i);
            const struct strata_gguf_tensor *f = strata_gguf_tensor_at(gf, i);
            if (a->n_bytes != f->n_bytes || memcmp(a->data, f->data, f->n_bytes))
                bad++;
        }
        ok(n > 0 && bad == 0, "%llu tensors, %llu differ", (unsigned long long)n,
           (unsigned long long)bad);
        struct strata_pack_expert xa, xf;
        int same = 1;
        for (uint32_t il = 0; il < 64; il++) {
            const struct strata_pack_layer *L = strata_pack_layer(pf, il);
            if (!L)
                continue;
            for (uint32_t e = 0; e < L->n_expert; e++)
                if (strata_pack_expert(pa, il, e, &xa, NULL) ||
                    strata_pack_expert(pf, il, e, &xf, NULL) ||
                    memcmp(xa.record, xf.record, xf.record_size))
                    same = 0;
        }
        ok(same, "every expert record the same from the image");
        const void *rb = NULL;
        uint64_t rl = 0;
        const unsigned char *rec = NULL;
        for (uint32_t il = 0; il < 64 && !rec; il++)
            if (strata_pack_layer(pa, il) && strata_pack_expert(pa, il, 0, &xa, NULL) == 0)
                rec = xa.record;
        int have = strata_pack_resident_region(pa, &rb, &rl);
        ok(have == 1 && rec &&
               rec >= (const unsigned char *)rb && rec < (const unsigned char *)rb + rl,
           "GPU registration region: the expert records (%llu bytes)", (unsigned long long)rl);
        ok(strata_pack_resident_region(pf, &rb, &rl) == 0 && !rb && !rl,
           "no region when reading the files");
    }
    strata_pack_close(pa);
    strata_pack_close(pf);
    strata_resident_image_remove(img);
}

int main(void)
{
    struct strata_err err = {0};
    struct strata_resident_pack a = {0}, b = {0}, c = {0};
    unsigned seed = (unsigned)getpid() ^ (unsigned)time(NULL);
    unsigned char *content = NULL;
    snprintf(g_tmp, sizeof(g_tmp), "%s/strata-resident-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_tmp))
        return 1;

    /* identity: content, not path; the mmproj is not part of the image */
    size_t n = 3u << 20 | 123; /* not a multiple of the page size */
    char *pa = strdup(make_pack("a.strata", n, seed, NULL, &content));
    char *pb = strdup(make_pack("b.strata", n, seed, NULL, NULL));
    char *pc = strdup(make_pack("c.strata", n, seed + 1, NULL, NULL));
    ok(strata_resident_describe(pa, &a, &err) == 0, "describe: %s", err.msg);
    ok(strata_resident_describe(pb, &b, &err) == 0, "describe another directory");
    ok(strata_resident_describe(pc, &c, &err) == 0, "describe other content");
    ok(strncmp(a.name, "strata-", 7) == 0 && strlen(a.name) == 23, "name %s", a.name);
    ok(strcmp(a.identity, b.identity) == 0, "same content, same identity in another dir");
    ok(strcmp(a.identity, c.identity) != 0, "other content, other identity");
    ok(a.n_files == 1 && strcmp(a.files[0].role, "model") == 0, "one data file (no mmproj)");
    ok(a.files[0].offset == 0 && a.data_bytes == 2 * STRATA_RESIDENT_ALIGN,
       "layout: %llu bytes in 2 MiB units", (unsigned long long)a.data_bytes);
    strata_resident_pack_free(&c);
    ok(strata_resident_describe(g_tmp, &c, &err) == STRATA_E_NOTFOUND, "no pack.json: %s",
       err.msg);

    /* load, attach, read back */
    struct strata_resident_load_opts lo = {.pack = pa, .huge_pages = 1, .direct_io = 1};
    struct strata_resident_image *img = NULL, *img2 = NULL;
    struct strata_resident_load_stats st;
    int rc = strata_resident_load(&lo, &img, &st, &err);
    ok(rc == 0, "load: %s", err.msg);
    ok(rc == 0 && st.bytes == n, "load read %llu bytes", (unsigned long long)st.bytes);
    ok(shm_exists(a.name, "meta") && shm_exists(a.name, "data"), "objects exist");
    ok(strata_resident_load(&lo, &img2, NULL, &err) == STRATA_E_INVALID &&
           strstr(err.msg, "already resident"), "a second load is refused: %s", err.msg);

    struct strata_resident_att *att = NULL;
    char why[1024];
    ok(strata_resident_attach(&b, &att, why, sizeof(why), &err) == 0 && att,
       "attach from the other directory (%s)", why);
    uint64_t sz = 0;
    const void *bytes = att ? strata_resident_att_file(att, 0, &sz) : NULL;
    ok(bytes && sz == n && memcmp(bytes, content, n) == 0, "attached bytes = the file");
    ok(att && strata_resident_att_file(att, 1, &sz) == NULL, "file index out of range: NULL");

    struct strata_resident_info *v = NULL;
    size_t nv = 0;
    int found = 0;
    ok(strata_resident_list(&v, &nv, &err) == 0, "list");
    for (size_t i = 0; i < nv; i++)
        if (strcmp(v[i].name, a.name) == 0)
            found = v[i].state == STRATA_RESIDENT_READY && v[i].loader_pid == getpid() &&
                    v[i].loader_alive && v[i].data_bytes == a.data_bytes;
    ok(found, "listed: ready, this process as loader, size");
    free(v);

    /* stale: the file changed since it was loaded */
    struct timespec ts[2] = {{1000000000, 0}, {1000000000, 0}};
    utimensat(AT_FDCWD, a.files[0].path, ts, 0);
    struct strata_resident_att *att2 = NULL;
    ok(strata_resident_attach(&a, &att2, why, sizeof(why), &err) == 0 && !att2 &&
           strstr(why, "stale"), "changed mtime: stale (%s)", why);

    /* remove: the attachment stays readable */
    strata_resident_image_remove(img);
    img = NULL;
    ok(!shm_exists(a.name, "meta") && !shm_exists(a.name, "data"), "removed");
    ok(bytes && memcmp(bytes, content, n) == 0, "still readable after removal");
    ok(strata_resident_attach(&b, &att2, why, sizeof(why), &err) == 0 && !att2 && !why[0],
       "no image: nothing attached, no message");
    strata_resident_detach(att);
    ok(strata_resident_unload(a.name, NULL, &err) == STRATA_E_NOTFOUND, "unload: %s", err.msg);

    /* a recorded hash that does not match: refused, nothing left */
    struct strata_resident_pack d = {0};
    char *pd = make_pack("d.strata", 5000, seed + 2,
                         "00000000000000000000000000000000000000000000000000000000000000ff",
                         NULL);
    strata_resident_describe(pd, &d, NULL);
    lo.pack = pd;
    lo.direct_io = 0;
    ok(strata_resident_load(&lo, &img2, NULL, &err) == STRATA_E_CHECKSUM &&
           strstr(err.msg, "model.gguf': sha256"), "checksum mismatch: %s", err.msg);
    ok(!shm_exists(d.name, "meta") && !shm_exists(d.name, "data"), "nothing left after it");

    /* not enough memory: refused before anything is created */
    lo.pack = pb;
    lo.reserve_bytes = 1ull << 60;
    ok(strata_resident_load(&lo, &img2, NULL, &err) == STRATA_E_NOMEM &&
           strstr(err.msg, "MemAvailable"), "reserve: %s", err.msg);
    ok(!shm_exists(b.name, "meta"), "nothing created");

    test_repacked(seed);

    strata_resident_pack_free(&a);
    strata_resident_pack_free(&b);
    strata_resident_pack_free(&c);
    strata_resident_pack_free(&d);
    free(content);
    free(pa);
    free(pb);
    free(pc);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_tmp);
    if (system(cmd))
        diag("cannot remove %s", g_tmp);
    return tap_done();
}
