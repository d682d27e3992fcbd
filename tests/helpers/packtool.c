/* packtool.c - helpers for the pack and download tests.
 *
 *   packtool split IN.gguf N PREFIX
 *       write PREFIX-0000K-of-0000N.gguf, a split set of IN as gguf-split
 *       lays it out (all metadata in the first shard; split.no, split.count,
 *       split.tensors.count in each).
 *   packtool synth OUT.gguf MIB
 *       a synthetic qwen3moe-shaped GGUF of about MIB MiB, mostly routed
 *       experts (Q8_0), for the repack benchmark.
 *   packtool serve ROOT [--port-file F] [--log F] [--fault KIND] [--fault-count N]
 *                  [--stall-s S] [--max-s S] [--no-etag]
 *       a loopback HTTP server for ROOT's files with Range support, an ETag
 *       and X-Linked-Etag carrying each file's SHA-256 (as the Hugging Face
 *       Hub publishes it); paths OWNER/REPO/resolve/REV/PATH map to ROOT/PATH.
 *       Faults for the first N file requests (default: all): cut (close the
 *       connection halfway), 404, stall (send half, then nothing for S s),
 *       corrupt (one byte changed; the hash headers stay the real ones),
 *       500.  The port is written to F (or stdout); the server exits on
 *       SIGTERM/SIGINT or after --max-s seconds (default 120).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <microhttpd.h>

#include "gguf.h"
#include "gguf_write.h"
#include "sha256.h"

/* ---- split ------------------------------------------------------------- */

static int cmd_split(const char *in, int n, const char *prefix)
{
    struct strata_err err = {0};
    struct strata_gguf *g = NULL;
    int rc = 1;
    if (n < 1 || n > 99 || strata_gguf_open(&g, in, &err)) {
        fprintf(stderr, "packtool: split: %s\n", err.msg[0] ? err.msg : "bad shard count");
        return 1;
    }
    uint64_t nt = strata_gguf_n_tensors(g);
    for (int k = 0; k < n; k++) {
        struct strata_gguf_writer *w = NULL;
        char path[4096];
        if (strata_gguf_writer_create(&w, &err))
            goto fail;
        strata_gguf_writer_set_alignment(w, strata_gguf_alignment(g), &err);
        if (k == 0)
            for (uint64_t i = 0; i < strata_gguf_n_kv(g); i++) {
                const struct strata_gguf_kv *kv = strata_gguf_kv_at(g, i);
                if (strncmp(kv->key, "split.", 6) && strcmp(kv->key, "general.alignment") &&
                    strata_gguf_writer_add_kv(w, kv, &err)) {
                    strata_gguf_writer_free(w);
                    goto fail;
                }
            }
        strata_gguf_writer_add_u16(w, "split.no", (uint16_t)k, &err);
        strata_gguf_writer_add_u16(w, "split.count", (uint16_t)n, &err);
        strata_gguf_writer_add_i32(w, "split.tensors.count", (int32_t)nt, &err);
        for (uint64_t i = nt * (uint64_t)k / (uint64_t)n; i < nt * (uint64_t)(k + 1) / (uint64_t)n;
             i++) {
            const struct strata_gguf_tensor *t = strata_gguf_tensor_at(g, i);
            if (strata_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data,
                                              &err)) {
                strata_gguf_writer_free(w);
                goto fail;
            }
        }
        snprintf(path, sizeof(path), "%s-%05d-of-%05d.gguf", prefix, k + 1, n);
        int wr = strata_gguf_writer_write_file(w, path, &err);
        strata_gguf_writer_free(w);
        if (wr)
            goto fail;
    }
    rc = 0;
fail:
    if (rc)
        fprintf(stderr, "packtool: split: %s\n", err.msg);
    strata_gguf_close(g);
    return rc;
}

/* ---- synth ------------------------------------------------------------- */

