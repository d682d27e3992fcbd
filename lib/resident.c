/* resident.c - resident images of packs in POSIX shared memory. */
#include "resident.h"

#include "json_util.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "gguf.h"
#include "pack.h"
#include "sha256.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older kernels return EINVAL */
#endif

#define SHM_DIR "/dev/shm"
#define META_MAGIC "STRATARI"
#define META_VERSION 2
#define CHUNK (32ull << 20)   /* bytes per read */
#define DIO_ALIGN 4096ull     /* O_DIRECT offset/length granule */

/* The header of NAME.meta; the file entries follow it. */
struct meta_hdr {
    char magic[8];
    uint32_t version;
    uint32_t state;           /* enum strata_resident_state; atomic */
    int32_t loader_pid;       /* atomic */
    uint32_t n_files;
    int64_t created;
    uint64_t data_bytes;
    char identity[72];
    char name[STRATA_RESIDENT_NAME_MAX];
    char pack_dir[STRATA_RESIDENT_PATH_MAX];
    char pack_name[256];
};

struct strata_resident_image {
    struct strata_resident_pack pack;
    struct meta_hdr *meta;    /* mapping of NAME.meta */
    size_t meta_size;
};

struct strata_resident_att {
    char name[STRATA_RESIDENT_NAME_MAX];
    int n_fds;
    int *fds;                 /* files mapped over holes (kept open for nothing else) */
    const unsigned char *base;
    uint64_t len;
    uint32_t n_files;
    struct strata_resident_file *files; /* the pack's paths, the image's offsets */
};

/* ---- small helpers ---------------------------------------------------- */

static uint64_t align_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

static void copy_str(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src ? src : "");
}

static double gib(uint64_t b)
{
    return (double)b / (double)(1ull << 30);
}

/* A live process (a zombie is not: it waits only to be reaped). */
static int pid_alive(pid_t pid)
{
    char path[64], buf[512];
    if (pid <= 0 || (kill(pid, 0) != 0 && errno != EPERM))
        return 0;
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *rp = strrchr(buf, ')'); /* "PID (comm) S ..." */
    return !(rp && rp[1] == ' ' && rp[2] == 'Z');
}

static size_t meta_size_for(uint32_t n_files)
{
    return sizeof(struct meta_hdr) + (size_t)n_files * sizeof(struct strata_resident_file);
}

static struct strata_resident_file *meta_files(const struct meta_hdr *m)
{
    return (struct strata_resident_file *)(void *)((char *)(void *)m + sizeof(*m));
}

static void obj_name(char *dst, size_t cap, const char *name, const char *ext)
{
    snprintf(dst, cap, "/%s.%s", name, ext);
}



/* ---- describe ---------------------------------------------------------- */

static int add_file(struct strata_resident_pack *p, const char *dir, const char *rel,
                    const char *role, int64_t size, const char *sha, const char *pj,
                    struct strata_err *err)
{
    if (!rel || size < 0 || !strata_sha256_is_hex(sha))
        return strata_err_set(err, STRATA_E_FORMAT, "'%s': bad %s entry (path, size, sha256)",
                              pj, role);
    if (p->n_files == STRATA_RESIDENT_MAX_FILES)
        return strata_err_set(err, STRATA_E_LIMIT, "'%s': more than %d data files", pj,
                              STRATA_RESIDENT_MAX_FILES);
    struct strata_resident_file *f = &p->files[p->n_files];
    memset(f, 0, sizeof(*f));
    int n = rel[0] == '/' ? snprintf(f->path, sizeof(f->path), "%s", rel)
                          : snprintf(f->path, sizeof(f->path), "%s/%s", dir, rel);
    if (n < 0 || (size_t)n >= sizeof(f->path))
        return strata_err_set(err, STRATA_E_LIMIT, "'%s': path of '%s' is too long", pj, rel);
    copy_str(f->role, sizeof(f->role), role);
    f->size = (uint64_t)size;
    for (int i = 0; i < 64; i++)
        f->sha256[i] = (char)(sha[i] >= 'A' && sha[i] <= 'F' ? sha[i] - 'A' + 'a' : sha[i]);
    f->sha256[64] = 0;
    f->offset = p->data_bytes;
    p->data_bytes = align_up(p->data_bytes + f->size, STRATA_RESIDENT_ALIGN);
    p->n_files++;
    return 0;
}

