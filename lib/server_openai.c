/* server_openai.c - OpenAI API semantics for strata-serve: request
 * validation (400 naming the field), prompts through the model's chat
 * template, generate requests for the engine, responses, SSE chunks, stop
 * strings, logprobs, usage and tool calls.
 *
 * Reference: the OpenAI API reference for /v1/chat/completions and
 * /v1/completions (object shapes, SSE "data:" framing with "data: [DONE]").
 */
#include "server_int.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat.h"
#include "log.h"
#include "proto.h"

#define MAX_STOP 16
#define MAX_TOP_LOGPROBS 20

struct srv_stream {
    struct srv *s;
    struct srv_model *m;
    struct srv_job *job;
    struct srv_http http;

    /* request */
    int chat;
    int parse;             /* parse the output with the template's format */
    unsigned parse_flags;
    int fmt;
    char *stop[MAX_STOP];
    size_t n_stop, max_stop;
    int logprobs;
    int n_top;
    int stream;
    int include_usage;
    char id[64];
    long created;

    /* accumulated output */
    char *text;
    size_t len, cap;
    size_t consumed;       /* job tokens looked at */
    size_t n_counted;      /* tokens up to a stop string found here */
    int cut;
    int finished, failed;
    int status;
    char err_type[40];
    char err_msg[2048];
    char reason[16];
    int n_prompt, n_gen, n_cached;
    cJSON *lp_pending;     /* logprob entries not yet sent */
    size_t released;       /* plain text sent */
    size_t sent_content, sent_reasoning;

    /* SSE output */
    char *out;
    size_t olen, ocap, ooff;
    int sent_role, sent_done;
};

static void st_free(struct srv_stream *st)
{
    if (!st)
        return;
    for (size_t i = 0; i < st->n_stop; i++)
        free(st->stop[i]);
    if (st->job) {
        pthread_mutex_lock(&st->job->mu);
        int live = st->job->state == SRV_JOB_QUEUED || st->job->state == SRV_JOB_RUNNING;
        pthread_mutex_unlock(&st->job->mu);
        if (live)
            srv_job_cancel(st->job, SRV_CANCEL_CLIENT);
        srv_job_unref(st->job);
    }
    free(st->text);
    cJSON_Delete(st->lp_pending);
    free(st->out);
    free(st);
}

void srv_stream_free(struct srv_stream *st) { st_free(st); }

static int text_add(struct srv_stream *st, const char *s, size_t n)
{
    if (st->len + n + 1 > st->cap) {
        size_t cap = st->cap ? st->cap : 1024;
        while (cap < st->len + n + 1)
            cap *= 2;
        char *nb = realloc(st->text, cap);
        if (!nb)
            return -1;
        st->text = nb;
        st->cap = cap;
    }
    memcpy(st->text + st->len, s, n);
    st->len += n;
    st->text[st->len] = '\0';
    return 0;
}

static void out_add(struct srv_stream *st, const char *s, size_t n)
{
    if (st->olen + n > st->ocap) {
        size_t cap = st->ocap ? st->ocap : 4096;
        while (cap < st->olen + n)
            cap *= 2;
        char *nb = realloc(st->out, cap);
        if (!nb)
            return;
        st->out = nb;
        st->ocap = cap;
    }
    memcpy(st->out + st->olen, s, n);
    st->olen += n;
}

static void sse_send(struct srv_stream *st, cJSON *obj)
{
    char *j = cJSON_PrintUnformatted(obj);
    if (j) {
        out_add(st, "data: ", 6);
        out_add(st, j, strlen(j));
        out_add(st, "\n\n", 2);
        free(j);
    }
    cJSON_Delete(obj);
}

static cJSON *bytes_array(const char *s)
{
    cJSON *a = cJSON_CreateArray();
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(*p));
    return a;
}

/* A logprob entry for one token, in the chat ("content") shape; the
 * completion shape is derived from it when the response is built. */
static cJSON *lp_entry(const struct srv_tok *t, int n_top)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "token", t->piece ? t->piece : "");
    cJSON_AddNumberToObject(e, "logprob", t->logprob);
    cJSON_AddItemToObject(e, "bytes", bytes_array(t->piece ? t->piece : ""));
    cJSON *top = cJSON_AddArrayToObject(e, "top_logprobs");
    int k = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, t->top)
    {
        if (k++ >= n_top)
            break;
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(c, "piece");
        const cJSON *lp = cJSON_GetObjectItemCaseSensitive(c, "logprob");
        cJSON *o = cJSON_CreateObject();
        const char *ps = cJSON_IsString(p) ? p->valuestring : "";
        cJSON_AddStringToObject(o, "token", ps);
        cJSON_AddNumberToObject(o, "logprob", cJSON_IsNumber(lp) ? lp->valuedouble : 0);
        cJSON_AddItemToObject(o, "bytes", bytes_array(ps));
        cJSON_AddItemToArray(top, o);
    }
    return e;
}

/* Take what the engine produced since the last call (waiting up to wait_ms
 * for something new).  Applies stop strings and records the end. */
