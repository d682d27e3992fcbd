/* server.c - strata-serve's HTTP layer (GNU libmicrohttpd): routing, auth,
 * body limits, /health, /metrics, and the SSE content reader.
 *
 * libmicrohttpd runs one thread per connection (bounded by
 * max_connections): a generation handler blocks until its engine answers, so
 * a shared event-loop pool would stall every connection behind one long
 * generation.  Keep-alive and chunked transfer come from libmicrohttpd.
 */
#include "server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "chat.h"
#include "log.h"
#include "server_int.h"

void strata_server_opts_init(struct strata_server_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->host = "127.0.0.1";
    o->port = 8080;
    o->parallel = 1;
    o->watchdog_s = 120;
    o->load_timeout_s = 600;
    o->max_body = 10u << 20;
    o->max_connections = 256;
    o->conn_timeout_s = 60;
}

/* Per-connection state kept by libmicrohttpd between handler calls. */
struct conn_ctx {
    char *body;
    size_t len, cap;
    int too_big;
};

int srv_http_client_gone(const struct srv_http *h)
{
    if (!h || !h->conn)
        return 0;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(h->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return 0;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0)
        return 0;
    if (p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL))
        return 1;
    if (p.revents & POLLIN) {
        char c;
        ssize_t n = recv(ci->connect_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        return n == 0;
    }
    return 0;
}

void srv_reply_error(struct srv_reply *r, int status, const char *type, const char *param,
                     const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    cJSON *root = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", type);
    if (param)
        cJSON_AddStringToObject(e, "param", param);
    else
        cJSON_AddNullToObject(e, "param");
    const char *code = status == 401                                       ? "invalid_api_key"
                       : status == 404 && param && !strcmp(param, "model") ? "model_not_found"
                       : status == 413                                     ? "request_too_large"
                                                                           : NULL;
    if (code)
        cJSON_AddStringToObject(e, "code", code);
    else
        cJSON_AddNullToObject(e, "code");
    free(r->body);
    r->status = status;
    r->body = cJSON_PrintUnformatted(root);
    r->body_len = r->body ? strlen(r->body) : 0;
    r->stream = NULL;
    cJSON_Delete(root);
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    ssize_t n = srv_stream_read(cls, buf, max);
    return n > 0 ? n : n == 0 ? MHD_CONTENT_READER_END_OF_STREAM
                              : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void stream_free(void *cls) { srv_stream_free(cls); }

static enum MHD_Result queue_reply(struct MHD_Connection *c, struct srv_reply *r)
{
    struct MHD_Response *resp;
    if (r->stream) {
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader,
                                                 r->stream, stream_free);
        if (!resp) {
            srv_stream_free(r->stream);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
    } else {
        if (!r->body) {
            r->body = strdup("{}");
            r->body_len = 2;
        }
        resp = MHD_create_response_from_buffer(r->body_len, r->body, MHD_RESPMEM_MUST_FREE);
        if (!resp) {
            free(r->body);
            return MHD_NO;
        }
        r->body = NULL;
        MHD_add_response_header(resp, "Content-Type", "application/json");
    }
    if (r->status == 503)
        MHD_add_response_header(resp, "Retry-After", "1");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result queue_text(struct MHD_Connection *c, int status, const char *ctype,
                                  char *text)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", ctype);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* Constant-time comparison of the presented key with the configured one:
 * the time depends only on the presented key's length. */
static int key_ok(const char *want, const char *got)
{
    if (!got)
        return 0;
    size_t wl = strlen(want), gl = strlen(got);
    unsigned diff = (unsigned)(wl ^ gl);
    for (size_t i = 0; i < gl; i++)
        diff |= (unsigned char)got[i] ^ (unsigned char)(wl ? want[i % wl] : 0);
    return diff == 0 && wl > 0;
}

static void health_json(struct srv *s, struct srv_reply *r)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *arr = cJSON_CreateArray();
    int all_ready = 1;
    for (int i = 0; i < s->n_models; i++) {
        struct srv_model *m = &s->models[i];
        int n_ready = 0, restarts = 0;
        const char *st = srv_model_state(m, &n_ready, &restarts);
        if (strcmp(st, "ready"))
            all_ready = 0;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "id", m->id);
        cJSON_AddStringToObject(o, "engine", st);
        cJSON_AddBoolToObject(o, "loaded", n_ready > 0);
        cJSON_AddNumberToObject(o, "engines_ready", n_ready);
        cJSON_AddNumberToObject(o, "engines", m->n_engines);
        cJSON_AddNumberToObject(o, "restarts", restarts);
        if (m->vision)
            cJSON_AddBoolToObject(o, "images", srv_vision_ready(m));
        pthread_mutex_lock(&m->mu);
        cJSON_AddNumberToObject(o, "n_ctx", m->n_ctx);
        cJSON_AddNumberToObject(o, "queue", m->q_len);
        cJSON *pids = cJSON_AddArrayToObject(o, "pids");
        for (int k = 0; k < m->n_engines; k++)
            if (m->engines[k].pid > 0)
                cJSON_AddItemToArray(pids, cJSON_CreateNumber(m->engines[k].pid));
        pthread_mutex_unlock(&m->mu);
        cJSON_AddItemToArray(arr, o);
    }
    cJSON_AddStringToObject(root, "status", all_ready ? "ok" : "loading");
    if (s->n_models)
        cJSON_AddStringToObject(root, "model", s->models[0].id);
    cJSON_AddItemToObject(root, "models", arr);
    int images = 0;
    for (int i = 0; i < s->n_models; i++)
        images |= srv_vision_ready(&s->models[i]);
    cJSON_AddBoolToObject(root, "images", images);
    r->status = all_ready ? 200 : 503;
    r->body = cJSON_PrintUnformatted(root);
    r->body_len = r->body ? strlen(r->body) : 0;
    cJSON_Delete(root);
}

