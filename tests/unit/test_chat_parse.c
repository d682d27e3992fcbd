/* test_chat_parse.c - generated assistant text back to content / reasoning / tool calls.
 *
 * Round trips: the assistant turns that the real templates render (fixtures
 * templates/reference.json, and renders of an assistant turn carrying reasoning and a
 * tool call) parse back into the same structured calls and reasoning.  Plain text is
 * left alone; malformed calls are refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "tap.h"

struct turn {
    const char *tmpl;
    enum strata_chat_format format;
    const char *after; /* first marker after "Weather in Paris?"; the turn starts after it */
    const char *end;   /* the turn ends before this */
};

#define DS_ASSISTANT "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"
#define DS_EOS "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>"

static const struct turn turns[] = {
    { "Qwen3-Coder.jinja", STRATA_CHAT_FORMAT_QWEN3_CODER, "<|im_start|>assistant\n", "<|im_end|>" },
    { "Qwen3.5-4B.jinja", STRATA_CHAT_FORMAT_QWEN3_CODER, "<|im_start|>assistant\n", "<|im_end|>" },
    { "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", STRATA_CHAT_FORMAT_QWEN3_CODER,
      "<|im_start|>assistant\n", "<|im_end|>" },
    { "Qwen-Qwen3-0.6B.jinja", STRATA_CHAT_FORMAT_HERMES, "<|im_start|>assistant\n", "<|im_end|>" },
    { "Qwen-QwQ-32B.jinja", STRATA_CHAT_FORMAT_HERMES, "<|im_start|>assistant\n", "<|im_end|>" },
    { "deepseek-ai-DeepSeek-V3.1.jinja", STRATA_CHAT_FORMAT_DEEPSEEK_V31, DS_ASSISTANT, DS_EOS },
    { "GLM-4.6.jinja", STRATA_CHAT_FORMAT_GLM45, "<|assistant|>", "<|observation|>" },
    { "openai-gpt-oss-120b.jinja", STRATA_CHAT_FORMAT_GPT_OSS, "<|start|>assistant",
      "<|start|>functions" },
    { "moonshotai-Kimi-K2.jinja", STRATA_CHAT_FORMAT_KIMI_K2,
      "<|im_assistant|>assistant<|im_middle|>", "<|im_end|>" },
    { "MiniMax-M2.jinja", STRATA_CHAT_FORMAT_MINIMAX_M2, "]~b]ai\n", "[e~[" },
};

/* each call's name and parsed arguments equal the request's */
static int same_calls(const cJSON *want, const cJSON *got, char *why, size_t why_n)
{
    if (cJSON_GetArraySize(want) != cJSON_GetArraySize(got)) {
        snprintf(why, why_n, "%d calls, want %d", cJSON_GetArraySize(got),
                 cJSON_GetArraySize(want));
        return 0;
    }
    for (int i = 0; i < cJSON_GetArraySize(want); i++) {
        const cJSON *w = cJSON_GetObjectItem(cJSON_GetArrayItem(want, i), "function");
        const cJSON *g = cJSON_GetObjectItem(cJSON_GetArrayItem(got, i), "function");
        const char *wn = cJSON_GetStringValue(cJSON_GetObjectItem(w, "name"));
        const char *gn = cJSON_GetStringValue(cJSON_GetObjectItem(g, "name"));
        const char *ga = cJSON_GetStringValue(cJSON_GetObjectItem(g, "arguments"));
        cJSON *args = ga ? cJSON_Parse(ga) : NULL;
        int same = wn && gn && !strcmp(wn, gn) && args
                && cJSON_Compare(cJSON_GetObjectItem(w, "arguments"), args, 1);
        if (!same)
            snprintf(why, why_n, "call %d: %s(%s), want %s", i, gn ? gn : "?", ga ? ga : "?",
                     wn ? wn : "?");
        cJSON_Delete(args);
        if (!same)
            return 0;
    }
    return 1;
}