static void pull(struct srv_stream *st, int wait_ms)
{
    struct srv_job *j = st->job;
    pthread_mutex_lock(&j->mu);
    if (wait_ms > 0 && j->n_toks == st->consumed && j->state != SRV_JOB_DONE &&
        j->state != SRV_JOB_FAILED) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)wait_ms * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
    }
    int found = 0;
    while (st->consumed < j->n_toks) {
        const struct srv_tok *t = &j->toks[st->consumed++];
        if (st->cut)
            continue;
        st->n_counted++;
        size_t old = st->len;
        text_add(st, t->text, strlen(t->text));
        if (st->logprobs)
            cJSON_AddItemToArray(st->lp_pending, lp_entry(t, st->n_top));
        if (st->n_stop) {
            size_t from = old + 1 > st->max_stop ? old + 1 - st->max_stop : 0;
            size_t pos = strata_proto_stop_find(st->text + from, st->len - from,
                                                (const char *const *)st->stop, st->n_stop,
                                                NULL);
            if (from + pos < st->len) {
                st->len = from + pos;
                st->text[st->len] = '\0';
                st->cut = 1;
                found = 1;
            }
        }
    }
    int state = j->state;
    if (state == SRV_JOB_DONE && !st->finished) {
        const cJSON *d = j->done;
        const cJSON *tail = cJSON_GetObjectItemCaseSensitive(d, "tail");
        if (!st->cut && cJSON_IsString(tail) && tail->valuestring[0]) {
            size_t old = st->len;
            text_add(st, tail->valuestring, strlen(tail->valuestring));
            size_t pos = strata_proto_stop_find(st->text + old, st->len - old,
                                                (const char *const *)st->stop, st->n_stop,
                                                NULL);
            if (old + pos < st->len) {
                st->len = old + pos;
                st->text[st->len] = '\0';
                st->cut = 1;
            }
        }
        const cJSON *v;
        v = cJSON_GetObjectItemCaseSensitive(d, "n_prompt");
        st->n_prompt = cJSON_IsNumber(v) ? v->valueint : 0;
        v = cJSON_GetObjectItemCaseSensitive(d, "n_gen");
        st->n_gen = cJSON_IsNumber(v) ? v->valueint : (int)st->n_counted;
        v = cJSON_GetObjectItemCaseSensitive(d, "n_cached");
        st->n_cached = cJSON_IsNumber(v) ? v->valueint : 0;
        if (st->cut)
            st->n_gen = (int)st->n_counted;
        v = cJSON_GetObjectItemCaseSensitive(d, "reason");
        const char *r = cJSON_IsString(v) ? v->valuestring : "stop";
        snprintf(st->reason, sizeof(st->reason), "%s",
                 st->cut                                            ? "stop"
                 : !strcmp(r, "length") || !strcmp(r, "context")    ? "length"
                                                                    : "stop");
        st->finished = 1;
    } else if (state == SRV_JOB_FAILED && !st->finished) {
        if (st->cut) {
            snprintf(st->reason, sizeof(st->reason), "stop");
            st->n_gen = (int)st->n_counted;
            st->finished = 1;
        } else {
            st->failed = st->finished = 1;
            st->status = j->err_status ? j->err_status : 500;
            snprintf(st->err_type, sizeof(st->err_type), "%s",
                     j->err_type[0] ? j->err_type : "server_error");
            snprintf(st->err_msg, sizeof(st->err_msg), "%s", j->err_msg);
        }
    }
    pthread_mutex_unlock(&j->mu);
    if (found)
        srv_job_cancel(j, SRV_CANCEL_STOP);
}

/* Wait until the job finished (or, with first_only, produced something),
 * cancelling it when the client goes away.  Returns 0, or -1 when the
 * client left. */
static int wait_job(struct srv_stream *st, int first_only)
{
    for (;;) {
        pull(st, 100);
        if (st->finished)
            return 0;
        if (first_only && st->consumed > 0)
            return 0;
        if (srv_http_client_gone(&st->http)) {
            srv_job_cancel(st->job, SRV_CANCEL_CLIENT);
            return -1;
        }
    }
}

/* ---- request fields ---- */

struct field_err {
    const char *param;
    char msg[512];
};

static int bad(struct field_err *fe, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(struct field_err *fe, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fe->msg, sizeof(fe->msg), fmt, ap);
    va_end(ap);
    fe->param = param;
    return -1;
}

/* Optional number in [lo, hi]; absent or null leaves *out. */
static int get_num(const cJSON *req, const char *key, double lo, double hi, double *out,
                   int *present, struct field_err *fe)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(req, key);
    if (present)
        *present = 0;
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return bad(fe, key, "'%s' must be a number", key);
    if (v->valuedouble < lo || v->valuedouble > hi)
        return bad(fe, key, "'%s' must be between %g and %g, not %g", key, lo, hi,
                   v->valuedouble);
    *out = v->valuedouble;
    if (present)
        *present = 1;
    return 0;
}

static int get_int(const cJSON *req, const char *key, double lo, double hi, long long *out,
                   int *present, struct field_err *fe)
{
    double d = 0;
    int p = 0;
    if (get_num(req, key, lo, hi, &d, &p, fe))
        return -1;
    if (p && d != floor(d))
        return bad(fe, key, "'%s' must be an integer", key);
    if (p)
        *out = (long long)d;
    if (present)
        *present = p;
    return 0;
}

static int get_bool(const cJSON *req, const char *key, int *out, struct field_err *fe)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(req, key);
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsBool(v))
        return bad(fe, key, "'%s' must be true or false", key);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* Fields both endpoints share; fills the engine's generate request gen. */
static int parse_common(const cJSON *req, struct srv_stream *st, cJSON *gen,
                        struct field_err *fe)
{
    long long ll = 0;
    double d = 0;
    int p = 0;
    if (get_int(req, "n", 1, 1e9, &ll, &p, fe))
        return -1;
    if (p && ll != 1)
        return bad(fe, "n", "'n' must be 1: one choice per request is supported");
    if (get_int(req, "best_of", 1, 1e9, &ll, &p, fe))
        return -1;
    if (p && ll != 1)
        return bad(fe, "best_of", "'best_of' must be 1");

    long long max_tokens = -1;
    if (get_int(req, "max_tokens", 0, 1e9, &max_tokens, &p, fe))
        return -1;
    if (st->chat && get_int(req, "max_completion_tokens", 0, 1e9, &max_tokens, &p, fe))
        return -1;
    cJSON_AddNumberToObject(gen, "max_tokens", (double)max_tokens);

