/* chat.c - render chat requests with the model's template; parse assistant output.
 *
 * Rendering passes the request to the template the way transformers'
 * apply_chat_template does (messages, tools or None, add_generation_prompt,
 * bos_token/eos_token, then every chat_template_kwargs member, which may override
 * them).  Parsing splits generated text into content, reasoning and tool calls for
 * the tool-call syntaxes the templates themselves teach the model.
 */
#include "chat.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

struct strata_chat {
    struct strata_jinja *tmpl;
    char *bos, *eos;
    enum strata_chat_format format;
};

enum strata_chat_format strata_chat_detect_format(const char *t, size_t len)
{
    /* the order matters: several formats wrap calls in <tool_call> */
    if (memmem(t, len, "<function=", 10) && memmem(t, len, "<parameter=", 11))
        return STRATA_CHAT_FORMAT_QWEN3_CODER;
    if (memmem(t, len, "<minimax:tool_call>", 19))
        return STRATA_CHAT_FORMAT_MINIMAX_M2;
    if (memmem(t, len, "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>", 27))
        return STRATA_CHAT_FORMAT_DEEPSEEK_V31;
    if (memmem(t, len, "<arg_key>", 9))
        return STRATA_CHAT_FORMAT_GLM45;
    if (memmem(t, len, "<|channel|>", 11))
        return STRATA_CHAT_FORMAT_GPT_OSS;
    if (memmem(t, len, "<|tool_calls_section_begin|>", 28))
        return STRATA_CHAT_FORMAT_KIMI_K2;
    if (memmem(t, len, "<tool_call>", 11))
        return STRATA_CHAT_FORMAT_HERMES;
    return STRATA_CHAT_FORMAT_PLAIN;
}

const char *strata_chat_format_name(enum strata_chat_format f)
{
    switch (f) {
    case STRATA_CHAT_FORMAT_PLAIN: return "plain";
    case STRATA_CHAT_FORMAT_HERMES: return "hermes";
    case STRATA_CHAT_FORMAT_QWEN3_CODER: return "qwen3-coder";
    case STRATA_CHAT_FORMAT_DEEPSEEK_V31: return "deepseek-v3.1";
    case STRATA_CHAT_FORMAT_GLM45: return "glm-4.5";
    case STRATA_CHAT_FORMAT_GPT_OSS: return "gpt-oss";
    case STRATA_CHAT_FORMAT_KIMI_K2: return "kimi-k2";
    case STRATA_CHAT_FORMAT_MINIMAX_M2: return "minimax-m2";
    default: return "unknown";
    }
}

int strata_chat_create(struct strata_chat **out, const char *tmpl, size_t len, const char *name,
                       const char *bos_token, const char *eos_token, struct strata_err *err)
{
    struct strata_chat *c = calloc(1, sizeof *c);
    int rc = 0;
    *out = NULL;
    if (!c || !(c->bos = strdup(bos_token ? bos_token : ""))
        || !(c->eos = strdup(eos_token ? eos_token : ""))) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    if ((rc = strata_jinja_parse(&c->tmpl, tmpl, len, name ? name : "chat_template", err)))
        goto out;
    c->format = strata_chat_detect_format(tmpl, len);
    *out = c;
    c = NULL;
out:
    strata_chat_free(c);
    return rc;
}

static const struct strata_gguf_str *token_text(const struct strata_gguf *g, const char *key)
{
    uint32_t id;
    const struct strata_gguf_arr *toks;
    if (!strata_gguf_find_kv(g, key) || strata_gguf_get_u32(g, key, &id, NULL))
        return NULL;
    if (strata_gguf_get_arr(g, "tokenizer.ggml.tokens", STRATA_GGUF_STRING, &toks, NULL))
        return NULL;
    if (id >= toks->n)
        return NULL;
    return &toks->strs[id];
}