static char *metrics_text(struct srv *s)
{
    pthread_mutex_lock(&s->stat_mu);
    unsigned long req = s->n_requests, errs = s->n_errors, gen = s->n_gen_tokens;
    unsigned long prompt = s->n_prompt_tokens, cached = s->n_cached_tokens;
    unsigned long restarts = s->n_restarts, cancelled = s->n_cancelled;
    double secs = s->gen_seconds, last = s->last_tps;
    unsigned long sp_steps = s->spec_steps, sp_tokens = s->spec_tokens;
    unsigned long sp_drafted = s->spec_drafted, sp_accepted = s->spec_accepted;
    double sp_ms = s->spec_ms;
    pthread_mutex_unlock(&s->stat_mu);
    int q = srv_queue_len(s);
    size_t cap = 8192;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    snprintf(out, cap,
             "# HELP strata_requests_total HTTP requests handled.\n"
             "# TYPE strata_requests_total counter\n"
             "strata_requests_total %lu\n"
             "# HELP strata_request_errors_total Requests answered with an error status.\n"
             "# TYPE strata_request_errors_total counter\n"
             "strata_request_errors_total %lu\n"
             "# HELP strata_tokens_generated_total Tokens generated.\n"
             "# TYPE strata_tokens_generated_total counter\n"
             "strata_tokens_generated_total %lu\n"
             "# HELP strata_prompt_tokens_total Prompt tokens processed.\n"
             "# TYPE strata_prompt_tokens_total counter\n"
             "strata_prompt_tokens_total %lu\n"
             "# HELP strata_tokens_per_second Generation speed of the last request.\n"
             "# TYPE strata_tokens_per_second gauge\n"
             "strata_tokens_per_second %.3f\n"
             "# HELP strata_generation_seconds_total Engine time spent generating.\n"
             "# TYPE strata_generation_seconds_total counter\n"
             "strata_generation_seconds_total %.3f\n"
             "# HELP strata_queue_length Requests waiting for an engine.\n"
             "# TYPE strata_queue_length gauge\n"
             "strata_queue_length %d\n"
             "# HELP strata_engine_restarts_total Engine processes restarted.\n"
             "# TYPE strata_engine_restarts_total counter\n"
             "strata_engine_restarts_total %lu\n"
             "# HELP strata_requests_cancelled_total Generations cancelled by a client.\n"
             "# TYPE strata_requests_cancelled_total counter\n"
             "strata_requests_cancelled_total %lu\n"
             "# HELP strata_prompt_cache_hit_ratio Prompt tokens reused from the kv cache.\n"
             "# TYPE strata_prompt_cache_hit_ratio gauge\n"
             "strata_prompt_cache_hit_ratio %.4f\n",
             req, errs, gen, prompt, last, secs, q, restarts, cancelled,
             prompt ? (double)cached / (double)prompt : 0.0);
    size_t len = strlen(out);
    snprintf(out + len, cap - len,
             "# HELP strata_spec_steps_total Speculative verify windows evaluated.\n"
             "# TYPE strata_spec_steps_total counter\n"
             "strata_spec_steps_total %lu\n"
             "# HELP strata_spec_drafted_tokens_total Drafted tokens sent to verification.\n"
             "# TYPE strata_spec_drafted_tokens_total counter\n"
             "strata_spec_drafted_tokens_total %lu\n"
             "# HELP strata_spec_accepted_tokens_total Drafted tokens accepted.\n"
             "# TYPE strata_spec_accepted_tokens_total counter\n"
             "strata_spec_accepted_tokens_total %lu\n"
             "# HELP strata_spec_acceptance_ratio Accepted over drafted tokens.\n"
             "# TYPE strata_spec_acceptance_ratio gauge\n"
             "strata_spec_acceptance_ratio %.4f\n"
             "# HELP strata_spec_tokens_per_step Tokens produced per verify window.\n"
             "# TYPE strata_spec_tokens_per_step gauge\n"
             "strata_spec_tokens_per_step %.4f\n"
             "# HELP strata_spec_step_seconds Mean time of a verify window (draft and verify).\n"
             "# TYPE strata_spec_step_seconds gauge\n"
             "strata_spec_step_seconds %.6f\n",
             sp_steps, sp_drafted, sp_accepted,
             sp_drafted ? (double)sp_accepted / (double)sp_drafted : 0.0,
             sp_steps ? (double)sp_tokens / (double)sp_steps : 0.0,
             sp_steps ? sp_ms / 1000.0 / (double)sp_steps : 0.0);
    return out;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **con_cls)
{
    struct srv *s = cls;
    struct conn_ctx *cc = *con_cls;
    (void)version;
    if (!cc) {
        cc = calloc(1, sizeof(*cc));
        if (!cc)
            return MHD_NO;
        *con_cls = cc;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->o->max_body)
            cc->too_big = 1;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cc->too_big && cc->len + *upload_size > s->o->max_body)
            cc->too_big = 1;
        if (!cc->too_big) {
            if (cc->len + *upload_size + 1 > cc->cap) {
                size_t cap = cc->cap ? cc->cap : 16384;
                while (cap < cc->len + *upload_size + 1)
                    cap *= 2;
                char *nb = realloc(cc->body, cap);
                if (!nb)
                    return MHD_NO;
                cc->body = nb;
                cc->cap = cap;
            }
            memcpy(cc->body + cc->len, upload, *upload_size);
            cc->len += *upload_size;
        }
        *upload_size = 0;
        return MHD_YES;
    }

    struct srv_reply r = {.status = 200};
    struct srv_http h = {.conn = c};
    int is_get = !strcmp(method, "GET"), is_post = !strcmp(method, "POST");
    const char *path = url;
    if (!strncmp(path, "/v1/", 4))
        path += 3; /* "/v1/models" -> "/models" */

    pthread_mutex_lock(&s->stat_mu);
    s->n_requests++;
    pthread_mutex_unlock(&s->stat_mu);

    if (!strcmp(url, "/health") && is_get) {
        health_json(s, &r);
        goto reply;
    }
    if (s->o->api_key) {
        const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
        const char *key = NULL;
        if (auth && !strncasecmp(auth, "Bearer ", 7)) {
            key = auth + 7;
            while (*key == ' ')
                key++;
        }
        if (!key_ok(s->o->api_key, key)) {
            srv_reply_error(&r, 401, "invalid_request_error", NULL,
                            auth ? "incorrect API key provided"
                                 : "missing API key: send 'Authorization: Bearer KEY'");
            goto reply;
        }
    }
    if (cc->too_big) {
        srv_reply_error(&r, 413, "invalid_request_error", NULL,
                        "request body larger than %zu bytes", s->o->max_body);
        goto reply;
    }
    if (!strcmp(url, "/metrics") && is_get) {
        char *t = metrics_text(s);
        if (!t)
            return MHD_NO;
        return queue_text(c, 200, "text/plain; version=0.0.4", t);
    }
    if (!strcmp(path, "/models") && is_get) {
        srv_openai_models(s, &r);
    } else if (!strcmp(path, "/chat/completions") && is_post) {
        srv_openai_chat(s, cc->body ? cc->body : "", cc->len, &h, &r);
    } else if (!strcmp(path, "/completions") && is_post) {
        srv_openai_completion(s, cc->body ? cc->body : "", cc->len, &h, &r);
    } else if (!strcmp(url, "/tokenize") && is_post) {
        srv_openai_tokenize(s, cc->body ? cc->body : "", cc->len, &h, 0, &r);
    } else if (!strcmp(url, "/detokenize") && is_post) {
        srv_openai_tokenize(s, cc->body ? cc->body : "", cc->len, &h, 1, &r);
    } else if (!strcmp(path, "/models") || !strcmp(path, "/chat/completions") ||
               !strcmp(path, "/completions") || !strcmp(url, "/tokenize") ||
               !strcmp(url, "/detokenize") || !strcmp(url, "/health") ||
               !strcmp(url, "/metrics")) {
        srv_reply_error(&r, 405, "invalid_request_error", NULL, "method %s not allowed on %s",
                        method, url);
    } else {
        srv_reply_error(&r, 404, "invalid_request_error", NULL, "no such endpoint: %s %.400s",
                        method, url);
    }
