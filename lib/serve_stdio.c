/* serve_stdio.c - `strata-generate --serve-stdio`: the engine protocol loop. */
#include "serve_stdio.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "engine.h"
#include "generate.h"
#include "gguf.h"
#include "model.h"
#include "proto.h"
#include "spec.h"
#include "splice.h"
#include "vision.h"
#include "vocab.h"

void strata_serve_stdio_opts_init(struct strata_serve_stdio_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->in_fd = 0;
    o->out_fd = 1;
}

struct pending {
    char *line;
    struct pending *next;
};

struct loop {
    struct strata_engine *e;
    const struct strata_vocab *v;
    const struct strata_serve_stdio_opts *o;
    struct strata_proto_reader rd;
    struct pending *head, *tail;
    int shutdown;
    int write_failed;
    struct strata_err werr;
    /* the generation in progress */
    const char *gen_id;
    int logprobs;     /* token events carry "logprob" */
    int cancel;
    char *tail_text;  /* text released by the final flush */
    size_t tail_len;
};

static int emit(struct loop *L, cJSON *ev)
{
    size_t n = 0;
    char *s = strata_proto_encode(ev, &n);
    cJSON_Delete(ev);
    if (!s)
        return strata_err_set(&L->werr, STRATA_E_NOMEM, "encoding an event");
    int rc = L->write_failed ? STRATA_E_IO
                             : strata_proto_write_all(L->o->out_fd, s, n, "engine events",
                                                      &L->werr);
    if (rc)
        L->write_failed = 1;
    free(s);
    return rc;
}

static const char *code_name(int code)
{
    switch (code) {
    case STRATA_E_INVALID: return "invalid";
    case STRATA_E_LIMIT: return "limit";
    case STRATA_E_TEMPLATE: return "template";
    case STRATA_E_NOMEM: return "nomem";
    case STRATA_E_GPU: return "gpu";
    default: return "engine";
    }
}

static int emit_error(struct loop *L, const char *id, int code, const char *msg)
{
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddStringToObject(ev, "type", "error");
    if (id)
        cJSON_AddStringToObject(ev, "id", id);
    cJSON_AddStringToObject(ev, "code", code_name(code));
    char *fixed = strata_proto_utf8_fix(msg, strlen(msg), NULL);
    cJSON_AddStringToObject(ev, "msg", fixed ? fixed : "error");
    free(fixed);
    return emit(L, ev);
}

static void add_text(cJSON *o, const char *key, const char *s, size_t n)
{
    char *fixed = strata_proto_utf8_fix(s, n, NULL);
    cJSON_AddStringToObject(o, key, fixed ? fixed : "");
    free(fixed);
}

static void push_pending(struct loop *L, char *line)
{
    struct pending *p = malloc(sizeof(*p));
    if (!p) {
        free(line);
        return;
    }
    p->line = line;
    p->next = NULL;
    if (L->tail)
        L->tail->next = p;
    else
        L->head = p;
    L->tail = p;
}

/* Look at requests that arrived during a generation: cancels and shutdown
 * act now, the rest waits its turn. */
static void poll_input(struct loop *L)
{
    for (;;) {
        struct pollfd p = {.fd = L->o->in_fd, .events = POLLIN};
        if (L->rd.eof || poll(&p, 1, 0) <= 0)
            break;
        struct strata_err err = {0};
        int r = strata_proto_reader_fill(&L->rd, &err);
        if (r <= 0 && r != -1) {
            L->shutdown = 1; /* end of input or a broken stream: stop */
            L->cancel = 1;
            break;
        }
        if (r == -1)
            break;
    }
    char *line;
    while ((line = strata_proto_reader_line(&L->rd))) {
        cJSON *q = cJSON_Parse(line);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(q, "type");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(q, "id");
        int handled = 0;
        if (cJSON_IsString(t) && !strcmp(t->valuestring, "cancel")) {
            if (L->gen_id && cJSON_IsString(id) && !strcmp(id->valuestring, L->gen_id))
                L->cancel = 1;
            handled = 1;
        } else if (cJSON_IsString(t) && !strcmp(t->valuestring, "shutdown")) {
            L->shutdown = 1;
            L->cancel = 1;
            handled = 1;
        }
        cJSON_Delete(q);
        if (handled)
            free(line);
        else
            push_pending(L, line);
    }
}

