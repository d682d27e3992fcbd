/* server_vision.c - strata-serve's vision helpers: one `strata-embed --serve`
 * process per model that has a vision projector (mmproj), started and
 * restarted by a supervisor thread, and the path of an OpenAI image part to
 * the engine: image bytes (a data: URL, or an http(s) URL fetched with
 * libcurl when allowed) -> POST /embed on the helper -> the embedding
 * payload, base64, in the generate request's "images" member
 * (docs/engine-protocol.md).
 */
#include "server_int.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "gguf.h"
#include "log.h"

#define VIS_MAX_IMAGE (20u << 20)   /* bytes of one fetched image */
#define VIS_WAIT_READY_S 60.0       /* a request waits this long for a (re)starting helper */

struct srv_vision {
    struct srv_model *model;
    char *mmproj;
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* under mu */
    pid_t pid;
    int port;
    int ready;
    int restarts;
};

/* ---- base64 (RFC 4648) ---- */

static const char b64_chars[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *b64_encode(const unsigned char *p, size_t n)
{
    char *o = malloc((n + 2) / 3 * 4 + 1), *q = o;
    if (!o)
        return NULL;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) |
                     (i + 2 < n ? p[i + 2] : 0);
        *q++ = b64_chars[v >> 18 & 63];
        *q++ = b64_chars[v >> 12 & 63];
        *q++ = i + 1 < n ? b64_chars[v >> 6 & 63] : '=';
        *q++ = i + 2 < n ? b64_chars[v & 63] : '=';
    }
    *q = 0;
    return o;
}

/* Decode s[0..n) (whitespace skipped, padding optional); NULL on a bad
 * character. */
static unsigned char *b64_decode(const char *s, size_t n, size_t *out_len)
{
    unsigned char *o = malloc(n / 4 * 3 + 3);
    uint32_t acc = 0;
    int bits = 0;
    size_t k = 0;
    if (!o)
        return NULL;
    for (size_t i = 0; i < n && s[i] != '='; i++) {
        const char *c = strchr(b64_chars, s[i]);
        if (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')
            continue;
        if (!s[i] || !c) {
            free(o);
            return NULL;
        }
        acc = acc << 6 | (uint32_t)(c - b64_chars);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            o[k++] = (unsigned char)(acc >> bits);
        }
    }
    *out_len = k;
    return o;
}

/* ---- HTTP with libcurl ---- */

struct body {
    unsigned char *p;
    size_t n, cap, max;
    int too_big;
};

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *ud)
{
    struct body *b = ud;
    size_t n = size * nmemb;
    if (b->n + n > b->max) {
        b->too_big = 1;
        return 0;
    }
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 65536;
        while (cap < b->n + n)
            cap *= 2;
        unsigned char *q = realloc(b->p, cap);
        if (!q)
            return 0;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, ptr, n);
    b->n += n;
    return n;
}

/* GET or POST (post != NULL) url; *status gets the HTTP status (0 when no
 * answer came).  Returns the curl error text or NULL. */
static const char *http(const char *url, const void *post, size_t post_n, double timeout_s,
                        struct body *b, long *status)
{
    CURL *c = curl_easy_init();
    static __thread char msg[CURL_ERROR_SIZE + 64];
    char ebuf[CURL_ERROR_SIZE] = "";
    *status = 0;
    if (!c)
        return "cannot create an HTTP handle";
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1000));
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, b);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, ebuf);
    curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)b->max);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(c, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 3L);
    struct curl_slist *hdr = NULL;
    if (post) {
        hdr = curl_slist_append(NULL, "Content-Type: application/octet-stream");
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, post);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)post_n);
    }
    CURLcode rc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, status);
    const char *r = NULL;
    if (rc != CURLE_OK) {
        snprintf(msg, sizeof msg, "%s", b->too_big ? "larger than the limit"
                                        : ebuf[0] ? ebuf : curl_easy_strerror(rc));
        r = msg;
    }
    curl_slist_free_all(hdr);
    curl_easy_cleanup(c);
    return r;
}

/* ---- the helper process ---- */

/* A free loopback port (the kernel's choice for port 0). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = 0;
    struct sockaddr_in a = {0};
    socklen_t len = sizeof a;
    if (fd < 0)
        return 0;
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* strata-embed next to the engine program (or from PATH). */
static char *embed_path(const struct srv *s)
{
    const char *e = s->engine_path, *sl = strrchr(e, '/');
    size_t dl = sl ? (size_t)(sl - e + 1) : 0;
    char *p = malloc(dl + sizeof("strata-embed"));
    if (p) {
        memcpy(p, e, dl);
        strcpy(p + dl, "strata-embed");
    }
    return p;
}