int strata_chat_create_gguf(struct strata_chat **out, const struct strata_gguf *g,
                            const char *override_tmpl, size_t override_len,
                            struct strata_err *err)
{
    const char *tmpl = override_tmpl;
    size_t len = override_len;
    char *bos = NULL, *eos = NULL;
    int rc = 0;
    *out = NULL;
    if (!tmpl) {
        const struct strata_gguf_kv *kv = strata_gguf_find_kv(g, "tokenizer.chat_template");
        if (!kv || kv->type != STRATA_GGUF_STRING)
            return strata_err_set(err, STRATA_E_NOTFOUND,
                                  "model has no chat template (tokenizer.chat_template); "
                                  "give one with --chat-template");
        tmpl = kv->v.str.ptr;
        len = (size_t)kv->v.str.len;
    }
    const char *keys[2] = { "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id" };
    char **dst[2] = { &bos, &eos };
    for (int i = 0; i < 2; i++) {
        const struct strata_gguf_str *s = token_text(g, keys[i]);
        if (!s)
            continue;
        if (!(*dst[i] = strndup(s->ptr, (size_t)s->len))) {
            rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
            goto out;
        }
    }
    rc = strata_chat_create(out, tmpl, len, "tokenizer.chat_template", bos, eos, err);
out:
    free(bos);
    free(eos);
    return rc;
}

void strata_chat_free(struct strata_chat *c)
{
    if (!c)
        return;
    strata_jinja_free(c->tmpl);
    free(c->bos);
    free(c->eos);
    free(c);
}

enum strata_chat_format strata_chat_get_format(const struct strata_chat *c)
{
    return c->format;
}

int strata_chat_render(const struct strata_chat *c, const cJSON *request,
                       const struct strata_jinja_opts *opts, char **prompt, size_t *prompt_len,
                       struct strata_err *err)
{
    cJSON *vars = NULL;
    int rc = 0;
    *prompt = NULL;
    if (!cJSON_IsObject(request))
        return strata_err_set(err, STRATA_E_INVALID, "chat request must be a JSON object");
    const cJSON *messages = cJSON_GetObjectItemCaseSensitive(request, "messages");
    if (!cJSON_IsArray(messages))
        return strata_err_set(err, STRATA_E_INVALID,
                              "chat request: 'messages' is missing or not an array");
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(request, "tools");
    const cJSON *documents = cJSON_GetObjectItemCaseSensitive(request, "documents");
    const cJSON *agp = cJSON_GetObjectItemCaseSensitive(request, "add_generation_prompt");
    const cJSON *kwargs = cJSON_GetObjectItemCaseSensitive(request, "chat_template_kwargs");
    if (agp && !cJSON_IsBool(agp))
        return strata_err_set(err, STRATA_E_INVALID,
                              "chat request: 'add_generation_prompt' must be a boolean");
    if (kwargs && !cJSON_IsObject(kwargs) && !cJSON_IsNull(kwargs))
        return strata_err_set(err, STRATA_E_INVALID,
                              "chat request: 'chat_template_kwargs' must be an object");
    if (!(vars = cJSON_CreateObject()))
        goto nomem;
    /* transformers passes tools=None and documents=None when the request has none */
    if (!cJSON_AddItemReferenceToObject(vars, "messages", (cJSON *)messages)
        || !(tools && !cJSON_IsNull(tools)
                 ? cJSON_AddItemReferenceToObject(vars, "tools", (cJSON *)tools)
                 : cJSON_AddNullToObject(vars, "tools") != NULL)
        || !(documents && !cJSON_IsNull(documents)
                 ? cJSON_AddItemReferenceToObject(vars, "documents", (cJSON *)documents)
                 : cJSON_AddNullToObject(vars, "documents") != NULL)
        || !cJSON_AddBoolToObject(vars, "add_generation_prompt", agp ? cJSON_IsTrue(agp) : 1)
        || !cJSON_AddStringToObject(vars, "bos_token", c->bos)
        || !cJSON_AddStringToObject(vars, "eos_token", c->eos))
        goto nomem;
    if (cJSON_IsObject(kwargs)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, kwargs)
        {
            if (!e->string)
                continue;
            cJSON_DeleteItemFromObjectCaseSensitive(vars, e->string);
            if (!cJSON_AddItemReferenceToObject(vars, e->string, (cJSON *)e))
                goto nomem;
        }
    }
    rc = strata_jinja_render(c->tmpl, vars, opts, prompt, prompt_len, err);
    goto out;