static int cmd_synth(const char *out, uint64_t mib)
{
    struct strata_err err = {0};
    struct strata_gguf_writer *w = NULL;
    const uint32_t n_embd = 1024, n_ff = 512, n_expert = 64, n_vocab = 1024;
    /* one layer's experts: 3 tensors of n_expert * n_ff * n_embd Q8_0 values
     * (34 bytes per 32) */
    uint64_t per_layer = 3ull * n_expert * n_ff * n_embd / 32 * 34;
    uint32_t n_layer = (uint32_t)((mib << 20) / per_layer);
    uint64_t big = (uint64_t)n_expert * n_ff * n_embd / 32 * 34;
    unsigned char *data = malloc(big);
    int rc = 1;
    if (!data || n_layer < 1 || strata_gguf_writer_create(&w, &err))
        goto out;
    for (uint64_t i = 0; i < big; i++)
        data[i] = (unsigned char)(i * 2654435761u >> 13);
    strata_gguf_writer_add_str(w, "general.architecture", "qwen3moe", &err);
    strata_gguf_writer_add_str(w, "general.name", "synthetic", &err);
    strata_gguf_writer_add_u32(w, "qwen3moe.block_count", n_layer, &err);
    strata_gguf_writer_add_u32(w, "qwen3moe.embedding_length", n_embd, &err);
    strata_gguf_writer_add_u32(w, "qwen3moe.attention.head_count", 8, &err);
    strata_gguf_writer_add_u32(w, "qwen3moe.attention.head_count_kv", 2, &err);
    strata_gguf_writer_add_u32(w, "qwen3moe.expert_count", n_expert, &err);
    strata_gguf_writer_add_u32(w, "qwen3moe.expert_used_count", 8, &err);
    strata_gguf_writer_add_u32(w, "qwen3moe.expert_feed_forward_length", n_ff, &err);
    strata_gguf_writer_add_u32(w, "qwen3moe.context_length", 4096, &err);
    strata_gguf_writer_add_tensor(w, "token_embd.weight", STRATA_TYPE_Q8_0, 2,
                                  (uint64_t[]){n_embd, n_vocab}, data, &err);
    for (uint32_t l = 0; l < n_layer; l++) {
        char name[96];
        static const char *const parts[] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
        snprintf(name, sizeof(name), "blk.%u.attn_q.weight", l);
        strata_gguf_writer_add_tensor(w, name, STRATA_TYPE_Q8_0, 2,
                                      (uint64_t[]){n_embd, n_embd}, data, &err);
        for (int p = 0; p < 3; p++) {
            snprintf(name, sizeof(name), "blk.%u.%s.weight", l, parts[p]);
            uint64_t ne[3] = {p == 2 ? n_ff : n_embd, p == 2 ? n_embd : n_ff, n_expert};
            if (strata_gguf_writer_add_tensor(w, name, STRATA_TYPE_Q8_0, 3, ne, data, &err))
                goto out;
        }
    }
    if (strata_gguf_writer_write_file(w, out, &err))
        goto out;
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "packtool: synth: %s\n", err.msg[0] ? err.msg : "failed");
    strata_gguf_writer_free(w);
    free(data);
    return rc;
}

/* ---- serve ------------------------------------------------------------- */

static struct {
    const char *root;
    const char *fault;
    int fault_count;      /* faults left; -1: every request */
    unsigned stall_s;
    int no_etag;
    FILE *log;
    pthread_mutex_t mu;
    volatile sig_atomic_t quit;
} S = {.fault_count = -1, .stall_s = 30, .mu = PTHREAD_MUTEX_INITIALIZER};

struct body {
    int fd;
    uint64_t start, len;   /* bytes of the file served */
    uint64_t cut_at;       /* stop after this many body bytes (cut/stall), else len */
    int stall;
    int64_t corrupt_at;    /* file offset of the changed byte, -1 none */
};