static void round_trip_reference(const cJSON *ref)
{
    const cJSON *conv = cJSON_GetObjectItem(cJSON_GetObjectItem(ref, "conversations"), "tools-call");
    const cJSON *want = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(conv, "messages"), 1),
                                            "tool_calls");
    for (size_t i = 0; i < sizeof turns / sizeof turns[0]; i++) {
        const struct turn *t = &turns[i];
        const char *exp = cJSON_GetStringValue(cJSON_GetObjectItem(
            cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(ref, "templates"), t->tmpl),
                                "tools-call"),
            "expected"));
        char path[4096];
        snprintf(path, sizeof path, "%s/templates/%s", tap_fixtures(), t->tmpl);
        size_t len;
        char *src = tap_slurp(path, &len);
        ok(src && strata_chat_detect_format(src, len) == t->format, "%s: format detected as %s",
           t->tmpl, strata_chat_format_name(t->format));
        free(src);
        const char *q = exp ? strstr(exp, "Weather in Paris?") : NULL;
        const char *a = q ? strstr(q, t->after) : NULL;
        const char *b = a ? strstr(a + strlen(t->after), t->end) : NULL;
        if (!ok(b != NULL, "%s: assistant turn found in the reference rendering", t->tmpl))
            continue;
        a += strlen(t->after);
        cJSON *msg = NULL;
        struct strata_err err = { 0 };
        int rc = strata_chat_parse(t->format, a, (size_t)(b - a), 0, &msg, &err);
        char why[512] = "";
        int good = rc == 0 && same_calls(want, cJSON_GetObjectItem(msg, "tool_calls"), why, sizeof why);
        const cJSON *content = cJSON_GetObjectItem(msg, "content");
        good = good && (cJSON_IsNull(content) || !strcmp(cJSON_GetStringValue(content), ""));
        ok(good, "%s: tool call round trip %s%s", t->tmpl, rc ? err.msg : "", why);
        cJSON_Delete(msg);
    }
}

/* An assistant turn with reasoning and a call, rendered as the last turn (no generation
 * prompt): wherever the template writes the reasoning out, parsing recovers it. */