nomem:
    rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
out:
    cJSON_Delete(vars);
    return rc;
}

/* ---------------------------------------------------------------- output parsing */

struct parsed {
    cJSON *calls; /* array */
    char *content;
    size_t content_n, content_cap;
    char *reasoning;
    int marked; /* markup was removed: trim the content */
};

static int add_text(struct parsed *p, const char *s, size_t n)
{
    if (p->content_n + n + 1 > p->content_cap) {
        size_t nc = (p->content_n + n + 1) * 2;
        char *q = realloc(p->content, nc);
        if (!q)
            return -1;
        p->content = q;
        p->content_cap = nc;
    }
    memcpy(p->content + p->content_n, s, n);
    p->content_n += n;
    p->content[p->content_n] = 0;
    return 0;
}

static const char *find(const char *s, const char *e, const char *needle)
{
    return memmem(s, (size_t)(e - s), needle, strlen(needle));
}

static void trim(const char **s, const char **e)
{
    while (*s < *e && isspace((unsigned char)**s))
        (*s)++;
    while (*e > *s && isspace((unsigned char)(*e)[-1]))
        (*e)--;
}

static int starts(const char *s, const char *e, const char *w)
{
    size_t n = strlen(w);
    return (size_t)(e - s) >= n && memcmp(s, w, n) == 0;
}

/* Add a call; args is JSON text (validated, must be an object) or, when args_obj is
 * given, an object to serialise.  id may be NULL (call_N). */
static int add_call(struct parsed *p, const char *name, size_t name_n, const char *args,
                    size_t args_n, cJSON *args_obj, const char *id, size_t id_n,
                    struct strata_err *err, const char *fmt)
{
    cJSON *call = cJSON_CreateObject(), *fn = NULL;
    char *nm = strndup(name, name_n), *idbuf = NULL, *text = NULL;
    int rc = 0;
    if (!call || !nm)
        goto nomem;
    if (!args_obj) {
        const char *s = args, *e = args + args_n;
        trim(&s, &e);
        if (s == e) {
            s = "{}";
            e = s + 2;
        }
        args_obj = cJSON_ParseWithLength(s, (size_t)(e - s));
        if (!args_obj || !cJSON_IsObject(args_obj)) {
            cJSON_Delete(args_obj);
            args_obj = NULL;
            rc = strata_err_set(err, STRATA_E_FORMAT,
                                "%s tool call '%s': arguments are not a JSON object", fmt, nm);
            goto out;
        }
    }
    if (!(text = cJSON_PrintUnformatted(args_obj)))
        goto nomem;
    if (id) {
        idbuf = strndup(id, id_n);
    } else {
        idbuf = malloc(32);
        if (idbuf)
            snprintf(idbuf, 32, "call_%d", cJSON_GetArraySize(p->calls));
    }
    if (!idbuf || !cJSON_AddStringToObject(call, "id", idbuf)
        || !cJSON_AddStringToObject(call, "type", "function")
        || !(fn = cJSON_AddObjectToObject(call, "function"))
        || !cJSON_AddStringToObject(fn, "name", nm)
        || !cJSON_AddStringToObject(fn, "arguments", text))
        goto nomem;
    cJSON_AddItemToArray(p->calls, call);
    call = NULL;
    goto out;
nomem:
    rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
out:
    cJSON_Delete(call);
    cJSON_Delete(args_obj);
    free(nm);
    free(idbuf);
    free(text);
    return rc;
}

