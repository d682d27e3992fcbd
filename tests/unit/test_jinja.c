/* test_jinja.c - the interpreter against Python jinja2's output for the feature cases
 * in tests/data/jinja/cases.json (made by gen_cases.py), and hostile templates: each
 * must fail with a clear error within bounded time and memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja.h"
#include "tap.h"

/* render src with vars; returns the error code, *out (malloc'ed) on success */
static int render(const char *src, const cJSON *vars, const struct strata_jinja_opts *o,
                  char **out, struct strata_err *err)
{
    struct strata_jinja *t = NULL;
    *out = NULL;
    int rc = strata_jinja_parse(&t, src, strlen(src), "test", err);
    if (rc)
        return rc;
    rc = strata_jinja_render(t, vars, o, out, NULL, err);
    strata_jinja_free(t);
    return rc;
}

static void run_cases(void)
{
    char path[4096];
    const char *root = getenv("STRATA_ROOT");
    snprintf(path, sizeof path, "%s/tests/data/jinja/cases.json", root && *root ? root : ".");
    char *text = tap_slurp(path, NULL);
    if (!ok(text != NULL, "read %s", path))
        return;
    cJSON *doc = cJSON_Parse(text);
    free(text);
    const cJSON *cases = cJSON_GetObjectItem(doc, "cases"), *c;
    int i = 0, n_ok = 0, n = 0;
    /* gen_cases.py fixes strftime_now to 2026-11-30 12:00:00 */
    struct strata_jinja_opts o = { 0 };
    setenv("TZ", "UTC", 1);
    o.now = 1796040000;
    cJSON_ArrayForEach(c, cases)
    {
        const char *src = cJSON_GetStringValue(cJSON_GetObjectItem(c, "template"));
        const char *want = cJSON_GetStringValue(cJSON_GetObjectItem(c, "expected"));
        const char *kind = cJSON_GetStringValue(cJSON_GetObjectItem(c, "error"));
        const char *msg = cJSON_GetStringValue(cJSON_GetObjectItem(c, "message"));
        struct strata_err err = { 0 };
        char *got = NULL;
        int rc = render(src, cJSON_GetObjectItem(c, "vars"), &o, &got, &err);
        int good;
        if (want) {
            good = rc == 0 && strcmp(got, want) == 0;
            if (!good)
                diag("case %d %s (template, expected and actual output are in cases.json order)",
                     i, rc ? err.msg : "differs");
        } else if (kind && !strcmp(kind, "raise")) {
            good = rc == STRATA_E_TEMPLATE && msg && strcmp(err.msg, msg) == 0;
            if (!good)
                diag("case %d: want raise '%s', got %d '%s'", i, msg, rc, err.msg);
        } else {
            /* jinja2 fails: so must we, with a message that points into the template */
            good = rc != 0 && rc != STRATA_E_TEMPLATE && strstr(err.msg, "line ") != NULL;
            if (!good)
                diag("case %d: want an error like '%s', got %d '%s'", i, msg, rc, err.msg);
        }
        char name[64];
        size_t k = 0;
        for (; src[k] && k < sizeof name - 1; k++)
            name[k] = src[k] == '\n' || src[k] == '\r' ? ' ' : src[k];
        name[k] = 0;
        ok(good, "case %d: %s", i, name);
        n_ok += good;
        n++;
        free(got);
        i++;
    }
    ok(n >= 70, "%d/%d jinja2 feature cases", n_ok, n);
    cJSON_Delete(doc);
}

#define K16 "xxxxxxxxxxxxxxxx"
#define K1 K16 K16 K16 K16 K16 K16 K16 K16 K16 K16 K16 K16 K16 K16 K16 K16 \
           K16 K16 K16 K16 K16 K16 K16 K16 K16 K16 K16 K16 K16 K16 K16 K16 \
           K16 K16 K16 K16 K16 K16 K16 K16 K16 K16 K16 K16 K16 K16 K16 K16 \
           K16 K16 K16 K16 K16 K16 K16 K16 K16 K16 K16 K16 K16 K16 K16 K16

struct hostile {
    const char *name, *src;
    int code;          /* expected error code */
    const char *needle; /* text the message must contain */
};

