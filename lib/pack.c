/* pack.c - pack reader, writer, verifier (format: man/strata-pack.5). */
#include "pack.h"

#include "json_util.h"
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "log.h"
#include "resident.h"
#include "sha256.h"

#define PACK_JSON "pack.json"
#define EXPERTS_BIN "experts.bin"
#define MAX_LAYERS 4096

struct strata_pack {
    struct strata_gguf *g;
    char *dir;             /* NULL for a bare GGUF */
    int mode;
    uint32_t n_layer;      /* size of layers[] */
    struct strata_pack_layer *layers; /* [n_layer]; n_parts 0: no experts */
    int experts_fd;
    const unsigned char *experts_map;
    uint64_t experts_size;
    uint32_t n_ctx_recorded;
    int low_ram;
    struct strata_resident_att *res;  /* resident image read from, or NULL */
    struct strata_gguf_mem_file *mem; /* its model files, for the GGUF reader */
    uint32_t n_mem;
    int experts_resident;             /* experts_map points into res */
    char res_note[STRATA_ERR_MSG_MAX]; /* why an image was ignored */
};

/* ---- small helpers ---------------------------------------------------- */

static uint64_t align_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

static char *path_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p)
        return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

int strata_pack_pwrite_all(int fd, const void *buf, size_t n, uint64_t offset,
                           const char *path, struct strata_err *err)
{
    const char *lim = getenv("STRATA_FAULT_ENOSPC_AT");
    if (lim && *lim && offset + n > strtoull(lim, NULL, 10))
        return strata_err_set(err, STRATA_E_IO, "cannot write '%s': %s", path,
                              strerror(ENOSPC));
    const char *p = buf;
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n, (off_t)offset);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return strata_err_set(err, STRATA_E_IO, "cannot write '%s': %s", path,
                                  w < 0 ? strerror(errno) : "short write");
        p += w;
        n -= (size_t)w;
        offset += (uint64_t)w;
    }
    return 0;
}

/* A u32 hyper-parameter "ARCH.suffix"; arrays (per-layer values) give their
 * maximum.  0 when absent. */
static uint32_t hp_u32(const struct strata_gguf *g, const char *arch, const char *suffix)
{
    char key[256];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    const struct strata_gguf_kv *kv = strata_gguf_find_kv(g, key);
    if (!kv)
        return 0;
    if (kv->type == STRATA_GGUF_ARRAY) {
        int64_t m = 0;
        for (uint64_t i = 0; i < kv->v.arr.n; i++) {
            int64_t v = strata_gguf_arr_i64(&kv->v.arr, i);
            if (v > m)
                m = v;
        }
        return m > UINT32_MAX ? UINT32_MAX : (uint32_t)m;
    }
    uint32_t v = 0;
    if (strata_gguf_get_u32(g, key, &v, NULL))
        return 0;
    return v;
}

uint64_t strata_mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    uint64_t kb = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "MemAvailable: %" SCNu64 " kB", &kb) == 1)
            break;
    fclose(f);
    return kb * 1024;
}

/* ---- expert index ------------------------------------------------------ */

/* Part order inside a record: gate, up, down, then the rest by name. */
static int part_rank(const char *name)
{
    if (strstr(name, "ffn_gate_exps.weight"))
        return 0;
    if (strstr(name, "ffn_up_exps.weight"))
        return 1;
    if (strstr(name, "ffn_down_exps.weight"))
        return 2;
    return 3;
}

static int part_before(const struct strata_pack_part *a, const struct strata_pack_part *b)
{
    int ra = part_rank(a->tensor), rb = part_rank(b->tensor);
    if (ra != rb)
        return ra < rb;
    return strcmp(a->tensor, b->tensor) < 0;
}

/* Find the routed-expert tensors ("blk.N.*_exps.*" whose last dimension is
 * ARCH.expert_count) and lay the records out.  layers is [n_layer]. */
static int build_layers(const struct strata_gguf *g, struct strata_pack_layer **out,
                        uint32_t *n_out, struct strata_err *err)
{
    int rc = 0;
    const char *arch = NULL;
    struct strata_pack_layer *L = NULL;
    uint32_t n_layer = 0, n_expert = 0;
    if (strata_gguf_get_str(g, "general.architecture", &arch, err))
        return err ? err->code : STRATA_E_FORMAT;
    n_layer = hp_u32(g, arch, "block_count");
    n_expert = hp_u32(g, arch, "expert_count");
    if (n_layer > MAX_LAYERS)
        return strata_err_set(err, STRATA_E_FORMAT, "%s.block_count %u is too large", arch,
                              n_layer);
    L = calloc(n_layer ? n_layer : 1, sizeof(*L));
    if (!L)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    for (uint32_t i = 0; i < n_layer; i++)
        L[i].layer = i;
    for (uint64_t i = 0; n_expert > 0 && i < strata_gguf_n_tensors(g); i++) {
        const struct strata_gguf_tensor *t = strata_gguf_tensor_at(g, i);
        unsigned il;
        int pos = 0;
        if (sscanf(t->name, "blk.%u.%n", &il, &pos) != 1 || pos == 0 ||
            !strstr(t->name + pos, "_exps.") || t->n_dims < 2 ||
            t->ne[t->n_dims - 1] != n_expert)
            continue;
        if (il >= n_layer) {
            rc = strata_err_set(err, STRATA_E_FORMAT,
                                "tensor '%s': layer %u but %s.block_count is %u", t->name,
                                il, arch, n_layer);
            goto out;
        }
        struct strata_pack_layer *ly = &L[il];
        if (ly->n_parts == STRATA_PACK_MAX_PARTS) {
            rc = strata_err_set(err, STRATA_E_LIMIT,
                                "layer %u has more than %d per-expert tensors", il,
                                STRATA_PACK_MAX_PARTS);
            goto out;
        }
        if (t->n_bytes % n_expert) {
            rc = strata_err_set(err, STRATA_E_FORMAT,
                                "tensor '%s': %" PRIu64 " bytes do not split into %u experts",
                                t->name, t->n_bytes, n_expert);
            goto out;
        }
        struct strata_pack_part p = {
            .tensor = t->name, .type = t->type, .ne0 = t->ne[0],
            .ne1 = t->n_dims >= 3 ? t->ne[1] : 1, .n_bytes = t->n_bytes / n_expert, .src = t,
        };
        /* insertion keeps gate, up, down first whatever the file order */
        uint32_t k = ly->n_parts;
        while (k > 0 && part_before(&p, &ly->part[k - 1])) {
            ly->part[k] = ly->part[k - 1];
            k--;
        }
        ly->part[k] = p;
        ly->n_parts++;
        ly->n_expert = n_expert;
    }
    uint64_t off = 0;
    for (uint32_t i = 0; i < n_layer; i++) {
        struct strata_pack_layer *ly = &L[i];
        uint64_t r = 0;
        if (!ly->n_parts)
            continue;
        for (uint32_t k = 0; k < ly->n_parts; k++) {
            r = align_up(r, STRATA_PACK_PART_ALIGN);
            ly->part[k].rec_offset = r;
            r += ly->part[k].n_bytes;
        }
        ly->record_size = align_up(r, STRATA_PACK_RECORD_ALIGN);
        ly->record_offset = off;
        off += ly->record_size * ly->n_expert;
    }
    *out = L;
    *n_out = n_layer;
    L = NULL;
out:
    free(L);
    return rc;
}

static uint64_t experts_bin_size(const struct strata_pack_layer *L, uint32_t n)
{
    uint64_t s = 0;
    for (uint32_t i = 0; i < n; i++)
        if (L[i].n_parts)
            s = L[i].record_offset + L[i].record_size * L[i].n_expert;
    return s;
}

/* ---- memory figures ---------------------------------------------------- */