static void round_trip_reasoning(void)
{
    static const char *req_text =
        "{\"add_generation_prompt\": false, \"messages\": ["
        "{\"role\": \"user\", \"content\": \"Compute 6*7 and check the weather\"},"
        "{\"role\": \"assistant\", \"content\": \"Calling now.\","
        " \"reasoning_content\": \"The user wants two things.\\nFirst the product.\","
        " \"tool_calls\": [{\"id\": \"call_1\", \"type\": \"function\", \"function\": {"
        "\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 3}}},"
        "{\"id\": \"call_2\", \"type\": \"function\", \"function\": {"
        "\"name\": \"multiply\", \"arguments\": {\"a\": 6, \"b\": 7}}}]}],"
        "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\","
        " \"description\": \"Weather\","
        " \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"},"
        " \"days\": {\"type\": \"integer\"}}}}},"
        "{\"type\": \"function\", \"function\": {\"name\": \"multiply\", \"description\": \"a*b\","
        " \"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"},"
        " \"b\": {\"type\": \"integer\"}}}}}]}";
    cJSON *req = cJSON_Parse(req_text);
    const cJSON *asst = cJSON_GetArrayItem(cJSON_GetObjectItem(req, "messages"), 1);
    const cJSON *want = cJSON_GetObjectItem(asst, "tool_calls");
    for (size_t i = 0; i < sizeof turns / sizeof turns[0]; i++) {
        const struct turn *t = &turns[i];
        char path[4096];
        snprintf(path, sizeof path, "%s/templates/%s", tap_fixtures(), t->tmpl);
        size_t len;
        char *src = tap_slurp(path, &len);
        struct strata_chat *chat = NULL;
        struct strata_err err = { 0 };
        char *out = NULL;
        int rc = src ? strata_chat_create(&chat, src, len, t->tmpl, "<s>", "</s>", &err) : -1;
        if (!rc)
            rc = strata_chat_render(chat, req, NULL, &out, NULL, &err);
        free(src);
        if (!ok(rc == 0, "%s: render a reasoning + two calls turn %s", t->tmpl, rc ? err.msg : "")) {
            strata_chat_free(chat);
            continue;
        }
        /* the assistant turn: after the last "after" marker, up to the end marker */
        const char *a = NULL, *q = out;
        while ((q = strstr(q, t->after)))
            a = q++;
        if (t->format == STRATA_CHAT_FORMAT_GPT_OSS) {
            /* harmony: the turn is every assistant message after the user's */
            const char *u = strstr(out, "check the weather");
            a = u ? strstr(u, t->after) : NULL;
        }
        if (!a) {
            ok(0, "%s: no assistant turn in %s", t->tmpl, out);
            free(out);
            strata_chat_free(chat);
            continue;
        }
        a += strlen(t->after);
        const char *b = t->format == STRATA_CHAT_FORMAT_GPT_OSS ? NULL : strstr(a, t->end);
        if (!b)
            b = a + strlen(a);
        cJSON *msg = NULL;
        rc = strata_chat_parse(t->format, a, (size_t)(b - a), 0, &msg, &err);
        char why[512] = "";
        /* gpt-oss's template writes only the first call of a turn, and its content as
         * the analysis channel */
        cJSON *w = cJSON_Duplicate(want, 1);
        if (t->format == STRATA_CHAT_FORMAT_GPT_OSS)
            cJSON_DeleteItemFromArray(w, 1);
        int good = rc == 0 && same_calls(w, cJSON_GetObjectItem(msg, "tool_calls"), why, sizeof why);
        cJSON_Delete(w);
        ok(good, "%s: tool calls round trip %s%s", t->tmpl, rc ? err.msg : "", why);
        const char *reasoning = cJSON_GetStringValue(cJSON_GetObjectItem(msg, "reasoning_content"));
        if (t->format == STRATA_CHAT_FORMAT_GPT_OSS)
            ok(reasoning && !strcmp(reasoning, "Calling now."), "%s: analysis channel is reasoning",
               t->tmpl);
        else if (strstr(a, "First the product.")) {
            ok(reasoning && !strcmp(reasoning, "The user wants two things.\nFirst the product."),
               "%s: reasoning round trip", t->tmpl);
        }
        const char *content = cJSON_GetStringValue(cJSON_GetObjectItem(msg, "content"));
        if (strstr(a, "Calling now.") && t->format != STRATA_CHAT_FORMAT_GPT_OSS)
            ok(content && !strcmp(content, "Calling now."), "%s: content round trip (%s)", t->tmpl,
               content ? content : "null");
        cJSON_Delete(msg);
        free(out);
        strata_chat_free(chat);
    }
    cJSON_Delete(req);
}

static void plain_text(void)
{
    const char *texts[] = {
        "Hello, world!\n  Indented line\n",
        "Use <b>bold</b> and a JSON {\"name\": \"x\"} example; tool_call is a word here.",
        "",
        "   ",
        "naïve café — 日本語 🦙",
    };
    for (int f = 0; f < STRATA_CHAT_FORMAT_COUNT; f++) {
        for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
            cJSON *msg = NULL;
            struct strata_err err = { 0 };
            int rc = strata_chat_parse((enum strata_chat_format)f, texts[i], strlen(texts[i]), 0,
                                       &msg, &err);
            const char *content = cJSON_GetStringValue(cJSON_GetObjectItem(msg, "content"));
            ok(rc == 0 && content && !strcmp(content, texts[i])
                   && !cJSON_GetObjectItem(msg, "tool_calls")
                   && !cJSON_GetObjectItem(msg, "reasoning_content"),
               "%s: plain text %zu left alone", strata_chat_format_name((enum strata_chat_format)f),
               i);
            cJSON_Delete(msg);
        }
    }
}