/* A parameter value written as text: JSON when it parses as JSON, else the string. */
static int add_param(cJSON *obj, const char *k, size_t kn, const char *v, size_t vn)
{
    char *key = strndup(k, kn);
    cJSON *val = cJSON_ParseWithLength(v, vn);
    if (!val) {
        char *s = strndup(v, vn);
        val = s ? cJSON_CreateString(s) : NULL;
        free(s);
    }
    int ok = key && val && cJSON_AddItemToObject(obj, key, val);
    if (!ok)
        cJSON_Delete(val);
    free(key);
    return ok ? 0 : -1;
}

/* NAME>\n<parameter=K>\nV\n</parameter>\n</function>: what follows "<function=" */
static int parse_qwen3_function(struct parsed *p, const char *f, const char *e,
                                struct strata_err *err)
{
    const char *gt = memchr(f, '>', (size_t)(e - f));
    if (!gt)
        return strata_err_set(err, STRATA_E_FORMAT, "qwen3-coder tool call: unterminated <function=");
    const char *fe = find(gt, e, "</function>");
    if (!fe)
        fe = e;
    cJSON *args = cJSON_CreateObject();
    if (!args)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    const char *q = gt + 1;
    for (;;) {
        const char *ps = find(q, fe, "<parameter=");
        if (!ps)
            break;
        ps += 11;
        const char *pg = memchr(ps, '>', (size_t)(fe - ps));
        if (!pg)
            break;
        const char *vs = pg + 1, *ve = find(vs, fe, "</parameter>");
        const char *next = ve ? ve + 12 : NULL;
        if (!ve) {
            /* a missing close tag ends at the next parameter */
            ve = find(vs, fe, "<parameter=");
            if (!ve)
                ve = fe;
            next = ve;
        }
        /* the template writes "\n" around each value */
        if (vs < ve && *vs == '\n')
            vs++;
        if (ve > vs && ve[-1] == '\n')
            ve--;
        if (add_param(args, ps, (size_t)(pg - ps), vs, (size_t)(ve - vs))) {
            cJSON_Delete(args);
            return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        }
        q = next;
    }
    const char *ns = f, *ne = gt;
    trim(&ns, &ne);
    return add_call(p, ns, (size_t)(ne - ns), NULL, 0, args, NULL, 0, err, "qwen3-coder");
}

/* <tool_call>\n<function=NAME>...</function>\n</tool_call> */
static int parse_qwen3_coder_call(struct parsed *p, const char *s, const char *e,
                                  struct strata_err *err)
{
    const char *f = find(s, e, "<function=");
    if (!f)
        return strata_err_set(err, STRATA_E_FORMAT, "qwen3-coder tool call without <function=");
    return parse_qwen3_function(p, f + 10, e, err);
}

/* <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>...</tool_call> */
static int parse_glm_call(struct parsed *p, const char *s, const char *e, struct strata_err *err)
{
    const char *ne = find(s, e, "<arg_key>");
    if (!ne)
        ne = e;
    const char *ns = s;
    trim(&ns, &ne);
    cJSON *args = cJSON_CreateObject();
    if (!args)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    const char *q = s;
    for (;;) {
        const char *ks = find(q, e, "<arg_key>");
        if (!ks)
            break;
        ks += 9;
        const char *ke = find(ks, e, "</arg_key>");
        const char *vs = ke ? find(ke, e, "<arg_value>") : NULL;
        const char *ve = vs ? find(vs, e, "</arg_value>") : NULL;
        if (!ve) {
            cJSON_Delete(args);
            return strata_err_set(err, STRATA_E_FORMAT,
                                  "glm-4.5 tool call: unterminated <arg_key>/<arg_value>");
        }
        vs += 11;
        if (add_param(args, ks, (size_t)(ke - ks), vs, (size_t)(ve - vs))) {
            cJSON_Delete(args);
            return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        }
        q = ve + 12;
    }
    return add_call(p, ns, (size_t)(ne - ns), NULL, 0, args, NULL, 0, err, "glm-4.5");
}

