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
    /* transformers passes tools=None when the request has none */
    if (!cJSON_AddItemReferenceToObject(vars, "messages", (cJSON *)messages)
        || !(tools && !cJSON_IsNull(tools)
                 ? cJSON_AddItemReferenceToObject(vars, "tools", (cJSON *)tools)
                 : cJSON_AddNullToObject(vars, "tools") != NULL)
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