static void specific(void)
{
    struct {
        enum strata_chat_format f;
        unsigned flags;
        const char *text;
        int code;
        const char *content, *reasoning, *name, *args;
    } c[] = {
        { STRATA_CHAT_FORMAT_HERMES, 0, "<tool_call>{bad json</tool_call>", STRATA_E_FORMAT, 0, 0, 0, 0 },
        { STRATA_CHAT_FORMAT_HERMES, 0, "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
          STRATA_E_FORMAT, 0, 0, 0, 0 },
        { STRATA_CHAT_FORMAT_HERMES, STRATA_CHAT_PARSE_IN_REASONING,
          "step one\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": [1, 2]}}\n"
          "</tool_call>", 0, "Let me check.", "step one", "f", "{\"x\":[1,2]}" },
        { STRATA_CHAT_FORMAT_HERMES, STRATA_CHAT_PARSE_IN_REASONING, "still thinking, cut off", 0,
          "", "still thinking, cut off", 0, 0 },
        { STRATA_CHAT_FORMAT_QWEN3_CODER, 0,
          "<tool_call>\n<function=run>\n<parameter=cmd>\nls -la\n  two lines\n</parameter>\n"
          "<parameter=n>\n5\n</parameter>\n</function>\n</tool_call>", 0, NULL, NULL, "run",
          "{\"cmd\":\"ls -la\\n  two lines\",\"n\":5}" },
        { STRATA_CHAT_FORMAT_QWEN3_CODER, 0, "<tool_call>\n<function=stop>\n</function>", 0, NULL,
          NULL, "stop", "{}" },
        { STRATA_CHAT_FORMAT_QWEN3_CODER, 0,
          "I'll read it.\n<function=read>\n<parameter=path>\na.c\n</parameter>\n</function>", 0,
          "I'll read it.", NULL, "read", "{\"path\":\"a.c\"}" },
        { STRATA_CHAT_FORMAT_GPT_OSS, 0,
          "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Answer.",
          0, "Answer.", "Think.", 0, 0 },
        { STRATA_CHAT_FORMAT_GPT_OSS, 0,
          "<|channel|>commentary to=functions.lookup <|constrain|>json<|message|>{\"q\": \"x\"}<|call|>",
          0, NULL, NULL, "lookup", "{\"q\":\"x\"}" },
        { STRATA_CHAT_FORMAT_KIMI_K2, 0,
          "Sure.<|tool_calls_section_begin|><|tool_call_begin|>functions.search:0"
          "<|tool_call_argument_begin|>{\"q\": 1}<|tool_call_end|><|tool_calls_section_end|>",
          0, "Sure.", NULL, "search", "{\"q\":1}" },
        { STRATA_CHAT_FORMAT_GLM45, 0, "<think>hmm</think>\nok", 0, "ok", "hmm", 0, 0 },
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        cJSON *msg = NULL;
        struct strata_err err = { 0 };
        int rc = strata_chat_parse(c[i].f, c[i].text, strlen(c[i].text), c[i].flags, &msg, &err);
        int good = rc == c[i].code;
        if (good && rc == 0) {
            const char *content = cJSON_GetStringValue(cJSON_GetObjectItem(msg, "content"));
            const char *reasoning = cJSON_GetStringValue(cJSON_GetObjectItem(msg, "reasoning_content"));
            const cJSON *call = cJSON_GetArrayItem(cJSON_GetObjectItem(msg, "tool_calls"), 0);
            const cJSON *fn = cJSON_GetObjectItem(call, "function");
            const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(fn, "name"));
            const char *args = cJSON_GetStringValue(cJSON_GetObjectItem(fn, "arguments"));
            good = (c[i].content ? content && !strcmp(content, c[i].content) : content == NULL)
                && (c[i].reasoning ? reasoning && !strcmp(reasoning, c[i].reasoning) : !reasoning)
                && (c[i].name ? name && !strcmp(name, c[i].name) : !call)
                && (c[i].args ? args && !strcmp(args, c[i].args) : 1);
            if (!good) {
                char *j = cJSON_PrintUnformatted(msg);
                diag("got %s", j);
                free(j);
            }
        }
        ok(good, "%s case %zu (%s)", strata_chat_format_name(c[i].f), i, rc ? err.msg : "parsed");
        cJSON_Delete(msg);
    }
    ok(strata_chat_prompt_opens_reasoning("<|im_start|>assistant\n<think>\n", 30) == 1
           && strata_chat_prompt_opens_reasoning("<think>\n\n</think>\n\n", 20) == 0,
       "prompt ending in an open <think> is recognised");
}

int main(void)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/templates/reference.json", tap_fixtures());
    char *text = tap_slurp(path, NULL);
    cJSON *ref = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (ok(ref != NULL, "read %s", path))
        round_trip_reference(ref);
    cJSON_Delete(ref);
    round_trip_reasoning();
    plain_text();
    specific();
    return tap_done();
}