static void fill_info(const struct strata_gguf *g, const struct strata_pack_layer *L,
                      uint32_t n_layer_idx, uint32_t n_ctx, int low_ram,
                      struct strata_pack_info *o)
{
    const char *arch = "";
    memset(o, 0, sizeof(*o));
    strata_gguf_get_str(g, "general.architecture", &arch, NULL);
    snprintf(o->arch, sizeof(o->arch), "%s", arch);
    o->n_layer = hp_u32(g, arch, "block_count");
    o->n_embd = hp_u32(g, arch, "embedding_length");
    o->n_head = hp_u32(g, arch, "attention.head_count");
    o->n_head_kv = hp_u32(g, arch, "attention.head_count_kv");
    if (!o->n_head_kv)
        o->n_head_kv = o->n_head;
    o->n_expert = hp_u32(g, arch, "expert_count");
    o->n_expert_used = hp_u32(g, arch, "expert_used_count");
    o->n_ctx_train = hp_u32(g, arch, "context_length");
    const struct strata_gguf_kv *tok = strata_gguf_find_kv(g, "tokenizer.ggml.tokens");
    if (tok && tok->type == STRATA_GGUF_ARRAY)
        o->n_vocab = (uint32_t)tok->v.arr.n;
    for (uint64_t i = 0; i < strata_gguf_n_tensors(g); i++) {
        const struct strata_gguf_tensor *t = strata_gguf_tensor_at(g, i);
        o->n_params += t->n_elements;
        o->total_bytes += t->n_bytes;
    }
    for (uint32_t i = 0; i < n_layer_idx; i++) {
        uint64_t per = 0;
        if (!L[i].n_parts)
            continue;
        o->n_moe_layers++;
        for (uint32_t k = 0; k < L[i].n_parts; k++) {
            per += L[i].part[k].n_bytes;
            o->expert_bytes += L[i].part[k].n_bytes * L[i].n_expert;
        }
        if (per > o->expert_bytes_max)
            o->expert_bytes_max = per;
    }
    o->dense_bytes = o->total_bytes - o->expert_bytes;
    /* kv cache per token, F16: MLA (deepseek2) caches the compressed kv
     * (ARCH.attention.kv_lora_rank) plus the rope part of the key; other
     * architectures n_head_kv * (key_length + value_length) per layer. */
    uint32_t kv_lora = hp_u32(g, arch, "attention.kv_lora_rank");
    uint64_t per_layer;
    if (kv_lora) {
        per_layer = (uint64_t)kv_lora + hp_u32(g, arch, "rope.dimension_count");
    } else {
        uint32_t hd = o->n_head ? o->n_embd / o->n_head : 0;
        uint32_t kl = hp_u32(g, arch, "attention.key_length");
        uint32_t vl = hp_u32(g, arch, "attention.value_length");
        per_layer = (uint64_t)o->n_head_kv * ((kl ? kl : hd) + (vl ? vl : hd));
    }
    o->kv_bytes_per_token = per_layer * o->n_layer * 2;
    /* compute buffers: a 512-token ubatch of activations (n_embd floats and
     * a few intermediates each) plus its logits; a documented estimate. */
    o->scratch_bytes = (uint64_t)512 * 4 * ((uint64_t)o->n_embd * 16 + o->n_vocab) +
                       (64ull << 20);
    o->n_ctx = n_ctx ? n_ctx : (o->n_ctx_train ? o->n_ctx_train : 4096);
    o->vram_min = o->dense_bytes + o->kv_bytes_per_token * o->n_ctx + o->scratch_bytes;
    o->vram_full = o->vram_min + o->expert_bytes;
    if (low_ram < 0) {
        uint64_t avail = strata_mem_available();
        low_ram = avail && o->expert_bytes + o->dense_bytes > avail / 10 * 9;
    }
    o->low_ram = low_ram;
    o->ram_bytes = o->dense_bytes + (low_ram ? 0 : o->expert_bytes);
}

int strata_pack_plan_gguf(const struct strata_gguf *g, uint32_t n_ctx, int low_ram,
                          struct strata_pack_info *out, struct strata_err *err)
{
    struct strata_pack_layer *L = NULL;
    uint32_t n = 0;
    int rc = build_layers(g, &L, &n, err);
    if (rc)
        return rc;
    fill_info(g, L, n, n_ctx, low_ram, out);
    free(L);
    return 0;
}

/* ---- JSON helpers ------------------------------------------------------ */

static cJSON *jnum(cJSON *o, const char *k, double v)
{
    return cJSON_AddNumberToObject(o, k, v);
}

static cJSON *jshape(const struct strata_gguf_tensor *t)
{
    cJSON *a = cJSON_CreateArray();
    for (uint32_t d = 0; a && d < t->n_dims; d++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((double)t->ne[d]));
    return a;
}


/* ---- build ------------------------------------------------------------- */

/* Hash shard s with progress (the only pass over it in native mode). */
static int hash_shard(const struct strata_gguf *g, uint32_t s, char hex[STRATA_SHA256_HEX],
                      const struct strata_pack_build_opts *o, struct strata_err *err)
{
    enum { CHUNK = 16 << 20 };
    const char *path = strata_gguf_shard_path(g, s);
    uint64_t size = strata_gguf_shard_size(g, s), done = 0;
    unsigned char *buf = malloc(CHUNK);
    struct strata_sha256 *h = strata_sha256_new();
    int fd = -1, rc = 0;
    if (!h || !buf) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = strata_err_set(err, STRATA_E_IO, "cannot open '%s': %s", path, strerror(errno));
        goto out;
    }
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    while (done < size) {
        size_t want = size - done < CHUNK ? (size_t)(size - done) : CHUNK;
        ssize_t r = pread(fd, buf, want, (off_t)done);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            rc = strata_err_set(err, STRATA_E_IO, "cannot read '%s': %s", path,
                                r < 0 ? strerror(errno) : "file is shorter than it was");
            goto out;
        }
        strata_sha256_update(h, buf, (size_t)r);
        done += (uint64_t)r;
        if (o && o->progress && o->progress(base_name(path), done, size, o->progress_ud)) {
            rc = strata_err_set(err, STRATA_E_CANCELLED, "cancelled");
            goto out;
        }
    }
    strata_sha256_final(h, hex);
out:
    if (fd >= 0)
        close(fd);
    free(buf);
    strata_sha256_free(h);
    return rc;
}

/* Hashing the sources on a thread of its own while experts.bin is written:
 * both passes go through the files in about the same order, so one of them
 * mostly reads from the page cache. */
struct src_hasher {
    const struct strata_gguf *g;
    char (*hex)[STRATA_SHA256_HEX];
    pthread_mutex_t mu;
    uint32_t next;         /* the next shard to take */
    struct strata_err err; /* the first failure */
    int rc;
};

/* SHA-256 is sequential within a file, so the shards of a split set are
 * hashed side by side, each by whichever thread takes it next. */
static void *src_hasher_main(void *arg)
{
    struct src_hasher *sh = arg;
    uint32_t n = strata_gguf_n_shards(sh->g);
    for (;;) {
        pthread_mutex_lock(&sh->mu);
        uint32_t s = sh->next;
        while (s < n && sh->hex[s][0])
            s++;
        sh->next = s + 1;
        int stop = sh->rc || s >= n;
        pthread_mutex_unlock(&sh->mu);
        if (stop)
            break;
        struct strata_err e = {0};
        char hex[STRATA_SHA256_HEX];
        int rc = hash_shard(sh->g, s, hex, NULL, &e);
        pthread_mutex_lock(&sh->mu);
        if (rc && !sh->rc) {
            sh->rc = rc;
            sh->err = e;
        }
        if (!rc)
            memcpy(sh->hex[s], hex, sizeof(hex));
        pthread_mutex_unlock(&sh->mu);
    }
    return NULL;
}

#define MAX_HASHERS 4

/* Start up to MAX_HASHERS threads for the shards without a hash; with none
 * started the caller hashes them itself (src_hasher_main). */
static int start_hashers(struct src_hasher *sh, pthread_t *th)
{
    uint32_t todo = 0;
    int n = 0;
    for (uint32_t s = 0; s < strata_gguf_n_shards(sh->g); s++)
        todo += !sh->hex[s][0];
    while (n < MAX_HASHERS && (uint32_t)n < todo &&
           pthread_create(&th[n], NULL, src_hasher_main, sh) == 0)
        n++;
    return n;
}

/* experts.bin is written in record order by a writer thread that hashes
 * each block and writes it at the next offset; the main thread reads the
 * parts of each group of experts straight into place in the other block. */
