/* prepare.c - plan, download, build and commit a pack (see prepare.h). */
#include "prepare.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "download.h"
#include "gguf.h"
#include "log.h"
#include "pack.h"
#include "sha256.h"

#define MAX_FILES 64

struct item {
    char *src;      /* as given (URL, hf:, or local path) */
    char *path;     /* local file: the source; remote: the destination in partial */
    uint64_t size;  /* 0 unknown */
    int approx;
    int remote;
    int mmproj;
    char sha[STRATA_SHA256_HEX]; /* expected, "" unknown */
    uint64_t present;            /* bytes already downloaded */
};

struct job {
    const struct strata_prepare_opts *o;
    struct item it[MAX_FILES];
    int n;
    cJSON *preset;           /* the preset, when one was used */
    const cJSON *arch;       /* its "arch" */
    char *name, *final_dir, *partial_dir;
    struct strata_pack_info info;
    int have_info;           /* info is exact (from the GGUF) */
    int est;                 /* info is a preset estimate */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Bytes for people: "1.50 GiB", "9.2 MiB"; "~" marks an estimate. */
static void gib(char *b, size_t n, uint64_t v, int approx)
{
    const char *pre = approx ? "~" : "";
    if (v >= (1ull << 30))
        snprintf(b, n, "%s%.2f GiB", pre, (double)v / (1024.0 * 1024 * 1024));
    else if (v >= (1ull << 20))
        snprintf(b, n, "%s%.1f MiB", pre, (double)v / (1024.0 * 1024));
    else
        snprintf(b, n, "%s%.1f KiB", pre, (double)v / 1024.0);
}

static char *join(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", a, b);
    return p;
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static int read_json(const char *path, cJSON **out, struct strata_err *err)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n;
    int rc = 0;
    if (!f)
        return strata_err_set(err, errno == ENOENT ? STRATA_E_NOTFOUND : STRATA_E_IO,
                              "cannot open '%s': %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 || n > (16 << 20) ||
        fseek(f, 0, SEEK_SET)) {
        rc = strata_err_set(err, STRATA_E_IO, "cannot read '%s'", path);
        goto out;
    }
    buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        rc = strata_err_set(err, STRATA_E_IO, "cannot read '%s'", path);
        goto out;
    }
    buf[n] = 0;
    *out = cJSON_Parse(buf);
    if (!*out)
        rc = strata_err_set(err, STRATA_E_FORMAT, "'%s' is not valid JSON (near '%.20s')",
                            path, cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() : "?");
out:
    free(buf);
    fclose(f);
    return rc;
}