static ssize_t body_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct body *b = cls;
    if (pos >= b->cut_at) {
        if (b->stall)
            for (unsigned i = 0; i < S.stall_s * 20 && !S.quit; i++)
                usleep(50000);
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    if (max > b->cut_at - pos)
        max = (size_t)(b->cut_at - pos);
    ssize_t r = pread(b->fd, buf, max, (off_t)(b->start + pos));
    if (r <= 0)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    uint64_t a = b->start + pos;
    if (b->corrupt_at >= 0 && (uint64_t)b->corrupt_at >= a && (uint64_t)b->corrupt_at < a + (uint64_t)r)
        buf[b->corrupt_at - (int64_t)a] ^= 0x40;
    return r;
}

static void body_free(void *cls)
{
    struct body *b = cls;
    close(b->fd);
    free(b);
}

static enum MHD_Result reply_text(struct MHD_Connection *c, unsigned code, const char *text)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), (void *)text,
                                                             MHD_RESPMEM_MUST_COPY);
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_size, void **state)
{
    (void)cls;
    (void)version;
    (void)upload_data;
    (void)upload_size;
    if (!*state) { /* first call: headers only */
        *state = (void *)1;
        return MHD_YES;
    }
    int head = strcmp(method, "HEAD") == 0;
    if (!head && strcmp(method, "GET"))
        return reply_text(c, 405, "method not allowed\n");
    const char *range = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Range");
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const char *rel = url;
    const char *rs = strstr(url, "/resolve/");
    if (rs) { /* OWNER/REPO/resolve/REV/PATH */
        const char *p = strchr(rs + 9, '/');
        if (p)
            rel = p;
    }
    while (*rel == '/')
        rel++;
    const char *fault = NULL;
    pthread_mutex_lock(&S.mu);
    if (S.log) {
        fprintf(S.log, "%s /%s %s%s%s\n", method, rel, range ? range : "-",
                auth ? " auth=" : "", auth ? auth : "");
        fflush(S.log);
    }
    if (S.fault && !head && S.fault_count != 0) {
        fault = S.fault;
        if (S.fault_count > 0)
            S.fault_count--;
    }
    pthread_mutex_unlock(&S.mu);
    if (strstr(rel, "..") || !*rel)
        return reply_text(c, 403, "forbidden\n");
    if (fault && strcmp(fault, "404") == 0)
        return reply_text(c, 404, "not found (injected)\n");
    if (fault && strcmp(fault, "500") == 0)
        return reply_text(c, 500, "server error (injected)\n");
    char path[4096], hex[STRATA_SHA256_HEX];
    snprintf(path, sizeof(path), "%s/%s", S.root, rel);
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        if (fd >= 0)
            close(fd);
        return reply_text(c, 404, "not found\n");
    }
    uint64_t size = (uint64_t)st.st_size, start = 0, end = size;
    unsigned code = MHD_HTTP_OK;
    if (range && strncmp(range, "bytes=", 6) == 0) {
        char *e;
        start = strtoull(range + 6, &e, 10);
        if (*e == '-' && e[1])
            end = strtoull(e + 1, NULL, 10) + 1;
        if (end > size)
            end = size;
        if (start >= size) {
            char cr[64];
            close(fd);
            struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"",
                                                                     MHD_RESPMEM_PERSISTENT);
            snprintf(cr, sizeof(cr), "bytes */%" PRIu64, size);
            MHD_add_response_header(r, "Content-Range", cr);
            enum MHD_Result ret = MHD_queue_response(c, 416, r);
            MHD_destroy_response(r);
            return ret;
        }
        code = MHD_HTTP_PARTIAL_CONTENT;
    }
    struct body *b = calloc(1, sizeof(*b));
    if (!b) {
        close(fd);
        return MHD_NO;
    }
    b->fd = fd;
    b->start = start;
    b->len = end - start;
    b->cut_at = b->len;
    b->corrupt_at = -1;
    if (fault && (strcmp(fault, "cut") == 0 || strcmp(fault, "stall") == 0)) {
        b->cut_at = b->len / 2;
        b->stall = fault[0] == 's';
    }
    if (fault && strcmp(fault, "corrupt") == 0)
        b->corrupt_at = (int64_t)(size / 2);
    struct MHD_Response *r = MHD_create_response_from_callback(b->len, 64 * 1024, body_read, b,
                                                               body_free);
    if (!r) {
        body_free(b);
        return MHD_NO;
    }
    if (code == MHD_HTTP_PARTIAL_CONTENT) {
        char cr[96];
        snprintf(cr, sizeof(cr), "bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64, start, end - 1,
                 size);
        MHD_add_response_header(r, "Content-Range", cr);
    }
    MHD_add_response_header(r, "Accept-Ranges", "bytes");
    if (!S.no_etag && strata_sha256_file(path, UINT64_MAX, hex, NULL, NULL) == 0) {
        char q[80];
        snprintf(q, sizeof(q), "\"%s\"", hex);
        MHD_add_response_header(r, "ETag", q);
        if (rs) {
            char sz[32];
            MHD_add_response_header(r, "X-Linked-Etag", q);
            snprintf(sz, sizeof(sz), "%" PRIu64, size);
            MHD_add_response_header(r, "X-Linked-Size", sz);
        }
    }
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