    static const struct {
        const char *key, *eng;
        double lo, hi;
    } nums[] = {
        {"temperature", "temperature", 0, 100},
        {"top_p", "top_p", 0, 1},
        {"min_p", "min_p", 0, 1},
        {"presence_penalty", "presence_penalty", -2, 2},
        {"frequency_penalty", "frequency_penalty", -2, 2},
        {"repeat_penalty", "repeat_penalty", 0, 10},
    };
    for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
        if (get_num(req, nums[i].key, nums[i].lo, nums[i].hi, &d, &p, fe))
            return -1;
        if (p)
            cJSON_AddNumberToObject(gen, nums[i].eng, d);
    }
    if (cJSON_GetObjectItemCaseSensitive(gen, "top_p") &&
        cJSON_GetObjectItemCaseSensitive(gen, "top_p")->valuedouble <= 0)
        return bad(fe, "top_p", "'top_p' must be greater than 0");
    if (get_int(req, "top_k", -1, 1e9, &ll, &p, fe))
        return -1;
    if (p)
        cJSON_AddNumberToObject(gen, "top_k", (double)ll);
    if (get_int(req, "seed", -9.2e18, 9.2e18, &ll, &p, fe))
        return -1;
    if (!p) {
        static unsigned long ctr;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ll = (long long)(((unsigned long)ts.tv_nsec ^ (unsigned long)ts.tv_sec * 2654435761u) +
                         __atomic_add_fetch(&ctr, 1, __ATOMIC_RELAXED)) & 0x7fffffffffffLL;
    }
    cJSON_AddNumberToObject(gen, "seed", (double)ll);

    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(req, "stop");
    if (stop && !cJSON_IsNull(stop)) {
        if (cJSON_IsString(stop)) {
            if (stop->valuestring[0])
                st->stop[st->n_stop++] = strdup(stop->valuestring);
        } else if (cJSON_IsArray(stop)) {
            const cJSON *s;
            cJSON_ArrayForEach(s, stop)
            {
                if (!cJSON_IsString(s))
                    return bad(fe, "stop", "'stop' must be a string or a list of strings");
                if (st->n_stop == MAX_STOP)
                    return bad(fe, "stop", "'stop' has more than %d strings", MAX_STOP);
                if (s->valuestring[0])
                    st->stop[st->n_stop++] = strdup(s->valuestring);
            }
        } else {
            return bad(fe, "stop", "'stop' must be a string or a list of strings");
        }
        cJSON *arr = cJSON_AddArrayToObject(gen, "stop");
        for (size_t i = 0; i < st->n_stop; i++) {
            if (!st->stop[i])
                return bad(fe, "stop", "out of memory");
            size_t l = strlen(st->stop[i]);
            if (l > st->max_stop)
                st->max_stop = l;
            cJSON_AddItemToArray(arr, cJSON_CreateString(st->stop[i]));
        }
    }

    int ignore_eos = 0;
    if (get_bool(req, "ignore_eos", &ignore_eos, fe))
        return -1;
    if (ignore_eos)
        cJSON_AddBoolToObject(gen, "ignore_eos", 1);
    if (get_bool(req, "stream", &st->stream, fe))
        return -1;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(req, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so))
            return bad(fe, "stream_options", "'stream_options' must be an object");
        const cJSON *iu = cJSON_GetObjectItemCaseSensitive(so, "include_usage");
        if (iu && !cJSON_IsBool(iu))
            return bad(fe, "stream_options.include_usage",
                       "'stream_options.include_usage' must be true or false");
        st->include_usage = cJSON_IsTrue(iu);
    }
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(req, "response_format");
    if (rf && !cJSON_IsNull(rf)) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(rf, "type");
        if (!cJSON_IsString(t) || strcmp(t->valuestring, "text"))
            return bad(fe, "response_format",
                       "'response_format' of type other than \"text\" is not supported");
    }
    return 0;
}

/* ---- responses ---- */

static const char *finish_reason(struct srv_stream *st, int tool_calls)
{
    return tool_calls ? "tool_calls" : st->reason[0] ? st->reason : "stop";
}

static cJSON *usage_obj(struct srv_stream *st)
{
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", st->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", st->n_gen);
    cJSON_AddNumberToObject(u, "total_tokens", st->n_prompt + st->n_gen);
    cJSON *pd = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(pd, "cached_tokens", st->n_cached);
    return u;
}

/* Completion-style logprobs from chat-style entries. */
static cJSON *completion_logprobs(cJSON *entries, size_t text_offset0)
{
    cJSON *lp = cJSON_CreateObject();
    cJSON *toks = cJSON_AddArrayToObject(lp, "tokens");
    cJSON *tlp = cJSON_AddArrayToObject(lp, "token_logprobs");
    cJSON *top = cJSON_AddArrayToObject(lp, "top_logprobs");
    cJSON *off = cJSON_AddArrayToObject(lp, "text_offset");
    size_t o = text_offset0;
    const cJSON *e;
    cJSON_ArrayForEach(e, entries)
    {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "token");
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(e, "logprob");
        cJSON_AddItemToArray(toks, cJSON_CreateString(t->valuestring));
        cJSON_AddItemToArray(tlp, cJSON_CreateNumber(l->valuedouble));
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)o));
        o += strlen(t->valuestring);
        cJSON *m = cJSON_CreateObject();
        const cJSON *c;
        cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(e, "top_logprobs"))
        {
            const cJSON *ct = cJSON_GetObjectItemCaseSensitive(c, "token");
            const cJSON *cl = cJSON_GetObjectItemCaseSensitive(c, "logprob");
            if (!cJSON_GetObjectItemCaseSensitive(m, ct->valuestring))
                cJSON_AddNumberToObject(m, ct->valuestring, cl->valuedouble);
        }
        cJSON_AddItemToArray(top, m);
    }
    return lp;
}