int strata_resident_describe(const char *path, struct strata_resident_pack *out,
                             struct strata_err *err)
{
    int rc = 0;
    char dir[STRATA_RESIDENT_PATH_MAX], pj[STRATA_RESIDENT_PATH_MAX + 16];
    char *text = NULL;
    cJSON *root = NULL;
    size_t n = strlen(path);
    struct stat st;
    memset(out, 0, sizeof(*out));
    if (n >= sizeof(dir))
        return strata_err_set(err, STRATA_E_LIMIT, "pack path '%.64s...' is too long", path);
    if (stat(path, &st) == 0 && !S_ISDIR(st.st_mode) && n >= 9 &&
        strcmp(path + n - 9, "pack.json") == 0) {
        memcpy(dir, path, n + 1);
        char *sl = strrchr(dir, '/');
        if (sl)
            *sl = 0;
        else
            strcpy(dir, ".");
    } else {
        memcpy(dir, path, n + 1);
    }
    /* the identity names the image; paths are made absolute so engines in
     * other directories compare the same strings */
    char abs[PATH_MAX];
    if (realpath(dir, abs) && strlen(abs) < sizeof(dir))
        strcpy(dir, abs);
    snprintf(pj, sizeof(pj), "%s/pack.json", dir);
    if ((rc = strata_json_read_text(pj, &text, err))) {
        if (rc == STRATA_E_NOTFOUND)
            strata_err_set(err, rc, "'%s' is not a pack: no pack.json", path);
        goto out;
    }
    root = cJSON_Parse(text);
    const char *fmt = strata_json_get_s(root, "format"), *mode = strata_json_get_s(root, "mode");
    if (!root || !fmt || strcmp(fmt, "strata-pack") || !mode) {
        rc = strata_err_set(err, STRATA_E_FORMAT, "'%s' is not a strata pack description", pj);
        goto out;
    }
    const cJSON *srcs = cJSON_GetObjectItemCaseSensitive(root, "sources"), *s;
    int n_src = cJSON_IsArray(srcs) ? cJSON_GetArraySize(srcs) : 0;
    if (n_src < 1) {
        rc = strata_err_set(err, STRATA_E_FORMAT, "'%s': no \"sources\"", pj);
        goto out;
    }
    out->files = calloc((size_t)n_src + 1, sizeof(*out->files));
    if (!out->files) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    copy_str(out->dir, sizeof(out->dir), dir);
    const char *pname = strata_json_get_s(root, "name");
    const char *base = strrchr(dir, '/');
    copy_str(out->pack_name, sizeof(out->pack_name), pname ? pname : base ? base + 1 : dir);
    cJSON_ArrayForEach(s, srcs) {
        const char *role = strata_json_get_s(s, "role");
        if (role && strcmp(role, "model")) /* mmproj and the like: not the engine's */
            continue;
        rc = add_file(out, dir, strata_json_get_s(s, "path"), "model", strata_json_get_u(s, "size"),
                      strata_json_get_s(s, "sha256"), pj, err);
        if (rc)
            goto out;
    }
    if (out->n_files == 0) {
        rc = strata_err_set(err, STRATA_E_FORMAT, "'%s': no model source", pj);
        goto out;
    }
    if (strcmp(mode, "repacked") == 0) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, "experts");
        const char *file = strata_json_get_s(x, "file");
        rc = add_file(out, dir, file ? file : "experts.bin", "experts", strata_json_get_u(x, "size"),
                      strata_json_get_s(x, "sha256"), pj, err);
        if (rc)
            goto out;
    }
    /* identity: the recorded content, independent of paths */
    struct strata_sha256 *h = strata_sha256_new();
    if (!h) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    for (uint32_t i = 0; i < out->n_files; i++) {
        char line[128];
        int k = snprintf(line, sizeof(line), "%s %" PRIu64 " %s\n", out->files[i].role,
                         out->files[i].size, out->files[i].sha256);
        strata_sha256_update(h, line, (size_t)k);
    }
    strata_sha256_final(h, out->identity);
    strata_sha256_free(h);
    snprintf(out->name, sizeof(out->name), "strata-%.16s", out->identity);
out:
    if (rc) {
        free(out->files);
        out->files = NULL;
        out->n_files = 0;
    }
    cJSON_Delete(root);
    free(text);
    return rc;
}

void strata_resident_pack_free(struct strata_resident_pack *p)
{
    if (!p)
        return;
    free(p->files);
    p->files = NULL;
    p->n_files = 0;
}

/* ---- routed experts of the GGUF files ---------------------------------- */

struct hole {
    uint32_t file;            /* index into the pack's files */
    uint64_t off, len;        /* page-aligned, inside the file */
};

