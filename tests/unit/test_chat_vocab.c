/* test_chat_vocab.c - the real chat templates carried by the fixture vocabularies
 * (tokenizer.chat_template), with their own bos/eos token texts, render the reference
 * conversations exactly as jinja2 does (tests/data/chat/vocab-reference.json, made by
 * gen_vocab_reference.py). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat.h"
#include "gguf.h"
#include "tap.h"

int main(void)
{
    char path[4096];
    const char *root = getenv("STRATA_ROOT");
    snprintf(path, sizeof path, "%s/tests/data/chat/vocab-reference.json",
             root && *root ? root : ".");
    char *text = tap_slurp(path, NULL);
    if (!ok(text != NULL, "read %s", path))
        return tap_done();
    cJSON *ref = cJSON_Parse(text);
    free(text);
    snprintf(path, sizeof path, "%s/templates/reference.json", tap_fixtures());
    text = tap_slurp(path, NULL);
    cJSON *conv_ref = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!ok(ref && conv_ref, "parse the references"))
        goto out;
    setenv("TZ", "UTC", 1);
    tzset();
    struct strata_jinja_opts opts = { 0 };
    opts.now = 1796040000; /* 2026-11-30 12:00:00 UTC */
    const cJSON *convs = cJSON_GetObjectItem(conv_ref, "conversations");
    const cJSON *v;
    int n = 0;
    cJSON_ArrayForEach(v, cJSON_GetObjectItem(ref, "vocabs"))
    {
        snprintf(path, sizeof path, "%s/vocab/%s", tap_fixtures(), v->string);
        struct strata_gguf *g = NULL;
        struct strata_err err = { 0 };
        if (!ok(strata_gguf_open(&g, path, &err) == 0, "open %s %s", path, err.msg))
            continue;
        /* special tokens come from the vocabulary */
        struct strata_chat *chat = NULL;
        const char *probe = "[{{ bos_token }}|{{ eos_token }}]";
        int rc = strata_chat_create_gguf(&chat, g, probe, strlen(probe), &err);
        char *got = NULL;
        cJSON *req = cJSON_Parse("{\"messages\": []}");
        if (!rc)
            rc = strata_chat_render(chat, req, &opts, &got, NULL, &err);
        char want[512];
        snprintf(want, sizeof want, "[%s|%s]",
                 cJSON_GetStringValue(cJSON_GetObjectItem(v, "bos_token")),
                 cJSON_GetStringValue(cJSON_GetObjectItem(v, "eos_token")));
        ok(rc == 0 && !strcmp(got, want), "%s: bos/eos token texts %s (got %s)", v->string, want,
           rc ? err.msg : got);
        free(got);
        cJSON_Delete(req);
        strata_chat_free(chat);
        chat = NULL;
        rc = strata_chat_create_gguf(&chat, g, NULL, 0, &err);
        if (!ok(rc == 0, "%s: parse tokenizer.chat_template %s", v->string, rc ? err.msg : "")) {
            strata_gguf_close(g);
            continue;
        }
        const cJSON *cs;
        cJSON_ArrayForEach(cs, cJSON_GetObjectItem(v, "cases"))
        {
            const char *exp = cJSON_GetStringValue(cJSON_GetObjectItem(cs, "expected"));
            got = NULL;
            rc = strata_chat_render(chat, cJSON_GetObjectItem(convs, cs->string), &opts, &got,
                                    NULL, &err);
            if (exp)
                ok(rc == 0 && !strcmp(got, exp), "%s / %s renders as jinja2 does %s", v->string,
                   cs->string, rc ? err.msg : "");
            else
                ok(rc == STRATA_E_TEMPLATE, "%s / %s is refused by the template: %s", v->string,
                   cs->string, err.msg);
            free(got);
            n++;
        }
        strata_chat_free(chat);
        strata_gguf_close(g);
    }
    ok(n >= 27, "%d vocabulary template cases", n);
out:
    cJSON_Delete(ref);
    cJSON_Delete(conv_ref);
    return tap_done();
}