static cJSON *chunk_base(struct srv_stream *st)
{
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "id", st->id);
    cJSON_AddStringToObject(c, "object", st->chat ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(c, "created", (double)st->created);
    cJSON_AddStringToObject(c, "model", st->m->id);
    cJSON_AddStringToObject(c, "system_fingerprint", "strata");
    return c;
}

/* One SSE chunk: a delta (chat) or text (completion), with the pending
 * logprobs; finish may be NULL. */
static void send_chunk(struct srv_stream *st, cJSON *delta, const char *text,
                       const char *finish)
{
    cJSON *c = chunk_base(st);
    cJSON *choices = cJSON_AddArrayToObject(c, "choices");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", 0);
    if (st->chat)
        cJSON_AddItemToObject(ch, "delta", delta ? delta : cJSON_CreateObject());
    else
        cJSON_AddStringToObject(ch, "text", text ? text : "");
    if (st->logprobs && cJSON_GetArraySize(st->lp_pending) > 0) {
        if (st->chat) {
            cJSON *lp = cJSON_AddObjectToObject(ch, "logprobs");
            cJSON_AddItemToObject(lp, "content", st->lp_pending);
        } else {
            cJSON_AddItemToObject(ch, "logprobs", completion_logprobs(st->lp_pending,
                                                                      st->released));
            cJSON_Delete(st->lp_pending);
        }
        st->lp_pending = cJSON_CreateArray();
    } else {
        cJSON_AddNullToObject(ch, "logprobs");
    }
    if (finish)
        cJSON_AddStringToObject(ch, "finish_reason", finish);
    else
        cJSON_AddNullToObject(ch, "finish_reason");
    cJSON_AddItemToArray(choices, ch);
    if (st->include_usage)
        cJSON_AddNullToObject(c, "usage");
    sse_send(st, c);
}

static cJSON *delta_text(const char *key, const char *s, size_t n)
{
    cJSON *d = cJSON_CreateObject();
    char *t = strndup(s, n);
    cJSON_AddStringToObject(d, key, t ? t : "");
    free(t);
    return d;
}

/* Parse text[0..n) in the model's format; NULL when it does not parse. */
static cJSON *parse_msg(struct srv_stream *st, size_t n)
{
    cJSON *msg = NULL;
    struct strata_err err = {0};
    if (strata_chat_parse((enum strata_chat_format)st->fmt, st->text, n, st->parse_flags, &msg,
                          &err))
        return NULL;
    return msg;
}

static const char *str_of(const cJSON *o, const char *key, size_t *len)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsString(v)) {
        *len = 0;
        return "";
    }
    *len = strlen(v->valuestring);
    return v->valuestring;
}

/* Send the parsed message's new content/reasoning as deltas. */
static void send_parsed_diff(struct srv_stream *st, const cJSON *msg)
{
    size_t rl, cl;
    const char *r = str_of(msg, "reasoning_content", &rl);
    const char *c = str_of(msg, "content", &cl);
    if (rl > st->sent_reasoning) {
        send_chunk(st, delta_text("reasoning_content", r + st->sent_reasoning,
                                  rl - st->sent_reasoning), NULL, NULL);
        st->sent_reasoning = rl;
    }
    if (cl > st->sent_content) {
        send_chunk(st, delta_text("content", c + st->sent_content, cl - st->sent_content),
                   NULL, NULL);
        st->sent_content = cl;
    }
}

/* Turn new output into SSE chunks. */
static void produce(struct srv_stream *st)
{
    if (st->chat && !st->sent_role && !st->failed) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "role", "assistant");
        cJSON_AddStringToObject(d, "content", "");
        cJSON *pending = st->lp_pending;
        st->lp_pending = cJSON_CreateArray();
        send_chunk(st, d, NULL, NULL);
        cJSON_Delete(st->lp_pending);
        st->lp_pending = pending;
        st->sent_role = 1;
    }
    if (st->failed) {
        cJSON *root = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(root, "error");
        cJSON_AddStringToObject(e, "message", st->err_msg);
        cJSON_AddStringToObject(e, "type", st->err_type);
        cJSON_AddNullToObject(e, "param");
        cJSON_AddNullToObject(e, "code");
        sse_send(st, root);
        out_add(st, "data: [DONE]\n\n", 14);
        st->sent_done = 1;
        return;
    }
    size_t end = st->finished || st->cut
                     ? st->len
                     : st->len - strata_proto_stop_holdback(st->text, st->len,
                                                            (const char *const *)st->stop,
                                                            st->n_stop);
    if (!st->parse) {
        if (end > st->released) {
            if (st->chat)
                send_chunk(st, delta_text("content", st->text + st->released,
                                          end - st->released), NULL, NULL);
            else {
                char *t = strndup(st->text + st->released, end - st->released);
                send_chunk(st, NULL, t, NULL);
                free(t);
            }
            st->released = end;
        }
    } else if (!st->finished) {
        /* Markup begins with '<' in every known format: parse up to the last one,
         * send content and reasoning that only grew; a tool call still open
         * fails to parse and waits.  Tool calls go out when the text is final. */
        size_t upto = end;
        for (size_t i = end; i > 0; i--)
            if (st->text[i - 1] == '<') {
                upto = i - 1;
                break;
            }
        /* the final parse drops whitespace before a call: hold it back until
         * it is known whether markup follows, so the stream equals the whole */
        while (upto > st->released && (st->text[upto - 1] == ' ' || st->text[upto - 1] == '\n' ||
                                       st->text[upto - 1] == '\t' || st->text[upto - 1] == '\r'))
            upto--;
        if (upto > st->released) {
            cJSON *msg = parse_msg(st, upto);
            if (msg)
                send_parsed_diff(st, msg);
            cJSON_Delete(msg);
            st->released = upto;
        }
    }
    if (!st->finished)
        return;
    int n_calls = 0;
    if (st->parse) {
        cJSON *msg = parse_msg(st, st->len);
        if (!msg) {
            msg = cJSON_CreateObject();
            char *t = strndup(st->text, st->len);
            cJSON_AddStringToObject(msg, "content", t ? t : "");
            free(t);
        }
        send_parsed_diff(st, msg);
        const cJSON *tc;
        cJSON_ArrayForEach(tc, cJSON_GetObjectItemCaseSensitive(msg, "tool_calls"))
        {
            cJSON *d = cJSON_CreateObject();
            cJSON *arr = cJSON_AddArrayToObject(d, "tool_calls");
            cJSON *call = cJSON_Duplicate(tc, 1);
            cJSON_AddNumberToObject(call, "index", n_calls++);
            cJSON_AddItemToArray(arr, call);
            send_chunk(st, d, NULL, NULL);
        }
        cJSON_Delete(msg);
    }
    send_chunk(st, NULL, "", finish_reason(st, n_calls > 0));
    if (st->include_usage) {
        cJSON *c = chunk_base(st);
        cJSON_AddArrayToObject(c, "choices");
        cJSON_AddItemToObject(c, "usage", usage_obj(st));
        sse_send(st, c);
    }
    out_add(st, "data: [DONE]\n\n", 14);
    st->sent_done = 1;
}