static int cmp_tensor_off(const void *a, const void *b)
{
    const struct strata_gguf_tensor *x = *(const struct strata_gguf_tensor *const *)a;
    const struct strata_gguf_tensor *y = *(const struct strata_gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Is t a routed-expert tensor as lib/pack.c indexes them ("blk.N.*_exps.*"
 * whose last dimension is ARCH.expert_count)? */
static int is_expert_tensor(const struct strata_gguf_tensor *t, uint32_t n_expert)
{
    unsigned il;
    int pos = 0;
    return n_expert > 0 && sscanf(t->name, "blk.%u.%n", &il, &pos) == 1 && pos > 0 &&
           strstr(t->name + pos, "_exps.") && t->n_dims >= 2 &&
           t->ne[t->n_dims - 1] == n_expert;
}

/* The page ranges of the model files that hold nothing but routed experts:
 * runs of consecutive expert tensors, rounded inward to pages.  base: the
 * image mapping (files at their offsets).  *out malloc'ed. */
static int expert_holes(const struct strata_resident_pack *p, const unsigned char *base,
                        struct hole **out, size_t *n_out, struct strata_err *err)
{
    struct strata_gguf_mem_file *mem = calloc(p->n_files, sizeof(*mem));
    const struct strata_gguf_tensor **ts = NULL;
    struct strata_gguf *g = NULL;
    struct hole *h = NULL;
    size_t n = 0, cap = 0;
    uint32_t n_mem = 0, first = UINT32_MAX, n_expert = 0;
    int rc = 0;
    const uint64_t pg = 4096;
    *out = NULL;
    *n_out = 0;
    if (!mem)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    for (uint32_t i = 0; i < p->n_files; i++)
        if (strcmp(p->files[i].role, "model") == 0) {
            if (first == UINT32_MAX)
                first = i;
            mem[n_mem++] = (struct strata_gguf_mem_file){p->files[i].path,
                                                         base + p->files[i].offset,
                                                         p->files[i].size};
        }
    if (first == UINT32_MAX)
        goto out;
    if ((rc = strata_gguf_open_files(&g, p->files[first].path, mem, n_mem, err)))
        goto out;
    const char *arch = NULL;
    char key[96];
    if (strata_gguf_get_str(g, "general.architecture", &arch, NULL) == 0) {
        snprintf(key, sizeof(key), "%s.expert_count", arch);
        strata_gguf_get_u32(g, key, &n_expert, NULL);
    }
    uint64_t nt = strata_gguf_n_tensors(g);
    if (!(ts = calloc(nt ? nt : 1, sizeof(*ts)))) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    for (uint32_t s = 0; s < strata_gguf_n_shards(g); s++) {
        /* the pack file this shard is: the same path, else the same base name */
        const char *sp = strata_gguf_shard_path(g, s), *sb = strrchr(sp, '/');
        uint32_t fi = UINT32_MAX;
        sb = sb ? sb + 1 : sp;
        for (uint32_t i = 0; i < p->n_files && fi == UINT32_MAX; i++)
            if (strcmp(p->files[i].role, "model") == 0 && strcmp(p->files[i].path, sp) == 0)
                fi = i;
        for (uint32_t i = 0; i < p->n_files && fi == UINT32_MAX; i++) {
            const char *b = strrchr(p->files[i].path, '/');
            if (strcmp(p->files[i].role, "model") == 0 && strcmp(b ? b + 1 : p->files[i].path,
                                                                 sb) == 0)
                fi = i;
        }
        if (fi == UINT32_MAX)
            continue;
        size_t m = 0;
        for (uint64_t i = 0; i < nt; i++) {
            const struct strata_gguf_tensor *t = strata_gguf_tensor_at(g, i);
            if (t->shard == s && t->n_bytes)
                ts[m++] = t;
        }
        qsort(ts, m, sizeof(*ts), cmp_tensor_off);
        for (size_t i = 0; i < m;) {
            if (!is_expert_tensor(ts[i], n_expert)) {
                i++;
                continue;
            }
            uint64_t a = ts[i]->offset, b = ts[i]->offset + ts[i]->n_bytes;
            for (i++; i < m && is_expert_tensor(ts[i], n_expert); i++)
                b = ts[i]->offset + ts[i]->n_bytes;
            a = align_up(a, pg);
            b = b / pg * pg;
            if (b <= a)
                continue;
            if (n == cap) {
                size_t nc = cap ? cap * 2 : 64;
                void *nh = realloc(h, nc * sizeof(*h));
                if (!nh) {
                    rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
                    goto out;
                }
                h = nh;
                cap = nc;
            }
            h[n++] = (struct hole){fi, a, b - a};
        }
    }
    *out = h;
    *n_out = n;
    h = NULL;
out:
    free(h);
    free(ts);
    strata_gguf_close(g);
    free(mem);
    return rc;
}

/* ---- reading the meta object ------------------------------------------ */

/* Map NAME.meta read-only.  Returns 0 (with *m, *size), STRATA_E_NOTFOUND,
 * STRATA_E_FORMAT (not an image of this layout: why in err), STRATA_E_IO. */
static int meta_open(const char *name, const struct meta_hdr **m, size_t *size,
                     struct strata_err *err)
{
    char obj[STRATA_RESIDENT_NAME_MAX + 8];
    struct stat st;
    int fd, rc = 0;
    void *p = MAP_FAILED;
    obj_name(obj, sizeof(obj), name, "meta");
    fd = shm_open(obj, O_RDONLY, 0);
    if (fd < 0)
        return strata_err_set(err, errno == ENOENT ? STRATA_E_NOTFOUND : STRATA_E_IO,
                              "cannot open '%s%s': %s", SHM_DIR, obj, strerror(errno));
    if (fstat(fd, &st) || st.st_size < (off_t)sizeof(struct meta_hdr)) {
        rc = strata_err_set(err, STRATA_E_FORMAT, "'%s%s' is not a resident image header",
                            SHM_DIR, obj);
        goto out;
    }
    p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        rc = strata_err_set(err, STRATA_E_IO, "cannot map '%s%s': %s", SHM_DIR, obj,
                            strerror(errno));
        goto out;
    }
    const struct meta_hdr *h = p;
    if (memcmp(h->magic, META_MAGIC, 8)) {
        rc = strata_err_set(err, STRATA_E_FORMAT, "'%s%s' is not a resident image header",
                            SHM_DIR, obj);
    } else if (h->version != META_VERSION) {
        rc = strata_err_set(err, STRATA_E_FORMAT, "'%s%s' has layout version %u, expected %d",
                            SHM_DIR, obj, h->version, META_VERSION);
    } else if (h->n_files > STRATA_RESIDENT_MAX_FILES ||
               (size_t)st.st_size < meta_size_for(h->n_files)) {
        rc = strata_err_set(err, STRATA_E_FORMAT, "'%s%s' is truncated", SHM_DIR, obj);
    }
    if (rc) {
        munmap(p, (size_t)st.st_size);
        goto out;
    }
    *m = h;
    *size = (size_t)st.st_size;
out:
    close(fd);
    return rc;
}

static void unlink_objects(const char *name)
{
    char obj[STRATA_RESIDENT_NAME_MAX + 8], pidf[STRATA_RESIDENT_NAME_MAX + 32];
    obj_name(obj, sizeof(obj), name, "data");
    shm_unlink(obj);
    obj_name(obj, sizeof(obj), name, "meta");
    shm_unlink(obj);
    snprintf(pidf, sizeof(pidf), "%s/%s.pid", SHM_DIR, name);
    unlink(pidf);
}

/* ---- loading ----------------------------------------------------------- */

/* Hashes a file's bytes behind the reader, in the same mapping. */
struct hasher {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    const unsigned char *base;
    uint64_t avail;   /* bytes read so far */
    uint64_t hashed;
    int done;         /* the reader finished (or gave up) */
    struct strata_sha256 *h;
};

static void *hasher_main(void *arg)
{
    struct hasher *hs = arg;
    for (;;) {
        pthread_mutex_lock(&hs->mu);
        while (hs->hashed == hs->avail && !hs->done)
            pthread_cond_wait(&hs->cv, &hs->mu);
        uint64_t from = hs->hashed, to = hs->avail;
        int last = hs->done;
        pthread_mutex_unlock(&hs->mu);
        if (from == to && last)
            break;
        strata_sha256_update(hs->h, hs->base + from, (size_t)(to - from));
        pthread_mutex_lock(&hs->mu);
        hs->hashed = to;
        pthread_cond_broadcast(&hs->cv);
        pthread_mutex_unlock(&hs->mu);
    }
    return NULL;
}

static void hasher_post(struct hasher *hs, uint64_t avail, int done)
{
    pthread_mutex_lock(&hs->mu);
    hs->avail = avail;
    hs->done = done;
    pthread_cond_broadcast(&hs->cv);
    pthread_mutex_unlock(&hs->mu);
}

/* Files are loaded by up to MAX_STREAMS threads at once: SHA-256 is
 * sequential within a file (one core's worth), so a split set or a repacked
 * pack is hashed on several cores while the disk streams. */
#define MAX_STREAMS 4

struct load_ctx {
    const struct strata_resident_load_opts *o;
    struct strata_resident_pack *p;
    unsigned char *data;
    pthread_mutex_t mu;       /* guards everything below and progress calls */
    uint64_t all_done, all_total;
    int n_direct;
    uint32_t next;            /* the next file to take */
    int rc;                   /* the first failure */
    struct strata_err err;
};

/* Read file f into dst (room for f->size rounded up to DIO_ALIGN), hashing
 * it on a second thread, and compare with the recorded SHA-256. */
static int load_file(struct load_ctx *c, struct strata_resident_file *f, unsigned char *dst,
                     struct strata_err *err)
{
    int rc = 0, fd = -1, direct = 0, started = 0;
    struct stat st;
    pthread_t th;
    struct hasher hs = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER,
                        .base = dst};
    char hex[STRATA_SHA256_HEX];
    uint64_t done = 0;
    if (c->o->direct_io) {
        fd = open(f->path, O_RDONLY | O_CLOEXEC | O_DIRECT);
        direct = fd >= 0;
    }
    if (fd < 0)
        fd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = strata_err_set(err, errno == ENOENT ? STRATA_E_NOTFOUND : STRATA_E_IO,
                            "cannot open '%s': %s", f->path, strerror(errno));
        goto out;
    }
    if (fstat(fd, &st)) {
        rc = strata_err_set(err, STRATA_E_IO, "cannot stat '%s': %s", f->path, strerror(errno));
        goto out;
    }
    if ((uint64_t)st.st_size != f->size) {
        rc = strata_err_set(err, STRATA_E_FORMAT,
                            "'%s' is %" PRIu64 " bytes, the pack records %" PRIu64
                            " (truncated or replaced)", f->path, (uint64_t)st.st_size, f->size);
        goto out;
    }
    f->mtime_sec = st.st_mtim.tv_sec;
    f->mtime_nsec = st.st_mtim.tv_nsec;
    if (!direct)
        posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    if (!(hs.h = strata_sha256_new())) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    if (pthread_create(&th, NULL, hasher_main, &hs)) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "cannot start a thread");
        goto out;
    }
    started = 1;
    while (done < f->size) {
        uint64_t want = f->size - done < CHUNK ? f->size - done : CHUNK;
        ssize_t r = pread(fd, dst + done, direct ? (size_t)align_up(want, DIO_ALIGN)
                                                 : (size_t)want, (off_t)done);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && errno == EINVAL && direct) {
            /* the file system refused O_DIRECT at read time: read buffered */
            int fd2 = open(f->path, O_RDONLY | O_CLOEXEC);
            if (fd2 < 0) {
                rc = strata_err_set(err, STRATA_E_IO, "cannot open '%s': %s", f->path,
                                    strerror(errno));
                break;
            }
            close(fd);
            fd = fd2;
            direct = 0;
            continue;
        }
        if (r <= 0) {
            rc = strata_err_set(err, STRATA_E_IO, "cannot read '%s': %s", f->path,
                                r < 0 ? strerror(errno) : "file is shorter than it was");
            break;
        }
        if ((uint64_t)r > f->size - done)
            r = (ssize_t)(f->size - done);
        if (!direct) /* the image is the copy that stays: don't keep a second one */
            posix_fadvise(fd, (off_t)done, r, POSIX_FADV_DONTNEED);
        done += (uint64_t)r;
        hasher_post(&hs, done, 0);
        pthread_mutex_lock(&c->mu);
        c->all_done += (uint64_t)r;
        int stop = c->rc != 0 ||
                   (c->o->progress && c->o->progress(f->path, done, f->size, c->all_done,
                                                     c->all_total, c->o->progress_ud));
        pthread_mutex_unlock(&c->mu);
        if (stop) {
            rc = strata_err_set(err, STRATA_E_CANCELLED, "cancelled");
            break;
        }
    }
    if (direct) {
        pthread_mutex_lock(&c->mu);
        c->n_direct++;
        pthread_mutex_unlock(&c->mu);
    }