#define N_BLOCKS 2
struct writer {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned char *block[N_BLOCKS];
    uint64_t len[N_BLOCKS], off[N_BLOCKS];
    int full[N_BLOCKS];
    int done;                  /* no more blocks */
    uint64_t prev_off, prev_len; /* the block written before the last */
    int fd;
    const char *path;
    struct strata_sha256 *h;
    struct strata_err err;
    int rc;
};

static void *writer_main(void *arg)
{
    struct writer *w = arg;
    for (int i = 0;; i = (i + 1) % N_BLOCKS) {
        pthread_mutex_lock(&w->mu);
        while (!w->full[i] && !w->done)
            pthread_cond_wait(&w->cv, &w->mu);
        if (!w->full[i]) {
            pthread_mutex_unlock(&w->mu);
            break;
        }
        int rc = w->rc;
        pthread_mutex_unlock(&w->mu);
        if (!rc) {
            strata_sha256_update(w->h, w->block[i], w->len[i]);
            rc = strata_pack_pwrite_all(w->fd, w->block[i], w->len[i], w->off[i], w->path,
                                        &w->err);
        }
        if (!rc) {
            /* start writeback now so the disk writes overlap the reads (the
             * kernel would wait for dirty_background_ratio), and drop what
             * was written a block ago from the page cache so a model larger
             * than RAM does not push everything else out */
            sync_file_range(w->fd, (off_t)w->off[i], (off_t)w->len[i], SYNC_FILE_RANGE_WRITE);
            if (w->off[i] >= w->prev_len) {
                sync_file_range(w->fd, (off_t)w->prev_off, (off_t)w->prev_len,
                                SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                                    SYNC_FILE_RANGE_WAIT_AFTER);
                posix_fadvise(w->fd, (off_t)w->prev_off, (off_t)w->prev_len,
                              POSIX_FADV_DONTNEED);
            }
            w->prev_off = w->off[i];
            w->prev_len = w->len[i];
        }
        pthread_mutex_lock(&w->mu);
        w->rc = rc;
        w->full[i] = 0;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
    }
    return NULL;
}

static int read_at(int fd, void *buf, uint64_t n, uint64_t off, const char *path,
                   struct strata_err *err)
{
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return strata_err_set(err, STRATA_E_IO, "cannot read '%s': %s", path,
                                  r < 0 ? strerror(errno) : "file is shorter than it was");
        p += r;
        n -= (uint64_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

#define BLOCK_BYTES (64ull << 20)

static int write_experts(const struct strata_gguf *g, const struct strata_pack_layer *L,
                         uint32_t n_layer, int fd_out, const char *out_path,
                         char bin_hex[STRATA_SHA256_HEX], uint64_t bin_size,
                         const struct strata_pack_build_opts *o, struct strata_err *err)
{
    struct writer w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER,
                       .fd = fd_out, .path = out_path};
    uint32_t n_shards = strata_gguf_n_shards(g);
    /* a descriptor per (part, shard): each read stream keeps its own
     * readahead window */
    int n_fd = n_shards * STRATA_PACK_MAX_PARTS <= 512 ? STRATA_PACK_MAX_PARTS : 1;
    int *fds = malloc(sizeof(int) * (size_t)n_fd * n_shards);
    pthread_t th;
    int started = 0, rc = 0, cur = 0;
    uint64_t max_rec = 0, done = 0;
    for (uint32_t i = 0; i < n_layer; i++)
        if (L[i].record_size > max_rec)
            max_rec = L[i].record_size;
    uint64_t cap = max_rec > BLOCK_BYTES ? max_rec : BLOCK_BYTES / (max_rec ? max_rec : 1) *
                                                         (max_rec ? max_rec : 1);
    w.h = strata_sha256_new();
    for (int b = 0; b < N_BLOCKS; b++)
        w.block[b] = malloc(cap ? cap : 1);
    if (!fds || !w.h || !w.block[0] || !w.block[1]) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory for %" PRIu64
                            "-byte expert blocks", cap);
        goto out;
    }
    for (int i = 0; i < n_fd * (int)n_shards; i++)
        fds[i] = -1;
    for (int k = 0; k < n_fd; k++)
        for (uint32_t s = 0; s < n_shards; s++) {
            int fd = open(strata_gguf_shard_path(g, s), O_RDONLY | O_CLOEXEC);
            if (fd < 0) {
                rc = strata_err_set(err, STRATA_E_IO, "cannot open '%s': %s",
                                    strata_gguf_shard_path(g, s), strerror(errno));
                goto out;
            }
            posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
            fds[k * n_shards + s] = fd;
        }
    if (pthread_create(&th, NULL, writer_main, &w)) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "cannot start a thread");
        goto out;
    }
    started = 1;
    for (uint32_t il = 0; il < n_layer && !rc; il++) {
        const struct strata_pack_layer *ly = &L[il];
        if (!ly->n_parts)
            continue;
        uint32_t group = (uint32_t)(cap / ly->record_size);
        for (uint32_t e0 = 0; e0 < ly->n_expert && !rc; e0 += group) {
            uint32_t n = ly->n_expert - e0 < group ? ly->n_expert - e0 : group;
            pthread_mutex_lock(&w.mu);
            while (w.full[cur] && !w.rc)
                pthread_cond_wait(&w.cv, &w.mu);
            rc = w.rc;
            pthread_mutex_unlock(&w.mu);
            if (rc)
                break;
            unsigned char *blk = w.block[cur];
            memset(blk, 0, n * ly->record_size); /* padding is zeros */
            for (uint32_t k = 0; k < ly->n_parts && !rc; k++) {
                const struct strata_pack_part *p = &ly->part[k];
                int fd = fds[(k < (uint32_t)n_fd ? k : 0) * n_shards + p->src->shard];
                for (uint32_t e = 0; e < n && !rc; e++)
                    rc = read_at(fd, blk + (uint64_t)e * ly->record_size + p->rec_offset,
                                 p->n_bytes, p->src->offset + (uint64_t)(e0 + e) * p->n_bytes,
                                 strata_gguf_shard_path(g, p->src->shard), err);
            }
            if (rc)
                break;
            pthread_mutex_lock(&w.mu);
            w.len[cur] = n * ly->record_size;
            w.off[cur] = ly->record_offset + (uint64_t)e0 * ly->record_size;
            w.full[cur] = 1;
            pthread_cond_broadcast(&w.cv);
            pthread_mutex_unlock(&w.mu);
            cur = (cur + 1) % N_BLOCKS;
            done += n * ly->record_size;
            if (o->progress && o->progress(EXPERTS_BIN, done, bin_size, o->progress_ud))
                rc = strata_err_set(err, STRATA_E_CANCELLED, "cancelled");
        }
    }
out:
    if (started) {
        pthread_mutex_lock(&w.mu);
        w.done = 1;
        pthread_cond_broadcast(&w.cv);
        pthread_mutex_unlock(&w.mu);
        pthread_join(th, NULL);
        if (!rc && w.rc) {
            rc = w.rc;
            if (err)
                *err = w.err;
        }
    }
    if (!rc && strata_sha256_final(w.h, bin_hex))
        rc = strata_err_set(err, STRATA_E_INTERNAL, "hashing '%s' failed", out_path);
    for (int i = 0; fds && i < n_fd * (int)n_shards; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    free(fds);
    for (int b = 0; b < N_BLOCKS; b++)
        free(w.block[b]);
    strata_sha256_free(w.h);
    return rc;
}

/* Path to record for a source: relative when inside dir. */
static const char *rel_to(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    if (strncmp(path, dir, n) == 0 && path[n] == '/' && !strchr(path + n + 1, '/'))
        return path + n + 1;
    return NULL;
}

