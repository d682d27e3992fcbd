/* server_int.h - what the parts of strata-serve share: the job a request
 * becomes, the per-model queue, the supervised engine processes.
 *
 *   server.c         HTTP (libmicrohttpd), routing, auth, /health, /metrics
 *   server_openai.c  OpenAI request validation, prompts, responses, SSE
 *   server_engine.c  engine processes: spawn, protocol, queue, watchdog, restart
 *
 * Locking: srv_model.mu guards the queue and every engine's state/cur;
 * srv_job.mu guards a job's results.  A thread holding a job's mutex never
 * takes a model's mutex.
 */
#ifndef STRATA_SERVER_INT_H
#define STRATA_SERVER_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <cjson/cJSON.h>

#include "err.h"
#include "server.h"

struct strata_chat;
struct srv_vision;
struct srv_reply;

enum srv_job_state { SRV_JOB_QUEUED, SRV_JOB_RUNNING, SRV_JOB_DONE, SRV_JOB_FAILED };

/* Why a job was cancelled. */
enum srv_cancel { SRV_CANCEL_NONE = 0, SRV_CANCEL_CLIENT, SRV_CANCEL_STOP };

/* One token event of a generation. */
struct srv_tok {
    int32_t id;
    char *piece;    /* the token's own text (for logprobs) */
    char *text;     /* text released with it (see generate.h: may be empty or more) */
    double logprob;
    cJSON *top;     /* [{"tok","piece","logprob"}] or NULL; owned */
};

struct srv_job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    char id[48];
    char *line;                 /* the request line sent to the engine ('\n'-terminated) */
    size_t line_len;
    int is_generate;
    struct srv_model *model;

    /* under mu */
    int state;                  /* enum srv_job_state */
    int cancel;                 /* enum srv_cancel */
    int wake_fd;                /* write end of the running engine's wake pipe, or -1 */
    struct srv_tok *toks;
    size_t n_toks, cap_toks;
    cJSON *done;                /* the done event (owned) */
    int err_status;             /* HTTP status for a failure */
    char err_type[40];          /* OpenAI error type */
    char err_msg[2048];
    double t_enqueue, t_start, t_end;

    struct srv_job *next;       /* queue link, under model mu */
};

enum srv_engine_state {
    SRV_ENGINE_STARTING = 0,
    SRV_ENGINE_READY,
    SRV_ENGINE_RESTARTING,
    SRV_ENGINE_FAILED,          /* exited before its first ready: not restarted */
    SRV_ENGINE_STOPPED,
};

#define SRV_LOG_KEEP 8

struct srv_engine {
    struct srv_model *model;
    int slot;
    pthread_t thread;
    int thread_started;
    pid_t pid;
    int wake[2];
    /* under model mu */
    int state;
    int ever_ready;
    int restarts;
    struct srv_job *cur;
    char *log_ring[SRV_LOG_KEEP];   /* last stderr/log lines */
    int log_next;
    char fail_msg[4096];
    int fail_exit;                  /* exit status of a failed first start, or -1 */
};

struct srv_model {
    struct srv *srv;
    char *id;
    char *path;
    pthread_mutex_t mu;
    pthread_cond_t cv;              /* engine state changes */
    struct srv_engine *engines;
    int n_engines;
    struct srv_job *q_head, *q_tail;
    int q_len;
    /* set once from the first ready event (under mu) */
    int have_info;
    int n_ctx;
    int n_vocab;
    struct strata_chat *chat;       /* NULL when the model has no usable template */
    char chat_error[512];
    int chat_format;
    struct srv_vision *vision;      /* the vision helper (server_vision.c), NULL: no mmproj */
};

struct srv {
    const struct strata_server_opts *o;
    struct srv_model *models;
    int n_models;
    volatile int stopping;
    int allow_remote;
    char *engine_path;
    char *chat_template;            /* --chat-template file contents, or NULL */
    size_t chat_template_len;
    unsigned long job_seq;
    double t_start;