static pid_t spawn_helper(struct srv_vision *v, int port)
{
    char port_s[16];
    char *prog = embed_path(v->model->srv);
    snprintf(port_s, sizeof port_s, "%d", port);
    if (!prog)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int nul = open("/dev/null", 0);
        if (nul >= 0) {
            dup2(nul, 0);
            dup2(nul, 1);
        }
        char *argv[] = {prog, "-m", v->mmproj, "--serve", "--host", "127.0.0.1", "--port",
                        port_s, "--warmup", NULL};
        execvp(prog, argv);
        fprintf(stderr, "strata-serve: cannot run '%s': %s\n", prog, strerror(errno));
        _exit(127);
    }
    free(prog);
    return pid;
}

static void *supervise(void *arg)
{
    struct srv_vision *v = arg;
    struct srv *s = v->model->srv;
    double backoff = 0.25;
    while (!s->stopping) {
        int port = free_port();
        pid_t pid = port ? spawn_helper(v, port) : -1;
        if (pid < 0) {
            strata_log_warn("model '%s': cannot start the vision helper", v->model->id);
            sleep(1);
            continue;
        }
        pthread_mutex_lock(&v->mu);
        v->pid = pid;
        v->port = port;
        v->ready = 0;
        pthread_mutex_unlock(&v->mu);
        double t0 = srv_now();
        int status = 0;
        while (!s->stopping) {
            pid_t w = waitpid(pid, &status, WNOHANG);
            if (w == pid)
                break;
            int ready;
            pthread_mutex_lock(&v->mu);
            ready = v->ready;
            pthread_mutex_unlock(&v->mu);
            if (!ready) {
                char url[64];
                long st = 0;
                struct body b = {.max = 4096};
                snprintf(url, sizeof url, "http://127.0.0.1:%d/health", port);
                http(url, NULL, 0, 2.0, &b, &st);
                free(b.p);
                if (st == 200) {
                    pthread_mutex_lock(&v->mu);
                    v->ready = 1;
                    pthread_cond_broadcast(&v->cv);
                    pthread_mutex_unlock(&v->mu);
                    strata_log_info("model '%s': vision helper ready (pid %d, port %d)",
                                    v->model->id, (int)pid, port);
                }
            }
            struct timespec ts = {0, 50 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        pthread_mutex_lock(&v->mu);
        v->ready = 0;
        v->pid = 0;
        pthread_mutex_unlock(&v->mu);
        if (s->stopping) {
            kill(pid, SIGTERM);
            waitpid(pid, &status, 0);
            break;
        }
        if (srv_now() - t0 > 60)
            backoff = 0.25;
        if (WIFSIGNALED(status))
            strata_log_warn("model '%s': vision helper killed by signal %d; restarting",
                            v->model->id, WTERMSIG(status));
        else
            strata_log_warn("model '%s': vision helper exited with status %d; restarting",
                            v->model->id, WEXITSTATUS(status));
        pthread_mutex_lock(&v->mu);
        v->restarts++;
        pthread_mutex_unlock(&v->mu);
        for (double t = 0; t < backoff && !s->stopping; t += 0.05) {
            struct timespec ts = {0, 50 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        backoff = backoff * 2 > 8 ? 8 : backoff * 2;
    }
    return NULL;
}

/* The vision projector a pack recorded (pack.json "sources" entry with
 * role "mmproj", its path relative to the pack directory), malloc'ed, or
 * NULL when path is not a pack or has none. */
static char *pack_mmproj(const char *path)
{
    struct stat st;
    char dir[4096], pj[4200];
    size_t pl = strlen(path);
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(dir, sizeof dir, "%s", path);
    } else if (pl >= 9 && !strcmp(path + pl - 9, "pack.json")) {
        snprintf(dir, sizeof dir, "%.*s", (int)(pl - 9), path);
        if (!dir[0])
            strcpy(dir, ".");
    } else {
        return NULL;
    }
    snprintf(pj, sizeof pj, "%s/pack.json", dir);
    FILE *f = fopen(pj, "rb");
    if (!f)
        return NULL;
    char *text = NULL, *out = NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n > 0 && n < (16 << 20) && fseek(f, 0, SEEK_SET) == 0 && (text = malloc((size_t)n + 1)) &&
        fread(text, 1, (size_t)n, f) == (size_t)n) {
        text[n] = 0;
        cJSON *root = cJSON_Parse(text);
        const cJSON *src;
        cJSON_ArrayForEach(src, cJSON_GetObjectItemCaseSensitive(root, "sources"))
        {
            const cJSON *role = cJSON_GetObjectItemCaseSensitive(src, "role");
            const cJSON *p = cJSON_GetObjectItemCaseSensitive(src, "path");
            if (out || !cJSON_IsString(role) || strcmp(role->valuestring, "mmproj") ||
                !cJSON_IsString(p))
                continue;
            size_t need = strlen(dir) + strlen(p->valuestring) + 2;
            if ((out = malloc(need))) {
                if (p->valuestring[0] == '/')
                    snprintf(out, need, "%s", p->valuestring);
                else
                    snprintf(out, need, "%s/%s", dir, p->valuestring);
            }
        }
        cJSON_Delete(root);
    }
    free(text);
    fclose(f);
    return out;
}

/* A vision projector must open as a GGUF with clip.projector_type before
 * the helper is started on it: a file the helper cannot load is an error of
 * the server's command line, not a helper to restart forever. */
static int check_mmproj(const char *id, const char *path, struct strata_err *err)
{
    struct strata_gguf *g = NULL;
    const char *proj = NULL;
    int rc = strata_gguf_open(&g, path, err);
    if (!rc)
        rc = strata_gguf_get_str(g, "clip.projector_type", &proj, err);
    strata_gguf_close(g);
    if (rc)
        strata_err_wrap(err, "model '%s': vision projector", id);
    return rc;
}

int srv_vision_start(struct srv *s, struct strata_err *err)
{
    const struct strata_server_opts *o = s->o;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    for (int i = 0; i < s->n_models; i++) {
        const char *mm = o->mmprojs ? o->mmprojs[i] : NULL;
        char *from_pack = mm ? NULL : pack_mmproj(s->models[i].path);
        if (!mm && !from_pack)
            continue;
        int rc = check_mmproj(s->models[i].id, mm ? mm : from_pack, err);
        if (rc) {
            free(from_pack);
            return rc;
        }
        struct srv_vision *v = calloc(1, sizeof *v);
        if (!v || !(v->mmproj = mm ? strdup(mm) : from_pack)) {
            free(v);
            free(from_pack);
            return strata_err_set(err, STRATA_E_NOMEM, "vision helper state");
        }
        v->model = &s->models[i];
        pthread_mutex_init(&v->mu, NULL);
        pthread_cond_init(&v->cv, NULL);
        s->models[i].vision = v;
        strata_log_info("model '%s': vision helper for %s", v->model->id, v->mmproj);
        if (pthread_create(&v->thread, NULL, supervise, v))
            return strata_err_set(err, STRATA_E_IO, "cannot start the vision supervisor");
        v->thread_started = 1;
    }
    return 0;
}

void srv_vision_stop(struct srv *s)
{
    for (int i = 0; i < s->n_models; i++) {
        struct srv_vision *v = s->models[i].vision;
        if (!v)
            continue;
        pthread_mutex_lock(&v->mu);
        if (v->pid > 0)
            kill(v->pid, SIGTERM);
        pthread_cond_broadcast(&v->cv);
        pthread_mutex_unlock(&v->mu);
        if (v->thread_started)
            pthread_join(v->thread, NULL);
        pthread_mutex_destroy(&v->mu);
        pthread_cond_destroy(&v->cv);
        free(v->mmproj);
        free(v);
        s->models[i].vision = NULL;
    }
}

int srv_vision_ready(struct srv_model *m)
{
    struct srv_vision *v = m->vision;
    int r = 0;
    if (v) {
        pthread_mutex_lock(&v->mu);
        r = v->ready;
        pthread_mutex_unlock(&v->mu);
    }
    return r;
}

/* ---- image parts ---- */

/* The image bytes of an image_url value: a data: URL (base64), or an
 * http(s) URL when allowed. */
static int image_bytes(struct srv *s, const char *url, const char *param, struct body *b,
                       struct srv_reply *r)
{
    if (!strncmp(url, "data:", 5)) {
        const char *comma = strchr(url, ',');
        if (!comma || !memmem(url, (size_t)(comma - url), ";base64", 7)) {
            srv_reply_error(r, 400, "invalid_request_error", param,
                            "'%s': a data: URL must be base64 (data:image/...;base64,...)",
                            param);
            return -1;
        }
        b->p = b64_decode(comma + 1, strlen(comma + 1), &b->n);
        if (!b->p || b->n == 0) {
            srv_reply_error(r, 400, "invalid_request_error", param,
                            "'%s': the data: URL is not valid base64", param);
            return -1;
        }
        return 0;
    }
    if (strncmp(url, "http://", 7) && strncmp(url, "https://", 8)) {
        srv_reply_error(r, 400, "invalid_request_error", param,
                        "'%s': the image URL must be a data: or http(s) URL", param);
        return -1;
    }
    if (!s->o->allow_image_urls) {
        srv_reply_error(r, 400, "invalid_request_error", param,
                        "'%s': http(s) image URLs are not allowed on this server (send a "
                        "data: URL, or start strata-serve with --allow-image-urls)", param);
        return -1;
    }
    long st = 0;
    b->max = VIS_MAX_IMAGE;
    const char *e = http(url, NULL, 0, 30.0, b, &st);
    if (e || st != 200) {
        srv_reply_error(r, 400, "invalid_request_error", param,
                        "'%s': cannot fetch the image: %s", param,
                        e ? e : st ? "the server answered with an error status" : "no answer");
        return -1;
    }
    return 0;
}

/* Embed one image through the model's helper; *b64 gets the payload in
 * base64.  On failure the reply is written and -1 returned. */
static int embed_one(struct srv_model *m, const struct body *img, const char *param,
                     char **b64, struct srv_reply *r)
{
    struct srv_vision *v = m->vision;
    pthread_mutex_lock(&v->mu);
    double t_end = srv_now() + VIS_WAIT_READY_S;
    while (!v->ready && !m->srv->stopping && srv_now() < t_end) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&v->cv, &v->mu, &ts);
    }
    int port = v->port, ready = v->ready;
    pthread_mutex_unlock(&v->mu);
    if (!ready) {
        srv_reply_error(r, 503, "server_error", param,
                        "'%s': the vision helper of model '%s' is not ready", param, m->id);
        return -1;
    }
    char url[64];
    long st = 0;
    struct body out = {.max = 1u << 30};
    snprintf(url, sizeof url, "http://127.0.0.1:%d/embed", port);
    const char *e = http(url, img->p, img->n, 300.0, &out, &st);
    if (e || st == 0) {
        /* the helper died (or hangs): until the supervisor has restarted it
         * and seen /health answer, later requests wait instead of using the
         * dead port */
        pthread_mutex_lock(&v->mu);
        if (v->port == port)
            v->ready = 0;
        pthread_mutex_unlock(&v->mu);
        srv_reply_error(r, 500, "server_error", param,
                        "'%s': the vision helper of model '%s' failed (%s); it is restarted",
                        param, m->id, e ? e : "no answer");
        free(out.p);
        return -1;
    }
    if (st != 200) {
        /* the helper's error object carries the decoder's reason */
        char reason[512] = "the image cannot be decoded";
        cJSON *j = out.p ? cJSON_ParseWithLength((const char *)out.p, out.n) : NULL;
        const cJSON *em = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(j, "error"), "message");
        if (cJSON_IsString(em))
            snprintf(reason, sizeof reason, "%s", em->valuestring);
        cJSON_Delete(j);
        free(out.p);
        srv_reply_error(r, st == 413 ? 413 : 400, "invalid_request_error", param,
                        "'%s': %s", param, reason);
        return -1;
    }
    *b64 = b64_encode(out.p, out.n);
    free(out.p);
    if (!*b64) {
        srv_reply_error(r, 500, "server_error", NULL, "out of memory");
        return -1;
    }
    return 0;
}

int srv_vision_embed_parts(struct srv *s, struct srv_model *m, const cJSON *parts, cJSON *gen,
                           struct srv_reply *r)
{
    cJSON *arr = cJSON_AddArrayToObject(gen, "images");
    const cJSON *p;
    if (!arr) {
        srv_reply_error(r, 500, "server_error", NULL, "out of memory");
        return -1;
    }
    cJSON_AddStringToObject(gen, "image_marker", SRV_IMAGE_MARKER);
    cJSON_ArrayForEach(p, parts)
    {
        const char *param = cJSON_GetObjectItemCaseSensitive(p, "param")->valuestring;
        const char *url = cJSON_GetObjectItemCaseSensitive(p, "url")->valuestring;
        struct body img = {0};
        char *b64 = NULL;
        int rc = image_bytes(s, url, param, &img, r);
        if (rc == 0)
            rc = embed_one(m, &img, param, &b64, r);
        free(img.p);
        if (rc)
            return -1;
        cJSON_AddItemToArray(arr, cJSON_CreateString(b64));
        free(b64);
    }
    return 0;
}