reply:
    if (r.status >= 400) {
        pthread_mutex_lock(&s->stat_mu);
        s->n_errors++;
        pthread_mutex_unlock(&s->stat_mu);
        strata_log_info("%s %s -> %d", method, url, r.status);
    }
    return queue_reply(c, &r);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)c;
    (void)toe;
    struct conn_ctx *cc = *con_cls;
    if (cc) {
        free(cc->body);
        free(cc);
        *con_cls = NULL;
    }
}

static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t len)
{
    struct srv *s = cls;
    (void)len;
    if (s->allow_remote)
        return MHD_YES;
    if (addr->sa_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)addr;
        return (ntohl(a->sin_addr.s_addr) >> 24) == 127 ? MHD_YES : MHD_NO;
    }
    if (addr->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)addr;
        if (IN6_IS_ADDR_LOOPBACK(&a->sin6_addr))
            return MHD_YES;
        if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr) && a->sin6_addr.s6_addr[12] == 127)
            return MHD_YES;
    }
    return MHD_NO;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[1024];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n')
        msg[--n] = '\0';
    strata_log_debug("http: %s", msg);
}

static int is_loopback_host(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6)
        return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)sa)->sin6_addr);
    return 0;
}

static char *model_id_of(const char *path)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    const char *b = path;
    for (size_t i = 0; i < n; i++)
        if (path[i] == '/')
            b = path + i + 1;
    size_t bl = (size_t)(path + n - b);
    static const char *const sfx[] = {".gguf", ".strata"};
    for (size_t k = 0; k < 2; k++) {
        size_t sl = strlen(sfx[k]);
        if (bl > sl && !strncmp(b + bl - sl, sfx[k], sl)) {
            bl -= sl;
            break;
        }
    }
    char *id = malloc(bl + 1);
    if (id) {
        memcpy(id, b, bl);
        id[bl] = '\0';
    }
    return id;
}