static int on_token(const struct strata_gen_token *t, void *ud)
{
    struct loop *L = ud;
    if (t->index < 0) {
        /* the final flush of held-back text: sent with the done event */
        char *nt = realloc(L->tail_text, L->tail_len + t->text_len + 1);
        if (nt) {
            memcpy(nt + L->tail_len, t->text, t->text_len);
            L->tail_len += t->text_len;
            nt[L->tail_len] = '\0';
            L->tail_text = nt;
        }
        return 0;
    }
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddStringToObject(ev, "type", "token");
    cJSON_AddStringToObject(ev, "id", L->gen_id);
    cJSON_AddNumberToObject(ev, "tok", t->id);
    size_t pl = 0;
    const char *piece = strata_vocab_token_bytes(L->v, t->id, &pl);
    add_text(ev, "piece", piece ? piece : "", pl);
    add_text(ev, "text", t->text, t->text_len);
    if (L->logprobs)
        cJSON_AddNumberToObject(ev, "logprob", t->logprob);
    if (t->n_top > 0 && t->top) {
        cJSON *top = cJSON_AddArrayToObject(ev, "top");
        for (int i = 0; i < t->n_top; i++) {
            cJSON *c = cJSON_CreateObject();
            cJSON_AddNumberToObject(c, "tok", t->top[i].id);
            size_t cl = 0;
            const char *cp = strata_vocab_token_bytes(L->v, t->top[i].id, &cl);
            add_text(c, "piece", cp ? cp : "", cl);
            cJSON_AddNumberToObject(c, "logprob", t->top[i].logprob);
            cJSON_AddItemToArray(top, c);
        }
    }
    if (emit(L, ev))
        return 1;
    poll_input(L);
    return L->cancel;
}

static double num(const cJSON *q, const char *key, double d, int *present)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(q, key);
    if (present)
        *present = cJSON_IsNumber(v);
    return cJSON_IsNumber(v) ? v->valuedouble : d;
}

/* num() as an integer, clamped to [lo, hi] before the conversion (a double outside
 * the integer's range converts to anything). */
static int64_t inum(const cJSON *q, const char *key, int64_t d, int64_t lo, int64_t hi,
                    int *present)
{
    double v = num(q, key, (double)d, present);
    return !(v >= (double)lo) ? lo : v >= (double)hi ? hi : (int64_t)v;
}

static int flag(const cJSON *q, const char *key, int d)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(q, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : d;
}