/* <invoke name="N"><parameter name="K">V</parameter>...</invoke> (MiniMax-M2) */
static int parse_minimax_calls(struct parsed *p, const char *s, const char *e,
                               struct strata_err *err)
{
    const char *q = s;
    int rc;
    for (;;) {
        const char *is = find(q, e, "<invoke name=\"");
        if (!is)
            return 0;
        is += 14;
        const char *iq = memchr(is, '"', (size_t)(e - is));
        const char *ie = iq ? find(iq, e, "</invoke>") : NULL;
        if (!ie)
            return strata_err_set(err, STRATA_E_FORMAT, "minimax-m2 tool call: unterminated <invoke>");
        cJSON *args = cJSON_CreateObject();
        if (!args)
            return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        const char *r = iq;
        for (;;) {
            const char *ps = find(r, ie, "<parameter name=\"");
            if (!ps)
                break;
            ps += 17;
            const char *pq = memchr(ps, '"', (size_t)(ie - ps));
            const char *pg = pq ? memchr(pq, '>', (size_t)(ie - pq)) : NULL;
            const char *pe = pg ? find(pg, ie, "</parameter>") : NULL;
            if (!pe) {
                cJSON_Delete(args);
                return strata_err_set(err, STRATA_E_FORMAT,
                                      "minimax-m2 tool call: unterminated <parameter>");
            }
            if (add_param(args, ps, (size_t)(pq - ps), pg + 1, (size_t)(pe - pg - 1))) {
                cJSON_Delete(args);
                return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
            }
            r = pe + 12;
        }
        if ((rc = add_call(p, is, (size_t)(iq - is), NULL, 0, args, NULL, 0, err, "minimax-m2")))
            return rc;
        q = ie + 9;
    }
}

/* Hermes: {"name": ..., "arguments": {...}} */
static int parse_hermes_call(struct parsed *p, const char *s, const char *e,
                             struct strata_err *err)
{
    trim(&s, &e);
    cJSON *j = cJSON_ParseWithLength(s, (size_t)(e - s));
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
    cJSON *args = cJSON_DetachItemFromObjectCaseSensitive(j, "arguments");
    if (!args)
        args = cJSON_DetachItemFromObjectCaseSensitive(j, "parameters");
    int rc;
    if (!cJSON_IsString(name)) {
        rc = strata_err_set(err, STRATA_E_FORMAT,
                            "hermes tool call is not a JSON object with a \"name\"");
    } else if (cJSON_IsString(args)) {
        /* arguments given as JSON text */
        rc = add_call(p, name->valuestring, strlen(name->valuestring), args->valuestring,
                      strlen(args->valuestring), NULL, NULL, 0, err, "hermes");
    } else {
        if (!args)
            args = cJSON_CreateObject();
        if (!cJSON_IsObject(args)) {
            cJSON_Delete(args);
            args = NULL;
            rc = strata_err_set(err, STRATA_E_FORMAT, "hermes tool call '%s': arguments are not an object",
                                name->valuestring);
        } else {
            rc = add_call(p, name->valuestring, strlen(name->valuestring), NULL, 0, args, NULL, 0,
                          err, "hermes");
            args = NULL;
        }
    }
    if (cJSON_IsString(args) || rc)
        cJSON_Delete(args);
    cJSON_Delete(j);
    return rc;
}

/* Calls wrapped in open/close tags, text between them is content. */
static int parse_wrapped(struct parsed *p, const char *s, const char *e, const char *open,
                         const char *close, int (*one)(struct parsed *, const char *,
                                                       const char *, struct strata_err *),
                         const char *fmt, struct strata_err *err)
{
    size_t on = strlen(open), cn = strlen(close);
    int rc;
    for (;;) {
        const char *a = find(s, e, open);
        if (!a)
            return add_text(p, s, (size_t)(e - s)) ? strata_err_set(err, STRATA_E_NOMEM, "out of memory") : 0;
        if (add_text(p, s, (size_t)(a - s)))
            return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        p->marked = 1;
        const char *b = find(a + on, e, close);
        if (!b) {
            /* generation stopped at the close tag (a stop string) or was cut */
            b = e;
            if ((rc = one(p, a + on, b, err)))
                return strata_err_wrap(err, "%s: unterminated %s", fmt, open);
            return 0;
        }
        if ((rc = one(p, a + on, b, err)))
            return rc;
        s = b + cn;
    }
}