out:
    if (started) {
        hasher_post(&hs, done, 1);
        pthread_join(th, NULL);
    }
    if (!rc && strata_sha256_final(hs.h, hex))
        rc = strata_err_set(err, STRATA_E_INTERNAL, "hashing '%s' failed", f->path);
    if (!rc && strcmp(hex, f->sha256))
        rc = strata_err_set(err, STRATA_E_CHECKSUM,
                            "'%s': sha256 %s does not match %s recorded in the pack", f->path,
                            hex, f->sha256);
    strata_sha256_free(hs.h);
    if (fd >= 0)
        close(fd);
    return rc;
}

static void *load_worker(void *arg)
{
    struct load_ctx *c = arg;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        uint32_t i = c->next;
        int stop = c->rc != 0 || i >= c->p->n_files;
        if (!stop)
            c->next++;
        pthread_mutex_unlock(&c->mu);
        if (stop)
            break;
        struct strata_err e = {0};
        struct strata_resident_file *f = &c->p->files[i];
        int rc = load_file(c, f, c->data + f->offset, &e);
        pthread_mutex_lock(&c->mu);
        /* the first real failure wins over the others' "cancelled" */
        if (rc && (!c->rc || c->rc == STRATA_E_CANCELLED)) {
            if (!c->rc || rc != STRATA_E_CANCELLED) {
                c->rc = rc;
                c->err = e;
            }
        }
        pthread_mutex_unlock(&c->mu);
    }
    return NULL;
}

static void describe_huge(char *dst, size_t cap, int want)
{
    char mode[128] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");
    if (f) {
        if (fgets(mode, sizeof(mode), f)) {
            char *a = strchr(mode, '['), *b = a ? strchr(a, ']') : NULL;
            if (a && b) {
                *b = 0;
                memmove(mode, a + 1, strlen(a + 1) + 1);
            } else {
                mode[strcspn(mode, "\n")] = 0;
            }
        }
        fclose(f);
    }
    if (!mode[0])
        snprintf(dst, cap, "no (no transparent huge pages)");
    else if (!want)
        snprintf(dst, cap, "not asked (shmem_enabled=%.24s)", mode);
    else if (strcmp(mode, "never") == 0 || strcmp(mode, "deny") == 0)
        snprintf(dst, cap, "no (shmem_enabled=%.24s)", mode);
    else
        snprintf(dst, cap, "transparent (shmem_enabled=%.24s)", mode);
}