static char *find_engine(void)
{
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash) {
            size_t dl = (size_t)(slash - self) + 1;
            char *p = malloc(dl + sizeof("strata-generate"));
            if (p) {
                memcpy(p, self, dl);
                strcpy(p + dl, "strata-generate");
                if (access(p, X_OK) == 0)
                    return p;
                free(p);
            }
        }
    }
    return strdup("strata-generate");
}

static int read_file(const char *path, char **out, size_t *len, struct strata_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return strata_err_set(err, STRATA_E_IO, "cannot open '%s': %s", path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 65536;
            char *nb = realloc(buf, cap);
            if (!nb) {
                rc = strata_err_set(err, STRATA_E_NOMEM, "reading '%s'", path);
                goto out;
            }
            buf = nb;
        }
        size_t k = fread(buf + n, 1, cap - n - 1, f);
        n += k;
        if (k == 0)
            break;
    }
    if (ferror(f)) {
        rc = strata_err_set(err, STRATA_E_IO, "reading '%s': %s", path, strerror(errno));
        goto out;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    buf = NULL;
out:
    free(buf);
    fclose(f);
    return rc;
}

int strata_server_run(const struct strata_server_opts *o, volatile sig_atomic_t *stop,
                      struct strata_err *err)
{
    struct srv s = {0};
    struct MHD_Daemon *d = NULL;
    struct addrinfo *ai = NULL;
    int rc = 0, engines_started = 0;
    s.o = o;
    s.t_start = srv_now();
    pthread_mutex_init(&s.stat_mu, NULL);