ssize_t srv_stream_read(struct srv_stream *st, char *buf, size_t max)
{
    for (;;) {
        if (st->ooff < st->olen) {
            size_t n = st->olen - st->ooff;
            if (n > max)
                n = max;
            memcpy(buf, st->out + st->ooff, n);
            st->ooff += n;
            return (ssize_t)n;
        }
        st->olen = st->ooff = 0;
        if (st->sent_done)
            return 0;
        if (srv_http_client_gone(&st->http)) {
            srv_job_cancel(st->job, SRV_CANCEL_CLIENT);
            return -1;
        }
        pull(st, 100);
        produce(st);
    }
}

/* The whole (non-streamed) response. */
static void final_response(struct srv_stream *st, struct srv_reply *r)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", st->id);
    cJSON_AddStringToObject(root, "object", st->chat ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(root, "created", (double)st->created);
    cJSON_AddStringToObject(root, "model", st->m->id);
    cJSON_AddStringToObject(root, "system_fingerprint", "strata");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", 0);
    int n_calls = 0;
    char *text = strndup(st->text ? st->text : "", st->len);
    if (st->chat) {
        cJSON *msg = st->parse ? parse_msg(st, st->len) : NULL;
        if (!msg) {
            msg = cJSON_CreateObject();
            cJSON_AddStringToObject(msg, "role", "assistant");
            cJSON_AddStringToObject(msg, "content", text ? text : "");
        }
        n_calls = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(msg, "tool_calls"));
        cJSON_AddItemToObject(ch, "message", msg);
        if (st->logprobs) {
            cJSON *lp = cJSON_AddObjectToObject(ch, "logprobs");
            cJSON_AddItemToObject(lp, "content", st->lp_pending);
            st->lp_pending = cJSON_CreateArray();
        } else {
            cJSON_AddNullToObject(ch, "logprobs");
        }
    } else {
        cJSON_AddStringToObject(ch, "text", text ? text : "");
        if (st->logprobs)
            cJSON_AddItemToObject(ch, "logprobs", completion_logprobs(st->lp_pending, 0));
        else
            cJSON_AddNullToObject(ch, "logprobs");
    }
    free(text);
    cJSON_AddStringToObject(ch, "finish_reason", finish_reason(st, n_calls > 0));
    cJSON_AddItemToArray(choices, ch);
    cJSON_AddItemToObject(root, "usage", usage_obj(st));
    r->status = 200;
    r->body = cJSON_PrintUnformatted(root);
    r->body_len = r->body ? strlen(r->body) : 0;
    cJSON_Delete(root);
}

static struct srv_model *find_model(struct srv *s, const cJSON *req, struct srv_reply *r)
{
    const cJSON *mv = cJSON_GetObjectItemCaseSensitive(req, "model");
    if (!mv || cJSON_IsNull(mv) || (cJSON_IsString(mv) && !mv->valuestring[0])) {
        if (s->n_models == 1)
            return &s->models[0];
        srv_reply_error(r, 400, "invalid_request_error", "model",
                        "'model' is required when the server has several models");
        return NULL;
    }
    if (!cJSON_IsString(mv)) {
        srv_reply_error(r, 400, "invalid_request_error", "model", "'model' must be a string");
        return NULL;
    }
    for (int i = 0; i < s->n_models; i++)
        if (!strcmp(s->models[i].id, mv->valuestring))
            return &s->models[i];
    srv_reply_error(r, 404, "invalid_request_error", "model",
                    "the model '%.200s' does not exist (GET /v1/models lists them)",
                    mv->valuestring);
    return NULL;
}

static cJSON *parse_body(const char *body, size_t len, struct srv_reply *r)
{
    const char *end = NULL;
    cJSON *req = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!req) {
        size_t at = end && end >= body ? (size_t)(end - body) : 0;
        srv_reply_error(r, 400, "invalid_request_error", NULL,
                        "could not parse the JSON body (near byte %zu)", at);
        return NULL;
    }
    if (!cJSON_IsObject(req)) {
        srv_reply_error(r, 400, "invalid_request_error", NULL,
                        "the JSON body must be an object");
        cJSON_Delete(req);
        return NULL;
    }
    return req;
}

/* Submit gen for st's model and either wait for the whole result or start
 * the SSE stream. */