/* An existing image of the same name: refuse a live one, clear a dead one. */
static int clear_old(const struct strata_resident_pack *p, struct strata_err *err)
{
    const struct meta_hdr *m = NULL;
    size_t ms = 0;
    struct strata_err e2 = {0};
    int rc = meta_open(p->name, &m, &ms, &e2);
    if (rc == STRATA_E_NOTFOUND) {
        unlink_objects(p->name); /* a data object left without its header */
        return 0;
    }
    if (rc == 0) {
        int state = (int)__atomic_load_n(&m->state, __ATOMIC_ACQUIRE);
        pid_t pid = __atomic_load_n(&m->loader_pid, __ATOMIC_ACQUIRE);
        int alive = pid_alive(pid);
        int same = strcmp(m->identity, p->identity) == 0;
        munmap((void *)m, ms);
        if (same && state == STRATA_RESIDENT_READY)
            return strata_err_set(err, STRATA_E_INVALID,
                                  "'%s' is already resident as %s (loader pid %d, %s; "
                                  "strata-load --unload %s first)",
                                  p->dir, p->name, (int)pid, alive ? "running" : "gone",
                                  p->name);
        if (alive && same)
            return strata_err_set(err, STRATA_E_INVALID,
                                  "'%s' is being loaded as %s by pid %d", p->dir, p->name,
                                  (int)pid);
    }
    /* unreadable, of another layout, or left unfinished by a dead loader */
    unlink_objects(p->name);
    return 0;
}

int strata_resident_load(const struct strata_resident_load_opts *o,
                         struct strata_resident_image **out,
                         struct strata_resident_load_stats *stats, struct strata_err *err)
{
    int rc = 0, mfd = -1, dfd = -1, created = 0;
    struct strata_resident_image *img = NULL;
    unsigned char *data = MAP_FAILED;
    char obj[STRATA_RESIDENT_NAME_MAX + 8];
    struct timespec t0, t1;
    struct load_ctx c = {.o = o, .mu = PTHREAD_MUTEX_INITIALIZER};
    *out = NULL;
    if (!(img = calloc(1, sizeof(*img))))
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    if ((rc = strata_resident_describe(o->pack, &img->pack, err)))
        goto out;
    struct strata_resident_pack *p = &img->pack;
    uint64_t need = p->data_bytes, avail = strata_mem_available();
    if (avail && need + o->reserve_bytes > avail) {
        rc = strata_err_set(err, STRATA_E_NOMEM,
                            "'%s' needs %.2f GiB of memory; MemAvailable is %.2f GiB and "
                            "%.2f GiB are to stay free (--reserve-mib)",
                            p->dir, gib(need), gib(avail), gib(o->reserve_bytes));
        goto out;
    }
    struct statvfs vs;
    if (statvfs(SHM_DIR, &vs) == 0 && (uint64_t)vs.f_bavail * vs.f_frsize < need) {
        rc = strata_err_set(err, STRATA_E_NOMEM,
                            "'%s' needs %.2f GiB but %s has %.2f GiB free (its tmpfs size "
                            "limits it: mount -o remount,size=... %s)",
                            p->dir, gib(need), SHM_DIR,
                            gib((uint64_t)vs.f_bavail * vs.f_frsize), SHM_DIR);
        goto out;
    }
    if ((rc = clear_old(p, err)))
        goto out;
    /* header first (O_EXCL: one loader per image), state loading */
    img->meta_size = meta_size_for(p->n_files);
    obj_name(obj, sizeof(obj), p->name, "meta");
    mfd = shm_open(obj, O_RDWR | O_CREAT | O_EXCL, 0644);
    if (mfd < 0) {
        rc = strata_err_set(err, errno == EEXIST ? STRATA_E_INVALID : STRATA_E_IO,
                            "cannot create '%s%s': %s", SHM_DIR, obj, strerror(errno));
        goto out;
    }
    created = 1;
    if (ftruncate(mfd, (off_t)img->meta_size)) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "cannot size '%s%s': %s", SHM_DIR, obj,
                            strerror(errno));
        goto out;
    }
    void *mm = mmap(NULL, img->meta_size, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    if (mm == MAP_FAILED) {
        rc = strata_err_set(err, STRATA_E_IO, "cannot map '%s%s': %s", SHM_DIR, obj,
                            strerror(errno));
        goto out;
    }
    img->meta = mm;
    struct meta_hdr *m = img->meta;
    m->version = META_VERSION;
    m->state = STRATA_RESIDENT_LOADING;
    m->loader_pid = (int32_t)getpid();
    m->n_files = p->n_files;
    m->created = (int64_t)time(NULL);
    m->data_bytes = p->data_bytes;
    copy_str(m->identity, sizeof(m->identity), p->identity);
    copy_str(m->name, sizeof(m->name), p->name);
    copy_str(m->pack_dir, sizeof(m->pack_dir), p->dir);
    copy_str(m->pack_name, sizeof(m->pack_name), p->pack_name);
    memcpy(meta_files(m), p->files, p->n_files * sizeof(*p->files));
    /* the magic last: a reader never takes a half-written header for one */
    __atomic_thread_fence(__ATOMIC_RELEASE);
    memcpy(m->magic, META_MAGIC, 8);
    /* the data object, reserved up front so a full tmpfs is an error here
     * and not a SIGBUS while reading */
    obj_name(obj, sizeof(obj), p->name, "data");
    dfd = shm_open(obj, O_RDWR | O_CREAT | O_EXCL, 0644);
    if (dfd < 0) {
        rc = strata_err_set(err, STRATA_E_IO, "cannot create '%s%s': %s", SHM_DIR, obj,
                            strerror(errno));
        goto out;
    }
    if (ftruncate(dfd, (off_t)p->data_bytes)) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "cannot size '%s%s' to %" PRIu64 " bytes: %s",
                            SHM_DIR, obj, p->data_bytes, strerror(errno));
        goto out;
    }
    data = mmap(NULL, p->data_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, dfd, 0);
    if (data == MAP_FAILED) {
        rc = strata_err_set(err, STRATA_E_IO, "cannot map '%s%s': %s", SHM_DIR, obj,
                            strerror(errno));
        goto out;
    }
    if (o->huge_pages)
        madvise(data, p->data_bytes, MADV_HUGEPAGE);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int fr = posix_fallocate(dfd, 0, (off_t)p->data_bytes);
    if (fr && fr != EOPNOTSUPP && fr != EINVAL) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "cannot reserve %.2f GiB in '%s%s': %s",
                            gib(p->data_bytes), SHM_DIR, obj, strerror(fr));
        goto out;
    }
    /* page tables in one pass rather than a fault per page while reading */
    madvise(data, p->data_bytes, MADV_POPULATE_WRITE);
    for (uint32_t i = 0; i < p->n_files; i++)
        c.all_total += p->files[i].size;
    c.p = p;
    c.data = data;
    pthread_t th[MAX_STREAMS];
    int n_th = 0;
    while (n_th + 1 < MAX_STREAMS && (uint32_t)n_th + 1 < p->n_files &&
           pthread_create(&th[n_th], NULL, load_worker, &c) == 0)
        n_th++;
    load_worker(&c);
    for (int i = 0; i < n_th; i++)
        pthread_join(th[i], NULL);
    if (c.rc) {
        rc = c.rc;
        if (err)
            *err = c.err;
        goto out;
    }
    /* a repacked pack: the engine reads routed experts from experts.bin, so
     * release the GGUF pages that hold only them (attach maps the file there) */
    uint64_t released = 0;
    int repacked = 0;
    for (uint32_t i = 0; i < p->n_files; i++)
        repacked |= strcmp(p->files[i].role, "experts") == 0;
    if (repacked) {
        struct hole *h = NULL;
        size_t nh = 0;
        if ((rc = expert_holes(p, data, &h, &nh, err)))
            goto out;
        for (size_t i = 0; i < nh; i++)
            if (fallocate(dfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                          (off_t)(p->files[h[i].file].offset + h[i].off), (off_t)h[i].len) == 0) {
                p->files[h[i].file].sparse = 1;
                released += h[i].len;
            } else {
                /* keep the pages; the file then stays whole in the image */
                break;
            }
        free(h);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    /* mtimes were taken while reading */
    memcpy(meta_files(m), p->files, p->n_files * sizeof(*p->files));
    __atomic_store_n(&m->state, STRATA_RESIDENT_READY, __ATOMIC_RELEASE);
    if (stats) {
        memset(stats, 0, sizeof(*stats));
        stats->bytes = c.all_total;
        stats->data_bytes = p->data_bytes;
        stats->released_bytes = released;
        stats->seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        stats->direct_io = c.n_direct;
        describe_huge(stats->huge_pages, sizeof(stats->huge_pages), o->huge_pages);
    }
    *out = img;
    img = NULL;
out:
    if (data != MAP_FAILED)
        munmap(data, img ? img->pack.data_bytes : (*out)->pack.data_bytes);
    if (dfd >= 0)
        close(dfd);
    if (mfd >= 0)
        close(mfd);
    if (img) {
        if (created)
            unlink_objects(img->pack.name);
        strata_resident_image_close(img);
    }
    return rc;
}

