/* embed_serve.c - loopback HTTP helper for image embeddings (libmicrohttpd). */
#include "embed_serve.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"

struct server {
    struct strata_vision *v;
    struct strata_pool *pool;
    const struct strata_embed_serve_opts *o;
    size_t max_body;
    pthread_mutex_t encode_lock;
    volatile int ready;
};

struct request {
    unsigned char *body;
    size_t n, cap;
    int too_large;
};

static enum MHD_Result send_buf(struct MHD_Connection *c, unsigned status, const char *type,
                                void *buf, size_t n)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(n, buf, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(buf);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, cJSON *j)
{
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s)
        return MHD_NO;
    return send_buf(c, status, "application/json", s, strlen(s));
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *msg)
{
    cJSON *j = cJSON_CreateObject();
    cJSON *e = cJSON_AddObjectToObject(j, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", status == 413 ? "request_too_large"
                                       : status >= 500 ? "server_error"
                                                       : "invalid_request_error");
    return send_json(c, status, j);
}

static int64_t query_int(struct MHD_Connection *c, const char *key, int64_t def)
{
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, key);
    if (!v || !*v)
        return def;
    char *end;
    long long x = strtoll(v, &end, 10);
    return *end || x < 0 ? -1 : x;
}

static enum MHD_Result do_embed(struct server *s, struct MHD_Connection *c, struct request *rq)
{
    int64_t minp = query_int(c, "min_pixels", s->o->min_pixels);
    int64_t maxp = query_int(c, "max_pixels", s->o->max_pixels);
    if (minp < 0 || maxp < 0 || maxp < minp)
        return send_error(c, 400, "invalid min_pixels/max_pixels");
    if (rq->n == 0)
        return send_error(c, 400, "empty body: POST the image file's bytes to /embed");
    struct strata_err err = {0};
    struct strata_image img;
    float *rows = NULL;
    int n_tok = 0, gh = 0, gw = 0;
    int rc = strata_image_load_mem(&img, rq->body, rq->n, "request body", &err);
    if (rc == 0) {
        pthread_mutex_lock(&s->encode_lock);
        rc = strata_vision_encode_image(s->v, s->pool, &img, minp, maxp, &rows, &n_tok, &gh, &gw,
                                        &err);
        pthread_mutex_unlock(&s->encode_lock);
        strata_image_free(&img);
    }
    if (rc) {
        strata_log_warn("embed: %s", err.msg);
        return send_error(c, rc == STRATA_E_NOMEM ? 500 : 400, err.msg);
    }
    const struct strata_vision_hparams *hp = strata_vision_hparams(s->v);
    size_t payload = STRATA_EMBD_HEADER_SIZE + sizeof(float) * (size_t)n_tok * hp->n_out;
    char *buf = NULL;
    size_t blen = 0;
    FILE *f = open_memstream(&buf, &blen);
    struct strata_embd_header h = {1, (uint32_t)n_tok, (uint32_t)hp->n_out, 1, (uint32_t)gh,
                                   (uint32_t)gw, 0};
    rc = f ? strata_embd_write(f, &h, rows, &err) : STRATA_E_NOMEM;
    if (f)
        fclose(f);
    free(rows);
    if (rc || blen != payload) {
        free(buf);
        return send_error(c, 500, "cannot build the payload");
    }
    strata_log_info("embed: %d tokens (grid %dx%d)", n_tok, gh, gw);
    return send_buf(c, 200, "application/octet-stream", buf, blen);
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *data,
                               size_t *data_size, void **con_cls)
{
    (void)version;
    struct server *s = cls;
    if (strcmp(method, "GET") == 0 && strcmp(url, "/health") == 0) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "status", s->ready ? "ok" : "loading");
        cJSON_AddBoolToObject(j, "loaded", s->ready);
        cJSON_AddBoolToObject(j, "images", s->ready);
        cJSON_AddStringToObject(j, "backend", strata_vision_backend(s->v));
        return send_json(c, s->ready ? 200 : 503, j);
    }
    if (strcmp(url, "/embed") != 0)
        return send_error(c, 404, "unknown endpoint (use GET /health or POST /embed)");
    if (strcmp(method, "POST") != 0)
        return send_error(c, 405, "use POST /embed with the image as the body");

    struct request *rq = *con_cls;
    if (!rq) {
        rq = calloc(1, sizeof(*rq));
        if (!rq)
            return MHD_NO;
        *con_cls = rq;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->max_body)
            rq->too_large = 1;
        return MHD_YES;
    }
    if (*data_size) {
        if (!rq->too_large && rq->n + *data_size <= s->max_body) {
            if (rq->n + *data_size > rq->cap) {
                size_t cap = (rq->n + *data_size) * 2;
                if (cap > s->max_body)
                    cap = s->max_body;
                unsigned char *nb = realloc(rq->body, cap);
                if (!nb)
                    return MHD_NO;
                rq->body = nb;
                rq->cap = cap;
            }
            memcpy(rq->body + rq->n, data, *data_size);
            rq->n += *data_size;
        } else {
            rq->too_large = 1;
        }
        *data_size = 0;
        return MHD_YES;
    }
    if (rq->too_large) {
        char msg[128];
        snprintf(msg, sizeof(msg), "body larger than %zu bytes", s->max_body);
        return send_error(c, 413, msg);
    }
    if (!s->ready)
        return send_error(c, 503, "the vision encoder is still loading");
    return do_embed(s, c, rq);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)c;
    (void)toe;
    struct request *rq = *con_cls;
    if (rq) {
        free(rq->body);
        free(rq);
        *con_cls = NULL;
    }
}

int strata_embed_serve(struct strata_vision *v, struct strata_pool *pool,
                       const struct strata_embed_serve_opts *o, volatile int *stop,
                       struct strata_err *err)
{
    struct server s = {.v = v, .pool = pool, .o = o};
    s.max_body = o->max_body ? o->max_body : (size_t)64 << 20;
    pthread_mutex_init(&s.encode_lock, NULL);
    struct sockaddr_in addr = {0};
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)o->port);
    const char *host = o->host ? o->host : "127.0.0.1";
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
        pthread_mutex_destroy(&s.encode_lock);
        return strata_err_set(err, STRATA_E_INVALID, "invalid --host '%s' (an IPv4 address)",
                              host);
    }
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, (uint16_t)o->port, NULL, NULL,
        handler, &s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_THREAD_POOL_SIZE,
        (unsigned)4, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)60,
        MHD_OPTION_NOTIFY_COMPLETED, completed, NULL, MHD_OPTION_END);
    if (!d) {
        pthread_mutex_destroy(&s.encode_lock);
        return strata_err_set(err, STRATA_E_IO, "cannot listen on %s:%d", host, o->port);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int port = info ? info->port : o->port;
    if (o->warmup) {
        struct strata_image blank = {0};
        blank.w = blank.h = 56;
        blank.rgb = calloc(56 * 56 * 3, 1);
        float *rows = NULL;
        int n = 0;
        struct strata_err e = {0};
        if (blank.rgb &&
            strata_vision_encode_image(v, pool, &blank, 3136, 3136, &rows, &n, NULL, NULL, &e))
            strata_log_warn("warm-up failed: %s", e.msg);
        free(rows);
        strata_image_free(&blank);
    }
    s.ready = 1;
    strata_log_info("listening on http://%s:%d (encoder on the %s)", host, port,
                    strata_vision_backend(v));
    if (o->on_listen)
        o->on_listen(port, o->ud);
    while (!*stop)
        usleep(100 * 1000);
    MHD_stop_daemon(d);
    pthread_mutex_destroy(&s.encode_lock);
    return 0;
}