#define DS_CALLS_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALLS_END "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_CALL_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALL_END "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_SEP "<\xef\xbd\x9ctool\xe2\x96\x81" "sep\xef\xbd\x9c>"
#define DS_EOS "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>"

static int parse_deepseek(struct parsed *p, const char *s, const char *e, struct strata_err *err)
{
    const char *eos = find(s, e, DS_EOS);
    if (eos)
        e = eos;
    const char *a = find(s, e, DS_CALLS_BEGIN);
    if (!a)
        return add_text(p, s, (size_t)(e - s)) ? strata_err_set(err, STRATA_E_NOMEM, "out of memory") : 0;
    if (add_text(p, s, (size_t)(a - s)))
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    p->marked = 1;
    const char *q = a + strlen(DS_CALLS_BEGIN);
    const char *end = find(q, e, DS_CALLS_END);
    if (!end)
        end = e;
    int rc;
    for (;;) {
        const char *cb = find(q, end, DS_CALL_BEGIN);
        if (!cb)
            break;
        cb += strlen(DS_CALL_BEGIN);
        const char *sep = find(cb, end, DS_SEP);
        if (!sep)
            return strata_err_set(err, STRATA_E_FORMAT, "deepseek-v3.1 tool call without a separator");
        const char *ce = find(sep, end, DS_CALL_END);
        const char *as = sep + strlen(DS_SEP);
        if (!ce)
            ce = end;
        const char *ns = cb, *ne = sep;
        /* DeepSeek V3 (not V3.1) writes "function<sep>NAME\n```json\nARGS\n```" */
        trim(&ns, &ne);
        if ((rc = add_call(p, ns, (size_t)(ne - ns), as, (size_t)(ce - as), NULL, NULL, 0, err,
                           "deepseek-v3.1")))
            return rc;
        q = ce < end ? ce + strlen(DS_CALL_END) : end;
    }
    if (end < e) {
        const char *rest = end + strlen(DS_CALLS_END);
        if (add_text(p, rest, (size_t)(e - rest)))
            return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    }
    return 0;
}

static int parse_kimi(struct parsed *p, const char *s, const char *e, struct strata_err *err)
{
    const char *a = find(s, e, "<|tool_calls_section_begin|>");
    if (!a)
        return add_text(p, s, (size_t)(e - s)) ? strata_err_set(err, STRATA_E_NOMEM, "out of memory") : 0;
    if (add_text(p, s, (size_t)(a - s)))
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    p->marked = 1;
    const char *q = a + 28;
    const char *end = find(q, e, "<|tool_calls_section_end|>");
    if (!end)
        end = e;
    int rc;
    for (;;) {
        const char *cb = find(q, end, "<|tool_call_begin|>");
        if (!cb)
            break;
        cb += 19;
        const char *ab = find(cb, end, "<|tool_call_argument_begin|>");
        if (!ab)
            return strata_err_set(err, STRATA_E_FORMAT, "kimi-k2 tool call without arguments");
        const char *as = ab + 28, *ce = find(as, end, "<|tool_call_end|>");
        if (!ce)
            ce = end;
        /* the id is "functions.NAME:INDEX" */
        const char *is = cb, *ie = ab;
        trim(&is, &ie);
        const char *ns = is, *ne = ie;
        if (starts(ns, ne, "functions."))
            ns += 10;
        const char *colon = ne;
        while (colon > ns && colon[-1] != ':')
            colon--;
        if (colon > ns)
            ne = colon - 1;
        if ((rc = add_call(p, ns, (size_t)(ne - ns), as, (size_t)(ce - as), NULL, is,
                           (size_t)(ie - is), err, "kimi-k2")))
            return rc;
        q = ce < end ? ce + 17 : end;
    }
    if (end < e && add_text(p, end + 26, (size_t)(e - end - 26)))
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    return 0;
}