static double jnum(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

static const char *jstr(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* "$STRATA_FIXTURES/x" -> the fixtures directory + "/x"; else a copy. */
static char *expand_src(const char *src, const char *presets_dir)
{
    static const char var[] = "$STRATA_FIXTURES";
    if (strncmp(src, var, sizeof(var) - 1))
        return strdup(src);
    const char *fx = getenv("STRATA_FIXTURES");
    char def[4096];
    if (!fx || !*fx) {
        snprintf(def, sizeof(def), "%s/../../shared/fixtures", presets_dir);
        fx = def;
    }
    size_t n = strlen(fx) + strlen(src) + 1;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s%s", fx, src + sizeof(var) - 1);
    return p;
}

static uint64_t free_bytes(const char *dir)
{
    const char *t = getenv("STRATA_TEST_FREE_BYTES"); /* test hook */
    struct statvfs s;
    if (t && *t)
        return strtoull(t, NULL, 10);
    if (statvfs(dir, &s))
        return UINT64_MAX;
    return (uint64_t)s.f_bavail * s.f_frsize;
}

/* Estimated figures from a preset's "arch" and the total file size. */
static void estimate(const cJSON *arch, uint64_t total, uint32_t n_ctx, int low_ram,
                     struct strata_pack_info *o)
{
    memset(o, 0, sizeof(*o));
    snprintf(o->arch, sizeof(o->arch), "%s", jstr(arch, "arch") ? jstr(arch, "arch") : "");
    o->n_layer = (uint32_t)jnum(arch, "n_layer");
    o->n_embd = (uint32_t)jnum(arch, "n_embd");
    o->n_vocab = (uint32_t)jnum(arch, "n_vocab");
    o->n_head_kv = (uint32_t)jnum(arch, "n_head_kv");
    o->n_expert = (uint32_t)jnum(arch, "n_expert");
    o->n_expert_used = (uint32_t)jnum(arch, "n_expert_used");
    o->n_ctx_train = (uint32_t)jnum(arch, "n_ctx_train");
    o->kv_bytes_per_token = (uint64_t)jnum(arch, "kv_bytes_per_token");
    double frac = jnum(arch, "expert_fraction");
    o->total_bytes = total;
    o->expert_bytes = (uint64_t)((double)total * (frac > 0 && frac < 1 ? frac : 0.9));
    o->dense_bytes = total - o->expert_bytes;
    o->scratch_bytes = (uint64_t)512 * 4 * ((uint64_t)o->n_embd * 16 + o->n_vocab) +
                       (64ull << 20);
    o->n_ctx = n_ctx ? n_ctx : (o->n_ctx_train ? o->n_ctx_train : 4096);
    o->vram_min = o->dense_bytes + o->kv_bytes_per_token * o->n_ctx + o->scratch_bytes;
    o->vram_full = o->vram_min + o->expert_bytes;
    o->low_ram = low_ram > 0;
    o->ram_bytes = o->dense_bytes + (o->low_ram ? 0 : o->expert_bytes);
}

/* ---- resolving the files ----------------------------------------------- */

static int add_item(struct job *j, const char *src, uint64_t size, int approx, int mmproj,
                    const char *sha, const char *presets_dir, struct strata_err *err)
{
    if (j->n == MAX_FILES)
        return strata_err_set(err, STRATA_E_LIMIT, "more than %d source files", MAX_FILES);
    struct item *it = &j->it[j->n];
    memset(it, 0, sizeof(*it));
    it->src = presets_dir ? expand_src(src, presets_dir) : strdup(src);
    if (!it->src)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    j->n++;
    it->remote = strata_download_is_remote(it->src);
    if (it->remote) {
        /* a malformed hf: source is refused before the plan is printed */
        char *url = NULL;
        int rc = strata_download_resolve(it->src, &url, err);
        free(url);
        if (rc)
            return rc;
    }
    it->size = size;
    it->approx = approx;
    it->mmproj = mmproj;
    if (sha && *sha) {
        if (!strata_sha256_is_hex(sha))
            return strata_err_set(err, STRATA_E_INVALID, "'%s' is not a sha256 (64 hex "
                                  "digits)", sha);
        for (int i = 0; i < 65; i++)
            it->sha[i] = (char)(sha[i] >= 'A' && sha[i] <= 'F' ? sha[i] + 32 : sha[i]);
    }
    return 0;
}

static int from_preset(struct job *j, struct strata_err *err)
{
    const struct strata_prepare_opts *o = j->o;
    char path[4096];
    int rc;
    for (const char *c = o->family; *c; c++)
        if (*c == '/' || (c == o->family && *c == '.'))
            return strata_err_set(err, STRATA_E_INVALID, "bad family name '%s'", o->family);
    snprintf(path, sizeof(path), "%s/%s.json", o->presets_dir, o->family);
    rc = read_json(path, &j->preset, err);
    if (rc == STRATA_E_NOTFOUND)
        return strata_err_set(err, STRATA_E_INVALID,
                              "no preset for family '%s' in '%s' (see --list)", o->family,
                              o->presets_dir);
    if (rc)
        return rc;
    const char *model = o->model ? o->model : jstr(j->preset, "default_model");
    const cJSON *models = cJSON_GetObjectItemCaseSensitive(j->preset, "models");
    const cJSON *m = model ? cJSON_GetObjectItemCaseSensitive(models, model) : NULL;
    if (!m) {
        char avail[512] = "";
        const cJSON *x;
        cJSON_ArrayForEach(x, models) {
            size_t l = strlen(avail);
            snprintf(avail + l, sizeof(avail) - l, "%s%s", l ? ", " : "", x->string);
        }
        return strata_err_set(err, STRATA_E_INVALID,
                              "family '%s' has no model '%s' (available: %s)", o->family,
                              model ? model : "(none)", avail);
    }
    j->arch = cJSON_GetObjectItemCaseSensitive(j->preset, "arch");
    const cJSON *f;
    cJSON_ArrayForEach(f, cJSON_GetObjectItemCaseSensitive(m, "files")) {
        const char *src = jstr(f, "src");
        if (!src)
            return strata_err_set(err, STRATA_E_FORMAT, "'%s': a file of '%s' has no \"src\"",
                                  path, model);
        rc = add_item(j, src, (uint64_t)jnum(f, "size"),
                      cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(f, "approx")), 0,
                      jstr(f, "sha256"), o->presets_dir, err);
        if (rc)
            return rc;
    }
    if (!j->n)
        return strata_err_set(err, STRATA_E_FORMAT, "'%s': model '%s' lists no files", path,
                              model);
    if (o->vision) {
        const cJSON *mp = cJSON_GetObjectItemCaseSensitive(j->preset, "mmproj");
        if (!jstr(mp, "src"))
            return strata_err_set(err, STRATA_E_INVALID,
                                  "family '%s' has no vision projector (mmproj)", o->family);
        rc = add_item(j, jstr(mp, "src"), (uint64_t)jnum(mp, "size"), 0, 1, jstr(mp, "sha256"),
                      o->presets_dir, err);
        if (rc)
            return rc;
    }
    if (!o->name) {
        size_t n = strlen(o->family) + strlen(model) + 2;
        j->name = malloc(n);
        if (j->name)
            snprintf(j->name, n, "%s-%s", o->family, model);
    }
    return 0;
}

/* "X-00001-of-00003.gguf" at the end of s: fills the shard count and the
 * offset of the first digit. */
static int split_pos(const char *s, unsigned *count, size_t *pos)
{
    size_t n = strcspn(s, "?#");
    static const char pat[] = "-#####-of-#####.gguf";
    size_t pl = sizeof(pat) - 1;
    if (n <= pl)
        return 0;
    const char *p = s + n - pl;
    unsigned k = 0, c = 0;
    for (size_t i = 0; i < pl; i++) {
        if (pat[i] == '#') {
            if (p[i] < '0' || p[i] > '9')
                return 0;
            if (i < 7)
                k = k * 10 + (unsigned)(p[i] - '0');
            else
                c = c * 10 + (unsigned)(p[i] - '0');
        } else if (p[i] != pat[i]) {
            return 0;
        }
    }
    if (k != 1 || c < 1)
        return 0;
    *count = c;
    *pos = (size_t)(p - s) + 1;
    return 1;
}

static int from_source(struct job *j, struct strata_err *err)
{
    const struct strata_prepare_opts *o = j->o;
    int rc;
    if (strata_download_is_remote(o->source)) {
        unsigned count = 1;
        size_t pos = 0;
        if (!split_pos(o->source, &count, &pos))
            count = 1;
        if (count > 1 && o->sha256)
            return strata_err_set(err, STRATA_E_INVALID,
                                  "--sha256 names one file, '%s' is a split set of %u",
                                  o->source, count);
        for (unsigned k = 1; k <= count; k++) {
            char *s = strdup(o->source);
            if (!s)
                return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
            if (count > 1) {
                char d[6];
                snprintf(d, sizeof(d), "%05u", k % 100000);
                memcpy(s + pos, d, 5);
            }
            rc = add_item(j, s, 0, 0, 0, o->sha256, NULL, err);
            free(s);
            if (rc)
                return rc;
        }
        if (o->vision)
            return strata_err_set(err, STRATA_E_INVALID,
                                  "--vision yes needs a preset or a local model with an "
                                  "mmproj*.gguf beside it");
        return 0;
    }
    /* local: the GGUF reader finds and checks the shards */
    struct strata_gguf *g = NULL;
    if (o->sha256)
        return strata_err_set(err, STRATA_E_INVALID, "--sha256 is for downloads; use "
                              "--verify for a pack");
    rc = strata_gguf_open(&g, o->source, err);
    if (rc)
        return rc;
    for (uint32_t s = 0; !rc && s < strata_gguf_n_shards(g); s++)
        rc = add_item(j, strata_gguf_shard_path(g, s), strata_gguf_shard_size(g, s), 0, 0,
                      NULL, NULL, err);
    strata_gguf_close(g);
    if (rc || !o->vision)
        return rc;
    /* the projector beside the model, as llama.cpp users keep it */
    char *dir = strdup(o->source);
    if (!dir)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    char *sl = strrchr(dir, '/');
    if (sl)
        *sl = 0;
    else
        strcpy(dir, ".");
    DIR *d = opendir(dir);
    struct dirent *e;
    char *found = NULL;
    while (d && (e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (!strncmp(e->d_name, "mmproj", 6) && l > 5 && !strcmp(e->d_name + l - 5, ".gguf") &&
            (!found || strcmp(e->d_name, base_name(found)) < 0)) {
            free(found);
            found = join(dir, e->d_name);
        }
    }
    if (d)
        closedir(d);
    if (found) {
        struct stat st;
        rc = add_item(j, found, stat(found, &st) ? 0 : (uint64_t)st.st_size, 0, 1, NULL, NULL,
                      err);
    } else {
        rc = strata_err_set(err, STRATA_E_NOTFOUND,
                            "--vision yes: no mmproj*.gguf beside '%s'", o->source);
    }
    free(found);
    free(dir);
    return rc;
}

static char *default_name(const char *src)
{
    char *n = strata_download_file_name(src);
    unsigned c;
    size_t pos;
    if (!n)
        return NULL;
    if (split_pos(n, &c, &pos))
        n[pos - 1] = 0;
    else {
        size_t l = strlen(n);
        if (l > 5 && !strcmp(n + l - 5, ".gguf"))
            n[l - 5] = 0;
    }
    return n;
}

/* ---- plan -------------------------------------------------------------- */

static uint64_t file_size_or0(const char *p)
{
    struct stat st;
    return stat(p, &st) ? 0 : (uint64_t)st.st_size;
}

static void print_info(FILE *f, const struct strata_pack_info *in, int est)
{
    char a[32], b[32], c[32], d[32];
    gib(a, sizeof(a), in->dense_bytes, est);
    gib(b, sizeof(b), in->expert_bytes, est);
    fprintf(f, "  weights: dense %s, routed experts %s", a, b);
    if (in->n_expert)
        fprintf(f, " (%u experts, %u active)", in->n_expert, in->n_expert_used);
    fprintf(f, "\n");
    gib(a, sizeof(a), in->kv_bytes_per_token * in->n_ctx, est);
    fprintf(f, "  kv cache at context %u: %s (%" PRIu64 " bytes per token, F16)\n", in->n_ctx,
            a, in->kv_bytes_per_token);
    gib(b, sizeof(b), in->vram_min, est);
    gib(c, sizeof(c), in->vram_full, est);
    gib(d, sizeof(d), in->ram_bytes, est);
    fprintf(f, "  VRAM: at least %s (dense + kv + scratch), %s with every expert\n", b, c);
    fprintf(f, "  RAM: %s%s\n", d,
            in->low_ram ? " (low-ram: experts stay in the page cache)" : " (experts resident)");
}

static int plan(struct job *j, uint64_t *need_out, struct strata_err *err)
{
    const struct strata_prepare_opts *o = j->o;
    FILE *f = o->json ? stderr : o->out;
    uint64_t fetch = 0, total = 0, repack_bytes = 0;
    int approx = 0, unknown = 0;
    struct strata_download_opts dl = {.offline = o->offline, .stall_s = o->stall_s,
                                      .retries = 0};
    for (int i = 0; i < j->n; i++) {
        struct item *it = &j->it[i];
        if (!it->remote) {
            struct stat st;
            if (stat(it->src, &st))
                return strata_err_set(err, STRATA_E_NOTFOUND, "cannot open '%s': %s",
                                      it->src, strerror(errno));
            it->size = (uint64_t)st.st_size;
            it->path = strdup(it->src);
        } else {
            char *fn = strata_download_file_name(it->src);
            it->path = fn ? join(j->partial_dir, fn) : NULL;
            free(fn);
            if (!it->path)
                return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
            uint64_t have = file_size_or0(it->path);
            if (have) {
                it->present = have;
                if (!it->size)
                    it->size = have;
            } else {
                char part[4200];
                snprintf(part, sizeof(part), "%s.part", it->path);
                it->present = file_size_or0(part);
                if (!o->offline) {
                    uint64_t sz = 0;
                    char sha[STRATA_SHA256_HEX];
                    int rc = strata_download_head(it->src, &dl, &sz, sha, err);
                    if (rc == STRATA_E_NOTFOUND)
                        return rc;
                    if (!rc && sz) {
                        it->size = sz;
                        it->approx = 0;
                    }
                }
            }
            if (!it->size)
                unknown = 1;
            fetch += it->size > it->present ? it->size - it->present : 0;
        }
        if (!it->path)
            return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        total += it->size;
        approx |= it->approx;
    }
    /* memory figures: exact from a local GGUF, else the preset's estimate */
    if (!j->it[0].remote) {
        struct strata_gguf *g = NULL;
        int rc = strata_gguf_open(&g, j->it[0].path, err);
        if (rc)
            return rc;
        rc = strata_pack_plan_gguf(g, o->n_ctx, o->low_ram, &j->info, err);
        strata_gguf_close(g);
        if (rc)
            return rc;
        j->have_info = 1;
    } else if (j->arch) {
        int lr = o->low_ram;
        if (lr < 0) {
            uint64_t avail = strata_mem_available();
            lr = avail && total > avail / 10 * 9;
        }
        estimate(j->arch, total, o->n_ctx, lr, &j->info);
        j->est = 1;
    }
    if (o->repack)
        repack_bytes = j->have_info || j->est ? j->info.expert_bytes : total;
    uint64_t need = fetch + repack_bytes + (1 << 20);
    uint64_t avail = free_bytes(o->out_dir ? o->out_dir : ".");
    char a[32], b[32], c[32];
    fprintf(f, "plan for %s (%s%s):\n", j->final_dir, o->repack ? "repacked" : "native",
            o->offline ? ", offline" : "");
    for (int i = 0; i < j->n; i++) {
        const struct item *it = &j->it[i];
        gib(a, sizeof(a), it->size, it->approx);
        if (!it->remote)
            fprintf(f, "  use      %s (%s%s)\n", it->src, a, it->mmproj ? ", vision" : "");
        else if (it->present && it->present >= it->size && it->size)
            fprintf(f, "  have     %s (%s)\n", base_name(it->path), a);
        else {
            gib(b, sizeof(b), it->present, 0);
            fprintf(f, "  fetch    %s (%s%s%s%s)\n", it->src, it->size ? a : "size unknown",
                    it->present ? ", resuming after " : "", it->present ? b : "",
                    it->mmproj ? ", vision" : "");
        }
    }
    gib(a, sizeof(a), fetch, approx);
    gib(b, sizeof(b), repack_bytes, approx || !j->have_info);
    gib(c, sizeof(c), avail, 0);
    fprintf(f, "  download %s%s; experts.bin %s; free disk in '%s': %s\n", a,
            unknown ? " + files of unknown size" : "", o->repack ? b : "not written",
            o->out_dir ? o->out_dir : ".", c);
    if (j->have_info || j->est)
        print_info(f, &j->info, j->est);
    else
        fprintf(f, "  memory: known once the model is downloaded\n");
    *need_out = need;
    if (need > avail) {
        gib(a, sizeof(a), need, approx);
        return strata_err_set(err, STRATA_E_IO,
                              "not enough disk space in '%s': the pack needs %s (%" PRIu64
                              " bytes), %s (%" PRIu64 " bytes) free",
                              o->out_dir ? o->out_dir : ".", a, need, c, avail);
    }
    return 0;
}

/* ---- run --------------------------------------------------------------- */

static int build_progress(const char *what, uint64_t done, uint64_t total, void *ud)
{
    struct strata_download_stderr *st = ud;
    strata_download_progress_stderr(what, done, total, 0, done == total, st);
    return 0;
}

/* A failed run: drop anything that could look like a pack, keep downloads. */
static void cleanup_partial(const char *dir)
{
    static const char *const junk[] = {"pack.json", "pack.json.tmp", "experts.bin",
                                       "experts.bin.tmp"};
    int keep = 0;
    for (size_t i = 0; i < sizeof(junk) / sizeof(junk[0]); i++) {
        char *p = join(dir, junk[i]);
        if (p)
            unlink(p);
        free(p);
    }
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.')
            keep = 1;
    if (d)
        closedir(d);
    if (!keep)
        rmdir(dir);
}

static cJSON *summary_json(const struct job *j, const struct strata_pack_info *in,
                           double secs)
{
    cJSON *r = cJSON_CreateObject(), *files;
    if (!r)
        return NULL;
    cJSON_AddStringToObject(r, "pack", j->final_dir);
    cJSON_AddStringToObject(r, "name", j->name);
    cJSON_AddStringToObject(r, "mode", j->o->repack ? "repacked" : "native");
    files = cJSON_AddArrayToObject(r, "files");
    for (int i = 0; files && i < j->n; i++) {
        cJSON *f = cJSON_CreateObject();
        cJSON_AddItemToArray(files, f);
        cJSON_AddStringToObject(f, "src", j->it[i].src);
        cJSON_AddStringToObject(f, "path", j->it[i].path ? j->it[i].path : "");
        cJSON_AddNumberToObject(f, "size", (double)file_size_or0(j->it[i].path));
        cJSON_AddStringToObject(f, "role", j->it[i].mmproj ? "mmproj" : "model");
    }
    cJSON *m = cJSON_AddObjectToObject(r, "memory");
    cJSON_AddStringToObject(m, "arch", in->arch);
    cJSON_AddNumberToObject(m, "n_ctx", in->n_ctx);
    cJSON_AddNumberToObject(m, "dense_bytes", (double)in->dense_bytes);
    cJSON_AddNumberToObject(m, "expert_bytes", (double)in->expert_bytes);
    cJSON_AddNumberToObject(m, "kv_bytes_per_token", (double)in->kv_bytes_per_token);
    cJSON_AddNumberToObject(m, "vram_min", (double)in->vram_min);
    cJSON_AddNumberToObject(m, "vram_full", (double)in->vram_full);
    cJSON_AddNumberToObject(m, "ram_bytes", (double)in->ram_bytes);
    cJSON_AddBoolToObject(m, "low_ram", in->low_ram);
    cJSON_AddNumberToObject(r, "seconds", secs);
    return r;
}

int strata_prepare_run(const struct strata_prepare_opts *o, struct strata_err *err)
{
    struct job j = {.o = o};
    int rc = 0, made_partial = 0;
    double t0 = now_s();
    const char *out_dir = o->out_dir ? o->out_dir : ".";
    struct strata_pack_source known[MAX_FILES];
    struct strata_download_stderr pst = {.prog = o->prog};
    char *mmproj = NULL;
    uint64_t need = 0;

    if (!!o->source == !!o->family) {
        rc = strata_err_set(err, STRATA_E_INVALID,
                            "give a source (file, URL or hf:OWNER/REPO/PATH) or --family");
        goto out;
    }
    if (o->model && !o->family) {
        rc = strata_err_set(err, STRATA_E_INVALID, "--model %s needs --family", o->model);
        goto out;
    }
    if (o->sha256 && o->family) {
        rc = strata_err_set(err, STRATA_E_INVALID,
                            "--sha256 is for a single downloaded file, not a preset");
        goto out;
    }
    rc = o->family ? from_preset(&j, err) : from_source(&j, err);
    if (rc)
        goto out;
    if (o->name && (strchr(o->name, '/') || !*o->name || o->name[0] == '.')) {
        rc = strata_err_set(err, STRATA_E_INVALID, "bad pack name '%s'", o->name);
        goto out;
    }
    if (!j.name)
        j.name = o->name ? strdup(o->name) : default_name(j.it[0].src);
    if (!j.name) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    {
        size_t n = strlen(out_dir) + strlen(j.name) + 32;
        j.final_dir = malloc(n);
        j.partial_dir = malloc(n);
        if (!j.final_dir || !j.partial_dir) {
            rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
            goto out;
        }
        snprintf(j.final_dir, n, "%s/%s.strata", out_dir, j.name);
        snprintf(j.partial_dir, n, "%s/%s.strata.partial", out_dir, j.name);
    }
    struct stat st;
    if (!o->force && !o->plan_only && stat(j.final_dir, &st) == 0) {
        rc = strata_err_set(err, STRATA_E_INVALID,
                            "'%s' already exists (use --force to replace it)", j.final_dir);
        goto out;
    }
    if (stat(out_dir, &st) && mkdir(out_dir, 0755)) {
        rc = strata_err_set(err, STRATA_E_IO, "cannot create '%s': %s", out_dir,
                            strerror(errno));
        goto out;
    }
    rc = plan(&j, &need, err);
    if (rc || o->plan_only)
        goto out;
    if (mkdir(j.partial_dir, 0755) && errno != EEXIST) {
        rc = strata_err_set(err, STRATA_E_IO, "cannot create '%s': %s", j.partial_dir,
                            strerror(errno));
        goto out;
    }
    made_partial = 1;
    /* files an existing pack already downloaded (a --force rebuild, say from
     * native to repacked) are linked, not fetched again; the download step
     * still checks them against the expected hash */
    for (int i = 0; i < j.n; i++) {
        char *old = j.it[i].remote ? join(j.final_dir, base_name(j.it[i].path)) : NULL;
        if (old && access(j.it[i].path, F_OK) != 0 && link(old, j.it[i].path) == 0)
            strata_log_info("reusing '%s'", old);
        free(old);
    }

    /* downloads */
    int n_known = 0;
    for (int i = 0; i < j.n; i++) {
        struct item *it = &j.it[i];
        if (!it->remote)
            continue;
        struct strata_download_opts dl = {
            .offline = o->offline, .retries = o->retries, .backoff_ms = o->retry_delay_ms,
            .stall_s = o->stall_s, .sha256 = it->sha[0] ? it->sha : NULL,
            .progress = strata_download_progress_stderr, .progress_ud = &pst,
        };
        struct strata_download_result res;
        rc = strata_download_fetch(it->src, it->path, &dl, &res, err);
        if (rc)
            goto out;
        if (!res.checked)
            strata_log_warn("'%s': no published sha256 to check against; recorded %s",
                            it->src, res.sha256);
        memcpy(it->sha, res.sha256, sizeof(it->sha));
        known[n_known++] = (struct strata_pack_source){it->path, it->sha, it->src};
    }
    for (int i = 0; i < j.n; i++)
        if (j.it[i].mmproj)
            mmproj = j.it[i].path;

    /* build, check, commit */
    struct strata_pack_build_opts bo = {
        .dir = j.partial_dir, .gguf = j.it[0].path, .name = j.name, .repack = o->repack,
        .n_ctx = o->n_ctx, .low_ram = o->low_ram, .mmproj = mmproj, .known = known,
        .n_known = (size_t)n_known, .progress = build_progress, .progress_ud = &pst,
    };
    rc = strata_pack_build(&bo, err);
    if (rc)
        goto out;
    struct strata_pack *p = NULL;
    rc = strata_pack_open(&p, j.partial_dir, err);
    if (rc) {
        strata_err_wrap(err, "checking the new pack");
        goto out;
    }
    struct strata_pack_info info;
    strata_pack_get_info(p, o->n_ctx, &info);
    strata_pack_close(p);
    rc = strata_pack_commit(j.partial_dir, j.final_dir, o->force, err);
    if (rc)
        goto out;
    made_partial = 0;
    for (int i = 0; i < j.n; i++) /* downloaded files moved with the directory */
        if (j.it[i].remote) {
            char *np = join(j.final_dir, base_name(j.it[i].path));
            free(j.it[i].path);
            j.it[i].path = np;
        }
    double secs = now_s() - t0;
    if (o->json) {
        cJSON *r = summary_json(&j, &info, secs);
        char *text = r ? cJSON_Print(r) : NULL;
        if (text)
            fprintf(o->out, "%s\n", text);
        free(text);
        cJSON_Delete(r);
    } else {
        fprintf(o->out, "pack ready: %s (%s, %.1f s)\n", j.final_dir,
                o->repack ? "repacked" : "native", secs);
        print_info(o->out, &info, 0);
    }
out:
    if (rc && made_partial) {
        cleanup_partial(j.partial_dir);
        if (err && access(j.partial_dir, F_OK) == 0) {
            size_t l = strlen(err->msg);
            snprintf(err->msg + l, sizeof(err->msg) - l,
                     "; downloads kept in '%s' for the next run", j.partial_dir);
        }
    }
    for (int i = 0; i < j.n; i++) {
        free(j.it[i].src);
        free(j.it[i].path);
    }
    cJSON_Delete(j.preset);
    free(j.name);
    free(j.final_dir);
    free(j.partial_dir);
    return rc;
}

/* ---- list, verify ------------------------------------------------------ */

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int strata_prepare_list(const char *dir, uint32_t n_ctx, int json, FILE *out,
                        struct strata_err *err)
{
    int rc = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    char *names[256];
    size_t n = 0;
    cJSON *arr = json ? cJSON_CreateArray() : NULL;
    if (!d)
        return strata_err_set(err, STRATA_E_IO, "cannot open presets directory '%s': %s", dir,
                              strerror(errno));
    while ((e = readdir(d)) && n < 256) {
        size_t l = strlen(e->d_name);
        if (l > 5 && !strcmp(e->d_name + l - 5, ".json") && e->d_name[0] != '.')
            names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof(names[0]), name_cmp);
    if (!n_ctx)
        n_ctx = 32768;
    if (!json)
        fprintf(out, "%-16s %-12s %6s %14s %14s %14s  (context %u)\n", "FAMILY", "MODEL",
                "FILES", "SIZE", "VRAM MIN", "RAM", n_ctx);
    for (size_t i = 0; i < n && !rc; i++) {
        cJSON *p = NULL;
        char *path = names[i] ? join(dir, names[i]) : NULL;
        if (!path) {
            rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
            break;
        }
        rc = read_json(path, &p, err);
        const char *fam = jstr(p, "family");
        const cJSON *models = cJSON_GetObjectItemCaseSensitive(p, "models"), *m;
        if (!rc && (!fam || !cJSON_IsObject(models)))
            rc = strata_err_set(err, STRATA_E_FORMAT, "'%s': no \"family\" or \"models\"",
                                path);
        const cJSON *mlist = rc ? NULL : models;
        cJSON_ArrayForEach(m, mlist) {
            uint64_t total = 0;
            int approx = 0, nf = 0, local = 0;
            char *first_local = NULL;
            const cJSON *f;
            cJSON_ArrayForEach(f, cJSON_GetObjectItemCaseSensitive(m, "files")) {
                const char *src = jstr(f, "src");
                uint64_t sz = (uint64_t)jnum(f, "size");
                if (src && !strata_download_is_remote(src)) {
                    char *x = expand_src(src, dir);
                    struct stat st;
                    if (x && !stat(x, &st))
                        sz = (uint64_t)st.st_size;
                    if (!first_local)
                        first_local = x;
                    else
                        free(x);
                    local = 1;
                }
                total += sz;
                approx |= cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(f, "approx"));
                nf++;
            }
            struct strata_pack_info in;
            const cJSON *arch = cJSON_GetObjectItemCaseSensitive(p, "arch");
            estimate(arch, total, n_ctx, 0, &in);
            int have_mem = arch != NULL, exact = 0;
            struct strata_gguf *lg = NULL;
            if (first_local && !strata_gguf_open(&lg, first_local, NULL) &&
                !strata_pack_plan_gguf(lg, n_ctx, 0, &in, NULL))
                have_mem = exact = 1; /* a local model: exact figures */
            strata_gguf_close(lg);
            free(first_local);
            if (json) {
                cJSON *o = cJSON_CreateObject();
                cJSON_AddItemToArray(arr, o);
                cJSON_AddStringToObject(o, "family", fam);
                cJSON_AddStringToObject(o, "model", m->string);
                cJSON_AddNumberToObject(o, "files", nf);
                cJSON_AddNumberToObject(o, "size", (double)total);
                cJSON_AddBoolToObject(o, "approx", approx);
                cJSON_AddBoolToObject(o, "local", local);
                if (have_mem) {
                    cJSON_AddNumberToObject(o, "n_ctx", n_ctx);
                    cJSON_AddNumberToObject(o, "vram_min", (double)in.vram_min);
                    cJSON_AddNumberToObject(o, "ram_bytes", (double)in.ram_bytes);
                }
                const char *desc = jstr(p, "description");
                if (desc)
                    cJSON_AddStringToObject(o, "description", desc);
            } else {
                char a[32], b[32] = "-", c[32] = "-";
                gib(a, sizeof(a), total, approx);
                if (have_mem) {
                    gib(b, sizeof(b), in.vram_min, !exact);
                    gib(c, sizeof(c), in.ram_bytes, !exact);
                }
                fprintf(out, "%-16s %-12s %6d %14s %14s %14s\n", fam, m->string, nf, a, b, c);
            }
        }
        cJSON_Delete(p);
        free(path);
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    if (json && !rc) {
        char *t = cJSON_Print(arr);
        if (t)
            fprintf(out, "%s\n", t);
        free(t);
    }
    cJSON_Delete(arr);
    return rc;
}

int strata_prepare_verify(const char *pack, int json, FILE *out, const char *prog,
                          struct strata_err *err)
{
    struct strata_download_stderr pst = {.prog = prog};
    double t0 = now_s();
    int rc = strata_pack_verify(pack, build_progress, &pst, err);
    double secs = now_s() - t0;
    if (json) {
        cJSON *r = cJSON_CreateObject();
        cJSON_AddStringToObject(r, "pack", pack);
        cJSON_AddBoolToObject(r, "ok", rc == 0);
        if (rc)
            cJSON_AddStringToObject(r, "error", err ? err->msg : "");
        cJSON_AddNumberToObject(r, "seconds", secs);
        char *t = cJSON_Print(r);
        if (t)
            fprintf(out, "%s\n", t);
        free(t);
        cJSON_Delete(r);
    } else if (!rc) {
        fprintf(out, "ok: %s verified (%.1f s)\n", pack, secs);
    }
    return rc;
}