/* The scripted output of the test hook, or NULL. */
static char *forced_output(size_t *len)
{
    const char *path = getenv("STRATA_TEST_FORCE_OUTPUT_FILE");
    if (!path || !*path)
        return NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = malloc(65537);
    size_t n = buf ? fread(buf, 1, 65536, f) : 0;
    fclose(f);
    if (!buf || !n) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

static int prompt_ids(struct loop *L, const cJSON *q, int32_t **ids, size_t *n,
                      struct strata_err *err)
{
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(q, "tokens");
    if (cJSON_IsArray(toks)) {
        size_t k = (size_t)cJSON_GetArraySize(toks), i = 0;
        *ids = malloc((k ? k : 1) * sizeof(**ids));
        if (!*ids)
            return strata_err_set(err, STRATA_E_NOMEM, "prompt ids");
        int32_t nv = strata_vocab_n_tokens(L->v);
        const cJSON *t;
        cJSON_ArrayForEach(t, toks)
        {
            if (!cJSON_IsNumber(t) || t->valuedouble < 0 || t->valuedouble >= nv) {
                free(*ids);
                *ids = NULL;
                return strata_err_set(err, STRATA_E_INVALID,
                                      "prompt token %zu is not an id in 0..%d", i, nv - 1);
            }
            (*ids)[i++] = (int32_t)t->valuedouble;
        }
        *n = i;
        return 0;
    }
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(q, "prompt");
    if (!cJSON_IsString(p))
        return strata_err_set(err, STRATA_E_INVALID, "'prompt' must be a string");
    return strata_vocab_tokenize(L->v, p->valuestring, strlen(p->valuestring),
                                 flag(q, "add_bos", strata_vocab_add_bos(L->v)),
                                 flag(q, "parse_special", 1), ids, n, err);
}

/* Decode standard base64 (RFC 4648, padding optional, no line breaks).
 * malloc'ed; NULL on a bad character or out of memory. */
static unsigned char *b64_decode(const char *s, size_t *out_len)
{
    size_t n = strlen(s), k = 0;
    unsigned char *o = malloc(n / 4 * 3 + 3);
    uint32_t acc = 0;
    int bits = 0;
    if (!o)
        return NULL;
    for (size_t i = 0; i < n && s[i] != '='; i++) {
        int c = s[i], v = c >= 'A' && c <= 'Z' ? c - 'A' : c >= 'a' && c <= 'z' ? c - 'a' + 26
                        : c >= '0' && c <= '9' ? c - '0' + 52 : c == '+' ? 62 : c == '/' ? 63 : -1;
        if (v < 0) {
            free(o);
            return NULL;
        }
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            o[k++] = (unsigned char)(acc >> bits);
        }
    }
    *out_len = k;
    return o;
}

/* The request's "images" (base64 payloads, strata-embed(1)) tokenized
 * into the prompt at "image_marker" (default: the model's placeholder);
 * *rows gets their rows concatenated (for strata_gen_params.embd). */
static int prompt_images(struct loop *L, const cJSON *q, const cJSON *imgs, int32_t **ids,
                         size_t *n, float **rows, struct strata_err *err)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(q, "prompt");
    const cJSON *mk = cJSON_GetObjectItemCaseSensitive(q, "image_marker");
    const struct strata_model *m = strata_engine_model(L->e);
    int n_img = cJSON_GetArraySize(imgs), rc = 0, i = 0;
    uint32_t *nt = calloc((size_t)n_img + 1, sizeof *nt);
    size_t total = 0;
    const cJSON *it;
    if (!nt)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    if (!cJSON_IsString(p)) {
        rc = strata_err_set(err, STRATA_E_INVALID, "'prompt' must be a string with 'images'");
        goto out;
    }
    const char *marker = cJSON_IsString(mk) && mk->valuestring[0] ? mk->valuestring
                                                                  : strata_splice_default_marker(L->v);
    if (!marker) {
        rc = strata_err_set(err, STRATA_E_UNSUPPORTED, "the model has no image placeholder "
                            "token (%s) and the request gives no 'image_marker'",
                            STRATA_SPLICE_PAD);
        goto out;
    }
    cJSON_ArrayForEach(it, imgs)
    {
        char name[32];
        size_t len = 0;
        struct strata_embd_header h;
        float *r = NULL;
        snprintf(name, sizeof name, "images[%d]", i);
        unsigned char *buf = cJSON_IsString(it) ? b64_decode(it->valuestring, &len) : NULL;
        FILE *f = buf && len ? fmemopen(buf, len, "rb") : NULL;
        if (!f) {
            free(buf);
            rc = strata_err_set(err, STRATA_E_INVALID, "'%s' is not a base64 payload", name);
            goto out;
        }
        rc = strata_embd_read(f, name, &h, &r, err);
        fclose(f);
        free(buf);
        if (rc == 0)
            rc = strata_splice_check(strata_engine_gguf(L->e), m->hp.n_embd, h.n_embd, name, err);
        float *q2 = rc ? NULL : realloc(*rows, (total + (size_t)h.n_tokens * h.n_embd) * sizeof *q2);
        if (rc == 0 && !q2)
            rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        if (rc) {
            free(r);
            goto out;
        }
        memcpy(q2 + total, r, (size_t)h.n_tokens * h.n_embd * sizeof *q2);
        free(r);
        *rows = q2;
        total += (size_t)h.n_tokens * h.n_embd;
        nt[i++] = h.n_tokens;
    }
    rc = strata_splice_tokenize(L->v, p->valuestring, strlen(p->valuestring),
                                flag(q, "add_bos", strata_vocab_add_bos(L->v)), marker, n_img, nt,
                                ids, n, err);