static int add_source(cJSON *arr, const char *path, const char *dir, uint64_t size,
                      const char *hex, const char *role, const char *url,
                      struct strata_err *err)
{
    cJSON *s = cJSON_CreateObject();
    const char *rel = rel_to(path, dir);
    char abs[PATH_MAX];
    if (!s)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    if (!rel && path[0] != '/' && realpath(path, abs))
        path = abs;
    cJSON_AddStringToObject(s, "path", rel ? rel : path);
    cJSON_AddStringToObject(s, "role", role);
    jnum(s, "size", (double)size);
    cJSON_AddStringToObject(s, "sha256", hex);
    if (url)
        cJSON_AddStringToObject(s, "url", url);
    cJSON_AddItemToArray(arr, s);
    return 0;
}

static const char *known_hash(const struct strata_pack_build_opts *o, const char *path)
{
    for (size_t i = 0; i < o->n_known; i++)
        if (o->known[i].sha256 && strcmp(base_name(o->known[i].path), base_name(path)) == 0)
            return o->known[i].sha256;
    return NULL;
}

static const char *known_url(const struct strata_pack_build_opts *o, const char *path)
{
    for (size_t i = 0; i < o->n_known; i++)
        if (o->known[i].url && strcmp(base_name(o->known[i].path), base_name(path)) == 0)
            return o->known[i].url;
    return NULL;
}

static int write_file_atomic(const char *dir, const char *name, const char *text,
                             struct strata_err *err)
{
    int rc = 0, fd = -1;
    char *tmp = NULL, *fin = path_join(dir, name);
    if (fin)
        tmp = malloc(strlen(fin) + 5);
    if (!fin || !tmp) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    sprintf(tmp, "%s.tmp", fin);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = strata_err_set(err, STRATA_E_IO, "cannot create '%s': %s", tmp, strerror(errno));
        goto out;
    }
    rc = strata_pack_pwrite_all(fd, text, strlen(text), 0, tmp, err);
    if (!rc && fsync(fd))
        rc = strata_err_set(err, STRATA_E_IO, "cannot write '%s': %s", tmp, strerror(errno));
    close(fd);
    fd = -1;
    if (!rc && rename(tmp, fin))
        rc = strata_err_set(err, STRATA_E_IO, "cannot rename '%s': %s", tmp, strerror(errno));
    if (rc)
        unlink(tmp);
out:
    free(tmp);
    free(fin);
    return rc;
}

static cJSON *json_arch(const struct strata_gguf *g, const struct strata_pack_info *in)
{
    cJSON *a = cJSON_CreateObject();
    if (!a)
        return NULL;
    cJSON_AddStringToObject(a, "arch", in->arch);
    const char *name = NULL;
    if (!strata_gguf_get_str(g, "general.name", &name, NULL))
        cJSON_AddStringToObject(a, "name", name);
    jnum(a, "n_layer", in->n_layer);
    jnum(a, "n_embd", in->n_embd);
    jnum(a, "n_head", in->n_head);
    jnum(a, "n_head_kv", in->n_head_kv);
    jnum(a, "n_vocab", in->n_vocab);
    jnum(a, "n_expert", in->n_expert);
    jnum(a, "n_expert_used", in->n_expert_used);
    jnum(a, "n_ctx_train", in->n_ctx_train);
    jnum(a, "n_params", (double)in->n_params);
    /* every scalar ARCH.* key, as the GGUF spells it */
    cJSON *hp = cJSON_AddObjectToObject(a, "hparams");
    size_t al = strlen(in->arch);
    for (uint64_t i = 0; hp && i < strata_gguf_n_kv(g); i++) {
        const struct strata_gguf_kv *kv = strata_gguf_kv_at(g, i);
        if (strncmp(kv->key, in->arch, al) || kv->key[al] != '.')
            continue;
        const char *k = kv->key + al + 1;
        switch (kv->type) {
        case STRATA_GGUF_UINT8: case STRATA_GGUF_UINT16: case STRATA_GGUF_UINT32:
        case STRATA_GGUF_UINT64:
            jnum(hp, k, (double)kv->v.u);
            break;
        case STRATA_GGUF_INT8: case STRATA_GGUF_INT16: case STRATA_GGUF_INT32:
        case STRATA_GGUF_INT64:
            jnum(hp, k, (double)kv->v.i);
            break;
        case STRATA_GGUF_FLOAT32: case STRATA_GGUF_FLOAT64:
            jnum(hp, k, kv->v.f);
            break;
        case STRATA_GGUF_BOOL:
            cJSON_AddBoolToObject(hp, k, kv->v.b);
            break;
        default:
            break;
        }
    }
    return a;
}

static cJSON *json_tokenizer(const struct strata_gguf *g, const struct strata_pack_info *in)
{
    cJSON *t = cJSON_CreateObject();
    const char *s = NULL;
    uint32_t id;
    int b;
    if (!t)
        return NULL;
    if (!strata_gguf_get_str(g, "tokenizer.ggml.model", &s, NULL))
        cJSON_AddStringToObject(t, "model", s);
    if (!strata_gguf_get_str(g, "tokenizer.ggml.pre", &s, NULL))
        cJSON_AddStringToObject(t, "pre", s);
    jnum(t, "n_tokens", in->n_vocab);
    static const char *const ids[] = {"bos", "eos", "eot", "padding", "unknown"};
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        char key[64];
        snprintf(key, sizeof(key), "tokenizer.ggml.%s_token_id", ids[i]);
        if (!strata_gguf_get_u32(g, key, &id, NULL))
            jnum(t, ids[i], id);
    }
    if (!strata_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b, NULL))
        cJSON_AddBoolToObject(t, "add_bos", b);
    if (!strata_gguf_get_str(g, "tokenizer.chat_template", &s, NULL))
        cJSON_AddStringToObject(t, "chat_template", s);
    return t;
}

static cJSON *json_memory(const struct strata_pack_info *in)
{
    cJSON *m = cJSON_CreateObject();
    if (!m)
        return NULL;
    jnum(m, "total_bytes", (double)in->total_bytes);
    jnum(m, "dense_bytes", (double)in->dense_bytes);
    jnum(m, "expert_bytes", (double)in->expert_bytes);
    jnum(m, "expert_bytes_max", (double)in->expert_bytes_max);
    jnum(m, "n_moe_layers", in->n_moe_layers);
    jnum(m, "kv_bytes_per_token", (double)in->kv_bytes_per_token);
    jnum(m, "scratch_bytes", (double)in->scratch_bytes);
    jnum(m, "n_ctx", in->n_ctx);
    jnum(m, "vram_min", (double)in->vram_min);
    jnum(m, "vram_full", (double)in->vram_full);
    jnum(m, "ram_bytes", (double)in->ram_bytes);
    cJSON_AddBoolToObject(m, "low_ram", in->low_ram);
    return m;
}

static cJSON *json_experts(const struct strata_pack_layer *L, uint32_t n, int repack,
                           const char *hex, uint64_t size)
{
    cJSON *x = cJSON_CreateObject(), *layers;
    if (!x)
        return NULL;
    if (repack) {
        cJSON_AddStringToObject(x, "file", EXPERTS_BIN);
        jnum(x, "size", (double)size);
        cJSON_AddStringToObject(x, "sha256", hex);
    } else {
        cJSON_AddNullToObject(x, "file");
    }
    jnum(x, "record_align", STRATA_PACK_RECORD_ALIGN);
    jnum(x, "part_align", STRATA_PACK_PART_ALIGN);
    layers = cJSON_AddArrayToObject(x, "layers");
    for (uint32_t i = 0; layers && i < n; i++) {
        if (!L[i].n_parts)
            continue;
        cJSON *ly = cJSON_CreateObject();
        cJSON_AddItemToArray(layers, ly);
        jnum(ly, "layer", L[i].layer);
        jnum(ly, "n_expert", L[i].n_expert);
        jnum(ly, "record_offset", (double)L[i].record_offset);
        jnum(ly, "record_size", (double)L[i].record_size);
        cJSON *parts = cJSON_AddArrayToObject(ly, "parts");
        for (uint32_t k = 0; parts && k < L[i].n_parts; k++) {
            const struct strata_pack_part *p = &L[i].part[k];
            cJSON *pj = cJSON_CreateObject();
            cJSON_AddItemToArray(parts, pj);
            cJSON_AddStringToObject(pj, "tensor", p->tensor);
            cJSON_AddStringToObject(pj, "type", strata_ggml_type_name(p->type));
            cJSON *sh = cJSON_AddArrayToObject(pj, "shape");
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)p->ne0));
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)p->ne1));
            jnum(pj, "size", (double)p->n_bytes);
            jnum(pj, "offset", (double)p->rec_offset);
            jnum(pj, "source", p->src->shard);
            jnum(pj, "source_offset", (double)p->src->offset);
        }
    }
    return x;
}