const struct strata_resident_pack *strata_resident_image_pack(
    const struct strata_resident_image *img)
{
    return &img->pack;
}

int strata_resident_image_set_loader(struct strata_resident_image *img, pid_t pid,
                                     struct strata_err *err)
{
    if (!img->meta)
        return strata_err_set(err, STRATA_E_IO, "image %s has no header", img->pack.name);
    __atomic_store_n(&img->meta->loader_pid, (int32_t)pid, __ATOMIC_RELEASE);
    return 0;
}

void strata_resident_image_remove(struct strata_resident_image *img)
{
    if (!img)
        return;
    const struct meta_hdr *m = NULL;
    size_t ms = 0;
    /* the objects by this name may by now be a newer loader's */
    if (meta_open(img->pack.name, &m, &ms, NULL) == 0) {
        int mine = __atomic_load_n(&m->loader_pid, __ATOMIC_ACQUIRE) == (int32_t)getpid() &&
                   m->created == img->meta->created;
        munmap((void *)m, ms);
        if (mine)
            unlink_objects(img->pack.name);
    }
    strata_resident_image_close(img);
}

void strata_resident_image_close(struct strata_resident_image *img)
{
    if (!img)
        return;
    if (img->meta)
        munmap(img->meta, img->meta_size);
    strata_resident_pack_free(&img->pack);
    free(img);
}

/* ---- listing, unloading ------------------------------------------------ */

/* Processes other than skip whose /proc/PID/maps map SHM_DIR/NAME.data. */
static void find_attached(struct strata_resident_info *in, pid_t skip)
{
    char needle[STRATA_RESIDENT_NAME_MAX + 32], path[64], line[1024];
    DIR *d = opendir("/proc");
    struct dirent *de;
    snprintf(needle, sizeof(needle), "%s/%s.data", SHM_DIR, in->name);
    if (!d)
        return;
    while ((de = readdir(d))) {
        char *end;
        long pid = strtol(de->d_name, &end, 10);
        if (*end || pid <= 0 || pid == skip)
            continue;
        snprintf(path, sizeof(path), "/proc/%ld/maps", pid);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        int hit = 0;
        while (!hit && fgets(line, sizeof(line), f))
            hit = strstr(line, needle) != NULL;
        fclose(f);
        if (hit) {
            if (in->n_attached < sizeof(in->attached) / sizeof(in->attached[0]))
                in->attached[in->n_attached] = (pid_t)pid;
            in->n_attached++;
        }
    }
    closedir(d);
}

static int info_of(const char *name, struct strata_resident_info *in)
{
    const struct meta_hdr *m = NULL;
    size_t ms = 0;
    memset(in, 0, sizeof(*in));
    copy_str(in->name, sizeof(in->name), name);
    if (meta_open(name, &m, &ms, NULL))
        return -1;
    copy_str(in->identity, sizeof(in->identity), m->identity);
    copy_str(in->pack_dir, sizeof(in->pack_dir), m->pack_dir);
    copy_str(in->pack_name, sizeof(in->pack_name), m->pack_name);
    in->state = (int)__atomic_load_n(&m->state, __ATOMIC_ACQUIRE);
    in->data_bytes = m->data_bytes;
    in->n_files = m->n_files;
    in->loader_pid = __atomic_load_n(&m->loader_pid, __ATOMIC_ACQUIRE);
    in->loader_alive = pid_alive(in->loader_pid);
    in->created = m->created;
    munmap((void *)m, ms);
    find_attached(in, in->loader_pid);
    return 0;
}