out:
    free(nt);
    /* what the request gave does not fit this model: a bad request */
    if (rc == STRATA_E_FORMAT || rc == STRATA_E_UNSUPPORTED)
        rc = err->code = STRATA_E_INVALID;
    return rc;
}

static int run_forced(struct loop *L, const char *id, const char *text, size_t len,
                      size_t n_prompt, int32_t max_tokens)
{
    struct strata_err err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    if (strata_vocab_tokenize(L->v, text, len, 0, 1, &ids, &n, &err))
        return emit_error(L, id, err.code, err.msg);
    size_t cap = STRATA_DETOK_OUT_MAX(L->v);
    char *buf = malloc(cap);
    struct strata_detok dt;
    strata_detok_init(&dt, L->v, STRATA_DETOK_SPECIAL);
    size_t k = 0;
    const char *reason = "eos";
    int rc = 0;
    for (; buf && k < n && !L->cancel; k++) {
        if (max_tokens >= 0 && (int32_t)k >= max_tokens) {
            reason = "length";
            break;
        }
        size_t np = 0;
        if (strata_detok_push(&dt, ids[k], buf, cap, &np, &err))
            break;
        struct strata_gen_token t = {ids[k], buf, np, 0.0f, NULL, 0, (int32_t)k};
        if (on_token(&t, L))
            break;
    }
    if (L->cancel)
        reason = "cancelled";
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddStringToObject(ev, "type", "done");
    cJSON_AddStringToObject(ev, "id", id);
    cJSON_AddStringToObject(ev, "reason", reason);
    cJSON_AddNumberToObject(ev, "n_prompt", (double)n_prompt);
    cJSON_AddNumberToObject(ev, "n_cached", 0);
    cJSON_AddNumberToObject(ev, "n_gen", (double)k);
    cJSON_AddNumberToObject(ev, "t_prefill_ms", 0);
    cJSON_AddNumberToObject(ev, "t_decode_ms", 0);
    rc = emit(L, ev);
    free(buf);
    free(ids);
    return rc;
}

/* The done event's "spec" member: what this request's verify windows did (the
 * difference of the counters since st0). */
static void add_spec(cJSON *ev, const struct strata_spec *sp, const struct strata_spec_stats *st0)
{
    struct strata_spec_stats st;
    strata_spec_stats_get(sp, &st);
    cJSON *x = cJSON_AddObjectToObject(ev, "spec");
    if (!x)
        return;
    cJSON_AddNumberToObject(x, "n_max", strata_spec_n_max(sp));
    cJSON_AddStringToObject(x, "draft", strata_spec_draft_name(sp));
    cJSON_AddNumberToObject(x, "steps", (double)(st.n_steps - st0->n_steps));
    cJSON_AddNumberToObject(x, "tokens", (double)(st.n_tokens - st0->n_tokens));
    cJSON_AddNumberToObject(x, "drafted", (double)(st.n_drafted - st0->n_drafted));
    cJSON_AddNumberToObject(x, "accepted", (double)(st.n_accepted - st0->n_accepted));
    cJSON_AddNumberToObject(x, "draft_ms", st.t_draft_ms - st0->t_draft_ms);
    cJSON_AddNumberToObject(x, "verify_ms", st.t_verify_ms - st0->t_verify_ms);
}