int strata_pack_build(const struct strata_pack_build_opts *o, struct strata_err *err)
{
    int rc = 0, fd_out = -1;
    struct strata_gguf *g = NULL, *mm = NULL;
    struct strata_pack_layer *L = NULL;
    uint32_t n_layer = 0;
    char *tmp_path = NULL, *bin_path = NULL, *text = NULL;
    char (*hex)[STRATA_SHA256_HEX] = NULL;
    char bin_hex[STRATA_SHA256_HEX] = "";
    uint64_t bin_size = 0;
    cJSON *root = NULL;
    struct strata_pack_info info;

    rc = strata_gguf_open(&g, o->gguf, err);
    if (rc)
        goto out;
    rc = build_layers(g, &L, &n_layer, err);
    if (rc) {
        strata_err_wrap(err, "indexing '%s'", o->gguf);
        goto out;
    }
    fill_info(g, L, n_layer, o->n_ctx, o->low_ram, &info);
    uint32_t n_shards = strata_gguf_n_shards(g);
    hex = calloc(n_shards, sizeof(*hex));
    bin_path = path_join(o->dir, EXPERTS_BIN);
    tmp_path = path_join(o->dir, EXPERTS_BIN ".tmp");
    if (!hex || !bin_path || !tmp_path) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    bin_size = experts_bin_size(L, n_layer);
    if (o->repack) {
        unlink(bin_path);
        fd_out = open(tmp_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd_out < 0) {
            rc = strata_err_set(err, STRATA_E_IO, "cannot create '%s': %s", tmp_path,
                                strerror(errno));
            goto out;
        }
        /* reserve the space up front: a full disk fails here, not hours in */
        int e = posix_fallocate(fd_out, 0, (off_t)bin_size);
        if (e && e != EOPNOTSUPP && e != EINVAL) {
            rc = strata_err_set(err, STRATA_E_IO, "cannot write '%s': %s", tmp_path,
                                strerror(e));
            goto out;
        }
        if (bin_size) {  /* the hook sees the reservation too */
            rc = strata_pack_pwrite_all(fd_out, "", 1, bin_size - 1, tmp_path, err);
            if (rc)
                goto out;
        }
    }
    /* the sources' hashes: known from the download, else computed (on a
     * thread beside the experts.bin writer when repacking) */
    for (uint32_t s = 0; s < n_shards; s++) {
        const char *k = known_hash(o, strata_gguf_shard_path(g, s));
        if (k)
            snprintf(hex[s], STRATA_SHA256_HEX, "%s", k);
    }
    if (fd_out < 0 && n_shards == 1) {
        if (!hex[0][0] && (rc = hash_shard(g, 0, hex[0], o, err)))
            goto out;
    } else if (fd_out < 0) {
        struct src_hasher sh = {.g = g, .hex = hex, .mu = PTHREAD_MUTEX_INITIALIZER};
        pthread_t th[MAX_HASHERS];
        int n_th = start_hashers(&sh, th);
        if (!n_th)
            src_hasher_main(&sh);
        for (int i = 0; i < n_th; i++)
            pthread_join(th[i], NULL);
        if (sh.rc) {
            rc = sh.rc;
            if (err)
                *err = sh.err;
            goto out;
        }
    } else {
        struct src_hasher sh = {.g = g, .hex = hex, .mu = PTHREAD_MUTEX_INITIALIZER};
        pthread_t th[MAX_HASHERS];
        int n_th = start_hashers(&sh, th);
        if (!n_th)
            src_hasher_main(&sh);
        rc = write_experts(g, L, n_layer, fd_out, tmp_path, bin_hex, bin_size, o, err);
        for (int i = 0; i < n_th; i++)
            pthread_join(th[i], NULL);
        if (!rc && sh.rc) {
            rc = sh.rc;
            if (err)
                *err = sh.err;
        }
        if (rc)
            goto out;
        if (fsync(fd_out)) {
            rc = strata_err_set(err, STRATA_E_IO, "cannot write '%s': %s", tmp_path,
                                strerror(errno));
            goto out;
        }
        close(fd_out);
        fd_out = -1;
        if (rename(tmp_path, bin_path)) {
            rc = strata_err_set(err, STRATA_E_IO, "cannot rename '%s': %s", tmp_path,
                                strerror(errno));
            goto out;
        }
    }

    root = cJSON_CreateObject();
    if (!root) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    cJSON_AddStringToObject(root, "format", "strata-pack");
    jnum(root, "version", STRATA_PACK_FORMAT_VERSION);
    cJSON_AddStringToObject(root, "name", o->name ? o->name : "model");
    cJSON_AddStringToObject(root, "mode", o->repack ? "repacked" : "native");
    cJSON *srcs = cJSON_AddArrayToObject(root, "sources");
    for (uint32_t s = 0; s < n_shards; s++) {
        const char *p = strata_gguf_shard_path(g, s);
        rc = add_source(srcs, p, o->dir, strata_gguf_shard_size(g, s), hex[s], "model",
                        known_url(o, p), err);
        if (rc)
            goto out;
    }
    if (o->mmproj) {
        char mh[STRATA_SHA256_HEX];
        const char *k = known_hash(o, o->mmproj);
        uint64_t n = 0;
        rc = strata_gguf_open(&mm, o->mmproj, err); /* refuse a broken projector */
        if (rc)
            goto out;
        if (k)
            snprintf(mh, sizeof(mh), "%s", k);
        else if ((rc = strata_sha256_file(o->mmproj, UINT64_MAX, mh, &n, err)))
            goto out;
        rc = add_source(srcs, o->mmproj, o->dir, strata_gguf_shard_size(mm, 0), mh, "mmproj",
                        known_url(o, o->mmproj), err);
        if (rc)
            goto out;
    }
    cJSON_AddItemToObject(root, "architecture", json_arch(g, &info));
    cJSON_AddItemToObject(root, "tokenizer", json_tokenizer(g, &info));
    cJSON *tens = cJSON_AddArrayToObject(root, "tensors");
    for (uint64_t i = 0; tens && i < strata_gguf_n_tensors(g); i++) {
        const struct strata_gguf_tensor *t = strata_gguf_tensor_at(g, i);
        cJSON *tj = cJSON_CreateObject();
        cJSON_AddItemToArray(tens, tj);
        cJSON_AddStringToObject(tj, "name", t->name);
        cJSON_AddStringToObject(tj, "type", strata_ggml_type_name(t->type));
        cJSON_AddItemToObject(tj, "shape", jshape(t));
        jnum(tj, "source", t->shard);
        jnum(tj, "offset", (double)t->offset);
        jnum(tj, "size", (double)t->n_bytes);
    }
    cJSON_AddItemToObject(root, "experts", json_experts(L, n_layer, o->repack, bin_hex,
                                                        bin_size));
    cJSON_AddItemToObject(root, "memory", json_memory(&info));
    text = cJSON_Print(root);
    if (!text) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    rc = write_file_atomic(o->dir, PACK_JSON, text, err);
out:
    if (fd_out >= 0)
        close(fd_out);
    if (rc && tmp_path)
        unlink(tmp_path);
    free(text);
    cJSON_Delete(root);
    free(hex);
    free(bin_path);
    free(tmp_path);
    free(L);
    strata_gguf_close(mm);
    strata_gguf_close(g);
    return rc;
}

/* ---- open -------------------------------------------------------------- */


/* Resolve a source path recorded in pack.json (malloc'ed). */
static char *source_path(const char *dir, const char *p)
{
    return p[0] == '/' ? strdup(p) : path_join(dir, p);
}

