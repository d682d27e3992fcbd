/* test_chat_reference.c - every fixture template x every reference conversation,
 * byte-identical to what Python jinja2 rendered (templates/reference.json); where the
 * reference has an error, the render must fail with the template's message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat.h"
#include "tap.h"

/* first differing byte, for the failure message */
static void show_diff(const char *want, const char *got)
{
    size_t i = 0;
    while (want[i] && want[i] == got[i])
        i++;
    size_t from = i > 40 ? i - 40 : 0;
    diag("first difference at byte %zu", i);
    diag("want: %.80s", want + from);
    diag("got:  %.80s", got + from);
}

int main(void)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/templates/reference.json", tap_fixtures());
    char *text = tap_slurp(path, NULL);
    if (!ok(text != NULL, "read %s", path))
        return tap_done();
    cJSON *ref = cJSON_Parse(text);
    free(text);
    if (!ok(ref != NULL, "parse reference.json"))
        return tap_done();
    /* strftime_now was fixed to a date the file names ("... fixed to 2026-11-30
     * 12:00:00"), in local time */
    setenv("TZ", "UTC", 1);
    tzset();
    struct tm tm = { .tm_year = 126, .tm_mon = 10, .tm_mday = 30, .tm_hour = 12 };
    const char *made = cJSON_GetStringValue(cJSON_GetObjectItem(ref, "made_with"));
    const char *fx = made ? strstr(made, "fixed to ") : NULL;
    int y, mo, d, h, mi, se;
    if (fx && sscanf(fx + 9, "%d-%d-%d %d:%d:%d", &y, &mo, &d, &h, &mi, &se) == 6) {
        tm = (struct tm){ .tm_year = y - 1900, .tm_mon = mo - 1, .tm_mday = d, .tm_hour = h,
                          .tm_min = mi, .tm_sec = se };
    }
    struct strata_jinja_opts opts = { 0 };
    opts.now = timegm(&tm);

    const cJSON *vars = cJSON_GetObjectItem(ref, "variables");
    const cJSON *convs = cJSON_GetObjectItem(ref, "conversations");
    const cJSON *tmpls = cJSON_GetObjectItem(ref, "templates");
    const char *bos = cJSON_GetStringValue(cJSON_GetObjectItem(vars, "bos_token"));
    const char *eos = cJSON_GetStringValue(cJSON_GetObjectItem(vars, "eos_token"));
    if (!ok(cJSON_IsObject(convs) && cJSON_IsObject(tmpls), "reference has conversations and templates"))
        goto done;
    const cJSON *t;
    int n_cases = 0;
    cJSON_ArrayForEach(t, tmpls)
    {
        snprintf(path, sizeof path, "%s/templates/%s", tap_fixtures(), t->string);
        size_t len;
        char *src = tap_slurp(path, &len);
        if (!ok(src != NULL, "read %s", path))
            continue;
        struct strata_chat *chat = NULL;
        struct strata_err err = { 0 };
        int rc = strata_chat_create(&chat, src, len, t->string, bos, eos, &err);
        free(src);
        if (!ok(rc == 0, "parse %s%s%s", t->string, rc ? ": " : "", rc ? err.msg : ""))
            continue;
        const cJSON *cs;
        cJSON_ArrayForEach(cs, t)
        {
            const cJSON *conv = cJSON_GetObjectItem(convs, cs->string);
            const char *want = cJSON_GetStringValue(cJSON_GetObjectItem(cs, "expected"));
            const char *want_err = cJSON_GetStringValue(cJSON_GetObjectItem(cs, "error"));
            if (!conv || (!want && !want_err))
                continue; /* not a conversation entry */
            /* every listed variable reaches the template, as render(**variables) */
            cJSON *req = cJSON_Duplicate(conv, 1);
            cJSON *kw = cJSON_GetObjectItem(req, "chat_template_kwargs");
            if (!kw)
                kw = cJSON_AddObjectToObject(req, "chat_template_kwargs");
            const cJSON *var;
            cJSON_ArrayForEach(var, vars)
            {
                if (!cJSON_GetObjectItem(kw, var->string))
                    cJSON_AddItemToObject(kw, var->string, cJSON_Duplicate(var, 1));
            }
            char *got = NULL;
            struct strata_err e2 = { 0 };
            rc = strata_chat_render(chat, req, &opts, &got, NULL, &e2);
            cJSON_Delete(req);
            n_cases++;
            if (want) {
                int same = rc == 0 && strcmp(got, want) == 0;
                ok(same, "%s / %s renders as jinja2 does%s%s", t->string, cs->string,
                   rc ? ": " : "", rc ? e2.msg : "");
                if (!same && rc == 0)
                    show_diff(want, got);
            } else if (want_err && !strncmp(want_err, "TemplateError: ", 15)) {
                /* raise_exception: "TemplateError: <the template's message>" */
                ok(rc == STRATA_E_TEMPLATE && strcmp(e2.msg, want_err + 15) == 0,
                   "%s / %s fails with the template's message (got %d '%s')", t->string,
                   cs->string, rc, e2.msg);
            } else {
                /* another jinja2 error (undefined value, type error): fail too */
                ok(rc != 0, "%s / %s fails as jinja2 does ('%s'; got %d '%s')", t->string,
                   cs->string, want_err, rc, e2.msg);
            }
            free(got);
        }
        strata_chat_free(chat);
    }
    ok(n_cases >= 100, "%d reference cases", n_cases);
done:
    cJSON_Delete(ref);
    return tap_done();
}