static int do_generate(struct loop *L, const cJSON *q, const char *id)
{
    struct strata_err err = {0};
    struct strata_gen_params p;
    struct strata_gen_result res;
    memset(&res, 0, sizeof(res));
    int32_t *ids = NULL;
    size_t n_ids = 0;
    const char **stop = NULL;
    char *forced = NULL;
    float *img_rows = NULL;
    int rc = 0;
    strata_gen_params_init(&p);
    int has;
    double d;
    d = num(q, "temperature", 0, &has);
    if (has)
        p.sampling.temperature = (float)d;
    int64_t iv = inum(q, "top_k", 0, INT32_MIN, INT32_MAX, &has);
    if (has)
        p.sampling.top_k = (int32_t)iv;
    d = num(q, "top_p", 0, &has);
    if (has)
        p.sampling.top_p = (float)d;
    d = num(q, "min_p", 0, &has);
    if (has)
        p.sampling.min_p = (float)d;
    d = num(q, "repeat_penalty", 0, &has);
    if (has)
        p.sampling.repeat_penalty = (float)d;
    d = num(q, "presence_penalty", 0, &has);
    if (has)
        p.sampling.presence_penalty = (float)d;
    d = num(q, "frequency_penalty", 0, &has);
    if (has)
        p.sampling.frequency_penalty = (float)d;
    iv = inum(q, "seed", 0, INT64_MIN, INT64_MAX, &has);
    if (has)
        p.sampling.seed = (uint64_t)iv;
    p.n_predict = (int32_t)inum(q, "max_tokens", -1, -1, INT32_MAX, NULL);
    p.n_top_logprobs = (int)inum(q, "top_logprobs", 0, 0, STRATA_GEN_MAX_TOP, NULL);
    p.logprobs = flag(q, "logprobs", 0) || p.n_top_logprobs > 0;
    p.ignore_eog = flag(q, "ignore_eos", 0);
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(q, "stop");
    if (cJSON_IsArray(st) && cJSON_GetArraySize(st) > 0) {
        stop = calloc((size_t)cJSON_GetArraySize(st), sizeof(*stop));
        if (!stop) {
            rc = emit_error(L, id, STRATA_E_NOMEM, "out of memory");
            goto out;
        }
        const cJSON *s;
        cJSON_ArrayForEach(s, st) if (cJSON_IsString(s) && s->valuestring[0])
            stop[p.n_stop++] = s->valuestring;
        p.stop = stop;
    }
    const cJSON *imgs = cJSON_GetObjectItemCaseSensitive(q, "images");
    if (cJSON_IsArray(imgs) && cJSON_GetArraySize(imgs) > 0
            ? prompt_images(L, q, imgs, &ids, &n_ids, &img_rows, &err)
            : prompt_ids(L, q, &ids, &n_ids, &err)) {
        rc = emit_error(L, id, err.code, err.msg);
        goto out;
    }
    p.embd = img_rows;
    if (n_ids == 0) {
        rc = emit_error(L, id, STRATA_E_INVALID, "the prompt is empty (no tokens)");
        goto out;
    }
    L->gen_id = id;
    L->logprobs = p.logprobs;
    L->cancel = 0;
    free(L->tail_text);
    L->tail_text = NULL;
    L->tail_len = 0;
    size_t flen = 0;
    forced = forced_output(&flen);
    if (forced) {
        rc = run_forced(L, id, forced, flen, n_ids, p.n_predict);
        goto out;
    }
    /* the draft model has no image input: such a request decodes plainly */
    struct strata_spec_stats st0;
    if (L->o->spec && !(img_rows && !strcmp(strata_spec_draft_name(L->o->spec), "draft")))
        p.spec = L->o->spec;
    if (p.spec)
        strata_spec_stats_get(p.spec, &st0);
    if (strata_generate(L->e, L->v, ids, n_ids, &p, on_token, L, &res, &err)) {
        rc = L->write_failed ? STRATA_E_IO : emit_error(L, id, err.code, err.msg);
        goto out;
    }
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddStringToObject(ev, "type", "done");
    cJSON_AddStringToObject(ev, "id", id);
    cJSON_AddStringToObject(ev, "reason", strata_stop_reason_name(res.stop_reason));
    cJSON_AddNumberToObject(ev, "n_prompt", res.n_prompt);
    cJSON_AddNumberToObject(ev, "n_cached", res.n_cached);
    cJSON_AddNumberToObject(ev, "n_gen", res.n_gen);
    cJSON_AddNumberToObject(ev, "t_prefill_ms", res.t_prefill_ms);
    cJSON_AddNumberToObject(ev, "t_decode_ms", res.t_decode_ms);
    cJSON_AddNumberToObject(ev, "prefill_tps", res.prefill_tps);
    cJSON_AddNumberToObject(ev, "decode_tps", res.decode_tps);
    if (p.spec)
        add_spec(ev, p.spec, &st0);
    if (L->tail_len)
        add_text(ev, "tail", L->tail_text, L->tail_len);
    rc = emit(L, ev);
out:
    L->gen_id = NULL;
    strata_gen_result_free(&res);
    free(forced);
    free(stop);
    free(ids);
    free(img_rows);
    return rc;
}