static int check_file_size(const char *path, uint64_t want, struct strata_err *err)
{
    struct stat st;
    if (stat(path, &st))
        return strata_err_set(err, errno == ENOENT ? STRATA_E_NOTFOUND : STRATA_E_IO,
                              "missing file '%s': %s", path, strerror(errno));
    if ((uint64_t)st.st_size != want)
        return strata_err_set(err, STRATA_E_FORMAT,
                              "'%s' is %" PRIu64 " bytes, the pack records %" PRIu64
                              " (truncated or replaced)", path, (uint64_t)st.st_size, want);
    return 0;
}

static int check_index(struct strata_pack *p, const cJSON *root, const char *pj,
                       struct strata_err *err)
{
    const cJSON *tens = cJSON_GetObjectItemCaseSensitive(root, "tensors"), *t;
    if (!cJSON_IsArray(tens) ||
        (uint64_t)cJSON_GetArraySize(tens) != strata_gguf_n_tensors(p->g))
        return strata_err_set(err, STRATA_E_FORMAT,
                              "'%s': tensor index does not match the GGUF (%" PRIu64
                              " tensors)", pj, strata_gguf_n_tensors(p->g));
    cJSON_ArrayForEach(t, tens) {
        const char *name = strata_json_get_s(t, "name"), *type = strata_json_get_s(t, "type");
        const struct strata_gguf_tensor *gt = name ? strata_gguf_find_tensor(p->g, name) : NULL;
        if (!gt || !type || strata_ggml_type_from_name(type) != (int)gt->type ||
            strata_json_get_u(t, "source") != gt->shard || strata_json_get_u(t, "offset") != (int64_t)gt->offset ||
            strata_json_get_u(t, "size") != (int64_t)gt->n_bytes)
            return strata_err_set(err, STRATA_E_FORMAT,
                                  "'%s': index entry of tensor '%s' does not match the GGUF",
                                  pj, name ? name : "?");
    }
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, "experts"), *ly;
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(x, "layers");
    uint32_t n_moe = 0;
    for (uint32_t i = 0; i < p->n_layer; i++)
        n_moe += p->layers[i].n_parts > 0;
    if (!cJSON_IsArray(layers) || (uint32_t)cJSON_GetArraySize(layers) != n_moe)
        return strata_err_set(err, STRATA_E_FORMAT,
                              "'%s': expert index does not match the GGUF", pj);
    cJSON_ArrayForEach(ly, layers) {
        int64_t il = strata_json_get_u(ly, "layer");
        const struct strata_pack_layer *L =
            il >= 0 && il < p->n_layer ? &p->layers[il] : NULL;
        const cJSON *parts = cJSON_GetObjectItemCaseSensitive(ly, "parts");
        if (!L || !L->n_parts || strata_json_get_u(ly, "record_offset") != (int64_t)L->record_offset ||
            strata_json_get_u(ly, "record_size") != (int64_t)L->record_size ||
            !cJSON_IsArray(parts) || (uint32_t)cJSON_GetArraySize(parts) != L->n_parts)
            return strata_err_set(err, STRATA_E_FORMAT,
                                  "'%s': expert index of layer %" PRId64
                                  " does not match the GGUF", pj, il);
        for (uint32_t k = 0; k < L->n_parts; k++) {
            const cJSON *pt = cJSON_GetArrayItem(parts, (int)k);
            const char *tn = strata_json_get_s(pt, "tensor");
            if (!tn || strcmp(tn, L->part[k].tensor) ||
                strata_json_get_u(pt, "offset") != (int64_t)L->part[k].rec_offset ||
                strata_json_get_u(pt, "size") != (int64_t)L->part[k].n_bytes)
                return strata_err_set(err, STRATA_E_FORMAT,
                                      "'%s': expert part %u of layer %" PRId64
                                      " does not match the GGUF", pj, k, il);
        }
    }
    return 0;
}

/* Attach to a ready resident image of the pack when there is one
 * (strata-load(1)); STRATA_NO_RESIDENT=1 in the environment reads the files.
 * Only running out of memory is an error: any other problem leaves the
 * files to be read as usual, with the reason in res_note. */
static int attach_resident(struct strata_pack *p, const char *dir, struct strata_err *err)
{
    struct strata_resident_pack rp;
    const char *off = getenv("STRATA_NO_RESIDENT");
    int rc = 0;
    if ((off && *off && strcmp(off, "0")) || strata_resident_describe(dir, &rp, NULL))
        return 0;
    rc = strata_resident_attach(&rp, &p->res, p->res_note, sizeof(p->res_note), err);
    if (rc || !p->res)
        goto out;
    p->mem = calloc(rp.n_files, sizeof(*p->mem));
    if (!p->mem) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    for (uint32_t i = 0; i < rp.n_files; i++) {
        if (strcmp(rp.files[i].role, "model"))
            continue;
        /* paths point into the attachment's copy of the description */
        struct strata_gguf_mem_file *m = &p->mem[p->n_mem++];
        m->base = strata_resident_att_file(p->res, i, &m->size);
        m->path = strata_resident_att_path(p->res, i);
    }
out:
    strata_resident_pack_free(&rp);
    return rc;
}

static int open_dir(struct strata_pack *p, const char *dir, struct strata_err *err)
{
    int rc = 0;
    char *pj = path_join(dir, PACK_JSON), *text = NULL, *first = NULL, *bin = NULL;
    cJSON *root = NULL;
    const cJSON *srcs, *s;
    uint32_t n_model = 0;
    if (!pj)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    rc = strata_json_read_text(pj, &text, err);
    if (rc) {
        if (rc == STRATA_E_NOTFOUND)
            strata_err_set(err, rc, "'%s' is not a pack: no %s", dir, PACK_JSON);
        goto out;
    }
    root = cJSON_Parse(text);
    const char *fmt = strata_json_get_s(root, "format"), *mode = strata_json_get_s(root, "mode");
    int64_t ver = strata_json_get_u(root, "version");
    if (!root || !fmt || strcmp(fmt, "strata-pack") || ver < 1 || !mode) {
        rc = strata_err_set(err, STRATA_E_FORMAT, "'%s' is not a strata pack description", pj);
        goto out;
    }
    if (ver > STRATA_PACK_FORMAT_VERSION) {
        rc = strata_err_set(err, STRATA_E_UNSUPPORTED,
                            "'%s': pack format version %" PRId64 " is newer than %d", pj, ver,
                            STRATA_PACK_FORMAT_VERSION);
        goto out;
    }
    p->mode = strcmp(mode, "repacked") == 0 ? STRATA_PACK_REPACKED : STRATA_PACK_NATIVE;
    srcs = cJSON_GetObjectItemCaseSensitive(root, "sources");
    cJSON_ArrayForEach(s, srcs) {
        const char *path = strata_json_get_s(s, "path"), *role = strata_json_get_s(s, "role");
        int64_t size = strata_json_get_u(s, "size");
        char *full;
        if (!path || size < 0 || !strata_sha256_is_hex(strata_json_get_s(s, "sha256"))) {
            rc = strata_err_set(err, STRATA_E_FORMAT, "'%s': bad entry in \"sources\"", pj);
            goto out;
        }
        full = source_path(dir, path);
        if (!full) {
            rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
            goto out;
        }
        rc = check_file_size(full, (uint64_t)size, err);
        if (!rc && (!role || strcmp(role, "model") == 0) && n_model++ == 0)
            first = full;
        else
            free(full);
        if (rc)
            goto out;
    }
    if (!first) {
        rc = strata_err_set(err, STRATA_E_FORMAT, "'%s': no model source", pj);
        goto out;
    }
    rc = attach_resident(p, dir, err);
    if (rc)
        goto out;
    if (p->res) {
        /* an image whose bytes do not parse is ignored like a stale one */
        struct strata_err e2 = {0};
        rc = strata_gguf_open_files(&p->g, first, p->mem, p->n_mem, &e2);
        if (rc == STRATA_E_NOMEM) {
            if (err)
                *err = e2;
            goto out;
        }
        if (rc) {
            snprintf(p->res_note, sizeof(p->res_note), "ignoring resident image %s: %.900s",
                     strata_resident_att_name(p->res), e2.msg);
            strata_resident_detach(p->res);
            p->res = NULL;
            free(p->mem);
            p->mem = NULL;
            p->n_mem = 0;
        }
    }
    if (!p->res)
        rc = strata_gguf_open(&p->g, first, err);
    if (rc)
        goto out;
    if (strata_gguf_n_shards(p->g) != n_model) {
        rc = strata_err_set(err, STRATA_E_FORMAT, "'%s' lists %u model files, the GGUF has %u",
                            pj, n_model, strata_gguf_n_shards(p->g));
        goto out;
    }
    rc = build_layers(p->g, &p->layers, &p->n_layer, err);
    if (rc)
        goto out;
    rc = check_index(p, root, pj, err);
    if (rc)
        goto out;
    const cJSON *mem = cJSON_GetObjectItemCaseSensitive(root, "memory");
    int64_t nctx = strata_json_get_u(mem, "n_ctx");
    p->n_ctx_recorded = nctx > 0 && nctx <= UINT32_MAX ? (uint32_t)nctx : 0;
    p->low_ram = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(mem, "low_ram"));
    if (p->mode == STRATA_PACK_REPACKED) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, "experts");
        int64_t size = strata_json_get_u(x, "size");
        p->experts_size = experts_bin_size(p->layers, p->n_layer);
        bin = path_join(dir, EXPERTS_BIN);
        if (!bin) {
            rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
            goto out;
        }
        if (size != (int64_t)p->experts_size) {
            rc = strata_err_set(err, STRATA_E_FORMAT, "'%s': experts size does not match "
                                "the index", pj);
            goto out;
        }
        rc = check_file_size(bin, p->experts_size, err);
        if (rc)
            goto out;
        p->experts_fd = open(bin, O_RDONLY | O_CLOEXEC);
        if (p->experts_fd < 0) {
            rc = strata_err_set(err, STRATA_E_IO, "cannot open '%s': %s", bin, strerror(errno));
            goto out;
        }
        uint64_t rsz = 0;
        const void *rb = p->res ? strata_resident_att_file(p->res, n_model, &rsz) : NULL;
        if (rb && rsz == p->experts_size) {
            p->experts_map = rb;
            p->experts_resident = 1;
        } else if (p->experts_size) {
            void *m = mmap(NULL, p->experts_size, PROT_READ, MAP_SHARED, p->experts_fd, 0);
            if (m == MAP_FAILED) {
                rc = strata_err_set(err, STRATA_E_IO, "cannot map '%s': %s", bin,
                                    strerror(errno));
                goto out;
            }
            p->experts_map = m;
        }
    }
