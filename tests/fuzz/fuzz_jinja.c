/* fuzz_jinja.c - libFuzzer target: parse and render arbitrary template text against a
 * chat-like set of variables, with small limits.  Any crash, leak, sanitizer report
 * or a render that outlives its bounds is a bug; errors are fine. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "jinja.h"

static const char vars_json[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"},"
    " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"hi <think>\"}]},"
    " {\"role\": \"assistant\", \"content\": \"ok\", \"reasoning_content\": \"r\","
    "  \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"f\","
    "   \"arguments\": {\"a\": [1, 2.5, null, true], \"b\": {\"c\": \"d\"}}}}]},"
    " {\"role\": \"tool\", \"content\": \"{\\\"x\\\": 1}\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d\","
    "  \"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"array\"}}}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static cJSON *vars;
    if (!vars)
        vars = cJSON_Parse(vars_json);
    struct strata_jinja *t = NULL;
    struct strata_err err = { 0 };
    if (strata_jinja_parse(&t, (const char *)data, size, "fuzz", &err))
        return 0;
    struct strata_jinja_opts o = { 0 };
    o.now = 1796040000;
    o.limits.max_steps = 200000;
    o.limits.max_loop_iters = 50000;
    o.limits.max_depth = 64;
    o.limits.max_output = 1 << 20;
    o.limits.max_memory = 32u << 20;
    char *out = NULL;
    if (strata_jinja_render(t, vars, &o, &out, NULL, &err) == 0)
        free(out);
    strata_jinja_free(t);
    return 0;
}