/* gpt-oss harmony: a sequence of messages
 *   [<|start|>assistant][ to=functions.NAME]<|channel|>CH[ to=functions.NAME][ <|constrain|>json]
 *   <|message|>BODY(<|end|>|<|call|>|<|return|>|end of text)
 * analysis -> reasoning, final (and commentary without recipient) -> content,
 * a recipient functions.NAME -> a tool call with BODY as arguments. */
static int parse_harmony(struct parsed *p, const char *s, const char *e, struct strata_err *err,
                         char **reasoning)
{
    const char *q = s;
    int rc;
    size_t rn = 0;
    if (!find(s, e, "<|channel|>") && !find(s, e, "<|message|>"))
        return add_text(p, s, (size_t)(e - s)) ? strata_err_set(err, STRATA_E_NOMEM, "out of memory") : 0;
    p->marked = 1;
    while (q < e) {
        const char *m = find(q, e, "<|message|>");
        if (!m)
            break;
        const char *hs = q, *he = m; /* header */
        const char *bs = m + 11, *be = e, *next = e;
        const char *cands[3] = { find(bs, e, "<|end|>"), find(bs, e, "<|call|>"),
                                 find(bs, e, "<|return|>") };
        for (int i = 0; i < 3; i++)
            if (cands[i] && cands[i] < be) {
                be = cands[i];
                next = cands[i] + (i == 0 ? 7 : i == 1 ? 8 : 10);
            }
        const char *st = find(next, e, "<|start|>");
        if (st && st == next)
            next = st + 9;
        const char *ch = find(hs, he, "<|channel|>");
        const char *to = find(hs, he, "to=");
        char chan[32] = "";
        if (ch) {
            const char *cs = ch + 11, *ce = cs;
            while (ce < he && isalpha((unsigned char)*ce))
                ce++;
            snprintf(chan, sizeof chan, "%.*s", (int)(ce - cs), cs);
        }
        if (to) {
            const char *ns = to + 3, *ne = ns;
            while (ne < he && !isspace((unsigned char)*ne) && *ne != '<')
                ne++;
            if (starts(ns, ne, "functions."))
                ns += 10;
            if ((rc = add_call(p, ns, (size_t)(ne - ns), bs, (size_t)(be - bs), NULL, NULL, 0, err,
                               "gpt-oss")))
                return rc;
        } else if (!strcmp(chan, "analysis")) {
            size_t add = (size_t)(be - bs);
            char *r = realloc(*reasoning, rn + add + 1);
            if (!r)
                return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
            memcpy(r + rn, bs, add);
            rn += add;
            r[rn] = 0;
            *reasoning = r;
        } else if (add_text(p, bs, (size_t)(be - bs))) {
            return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        }
        q = next;
    }
    return 0;
}

static int hermes_one(struct parsed *p, const char *s, const char *e, struct strata_err *err)
{
    return parse_hermes_call(p, s, e, err);
}

int strata_chat_prompt_opens_reasoning(const char *prompt, size_t len)
{
    const char *e = prompt + len;
    while (e > prompt && isspace((unsigned char)e[-1]))
        e--;
    return (size_t)(e - prompt) >= 7 && memcmp(e - 7, "<think>", 7) == 0;
}