static void run_hostile(void)
{
    static const struct hostile h[] = {
        { "unbounded range", "{% for i in range(1000000000000) %}x{% endfor %}", STRATA_E_LIMIT,
          "loop limit" },
        { "nested loops", "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}"
          "{% endfor %}", STRATA_E_LIMIT, "iterations" },
        { "loop over a growing list", "{% set ns = namespace(l=[1]) %}{% for i in range(100000) %}"
          "{% for j in ns.l %}{% endfor %}{% set ns.l = ns.l + ns.l %}{% endfor %}", STRATA_E_LIMIT, "" },
        { "infinite recursion", "{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}",
          STRATA_E_LIMIT, "macro calls nested" },
        { "mutual recursion", "{% macro a() %}{{ b() }}{% endmacro %}{% macro b() %}{{ a() }}"
          "{% endmacro %}{{ a() }}", STRATA_E_LIMIT, "line 1 column" },
        { "1 GB output", "{% for i in range(1000000) %}" K1 "{% endfor %}", STRATA_E_LIMIT,
          "output exceeds" },
        { "1 GB output from one expression", "{{ 'x' * 1000000000 }}", STRATA_E_LIMIT,
          "exceeds" },
        { "string doubling", "{% set ns = namespace(s='x') %}{% for i in range(64) %}"
          "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}", STRATA_E_LIMIT, "" },
        { "repeat overflow", "{{ 'ab' * 9223372036854775807 }}", STRATA_E_LIMIT, "exceeds" },
        { "memory growth", "{% set ns = namespace(l=[]) %}{% for i in range(1000000) %}"
          "{% set ns.l = ns.l + [i, i, i, i] %}{% endfor %}", STRATA_E_LIMIT, "memory" },
        { "self-containing namespace", "{% set ns = namespace(a=1) %}{% set ns.self = ns %}{{ ns }}",
          STRATA_E_LIMIT, "nested too deeply" },
        { "comparing a value nested 100000 deep",
          "{%- set ns = namespace(l=[]) -%}{%- for i in range(100000) -%}{%- set ns.l = [ns.l] -%}"
          "{%- endfor -%}{{ [ns.l] < [ns.l] }}", STRATA_E_LIMIT, "nested too deeply" },
        { "printing a value nested 100000 deep",
          "{%- set ns = namespace(l=[]) -%}{%- for i in range(100000) -%}{%- set ns.l = [ns.l] -%}"
          "{%- endfor -%}{{ ns.l }}", STRATA_E_LIMIT, "nested too deeply" },
        { "unterminated variable", "a\nb {{ x", STRATA_E_FORMAT, "line 2 column 3" },
        { "unterminated block", "{% if x", STRATA_E_FORMAT, "line 1 column 1" },
        { "unclosed if", "{% if x %}\nyes\n", STRATA_E_FORMAT, "expected 'endif'" },
        { "unclosed for", "{% for x in y %}\n", STRATA_E_FORMAT, "expected 'endfor'" },
        { "unterminated comment", "x {# no end", STRATA_E_FORMAT, "unterminated comment" },
        { "unterminated raw", "{% raw %} never", STRATA_E_FORMAT, "unterminated raw" },
        { "unterminated string", "{{ 'abc }}", STRATA_E_FORMAT, "unterminated string" },
        { "stray endif", "{% endif %}", STRATA_E_FORMAT, "unknown statement 'endif'" },
        { "unknown statement", "\n\n  {% frobnicate %}", STRATA_E_FORMAT, "line 3 column" },
        { "bad expression", "{{ 1 + }}", STRATA_E_FORMAT, "expected an expression" },
    };
    for (size_t i = 0; i < sizeof h / sizeof h[0]; i++) {
        struct strata_err err = { 0 };
        char *out = NULL;
        struct strata_jinja_opts o = { 0 };
        o.limits.max_loop_iters = 2000000; /* keeps the suite fast under ASan */
        o.limits.max_steps = 10000000;
        o.limits.max_memory = 64u << 20;
        int rc = render(h[i].src, NULL, &o, &out, &err);
        ok(rc == h[i].code && strstr(err.msg, h[i].needle) != NULL,
           "hostile: %s -> %d '%s'", h[i].name, rc, err.msg);
        free(out);
    }
    /* nesting deeper than the parser allows must fail, not overflow the C stack */
    size_t depth = 100000;
    char *deep = malloc(depth * 2 + 16);
    char *p = deep;
    p += sprintf(p, "{{ ");
    for (size_t i = 0; i < depth; i++)
        *p++ = '(';
    *p++ = '1';
    for (size_t i = 0; i < depth; i++)
        *p++ = ')';
    strcpy(p, " }}");
    struct strata_err err = { 0 };
    char *out = NULL;
    int rc = render(deep, NULL, NULL, &out, &err);
    ok(rc == STRATA_E_LIMIT && strstr(err.msg, "nested too deeply"), "hostile: 100000 parentheses -> %s",
       err.msg);
    free(out);
    free(deep);
    /* a flat chain of 5000 operators makes a tree 5000 deep: refused when parsed */
    char *chain = malloc(5000 * 4 + 16);
    p = chain;
    p += sprintf(p, "{{ 1");
    for (int i = 0; i < 5000; i++)
        p += sprintf(p, " ~ 1");
    strcpy(p, " }}");
    memset(&err, 0, sizeof err);
    rc = render(chain, NULL, NULL, &out, &err);
    ok(rc == STRATA_E_LIMIT && strstr(err.msg, "nested too deeply"),
       "hostile: a chain of 5000 '~' -> %s", err.msg);
    free(out);
    free(chain);
    size_t nb = 20000;
    char *blocks = malloc(nb * 24 + 16);
    p = blocks;
    for (size_t i = 0; i < nb; i++)
        p += sprintf(p, "{%% if 1 %%}");
    for (size_t i = 0; i < nb; i++)
        p += sprintf(p, "{%% endif %%}");
    memset(&err, 0, sizeof err);
    rc = render(blocks, NULL, NULL, &out, &err);
    ok(rc == STRATA_E_LIMIT && strstr(err.msg, "nested too deeply"), "hostile: 20000 nested ifs -> %s",
       err.msg);
    free(out);
    free(blocks);
}

