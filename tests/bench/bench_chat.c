/* bench_chat.c - time rendering a chat template with many tools and messages.
 *
 *   bench_chat [TEMPLATE.jinja [N_TOOLS [N_MESSAGES]]]
 *
 * Default: the Qwen3-Coder template from the fixtures, 20 tools (each with four
 * typed parameters, one an enum, one nested) and 50 messages (system, then user /
 * assistant turns where every third assistant turn calls a tool and a tool result
 * follows).  Prints the parse time and the best and median render time of 200 runs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (p) {
        *len = fread(p, 1, (size_t)n, f);
        p[*len] = 0;
    }
    fclose(f);
    return p;
}

static cJSON *make_request(int n_tools, int n_msgs)
{
    cJSON *req = cJSON_CreateObject();
    cJSON *tools = cJSON_AddArrayToObject(req, "tools");
    char buf[256];
    for (int i = 0; i < n_tools; i++) {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddStringToObject(t, "type", "function");
        cJSON *fn = cJSON_AddObjectToObject(t, "function");
        snprintf(buf, sizeof buf, "tool_%02d", i);
        cJSON_AddStringToObject(fn, "name", buf);
        snprintf(buf, sizeof buf, "Tool number %d: reads, searches or edits files in the "
                                  "workspace and reports what it did.", i);
        cJSON_AddStringToObject(fn, "description", buf);
        cJSON *par = cJSON_AddObjectToObject(fn, "parameters");
        cJSON_AddStringToObject(par, "type", "object");
        cJSON *props = cJSON_AddObjectToObject(par, "properties");
        cJSON *p = cJSON_AddObjectToObject(props, "path");
        cJSON_AddStringToObject(p, "type", "string");
        cJSON_AddStringToObject(p, "description", "Path of the file, relative to the root");
        p = cJSON_AddObjectToObject(props, "line");
        cJSON_AddStringToObject(p, "type", "integer");
        cJSON_AddStringToObject(p, "description", "1-based line number");
        p = cJSON_AddObjectToObject(props, "mode");
        cJSON_AddStringToObject(p, "type", "string");
        const char *modes[] = { "read", "write", "append" };
        cJSON_AddItemToObject(p, "enum", cJSON_CreateStringArray(modes, 3));
        p = cJSON_AddObjectToObject(props, "options");
        cJSON_AddStringToObject(p, "type", "object");
        cJSON *np = cJSON_AddObjectToObject(p, "properties");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(np, "recursive"), "type", "boolean");
        const char *req_names[] = { "path", "mode" };
        cJSON_AddItemToObject(par, "required", cJSON_CreateStringArray(req_names, 2));
        cJSON_AddItemToArray(tools, t);
    }
    cJSON *msgs = cJSON_AddArrayToObject(req, "messages");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "system");
    cJSON_AddStringToObject(m, "content", "You are a careful coding agent. Prefer small edits.");
    cJSON_AddItemToArray(msgs, m);
    int k = 1, turn = 0;
    while (k < n_msgs) {
        m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "user");
        snprintf(buf, sizeof buf, "Step %d: open src/module_%d.c, find the bug near line %d "
                                  "and fix it; explain briefly.", turn, turn, 10 * turn + 3);
        cJSON_AddStringToObject(m, "content", buf);
        cJSON_AddItemToArray(msgs, m);
        if (++k >= n_msgs)
            break;
        m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "assistant");
        if (turn % 3 == 0 && k + 1 < n_msgs) {
            cJSON_AddStringToObject(m, "content", "Let me look at the file.");
            cJSON *calls = cJSON_AddArrayToObject(m, "tool_calls");
            cJSON *c = cJSON_CreateObject();
            cJSON_AddStringToObject(c, "type", "function");
            cJSON *fn = cJSON_AddObjectToObject(c, "function");
            snprintf(buf, sizeof buf, "tool_%02d", turn % (n_tools ? n_tools : 1));
            cJSON_AddStringToObject(fn, "name", buf);
            cJSON *args = cJSON_AddObjectToObject(fn, "arguments");
            snprintf(buf, sizeof buf, "src/module_%d.c", turn);
            cJSON_AddStringToObject(args, "path", buf);
            cJSON_AddNumberToObject(args, "line", 10 * turn + 3);
            cJSON_AddStringToObject(args, "mode", "read");
            cJSON_AddItemToArray(calls, c);
            cJSON_AddItemToArray(msgs, m);
            k++;
            m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", "tool");
            cJSON_AddStringToObject(m, "content",
                                    "int f(int x)\n{\n    return x + 1; /* off by one? */\n}\n");
        } else {
            cJSON_AddStringToObject(m, "content",
                                    "Fixed: the loop bound was off by one. The test passes now.");
        }
        cJSON_AddItemToArray(msgs, m);
        k++;
        turn++;
    }
    return req;
}

int main(int argc, char **argv)
{
    char def[4096];
    const char *fx = getenv("STRATA_FIXTURES");
    snprintf(def, sizeof def, "%s/templates/Qwen3-Coder.jinja", fx && *fx ? fx : "../shared/fixtures");
    const char *path = argc > 1 ? argv[1] : def;
    int n_tools = argc > 2 ? atoi(argv[2]) : 20, n_msgs = argc > 3 ? atoi(argv[3]) : 50;
    size_t len = 0;
    char *src = slurp(path, &len);
    if (!src) {
        fprintf(stderr, "bench_chat: cannot read '%s'\n", path);
        return 1;
    }
    struct strata_err err = { 0 };
    struct strata_chat *chat = NULL;
    double t0 = now_ms();
    int rc = strata_chat_create(&chat, src, len, path, "<s>", "</s>", &err);
    double t_parse = now_ms() - t0;
    free(src);
    if (rc) {
        fprintf(stderr, "bench_chat: %s\n", err.msg);
        return 1;
    }
    cJSON *req = make_request(n_tools, n_msgs);
    enum { RUNS = 200 };
    double t[RUNS];
    size_t out_len = 0;
    for (int i = 0; i < RUNS; i++) {
        char *out = NULL;
        t0 = now_ms();
        rc = strata_chat_render(chat, req, NULL, &out, &out_len, &err);
        t[i] = now_ms() - t0;
        free(out);
        if (rc) {
            fprintf(stderr, "bench_chat: %s\n", err.msg);
            return 1;
        }
    }
    qsort(t, RUNS, sizeof t[0], cmp_double);
    printf("template %s: parse %.3f ms\n", path, t_parse);
    printf("render %d tools, %d messages -> %zu bytes: best %.3f ms, median %.3f ms, "
           "p95 %.3f ms (%d runs)\n", n_tools, cJSON_GetArraySize(cJSON_GetObjectItem(req, "messages")),
           out_len, t[0], t[RUNS / 2], t[RUNS * 95 / 100], RUNS);
    cJSON_Delete(req);
    strata_chat_free(chat);
    return 0;
}