static void on_signal(int sig)
{
    (void)sig;
    S.quit = 1;
}

static int cmd_serve(int argc, char **argv)
{
    const char *port_file = NULL;
    unsigned max_s = 120;
    if (argc < 1) {
        fprintf(stderr, "packtool: serve ROOT [options]\n");
        return 2;
    }
    S.root = argv[0];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--no-etag") == 0) {
            S.no_etag = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "packtool: serve: option '%s' needs a value\n", a);
            return 2;
        }
        i++;
        if (strcmp(a, "--port-file") == 0)
            port_file = v;
        else if (strcmp(a, "--log") == 0)
            S.log = fopen(v, "a");
        else if (strcmp(a, "--fault") == 0)
            S.fault = v;
        else if (strcmp(a, "--fault-count") == 0)
            S.fault_count = atoi(v);
        else if (strcmp(a, "--stall-s") == 0)
            S.stall_s = (unsigned)atoi(v);
        else if (strcmp(a, "--max-s") == 0)
            max_s = (unsigned)atoi(v);
        else {
            fprintf(stderr, "packtool: serve: unknown option '%s'\n", a);
            return 2;
        }
    }
    struct sockaddr_in addr = {0};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0, NULL, NULL,
        on_request, NULL, MHD_OPTION_SOCK_ADDR, &addr, MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "packtool: serve: cannot start the server\n");
        return 1;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    unsigned port = info ? info->port : 0;
    if (port_file) {
        char tmp[4096];
        snprintf(tmp, sizeof(tmp), "%s.tmp", port_file);
        FILE *f = fopen(tmp, "w");
        if (f) {
            fprintf(f, "%u\n", port);
            fclose(f);
            rename(tmp, port_file);
        }
    } else {
        printf("%u\n", port);
        fflush(stdout);
    }
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    for (unsigned i = 0; i < max_s * 10 && !S.quit; i++)
        usleep(100000);
    S.quit = 1;
    MHD_stop_daemon(d);
    if (S.log)
        fclose(S.log);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 5 && strcmp(argv[1], "split") == 0)
        return cmd_split(argv[2], atoi(argv[3]), argv[4]);
    if (argc >= 4 && strcmp(argv[1], "synth") == 0)
        return cmd_synth(argv[2], strtoull(argv[3], NULL, 10));
    if (argc >= 2 && strcmp(argv[1], "serve") == 0)
        return cmd_serve(argc - 2, argv + 2);
    fprintf(stderr, "usage: packtool split IN N PREFIX | synth OUT MIB | serve ROOT [opts]\n");
    return 2;
}