int strata_chat_parse(enum strata_chat_format f, const char *text, size_t len, unsigned flags,
                      cJSON **message, struct strata_err *err)
{
    struct parsed p = { 0 };
    cJSON *msg = NULL;
    const char *s = text, *e = text + len;
    char *reasoning = NULL;
    int rc = 0;
    *message = NULL;
    if (!(p.calls = cJSON_CreateArray()) || add_text(&p, "", 0))
        goto nomem;
    /* <think>...</think> reasoning, or text that starts inside it */
    if (f != STRATA_CHAT_FORMAT_PLAIN && f != STRATA_CHAT_FORMAT_GPT_OSS) {
        const char *rs = NULL, *re = NULL, *after = NULL;
        const char *lead = s;
        while (lead < e && isspace((unsigned char)*lead))
            lead++;
        if (flags & STRATA_CHAT_PARSE_IN_REASONING) {
            rs = s;
            if (starts(lead, e, "<think>"))
                rs = lead + 7;
        } else if (starts(lead, e, "<think>")) {
            rs = lead + 7;
        }
        if (rs) {
            re = find(rs, e, "</think>");
            after = re ? re + 8 : e;
            if (!re)
                re = e;
            const char *a = rs, *b = re;
            trim(&a, &b);
            if (!(reasoning = strndup(a, (size_t)(b - a))))
                goto nomem;
            s = after;
            p.marked = 1;
        }
    }
    switch (f) {
    case STRATA_CHAT_FORMAT_HERMES:
        rc = parse_wrapped(&p, s, e, "<tool_call>", "</tool_call>", hermes_one, "hermes", err);
        break;
    case STRATA_CHAT_FORMAT_QWEN3_CODER:
        /* models sometimes drop the <tool_call> wrapper around <function=...> */
        if (!find(s, e, "<tool_call>") && find(s, e, "<function="))
            rc = parse_wrapped(&p, s, e, "<function=", "</function>", parse_qwen3_function,
                               "qwen3-coder", err);
        else
            rc = parse_wrapped(&p, s, e, "<tool_call>", "</tool_call>", parse_qwen3_coder_call,
                               "qwen3-coder", err);
        break;
    case STRATA_CHAT_FORMAT_GLM45:
        rc = parse_wrapped(&p, s, e, "<tool_call>", "</tool_call>", parse_glm_call, "glm-4.5", err);
        break;
    case STRATA_CHAT_FORMAT_MINIMAX_M2: {
        const char *a = find(s, e, "<minimax:tool_call>");
        if (!a) {
            if (add_text(&p, s, (size_t)(e - s)))
                goto nomem;
            break;
        }
        if (add_text(&p, s, (size_t)(a - s)))
            goto nomem;
        p.marked = 1;
        const char *b = find(a, e, "</minimax:tool_call>");
        rc = parse_minimax_calls(&p, a, b ? b : e, err);
        if (!rc && b && add_text(&p, b + 20, (size_t)(e - b - 20)))
            goto nomem;
        break;
    }
    case STRATA_CHAT_FORMAT_DEEPSEEK_V31:
        rc = parse_deepseek(&p, s, e, err);
        break;
    case STRATA_CHAT_FORMAT_KIMI_K2:
        rc = parse_kimi(&p, s, e, err);
        break;
    case STRATA_CHAT_FORMAT_GPT_OSS:
        rc = parse_harmony(&p, s, e, err, &reasoning);
        break;
    default:
        if (add_text(&p, s, (size_t)(e - s)))
            goto nomem;
        break;
    }
    if (rc)
        goto out;
    if (!(msg = cJSON_CreateObject()) || !cJSON_AddStringToObject(msg, "role", "assistant"))
        goto nomem;
    const char *cs = p.content, *ce = p.content + p.content_n;
    if (p.marked)
        trim(&cs, &ce);
    int n_calls = cJSON_GetArraySize(p.calls);
    if (cs == ce && n_calls > 0) {
        if (!cJSON_AddNullToObject(msg, "content"))
            goto nomem;
    } else {
        char *c = strndup(cs, (size_t)(ce - cs));
        cJSON *item = c ? cJSON_CreateString(c) : NULL;
        free(c);
        if (!item || !cJSON_AddItemToObject(msg, "content", item)) {
            cJSON_Delete(item);
            goto nomem;
        }
    }
    if (reasoning && *reasoning && !cJSON_AddStringToObject(msg, "reasoning_content", reasoning))
        goto nomem;
    if (n_calls > 0) {
        cJSON_AddItemToObject(msg, "tool_calls", p.calls);
        p.calls = NULL;
    }
    *message = msg;
    msg = NULL;
    goto out;
nomem:
    rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
out:
    cJSON_Delete(msg);
    cJSON_Delete(p.calls);
    free(p.content);
    free(reasoning);
    return rc;
}