    if (o->n_models < 1) {
        rc = strata_err_set(err, STRATA_E_INVALID, "no model given (--model)");
        goto out;
    }
    if (o->parallel < 1 || o->parallel > 64) {
        rc = strata_err_set(err, STRATA_E_INVALID, "--parallel must be 1..64, not %d",
                            o->parallel);
        goto out;
    }
    if (o->port < 0 || o->port > 65535) {
        rc = strata_err_set(err, STRATA_E_INVALID, "--port must be 0..65535, not %d", o->port);
        goto out;
    }
    if (o->watchdog_s <= 0 || o->load_timeout_s <= 0) {
        rc = strata_err_set(err, STRATA_E_INVALID, "watchdog and load timeout must be > 0");
        goto out;
    }
    const char *host = o->host ? o->host : "127.0.0.1";
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE};
    char port_s[16];
    snprintf(port_s, sizeof(port_s), "%d", o->port);
    int gai = getaddrinfo(host, port_s, &hints, &ai);
    if (gai) {
        rc = strata_err_set(err, STRATA_E_INVALID, "--host '%s': %s", host, gai_strerror(gai));
        goto out;
    }
    s.allow_remote = o->api_key != NULL || !is_loopback_host(ai->ai_addr);
    if (!o->api_key && s.allow_remote)
        strata_log_warn("listening on %s without --api-key: anyone who can reach it may use it",
                        host);
    if (o->chat_template &&
        (rc = read_file(o->chat_template, &s.chat_template, &s.chat_template_len, err)))
        goto out;
    s.engine_path = o->engine ? strdup(o->engine) : find_engine();
    s.models = calloc((size_t)o->n_models, sizeof(*s.models));
    if (!s.engine_path || !s.models) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "server state");
        goto out;
    }
    s.n_models = o->n_models;
    for (int i = 0; i < o->n_models; i++) {
        struct srv_model *m = &s.models[i];
        m->srv = &s;
        pthread_mutex_init(&m->mu, NULL);
        pthread_cond_init(&m->cv, NULL);
        m->path = strdup(o->models[i]);
        m->id = model_id_of(o->models[i]);
        m->engines = calloc((size_t)o->parallel, sizeof(*m->engines));
        if (!m->path || !m->id || !m->engines) {
            rc = strata_err_set(err, STRATA_E_NOMEM, "server state");
            goto out;
        }
        m->n_engines = o->parallel;
        for (int k = 0; k < o->parallel; k++) {
            m->engines[k].model = m;
            m->engines[k].slot = k;
            m->engines[k].wake[0] = m->engines[k].wake[1] = -1;
        }
        for (int k = 0; k < i; k++)
            if (!strcmp(s.models[k].id, m->id)) {
                rc = strata_err_set(err, STRATA_E_INVALID,
                                    "two models have the id '%s' (--model %s)", m->id, m->path);
                goto out;
            }
        strata_log_info("model '%s': starting %d engine(s) for %s", m->id, o->parallel,
                        m->path);
    }
    engines_started = 1;
    if ((rc = srv_engines_start(&s, err)) || (rc = srv_vision_start(&s, err)))
        goto out;
    if ((rc = srv_engines_wait_ready(&s, stop, err)))
        goto out;

    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    d = MHD_start_daemon(flags, 0, on_accept, &s, on_request, &s,
                         /* the logger first: libmicrohttpd logs option errors itself
                          * until it has one */
                         MHD_OPTION_EXTERNAL_LOGGER, mhd_log, &s,
                         MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                         MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_connections,
                         MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)o->conn_timeout_s,
                         MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(256 * 1024),
                         MHD_OPTION_NOTIFY_COMPLETED, on_completed, &s,
                         MHD_OPTION_END);
    if (!d) {
        rc = strata_err_set(err, STRATA_E_IO, "cannot listen on %s port %d: %s", host, o->port,
                            strerror(errno));
        goto out;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int port = di ? (int)di->port : o->port;
    strata_log_info("listening on http://%s%s%s:%d (OpenAI API at /v1)",
                    ai->ai_family == AF_INET6 ? "[" : "", host,
                    ai->ai_family == AF_INET6 ? "]" : "", port);
    while (!stop || !*stop)
        usleep(100000);
    strata_log_info("shutting down");
out:
    if (d)
        MHD_stop_daemon(d);
    if (engines_started) {
        srv_engines_stop(&s);
        srv_vision_stop(&s);
    }
    for (int i = 0; i < s.n_models; i++) {
        struct srv_model *m = &s.models[i];
        for (int k = 0; m->engines && k < m->n_engines; k++)
            for (int w = 0; w < 2; w++)
                if (m->engines[k].wake[w] >= 0)
                    close(m->engines[k].wake[w]);
        strata_chat_free(m->chat);
        free(m->engines);
        free(m->path);
        free(m->id);
        pthread_mutex_destroy(&m->mu);
        pthread_cond_destroy(&m->cv);
    }
    free(s.models);
    free(s.engine_path);
    free(s.chat_template);
    if (ai)
        freeaddrinfo(ai);
    pthread_mutex_destroy(&s.stat_mu);
    return rc;
}