static void run_generation(struct srv_stream *st, cJSON *gen, struct srv_reply *r)
{
    struct strata_err err = {0};
    st->job = srv_job_new(st->m, gen, 1);
    if (!st->job) {
        srv_reply_error(r, 500, "server_error", NULL, "out of memory");
        goto fail;
    }
    if (srv_job_submit(st->job, &err)) {
        srv_reply_error(r, 503, "server_error", NULL, "%s", err.msg);
        goto fail;
    }
    if (wait_job(st, st->stream) < 0) {
        srv_reply_error(r, 499, "invalid_request_error", NULL, "client closed the request");
        goto fail;
    }
    if (st->failed) {
        srv_reply_error(r, st->status, st->err_type,
                        st->status == 400 ? (st->chat ? "messages" : "prompt") : NULL, "%s",
                        st->err_msg);
        goto fail;
    }
    if (st->stream) {
        r->status = 200;
        r->stream = st;
        return;
    }
    final_response(st, r);
fail:
    st_free(st);
}

static struct srv_stream *new_stream(struct srv *s, struct srv_model *m, struct srv_http *h,
                                     int chat)
{
    struct srv_stream *st = calloc(1, sizeof(*st));
    if (!st)
        return NULL;
    st->s = s;
    st->m = m;
    st->http = *h;
    st->chat = chat;
    st->created = (long)time(NULL);
    st->lp_pending = cJSON_CreateArray();
    static unsigned long seq;
    snprintf(st->id, sizeof(st->id), "%s-%lx%04lx", chat ? "chatcmpl" : "cmpl",
             (unsigned long)st->created, __atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED));
    return st;
}

/* The URL of an image part ({"type":"image_url","image_url":{"url":...}} or
 * "image_url":"..."; input_image alike), or NULL. */
static const char *image_part_url(const cJSON *part)
{
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(part, "image_url");
    if (cJSON_IsObject(u))
        u = cJSON_GetObjectItemCaseSensitive(u, "url");
    return cJSON_IsString(u) ? u->valuestring : NULL;
}

/* Messages with content-part arrays flattened to strings (the text parts
 * joined by newlines), validated.  images: NULL when the model takes no
 * images; else each image part is recorded there ({"param","url"}) and
 * written as SRV_IMAGE_MARKER in its place. */
static cJSON *normalize_messages(const cJSON *msgs, cJSON *images, struct field_err *fe)
{
    static char param[64];
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0) {
        bad(fe, "messages", "'messages' must be a non-empty array");
        return NULL;
    }
    cJSON *out = cJSON_CreateArray();
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs)
    {
        snprintf(param, sizeof(param), "messages[%d]", i);
        if (!cJSON_IsObject(m)) {
            bad(fe, param, "'%s' must be an object", param);
            goto fail;
        }
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role)) {
            snprintf(param, sizeof(param), "messages[%d].role", i);
            bad(fe, param, "'%s' must be a string", param);
            goto fail;
        }
        cJSON *nm = cJSON_Duplicate(m, 1);
        cJSON_AddItemToArray(out, nm);
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (cJSON_IsArray(content)) {
            size_t cap = 1, len = 0;
            char *joined = calloc(1, 1);
            int k = 0;
            const cJSON *part;
            cJSON_ArrayForEach(part, content)
            {
                const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
                const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
                snprintf(param, sizeof(param), "messages[%d].content[%d]", i, k);
                int is_image = cJSON_IsString(type) && (!strcmp(type->valuestring, "image_url") ||
                                                         !strcmp(type->valuestring, "input_image"));
                if (is_image && !images) {
                    bad(fe, param, "'%s': image input is not supported by this model (it has "
                        "no vision projector: give strata-serve --mmproj)", param);
                    free(joined);
                    goto fail;
                }
                if (is_image && !image_part_url(part)) {
                    bad(fe, param, "'%s' must have an \"image_url\" with a \"url\"", param);
                    free(joined);
                    goto fail;
                }
                if (is_image) {
                    cJSON *ip = cJSON_CreateObject();
                    cJSON_AddStringToObject(ip, "param", param);
                    cJSON_AddStringToObject(ip, "url", image_part_url(part));
                    cJSON_AddItemToArray(images, ip);
                    text = NULL;
                }
                if (!is_image && (!cJSON_IsString(type) || strcmp(type->valuestring, "text") ||
                                  !cJSON_IsString(text))) {
                    bad(fe, param, "'%s' must be a {\"type\": \"text\", \"text\": ...} part",
                        param);
                    free(joined);
                    goto fail;
                }
                const char *tv = text ? text->valuestring : SRV_IMAGE_MARKER;
                size_t tl = strlen(tv);
                char *nj = realloc(joined, cap + tl + 1);
                if (!nj) {
                    free(joined);
                    bad(fe, param, "out of memory");
                    goto fail;
                }
                joined = nj;
                if (k > 0)
                    joined[len++] = '\n';
                memcpy(joined + len, tv, tl);
                len += tl;
                joined[len] = '\0';
                cap = len + 2;
                k++;
            }
            cJSON_ReplaceItemInObjectCaseSensitive(nm, "content", cJSON_CreateString(joined));
            free(joined);
        } else if (!content || cJSON_IsNull(content)) {
            /* an assistant turn with only tool calls: templates test `in content` */
            if (content)
                cJSON_ReplaceItemInObjectCaseSensitive(nm, "content", cJSON_CreateString(""));
            else
                cJSON_AddStringToObject(nm, "content", "");
        } else if (!cJSON_IsString(content)) {
            snprintf(param, sizeof(param), "messages[%d].content", i);
            bad(fe, param, "'%s' must be a string or an array of content parts", param);
            goto fail;
        }
        i++;
    }
    return out;
fail:
    cJSON_Delete(out);
    return NULL;
}