out:
    cJSON_Delete(root);
    free(text);
    free(pj);
    free(first);
    free(bin);
    return rc;
}

int strata_pack_open(struct strata_pack **out, const char *path, struct strata_err *err)
{
    int rc = 0;
    struct stat st;
    struct strata_pack *p = calloc(1, sizeof(*p));
    char *dir = NULL;
    if (!p)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    p->experts_fd = -1;
    size_t n = strlen(path);
    int exists = stat(path, &st) == 0; /* else the GGUF reader names the error */
    if (exists && S_ISDIR(st.st_mode)) {
        dir = strdup(path);
    } else if (exists && n >= 9 && strcmp(path + n - 9, PACK_JSON) == 0) {
        dir = strdup(path);
        if (dir) {
            char *sl = strrchr(dir, '/');
            if (sl)
                *sl = 0;
            else
                strcpy(dir, ".");
        }
    } else {
        p->mode = STRATA_PACK_NATIVE;
        rc = strata_gguf_open(&p->g, path, err);
        /* a bare GGUF the index cannot describe (no architecture, odd
         * expert tensors) still opens: its loader reports what is wrong */
        if (!rc && build_layers(p->g, &p->layers, &p->n_layer, NULL)) {
            p->layers = NULL;
            p->n_layer = 0;
        }
        goto out;
    }
    if (!dir) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    rc = open_dir(p, dir, err);
    p->dir = dir;
    dir = NULL;
out:
    free(dir);
    if (rc) {
        strata_pack_close(p);
        p = NULL;
    }
    *out = p;
    return rc;
}

void strata_pack_close(struct strata_pack *p)
{
    if (!p)
        return;
    if (p->experts_map && !p->experts_resident)
        munmap((void *)p->experts_map, p->experts_size);
    if (p->experts_fd >= 0)
        close(p->experts_fd);
    free(p->layers);
    free(p->dir);
    strata_gguf_close(p->g);
    strata_resident_detach(p->res);
    free(p->mem);
    free(p);
}

const char *strata_pack_resident(const struct strata_pack *p, uint64_t *bytes)
{
    if (bytes)
        *bytes = p->res ? strata_resident_att_bytes(p->res) : 0;
    return p->res ? strata_resident_att_name(p->res) : NULL;
}

const char *strata_pack_resident_note(const struct strata_pack *p)
{
    return p->res_note;
}

int strata_pack_resident_region(const struct strata_pack *p, const void **base, uint64_t *len)
{
    *base = NULL;
    *len = 0;
    if (!p->res)
        return 0;
    if (p->experts_resident) { /* the expert records are what is copied to the GPU */
        *base = p->experts_map;
        *len = p->experts_size;
    } else {
        strata_resident_att_region(p->res, base, len);
    }
    return 1;
}

const struct strata_gguf *strata_pack_gguf(const struct strata_pack *p)
{
    return p->g;
}

int strata_pack_mode(const struct strata_pack *p)
{
    return p->mode;
}

const char *strata_pack_dir(const struct strata_pack *p)
{
    return p->dir;
}

void strata_pack_get_info(const struct strata_pack *p, uint32_t n_ctx,
                          struct strata_pack_info *out)
{
    fill_info(p->g, p->layers, p->n_layer, n_ctx ? n_ctx : p->n_ctx_recorded,
              p->dir ? p->low_ram : 0, out);
}

const struct strata_pack_layer *strata_pack_layer(const struct strata_pack *p, uint32_t il)
{
    return il < p->n_layer && p->layers[il].n_parts ? &p->layers[il] : NULL;
}

int strata_pack_expert(const struct strata_pack *p, uint32_t il, uint32_t ie,
                       struct strata_pack_expert *out, struct strata_err *err)
{
    const struct strata_pack_layer *L = strata_pack_layer(p, il);
    memset(out, 0, sizeof(*out));
    out->fd = -1;
    if (!L)
        return strata_err_set(err, STRATA_E_INVALID, "layer %u has no routed experts", il);
    if (ie >= L->n_expert)
        return strata_err_set(err, STRATA_E_INVALID, "expert %u of layer %u: the layer has %u",
                              ie, il, L->n_expert);
    out->n_parts = L->n_parts;
    if (p->mode == STRATA_PACK_REPACKED) {
        out->record_offset = L->record_offset + (uint64_t)ie * L->record_size;
        out->record_size = L->record_size;
        out->record = p->experts_map + out->record_offset;
        out->fd = p->experts_fd;
        for (uint32_t k = 0; k < L->n_parts; k++)
            out->part[k] = (const unsigned char *)out->record + L->part[k].rec_offset;
    } else {
        for (uint32_t k = 0; k < L->n_parts; k++)
            out->part[k] = (const unsigned char *)L->part[k].src->data +
                           (uint64_t)ie * L->part[k].n_bytes;
    }
    return 0;
}

int strata_pack_expert_tensor(const struct strata_pack *p, const char *tensor,
                              const void **data, size_t *stride, struct strata_err *err)
{
    for (uint32_t il = 0; il < p->n_layer; il++) {
        const struct strata_pack_layer *L = &p->layers[il];
        for (uint32_t k = 0; k < L->n_parts; k++) {
            if (strcmp(L->part[k].tensor, tensor))
                continue;
            if (p->mode == STRATA_PACK_REPACKED) {
                *data = p->experts_map + L->record_offset + L->part[k].rec_offset;
                *stride = (size_t)L->record_size;
            } else {
                *data = L->part[k].src->data;
                *stride = (size_t)L->part[k].n_bytes;
            }
            return 0;
        }
    }
    return strata_err_set(err, STRATA_E_NOTFOUND, "'%s' is not a routed-expert tensor",
                          tensor);
}

/* ---- verify, commit ---------------------------------------------------- */