static int cmp_info(const void *a, const void *b)
{
    return strcmp(((const struct strata_resident_info *)a)->name,
                  ((const struct strata_resident_info *)b)->name);
}

int strata_resident_list(struct strata_resident_info **out, size_t *n, struct strata_err *err)
{
    DIR *d = opendir(SHM_DIR);
    struct dirent *de;
    struct strata_resident_info *v = NULL;
    size_t cnt = 0, cap = 0;
    int rc = 0;
    *out = NULL;
    *n = 0;
    if (!d)
        return errno == ENOENT ? 0 : strata_err_set(err, STRATA_E_IO, "cannot list '%s': %s",
                                                    SHM_DIR, strerror(errno));
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (strncmp(de->d_name, "strata-", 7) || l < 6 || strcmp(de->d_name + l - 5, ".meta") ||
            l - 5 >= STRATA_RESIDENT_NAME_MAX)
            continue;
        if (cnt == cap) {
            size_t nc = cap ? cap * 2 : 8;
            void *nv = realloc(v, nc * sizeof(*v));
            if (!nv) {
                rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
                goto out;
            }
            v = nv;
            cap = nc;
        }
        char name[STRATA_RESIDENT_NAME_MAX];
        snprintf(name, sizeof(name), "%.*s", (int)(l - 5), de->d_name);
        info_of(name, &v[cnt++]);
    }
    if (cnt)
        qsort(v, cnt, sizeof(*v), cmp_info);
    *out = v;
    *n = cnt;
    v = NULL;
out:
    free(v);
    closedir(d);
    return rc;
}