static void run_api(void)
{
    /* variables: JSON numbers become ints when integral */
    cJSON *vars = cJSON_Parse("{\"a\": 3, \"b\": 2.5, \"c\": [1, \"x\"], \"d\": {\"k\": null}}");
    char *out = NULL;
    struct strata_err err = { 0 };
    int rc = render("{{ a / 2 }} {{ a // 2 }} {{ b }} {{ c }} {{ d.k }} {{ d | tojson }}", vars,
                    NULL, &out, &err);
    ok(rc == 0 && !strcmp(out, "1.5 1 2.5 [1, 'x'] None {\"k\": null}"), "variables from JSON: %s",
       rc ? err.msg : out);
    free(out);
    cJSON_Delete(vars);
    /* the parsed template is reusable and its renders independent */
    struct strata_jinja *t = NULL;
    rc = strata_jinja_parse(&t, "{% set x = (x or 0) + 1 %}{{ x }}", 33, "reuse", &err);
    char *o1 = NULL, *o2 = NULL;
    if (!rc)
        rc = strata_jinja_render(t, NULL, NULL, &o1, NULL, &err);
    if (!rc)
        rc = strata_jinja_render(t, NULL, NULL, &o2, NULL, &err);
    ok(rc == 0 && !strcmp(o1, "1") && !strcmp(o2, "1"), "renders do not share state");
    free(o1);
    free(o2);
    strata_jinja_free(t);
    /* the time strftime_now formats comes from the options */
    struct strata_jinja_opts o = { 0 };
    o.now = 86400 * 365;
    setenv("TZ", "UTC", 1);
    rc = render("{{ strftime_now('%Y-%m-%d') }}", NULL, &o, &out, &err);
    ok(rc == 0 && !strcmp(out, "1971-01-01"), "strftime_now uses opts.now: %s", rc ? err.msg : out);
    free(out);
    /* output limit is exact */
    o.limits.max_output = 10;
    rc = render("{{ 'x' * 10 }}", NULL, &o, &out, &err);
    ok(rc == 0 && strlen(out) == 10, "output of exactly max_output bytes is allowed");
    free(out);
    rc = render("{{ 'x' * 10 }}y", NULL, &o, &out, &err);
    ok(rc == STRATA_E_LIMIT, "one byte more is refused: %s", err.msg);
    free(out);
}

int main(void)
{
    run_cases();
    run_hostile();
    run_api();
    return tap_done();
}