/* One file of a pack to re-hash. */
struct vfile {
    char *path;
    uint64_t size;
    const char *want;
    char hex[STRATA_SHA256_HEX];
    struct strata_err err;
    int rc;
};

struct vctx {
    struct vfile *f;
    uint32_t n, next;
    int active;          /* workers still running */
    int cancel;
    uint64_t done;       /* bytes hashed, all files (atomic) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

/* SHA-256 of a whole file, adding each chunk's size to *done. */
static int hash_counted(struct vctx *v, struct vfile *f)
{
    enum { CHUNK = 8 << 20 };
    unsigned char *buf = malloc(CHUNK);
    struct strata_sha256 *h = strata_sha256_new();
    int fd = -1, rc = 0;
    uint64_t off = 0;
    if (!buf || !h) {
        rc = strata_err_set(&f->err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    fd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = strata_err_set(&f->err, STRATA_E_IO, "cannot open '%s': %s", f->path,
                            strerror(errno));
        goto out;
    }
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    for (;;) {
        if (__atomic_load_n(&v->cancel, __ATOMIC_RELAXED)) {
            rc = strata_err_set(&f->err, STRATA_E_CANCELLED, "cancelled");
            goto out;
        }
        ssize_t r = pread(fd, buf, CHUNK, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = strata_err_set(&f->err, STRATA_E_IO, "cannot read '%s': %s", f->path,
                                strerror(errno));
            goto out;
        }
        if (r == 0)
            break;
        strata_sha256_update(h, buf, (size_t)r);
        off += (uint64_t)r;
        __atomic_add_fetch(&v->done, (uint64_t)r, __ATOMIC_RELAXED);
    }
    strata_sha256_final(h, f->hex);
out:
    if (fd >= 0)
        close(fd);
    free(buf);
    strata_sha256_free(h);
    return rc;
}

static void *vworker(void *arg)
{
    struct vctx *v = arg;
    for (;;) {
        pthread_mutex_lock(&v->mu);
        uint32_t i = v->next++;
        pthread_mutex_unlock(&v->mu);
        if (i >= v->n)
            break;
        v->f[i].rc = hash_counted(v, &v->f[i]);
    }
    pthread_mutex_lock(&v->mu);
    v->active--;
    pthread_cond_broadcast(&v->cv);
    pthread_mutex_unlock(&v->mu);
    return NULL;
}

#define MAX_VERIFIERS 4

int strata_pack_verify(const char *dir, strata_pack_progress_fn progress, void *ud,
                       struct strata_err *err)
{
    int rc;
    struct strata_pack *p = NULL;
    char *pj = NULL, *text = NULL;
    cJSON *root = NULL;
    const cJSON *s;
    struct vctx v = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    pthread_t th[MAX_VERIFIERS];
    int n_th = 0;
    uint64_t total = 0;
    rc = strata_pack_open(&p, dir, err);
    if (rc)
        goto out;
    if (!p->dir) {
        rc = strata_err_set(err, STRATA_E_INVALID, "'%s' is a GGUF file, not a pack", dir);
        goto out;
    }
    pj = path_join(p->dir, PACK_JSON);
    if (!pj) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    rc = strata_json_read_text(pj, &text, err);
    if (rc)
        goto out;
    root = cJSON_Parse(text);
    if (!root) {
        rc = strata_err_set(err, STRATA_E_FORMAT, "'%s' is not valid JSON", pj);
        goto out;
    }
    const cJSON *srcs = cJSON_GetObjectItemCaseSensitive(root, "sources");
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, "experts");
    v.f = calloc((size_t)cJSON_GetArraySize(srcs) + 1, sizeof(*v.f));
    if (!v.f) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    /* sizes first (a missing or truncated file is named at once), then
     * every file hashed, several side by side */
    cJSON_ArrayForEach(s, srcs) {
        struct vfile *f = &v.f[v.n++];
        f->path = source_path(p->dir, strata_json_get_s(s, "path"));
        f->size = (uint64_t)strata_json_get_u(s, "size");
        f->want = strata_json_get_s(s, "sha256");
        if (!f->path) {
            rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
            goto out;
        }
    }
    if (p->mode == STRATA_PACK_REPACKED) {
        struct vfile *f = &v.f[v.n++];
        f->path = path_join(p->dir, EXPERTS_BIN);
        f->size = p->experts_size;
        f->want = strata_json_get_s(x, "sha256");
        if (!f->path || !strata_sha256_is_hex(f->want)) {
            rc = strata_err_set(err, f->path ? STRATA_E_FORMAT : STRATA_E_NOMEM,
                                "'%s': experts.bin has no valid sha256", pj);
            goto out;
        }
    }
    for (uint32_t i = 0; i < v.n; i++) {
        if ((rc = check_file_size(v.f[i].path, v.f[i].size, err)))
            goto out;
        total += v.f[i].size;
    }
    v.active = 0;
    while (n_th < MAX_VERIFIERS && (uint32_t)n_th < v.n) {
        pthread_mutex_lock(&v.mu);
        v.active++;
        pthread_mutex_unlock(&v.mu);
        if (pthread_create(&th[n_th], NULL, vworker, &v)) {
            pthread_mutex_lock(&v.mu);
            v.active--;
            pthread_mutex_unlock(&v.mu);
            break;
        }
        n_th++;
    }
    if (!n_th) {
        v.active = 1;
        vworker(&v);
    }
    pthread_mutex_lock(&v.mu);
    while (v.active > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 500000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&v.cv, &v.mu, &ts);
        uint64_t d = __atomic_load_n(&v.done, __ATOMIC_RELAXED);
        if (progress && v.active > 0 && progress("verify", d, total, ud))
            __atomic_store_n(&v.cancel, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&v.mu);
    for (int i = 0; i < n_th; i++)
        pthread_join(th[i], NULL);
    for (uint32_t i = 0; i < v.n; i++) {
        const struct vfile *f = &v.f[i];
        if (f->rc) {
            rc = f->rc;
            if (err)
                *err = f->err;
            goto out;
        }
        if (!f->want || strcasecmp(f->hex, f->want)) {
            rc = strata_err_set(err, STRATA_E_CHECKSUM,
                                "'%s': sha256 %s does not match %s recorded in '%s'", f->path,
                                f->hex, f->want ? f->want : "(none)", pj);
            goto out;
        }
    }
    if (progress)
        progress("verify", total, total, ud);
out:
    for (uint32_t i = 0; v.f && i < v.n; i++)
        free(v.f[i].path);
    free(v.f);
    cJSON_Delete(root);
    free(text);
    free(pj);
    strata_pack_close(p);
    return rc;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path) ? -1 : 0;
}

int strata_pack_remove_tree(const char *dir, struct strata_err *err)
{
    struct stat st;
    if (lstat(dir, &st) && errno == ENOENT)
        return 0;
    if (nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS))
        return strata_err_set(err, STRATA_E_IO, "cannot remove '%s': %s", dir,
                              strerror(errno));
    return 0;
}

int strata_pack_commit(const char *dir_partial, const char *dir_final, int force,
                       struct strata_err *err)
{
    struct stat st;
    int rc = 0;
    char *aside = NULL;
    if (lstat(dir_final, &st) == 0) {
        if (!force)
            return strata_err_set(err, STRATA_E_INVALID,
                                  "'%s' already exists (use --force to replace it)",
                                  dir_final);
        aside = malloc(strlen(dir_final) + 32);
        if (!aside)
            return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        sprintf(aside, "%s.old-%ld", dir_final, (long)getpid());
        if (rename(dir_final, aside)) {
            rc = strata_err_set(err, STRATA_E_IO, "cannot move '%s' aside: %s", dir_final,
                                strerror(errno));
            goto out;
        }
    }
    if (rename(dir_partial, dir_final)) {
        rc = strata_err_set(err, STRATA_E_IO, "cannot rename '%s' to '%s': %s", dir_partial,
                            dir_final, strerror(errno));
        if (aside)
            rename(aside, dir_final);
        goto out;
    }
    if (aside)
        rc = strata_pack_remove_tree(aside, err);
out:
    free(aside);
    return rc;
}