static int do_request(struct loop *L, const char *line)
{
    cJSON *q = cJSON_Parse(line);
    int rc = 0;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(q, "type");
    const cJSON *idv = cJSON_GetObjectItemCaseSensitive(q, "id");
    const char *id = cJSON_IsString(idv) ? idv->valuestring : NULL;
    if (!cJSON_IsObject(q) || !cJSON_IsString(t)) {
        rc = emit_error(L, id, STRATA_E_INVALID,
                        "request is not a JSON object with a \"type\" member");
        goto out;
    }
    const char *type = t->valuestring;
    if (!strcmp(type, "shutdown")) {
        L->shutdown = 1;
    } else if (!strcmp(type, "cancel")) {
        /* nothing running: a late cancel */
    } else if (!id) {
        rc = emit_error(L, NULL, STRATA_E_INVALID, "request has no \"id\" string");
    } else if (!strcmp(type, "generate")) {
        rc = do_generate(L, q, id);
    } else if (!strcmp(type, "tokenize")) {
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(q, "text");
        struct strata_err err = {0};
        int32_t *ids = NULL;
        size_t n = 0;
        if (!cJSON_IsString(text)) {
            rc = emit_error(L, id, STRATA_E_INVALID, "'text' must be a string");
        } else if (strata_vocab_tokenize(L->v, text->valuestring, strlen(text->valuestring),
                                         flag(q, "add_bos", 0), flag(q, "parse_special", 1),
                                         &ids, &n, &err)) {
            rc = emit_error(L, id, err.code, err.msg);
        } else {
            cJSON *ev = cJSON_CreateObject();
            cJSON_AddStringToObject(ev, "type", "done");
            cJSON_AddStringToObject(ev, "id", id);
            cJSON *arr = cJSON_AddArrayToObject(ev, "tokens");
            for (size_t i = 0; i < n; i++)
                cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
            rc = emit(L, ev);
        }
        free(ids);
    } else if (!strcmp(type, "detokenize")) {
        const cJSON *toks = cJSON_GetObjectItemCaseSensitive(q, "tokens");
        int32_t *ids = NULL;
        size_t n = 0;
        char *text = NULL;
        size_t tl = 0;
        struct strata_err err = {0};
        int32_t nv = strata_vocab_n_tokens(L->v);
        if (cJSON_IsArray(toks))
            ids = malloc(((size_t)cJSON_GetArraySize(toks) + 1) * sizeof(*ids));
        const cJSON *x;
        int ok = ids != NULL;
        cJSON_ArrayForEach(x, toks)
        {
            if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= nv)
                ok = 0;
            else if (ids)
                ids[n++] = (int32_t)x->valuedouble;
        }
        if (!ok)
            rc = emit_error(L, id, STRATA_E_INVALID,
                            "'tokens' must be an array of ids in the vocabulary");
        else if (strata_vocab_detokenize(L->v, ids, n, 1, &text, &tl, &err))
            rc = emit_error(L, id, err.code, err.msg);
        else {
            cJSON *ev = cJSON_CreateObject();
            cJSON_AddStringToObject(ev, "type", "done");
            cJSON_AddStringToObject(ev, "id", id);
            add_text(ev, "text", text, tl);
            rc = emit(L, ev);
        }
        free(text);
        free(ids);
    } else if (!strcmp(type, "health")) {
        cJSON *ev = cJSON_CreateObject();
        cJSON_AddStringToObject(ev, "type", "done");
        cJSON_AddStringToObject(ev, "id", id);
        cJSON_AddStringToObject(ev, "status", "ok");
        cJSON_AddNumberToObject(ev, "n_past", strata_engine_n_past(L->e));
        rc = emit(L, ev);
    } else {
        char msg[160];
        snprintf(msg, sizeof(msg), "unknown request type '%.100s'", type);
        rc = emit_error(L, id, STRATA_E_INVALID, msg);
    }