/* Is pid a strata-load (so a recycled pid is never signalled)? */
static int is_loader(pid_t pid)
{
    char path[64], comm[64] = "";
    snprintf(path, sizeof(path), "/proc/%d/comm", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    if (!fgets(comm, sizeof(comm), f))
        comm[0] = 0;
    fclose(f);
    return strncmp(comm, "strata-load", 11) == 0;
}

int strata_resident_unload(const char *what, struct strata_resident_info *info,
                           struct strata_err *err)
{
    char name[STRATA_RESIDENT_NAME_MAX];
    struct strata_resident_info in;
    struct strata_resident_pack p;
    struct stat st;
    if (stat(what, &st) == 0 && strata_resident_describe(what, &p, NULL) == 0) {
        copy_str(name, sizeof(name), p.name);
        strata_resident_pack_free(&p);
    } else if (strncmp(what, "strata-", 7) == 0) {
        copy_str(name, sizeof(name), what);
    } else {
        snprintf(name, sizeof(name), "strata-%.16s", what);
    }
    if (strchr(name, '/') || info_of(name, &in)) {
        /* a data object whose header is gone still goes */
        char obj[STRATA_RESIDENT_NAME_MAX + 8];
        obj_name(obj, sizeof(obj), name, "data");
        if (!strchr(name, '/') && shm_unlink(obj) == 0) {
            unlink_objects(name);
            if (info)
                memset(info, 0, sizeof(*info)), copy_str(info->name, sizeof(info->name), name);
            return 0;
        }
        return strata_err_set(err, STRATA_E_NOTFOUND, "no resident image '%s'", what);
    }
    if (in.loader_alive && in.loader_pid != getpid() && is_loader(in.loader_pid)) {
        kill(in.loader_pid, SIGTERM);
        for (int i = 0; i < 1000 && pid_alive(in.loader_pid); i++) {
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    unlink_objects(name);
    if (info)
        *info = in;
    return 0;
}

/* ---- attaching --------------------------------------------------------- */

/* Map each pack file over the holes the loader left in its GGUF pages (the
 * routed experts of a repacked pack), so the GGUF view reads them from the
 * file.  Returns 0, STRATA_E_NOMEM, or another code with why set. */
static int map_holes(struct strata_resident_att *a, char *why, size_t why_size,
                     struct strata_err *err);

__attribute__((format(printf, 3, 4))) static void say(char *why, size_t cap, const char *fmt, ...)
{
    va_list ap;
    if (!why || !cap)
        return;
    va_start(ap, fmt);
    vsnprintf(why, cap, fmt, ap);
    va_end(ap);
}

int strata_resident_attach(const struct strata_resident_pack *p,
                           struct strata_resident_att **out, char *why, size_t why_size,
                           struct strata_err *err)
{
    const struct meta_hdr *m = NULL;
    size_t ms = 0;
    struct strata_err e2 = {0};
    struct strata_resident_att *a = NULL;
    char obj[STRATA_RESIDENT_NAME_MAX + 8];
    int rc = 0, dfd = -1;
    *out = NULL;
    say(why, why_size, "%s", "");
    int r = meta_open(p->name, &m, &ms, &e2);
    if (r == STRATA_E_NOTFOUND)
        return 0;
    if (r) {
        say(why, why_size, "ignoring resident image %s: it does not match the pack (%s)",
            p->name, e2.msg);
        return 0;
    }
    int state = (int)__atomic_load_n(&m->state, __ATOMIC_ACQUIRE);
    pid_t pid = __atomic_load_n(&m->loader_pid, __ATOMIC_ACQUIRE);
    const struct strata_resident_file *mf = meta_files(m);
    if (strcmp(m->identity, p->identity) || m->n_files != p->n_files) {
        say(why, why_size, "ignoring resident image %s: it does not match the pack "
            "(identity %.16s, the pack's %.16s)", p->name, m->identity, p->identity);
        goto out;
    }
    if (state != STRATA_RESIDENT_READY) {
        if (pid_alive(pid))
            say(why, why_size, "ignoring resident image %s: still loading (pid %d)", p->name,
                (int)pid);
        else
            say(why, why_size, "ignoring resident image %s: stale (its loader, pid %d, "
                "died while loading)", p->name, (int)pid);
        goto out;
    }
    for (uint32_t i = 0; i < p->n_files; i++) {
        const struct strata_resident_file *pf = &p->files[i];
        struct stat st;
        if (strcmp(mf[i].sha256, pf->sha256) || mf[i].size != pf->size ||
            strcmp(mf[i].role, pf->role) || mf[i].offset % STRATA_RESIDENT_ALIGN ||
            mf[i].offset > m->data_bytes || m->data_bytes - mf[i].offset < pf->size) {
            say(why, why_size, "ignoring resident image %s: it does not match the pack "
                "(file %u, '%s')", p->name, i, pf->path);
            goto out;
        }
        if (stat(pf->path, &st) || (uint64_t)st.st_size != pf->size ||
            (strcmp(mf[i].path, pf->path) == 0 &&
             (st.st_mtim.tv_sec != mf[i].mtime_sec || st.st_mtim.tv_nsec != mf[i].mtime_nsec))) {
            say(why, why_size, "ignoring resident image %s: stale ('%s' changed since it was "
                "loaded)", p->name, pf->path);
            goto out;
        }
    }
    obj_name(obj, sizeof(obj), p->name, "data");
    dfd = shm_open(obj, O_RDONLY, 0);
    struct stat st;
    if (dfd < 0 || fstat(dfd, &st) || (uint64_t)st.st_size < m->data_bytes ||
        m->data_bytes == 0) {
        say(why, why_size, "ignoring resident image %s: its data object '%s%s' is missing or "
            "short", p->name, SHM_DIR, obj);
        goto out;
    }
    if (!(a = calloc(1, sizeof(*a))) || !(a->files = calloc(p->n_files, sizeof(*a->files)))) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    void *base = mmap(NULL, m->data_bytes, PROT_READ, MAP_SHARED, dfd, 0);
    if (base == MAP_FAILED) {
        say(why, why_size, "ignoring resident image %s: cannot map '%s%s': %s", p->name,
            SHM_DIR, obj, strerror(errno));
        goto out;
    }
    a->base = base;
    a->len = m->data_bytes;
    a->n_files = p->n_files;
    copy_str(a->name, sizeof(a->name), p->name);
    int any_sparse = 0;
    for (uint32_t i = 0; i < p->n_files; i++) {
        a->files[i] = p->files[i];
        a->files[i].offset = mf[i].offset;
        a->files[i].sparse = mf[i].sparse;
        any_sparse |= mf[i].sparse != 0;
    }
    if (any_sparse && (rc = map_holes(a, why, why_size, err)) != 0) {
        if (rc == STRATA_E_NOMEM)
            goto out;
        rc = 0; /* why says it; the files are read instead */
        strata_resident_detach(a);
        a = NULL;
        goto out;
    }
    *out = a;
    a = NULL;
out:
    if (dfd >= 0)
        close(dfd);
    if (a) {
        free(a->files);
        free(a);
    }
    munmap((void *)m, ms);
    return rc;
}

const void *strata_resident_att_file(const struct strata_resident_att *a, uint32_t i,
                                     uint64_t *size)
{
    if (i >= a->n_files)
        return NULL;
    if (size)
        *size = a->files[i].size;
    return a->base + a->files[i].offset;
}

const char *strata_resident_att_path(const struct strata_resident_att *a, uint32_t i)
{
    return i < a->n_files ? a->files[i].path : NULL;
}

uint64_t strata_resident_att_bytes(const struct strata_resident_att *a)
{
    return a->len;
}

const char *strata_resident_att_name(const struct strata_resident_att *a)
{
    return a->name;
}

void strata_resident_att_region(const struct strata_resident_att *a, const void **base,
                                uint64_t *len)
{
    *base = a->base;
    *len = a->len;
}

static int map_holes(struct strata_resident_att *a, char *why, size_t why_size,
                     struct strata_err *err)
{
    struct strata_resident_pack p = {.n_files = a->n_files, .files = a->files};
    struct hole *h = NULL;
    size_t nh = 0;
    struct strata_err e2 = {0};
    int rc = expert_holes(&p, a->base, &h, &nh, &e2);
    if (rc) {
        if (rc == STRATA_E_NOMEM)
            return strata_err_set(err, rc, "%s", e2.msg);
        say(why, why_size, "ignoring resident image %s: %s", a->name, e2.msg);
        return rc;
    }
    if (!(a->fds = malloc(sizeof(int) * (a->n_files ? a->n_files : 1)))) {
        free(h);
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    }
    for (uint32_t i = 0; i < a->n_files; i++)
        a->fds[i] = -1;
    a->n_fds = (int)a->n_files;
    for (size_t i = 0; i < nh && !rc; i++) {
        struct strata_resident_file *f = &a->files[h[i].file];
        int fd = a->fds[h[i].file];
        if (fd < 0 && (fd = a->fds[h[i].file] = open(f->path, O_RDONLY | O_CLOEXEC)) < 0) {
            say(why, why_size, "ignoring resident image %s: cannot open '%s': %s", a->name,
                f->path, strerror(errno));
            rc = STRATA_E_IO;
            break;
        }
        void *want = (void *)(a->base + f->offset + h[i].off);
        /* shared for the reason of lib/gguf.c's mapping (no private copies when pinned) */
        void *got = mmap(want, h[i].len, PROT_READ, MAP_SHARED | MAP_FIXED, fd,
                         (off_t)h[i].off);
        if (got != want) {
            say(why, why_size, "ignoring resident image %s: cannot map '%s': %s", a->name,
                f->path, strerror(errno));
            rc = STRATA_E_IO;
        }
    }
    /* the mappings keep the files; the descriptors are not needed */
    for (int i = 0; i < a->n_fds; i++)
        if (a->fds[i] >= 0)
            close(a->fds[i]);
    free(a->fds);
    a->fds = NULL;
    a->n_fds = 0;
    free(h);
    return rc;
}

void strata_resident_detach(struct strata_resident_att *a)
{
    if (!a)
        return;
    if (a->base)
        munmap((void *)a->base, a->len);
    free(a->files);
    free(a);
}