void srv_openai_chat(struct srv *s, const char *body, size_t len, struct srv_http *h,
                     struct srv_reply *r)
{
    struct field_err fe = {0};
    struct srv_stream *st = NULL;
    cJSON *gen = NULL, *treq = NULL, *images = NULL;
    char *prompt = NULL;
    cJSON *req = parse_body(body, len, r);
    if (!req)
        return;
    struct srv_model *m = find_model(s, req, r);
    if (!m)
        goto out;
    st = new_stream(s, m, h, 1);
    gen = cJSON_CreateObject();
    if (!st || !gen) {
        srv_reply_error(r, 500, "server_error", NULL, "out of memory");
        goto out;
    }
    cJSON_AddStringToObject(gen, "type", "generate");
    if (parse_common(req, st, gen, &fe))
        goto bad;
    if (get_bool(req, "logprobs", &st->logprobs, &fe))
        goto bad;
    long long top = 0;
    int p = 0;
    if (get_int(req, "top_logprobs", 0, MAX_TOP_LOGPROBS, &top, &p, &fe))
        goto bad;
    if (p && top > 0 && !st->logprobs) {
        bad(&fe, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        goto bad;
    }
    st->n_top = (int)top;
    if (st->logprobs) {
        cJSON_AddBoolToObject(gen, "logprobs", 1);
        cJSON_AddNumberToObject(gen, "top_logprobs", (double)top);
    }
    images = m->vision ? cJSON_CreateArray() : NULL;
    cJSON *msgs = normalize_messages(cJSON_GetObjectItemCaseSensitive(req, "messages"), images,
                                     &fe);
    if (!msgs)
        goto bad;
    treq = cJSON_CreateObject();
    cJSON_AddItemToObject(treq, "messages", msgs);
    cJSON_AddBoolToObject(treq, "add_generation_prompt", 1);
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(req, "tools");
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(req, "tool_choice");
    int tools_on = 0;
    if (tools && !cJSON_IsNull(tools)) {
        if (!cJSON_IsArray(tools)) {
            bad(&fe, "tools", "'tools' must be an array");
            goto bad;
        }
        tools_on = cJSON_GetArraySize(tools) > 0;
    }
    if (tc && !cJSON_IsNull(tc)) {
        if (cJSON_IsString(tc)) {
            if (!strcmp(tc->valuestring, "none"))
                tools_on = 0;
            else if (strcmp(tc->valuestring, "auto") && strcmp(tc->valuestring, "required")) {
                bad(&fe, "tool_choice", "'tool_choice' must be \"none\", \"auto\", "
                                        "\"required\" or a function object");
                goto bad;
            }
        } else if (!cJSON_IsObject(tc)) {
            bad(&fe, "tool_choice", "'tool_choice' must be a string or an object");
            goto bad;
        }
    }
    if (tools_on)
        cJSON_AddItemToObject(treq, "tools", cJSON_Duplicate(tools, 1));
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(req, "chat_template_kwargs");
    if (cJSON_IsObject(kw))
        cJSON_AddItemToObject(treq, "chat_template_kwargs", cJSON_Duplicate(kw, 1));

    pthread_mutex_lock(&m->mu);
    const struct strata_chat *chat = m->chat;
    char chat_error[sizeof(m->chat_error)];
    memcpy(chat_error, m->chat_error, sizeof(chat_error));
    pthread_mutex_unlock(&m->mu);
    if (!chat) {
        srv_reply_error(r, 400, "invalid_request_error", "messages", "%s",
                        chat_error[0] ? chat_error : "the model's chat template is not loaded");
        goto out;
    }
    struct strata_err err = {0};
    size_t plen = 0;
    if (strata_chat_render(chat, treq, NULL, &prompt, &plen, &err)) {
        srv_reply_error(r, err.code == STRATA_E_TEMPLATE || err.code == STRATA_E_INVALID ? 400
                                                                                         : 500,
                        err.code == STRATA_E_TEMPLATE || err.code == STRATA_E_INVALID
                            ? "invalid_request_error"
                            : "server_error",
                        "messages", "%s", err.msg);
        goto out;
    }
    st->fmt = (int)strata_chat_get_format(chat);
    st->parse = st->fmt != STRATA_CHAT_FORMAT_PLAIN;
    if (strata_chat_prompt_opens_reasoning(prompt, plen))
        st->parse_flags |= STRATA_CHAT_PARSE_IN_REASONING;
    cJSON_AddStringToObject(gen, "prompt", prompt);
    cJSON_AddBoolToObject(gen, "parse_special", 1);
    if (cJSON_GetArraySize(images) > 0 && srv_vision_embed_parts(s, m, images, gen, r))
        goto out;
    run_generation(st, gen, r);
    st = NULL;
    goto out;
bad:
    srv_reply_error(r, 400, "invalid_request_error", fe.param, "%s", fe.msg);
out:
    free(prompt);
    cJSON_Delete(images);
    cJSON_Delete(treq);
    cJSON_Delete(gen);
    cJSON_Delete(req);
    st_free(st);
}

void srv_openai_completion(struct srv *s, const char *body, size_t len, struct srv_http *h,
                           struct srv_reply *r)
{
    struct field_err fe = {0};
    struct srv_stream *st = NULL;
    cJSON *gen = NULL;
    cJSON *req = parse_body(body, len, r);
    if (!req)
        return;
    struct srv_model *m = find_model(s, req, r);
    if (!m)
        goto out;
    st = new_stream(s, m, h, 0);
    gen = cJSON_CreateObject();
    if (!st || !gen) {
        srv_reply_error(r, 500, "server_error", NULL, "out of memory");
        goto out;
    }
    cJSON_AddStringToObject(gen, "type", "generate");
    if (parse_common(req, st, gen, &fe))
        goto bad;
    long long lp = 0;
    int p = 0;
    if (get_int(req, "logprobs", 0, 5, &lp, &p, &fe))
        goto bad;
    if (p) {
        st->logprobs = 1;
        st->n_top = (int)lp;
        cJSON_AddBoolToObject(gen, "logprobs", 1);
        cJSON_AddNumberToObject(gen, "top_logprobs", (double)lp);
    }
    int echo = 0;
    if (get_bool(req, "echo", &echo, &fe))
        goto bad;
    if (echo) {
        bad(&fe, "echo", "'echo' is not supported");
        goto bad;
    }
    const cJSON *suffix = cJSON_GetObjectItemCaseSensitive(req, "suffix");
    if (suffix && !cJSON_IsNull(suffix)) {
        bad(&fe, "suffix", "'suffix' is not supported");
        goto bad;
    }
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(req, "prompt");
    if (cJSON_IsArray(pr) && cJSON_GetArraySize(pr) == 1 &&
        cJSON_IsString(cJSON_GetArrayItem(pr, 0)))
        pr = cJSON_GetArrayItem(pr, 0);
    if (cJSON_IsString(pr)) {
        cJSON_AddStringToObject(gen, "prompt", pr->valuestring);
    } else if (cJSON_IsArray(pr) && cJSON_GetArraySize(pr) > 0) {
        cJSON *ids = cJSON_AddArrayToObject(gen, "tokens");
        const cJSON *t;
        cJSON_ArrayForEach(t, pr)
        {
            if (!cJSON_IsNumber(t) || t->valuedouble < 0 ||
                t->valuedouble != floor(t->valuedouble)) {
                bad(&fe, "prompt", "'prompt' must be a string, a list of one string, or a "
                                   "list of token ids");
                goto bad;
            }
            cJSON_AddItemToArray(ids, cJSON_CreateNumber(t->valuedouble));
        }
    } else {
        bad(&fe, "prompt", "'prompt' must be a string, a list of one string, or a list of "
                           "token ids");
        goto bad;
    }
    cJSON_AddBoolToObject(gen, "parse_special", 1);
    run_generation(st, gen, r);
    st = NULL;
    goto out;
bad:
    srv_reply_error(r, 400, "invalid_request_error", fe.param, "%s", fe.msg);
out:
    cJSON_Delete(gen);
    cJSON_Delete(req);
    st_free(st);
}

void srv_openai_tokenize(struct srv *s, const char *body, size_t len, struct srv_http *h,
                         int detokenize, struct srv_reply *r)
{
    (void)h;
    struct srv_job *j = NULL;
    cJSON *q = NULL, *out = NULL;
    cJSON *req = parse_body(body, len, r);
    if (!req)
        return;
    struct srv_model *m = find_model(s, req, r);
    if (!m)
        goto done;
    q = cJSON_CreateObject();
    if (!detokenize) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(req, "content");
        if (!cJSON_IsString(c)) {
            srv_reply_error(r, 400, "invalid_request_error", "content",
                            "'content' must be a string");
            goto done;
        }
        const cJSON *as = cJSON_GetObjectItemCaseSensitive(req, "add_special");
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(req, "parse_special");
        cJSON_AddStringToObject(q, "type", "tokenize");
        cJSON_AddStringToObject(q, "text", c->valuestring);
        cJSON_AddBoolToObject(q, "add_bos", cJSON_IsTrue(as));
        cJSON_AddBoolToObject(q, "parse_special", !ps || cJSON_IsTrue(ps));
    } else {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(req, "tokens");
        if (!cJSON_IsArray(t)) {
            srv_reply_error(r, 400, "invalid_request_error", "tokens",
                            "'tokens' must be an array of token ids");
            goto done;
        }
        const cJSON *x;
        cJSON_ArrayForEach(x, t) if (!cJSON_IsNumber(x))
        {
            srv_reply_error(r, 400, "invalid_request_error", "tokens",
                            "'tokens' must be an array of token ids");
            goto done;
        }
        cJSON_AddStringToObject(q, "type", "detokenize");
        cJSON_AddItemToObject(q, "tokens", cJSON_Duplicate(t, 1));
    }
    struct strata_err err = {0};
    j = srv_job_new(m, q, 0);
    if (!j) {
        srv_reply_error(r, 500, "server_error", NULL, "out of memory");
        goto done;
    }
    if (srv_job_submit(j, &err)) {
        srv_reply_error(r, 503, "server_error", NULL, "%s", err.msg);
        goto done;
    }
    pthread_mutex_lock(&j->mu);
    while (j->state != SRV_JOB_DONE && j->state != SRV_JOB_FAILED)
        pthread_cond_wait(&j->cv, &j->mu);
    if (j->state == SRV_JOB_FAILED) {
        srv_reply_error(r, j->err_status ? j->err_status : 500,
                        j->err_type[0] ? j->err_type : "server_error",
                        detokenize ? "tokens" : "content", "%s", j->err_msg);
    } else {
        out = cJSON_CreateObject();
        if (detokenize) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(j->done, "text");
            cJSON_AddStringToObject(out, "content", cJSON_IsString(t) ? t->valuestring : "");
        } else {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(j->done, "tokens");
            cJSON_AddItemToObject(out, "tokens",
                                  t ? cJSON_Duplicate(t, 1) : cJSON_CreateArray());
        }
        r->status = 200;
        r->body = cJSON_PrintUnformatted(out);
        r->body_len = r->body ? strlen(r->body) : 0;
    }
    pthread_mutex_unlock(&j->mu);
done:
    srv_job_unref(j);
    cJSON_Delete(out);
    cJSON_Delete(q);
    cJSON_Delete(req);
}

void srv_openai_models(struct srv *s, struct srv_reply *r)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    for (int i = 0; i < s->n_models; i++) {
        struct srv_model *m = &s->models[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "id", m->id);
        cJSON_AddStringToObject(o, "object", "model");
        cJSON_AddNumberToObject(o, "created", (double)(long)time(NULL));
        cJSON_AddStringToObject(o, "owned_by", "strata");
        pthread_mutex_lock(&m->mu);
        cJSON_AddNumberToObject(o, "n_ctx", m->n_ctx);
        pthread_mutex_unlock(&m->mu);
        cJSON_AddItemToArray(data, o);
    }
    r->status = 200;
    r->body = cJSON_PrintUnformatted(root);
    r->body_len = r->body ? strlen(r->body) : 0;
    cJSON_Delete(root);
}