    pthread_mutex_t stat_mu;
    unsigned long n_requests, n_errors, n_gen_tokens, n_prompt_tokens, n_cached_tokens;
    unsigned long n_restarts, n_cancelled;
    double gen_seconds, last_tps;
    /* speculative decoding (the done events' "spec" members): verify windows, tokens
     * they produced, drafted and accepted tokens, milliseconds of drafting + verifying */
    unsigned long spec_steps, spec_tokens, spec_drafted, spec_accepted;
    double spec_ms;
};

double srv_now(void);

/* server_engine.c */
int srv_engines_start(struct srv *s, struct strata_err *err);
/* Wait until every model has a ready engine, or one failed for good. */
int srv_engines_wait_ready(struct srv *s, volatile sig_atomic_t *stop, struct strata_err *err);
void srv_engines_stop(struct srv *s);
/* Model state word for /health: "ready", "loading", "restarting", "failed". */
const char *srv_model_state(struct srv_model *m, int *n_ready, int *restarts);

/* Jobs. line is the request object (its "id" is set here); takes no ownership. */
struct srv_job *srv_job_new(struct srv_model *m, cJSON *req, int is_generate);
void srv_job_unref(struct srv_job *j);
/* Queue j on its model (the queue holds a reference).  Errors: 503 text in
 * err when no engine of the model can take work. */
int srv_job_submit(struct srv_job *j, struct strata_err *err);
/* Ask for cancellation: dequeued when still queued, else the engine is told. */
void srv_job_cancel(struct srv_job *j, int why);
/* Queue length across models. */
int srv_queue_len(struct srv *s);

/* server_openai.c; each returns an HTTP status and sets *body (JSON) or, for a
 * stream, *stream_ctx for server.c's content reader. */
struct srv_http {
    void *conn;                 /* struct MHD_Connection * */
};
/* 1 when the client of h closed its connection. */
int srv_http_client_gone(const struct srv_http *h);

struct srv_reply {
    int status;
    char *body;                 /* malloc'ed JSON text, or NULL when streaming */
    size_t body_len;
    struct srv_stream *stream;  /* non-NULL: an SSE stream */
};

void srv_openai_chat(struct srv *s, const char *body, size_t len, struct srv_http *h,
                     struct srv_reply *r);
void srv_openai_completion(struct srv *s, const char *body, size_t len, struct srv_http *h,
                           struct srv_reply *r);
void srv_openai_tokenize(struct srv *s, const char *body, size_t len, struct srv_http *h,
                         int detokenize, struct srv_reply *r);
void srv_openai_models(struct srv *s, struct srv_reply *r);
/* An OpenAI error object. */
void srv_reply_error(struct srv_reply *r, int status, const char *type, const char *param,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* The SSE stream: fill up to max bytes into buf; returns bytes, 0 at the end,
 * -1 when the client went away or on error. */
ssize_t srv_stream_read(struct srv_stream *st, char *buf, size_t max);
void srv_stream_free(struct srv_stream *st);

/* server_vision.c: a `strata-embed --serve` helper per model with an mmproj
 * (strata_server_opts.mmprojs), supervised and restarted like an engine.
 * Image parts reach the engine as "images" + "image_marker" in the generate
 * request; each image part's place in the rendered prompt is marked by
 * SRV_IMAGE_MARKER. */
#define SRV_IMAGE_MARKER "<|strata-image|>"
/* Checks each model's projector (--mmproj or the pack's) opens as a GGUF
 * with clip.projector_type, then starts its supervisor.  Errors: those of
 * strata_gguf_open / a missing key, prefixed with the model id; NOMEM; IO. */
int srv_vision_start(struct srv *s, struct strata_err *err);
void srv_vision_stop(struct srv *s);
/* 1 once the model's helper answered its /health. */
int srv_vision_ready(struct srv_model *m);
/* parts: [{"param": "messages[i].content[k]", "url": "..."}] in prompt order.
 * Fetches/decodes each image, embeds it through the helper and adds
 * "images" and "image_marker" to gen.  On failure writes the error reply
 * (400 naming the part for a bad image; 500 when the helper failed) and
 * returns -1. */
int srv_vision_embed_parts(struct srv *s, struct srv_model *m, const cJSON *parts, cJSON *gen,
                           struct srv_reply *r);

#endif