out:
    cJSON_Delete(q);
    return rc;
}

static int emit_ready(struct loop *L)
{
    const struct strata_gguf *g = strata_engine_gguf(L->e);
    const char *name = L->o->model_name, *tmpl = L->o->chat_template;
    if (!name && (!g || strata_gguf_get_str(g, "general.name", &name, NULL)))
        name = "model";
    if (!tmpl && g && strata_gguf_get_str(g, "tokenizer.chat_template", &tmpl, NULL))
        tmpl = NULL;
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddStringToObject(ev, "type", "ready");
    cJSON_AddNumberToObject(ev, "version", STRATA_PROTO_VERSION);
    add_text(ev, "model", name, strlen(name));
    cJSON_AddNumberToObject(ev, "n_ctx", strata_engine_n_ctx(L->e));
    cJSON_AddNumberToObject(ev, "n_vocab", strata_vocab_n_tokens(L->v));
    cJSON_AddStringToObject(ev, "backend", strata_engine_backend_name(L->e));
    if (tmpl)
        add_text(ev, "chat_template", tmpl, strlen(tmpl));
    int32_t bos = strata_vocab_bos(L->v), eos = strata_vocab_eos(L->v);
    const char *bt = bos >= 0 ? strata_vocab_token_text(L->v, bos) : NULL;
    const char *et = eos >= 0 ? strata_vocab_token_text(L->v, eos) : NULL;
    if (bt)
        add_text(ev, "bos_token", bt, strlen(bt));
    if (et)
        add_text(ev, "eos_token", et, strlen(et));
    cJSON_AddBoolToObject(ev, "add_bos", strata_vocab_add_bos(L->v));
    return emit(L, ev);
}

int strata_serve_stdio(struct strata_engine *e, const struct strata_vocab *v,
                       const struct strata_serve_stdio_opts *o, struct strata_err *err)
{
    struct loop L;
    memset(&L, 0, sizeof(L));
    L.e = e;
    L.v = v;
    L.o = o;
    strata_proto_reader_init(&L.rd, o->in_fd);
    int rc = emit_ready(&L);
    while (!rc && !L.shutdown) {
        char *line = NULL;
        if (L.head) {
            struct pending *p = L.head;
            L.head = p->next;
            if (!L.head)
                L.tail = NULL;
            line = p->line;
            free(p);
        } else {
            line = strata_proto_reader_line(&L.rd);
        }
        if (!line) {
            if (L.rd.eof)
                break;
            struct strata_err rerr = {0};
            int r = strata_proto_reader_fill(&L.rd, &rerr);
            if (r == -2) {
                rc = strata_err_set(err, rerr.code, "%s", rerr.msg);
                break;
            }
            continue;
        }
        if (line[0])
            rc = do_request(&L, line);
        free(line);
    }
    if (rc && L.write_failed && err)
        *err = L.werr;
    while (L.head) {
        struct pending *p = L.head;
        L.head = p->next;
        free(p->line);
        free(p);
    }
    free(L.tail_text);
    strata_proto_reader_free(&L.rd);
    return rc;
}

int strata_serve_stdio_error(int fd, int code, const char *msg, struct strata_err *err)
{
    struct strata_serve_stdio_opts o;
    strata_serve_stdio_opts_init(&o);
    o.out_fd = fd;
    struct loop L;
    memset(&L, 0, sizeof(L));
    L.o = &o;
    int rc = emit_error(&L, NULL, code, msg);
    if (rc && err)
        *err = L.werr;
    return rc;
}
