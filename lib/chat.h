/* chat.h - chat requests to prompts (the model's Jinja chat template) and generated
 * assistant text back to structured messages (content, reasoning, tool calls).
 *
 * Rendering reproduces transformers' apply_chat_template: the template sees
 * `messages`, `tools` and `documents` (None when the request has none),
 * `add_generation_prompt` (default true), `bos_token`, `eos_token`, and every member of
 * `chat_template_kwargs` (which may override bos_token/eos_token and set
 * enable_thinking, reasoning_effort, ...).
 * Message content may be a string or an OpenAI list of parts; the template receives it
 * unchanged, as transformers passes it.
 *
 * Parsing recognises the tool-call and reasoning formats of the common templates:
 *   QWEN3_CODER  <tool_call><function=NAME><parameter=K>V</parameter></function></tool_call>
 *   HERMES       <tool_call>{"name": ..., "arguments": {...}}</tool_call> (Qwen2.5/3, QwQ)
 *   DEEPSEEK_V31 <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>...
 *   GLM45        <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>...</tool_call>
 *   GPT_OSS      harmony channels: <|channel|>analysis<|message|>... /
 *                to=functions.NAME <|constrain|>json<|message|>ARGS<|call|>
 *   KIMI_K2      <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
 *                <|tool_call_argument_begin|>ARGS<|tool_call_end|>...
 *   MINIMAX_M2   <minimax:tool_call><invoke name="N"><parameter name="K">V</parameter>...
 * and <think>...</think> reasoning for the formats that use it.
 */
#ifndef STRATA_CHAT_H
#define STRATA_CHAT_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "err.h"
#include "jinja.h"

struct strata_gguf;

enum strata_chat_format {
    STRATA_CHAT_FORMAT_PLAIN = 0, /* no tool-call syntax known: all text is content */
    STRATA_CHAT_FORMAT_HERMES,
    STRATA_CHAT_FORMAT_QWEN3_CODER,
    STRATA_CHAT_FORMAT_DEEPSEEK_V31,
    STRATA_CHAT_FORMAT_GLM45,
    STRATA_CHAT_FORMAT_GPT_OSS,
    STRATA_CHAT_FORMAT_KIMI_K2,
    STRATA_CHAT_FORMAT_MINIMAX_M2,
    STRATA_CHAT_FORMAT_COUNT
};

struct strata_chat; /* a parsed template plus its special tokens; immutable once made */

/* Make a chat renderer from template text tmpl[0..len) and the vocabulary's special
 * token texts (bos_token/eos_token may be NULL: the variable is then ""), copied.
 * name labels error messages.  The output format for strata_chat_parse is detected
 * from the template text (strata_chat_format).
 * Errors: those of strata_jinja_parse (STRATA_E_FORMAT with line/column), NOMEM. */
int strata_chat_create(struct strata_chat **out, const char *tmpl, size_t len,
                       const char *name, const char *bos_token, const char *eos_token,
                       struct strata_err *err);

/* Same, from a model file: the template is tokenizer.chat_template (or
 * override_tmpl[0..override_len) when override_tmpl is non-NULL), bos/eos are the
 * texts of tokenizer.ggml.bos_token_id / eos_token_id in tokenizer.ggml.tokens.
 * Errors: STRATA_E_NOTFOUND when the file has no chat template and none is given. */
int strata_chat_create_gguf(struct strata_chat **out, const struct strata_gguf *g,
                            const char *override_tmpl, size_t override_len,
                            struct strata_err *err);

void strata_chat_free(struct strata_chat *c);

/* Render an OpenAI-style request body (a cJSON object with "messages", optional
 * "tools", "add_generation_prompt", "chat_template_kwargs") to the prompt text.
 * opts as for strata_jinja_render (NULL = defaults, current time).  On success *prompt
 * is malloc'ed and NUL-terminated (caller frees); prompt_len may be NULL.
 * Errors: STRATA_E_INVALID when "messages" is missing or not an array (names the
 * field); STRATA_E_TEMPLATE when the template refuses the conversation with
 * raise_exception (err->msg is the template's message); STRATA_E_LIMIT; NOMEM. */
int strata_chat_render(const struct strata_chat *c, const cJSON *request,
                       const struct strata_jinja_opts *opts, char **prompt,
                       size_t *prompt_len, struct strata_err *err);

/* The tool-call format the template writes (detected by strata_chat_create). */
enum strata_chat_format strata_chat_get_format(const struct strata_chat *c);

/* Short lowercase name ("qwen3-coder", "hermes", ...); never NULL. */
const char *strata_chat_format_name(enum strata_chat_format f);

/* Format detection from template text alone. */
enum strata_chat_format strata_chat_detect_format(const char *tmpl, size_t len);

/* 1 when a rendered prompt ends inside an opened reasoning block (e.g. "<think>\n"),
 * so the generated text starts with reasoning: pass STRATA_CHAT_PARSE_IN_REASONING. */
int strata_chat_prompt_opens_reasoning(const char *prompt, size_t len);

#define STRATA_CHAT_PARSE_IN_REASONING 1u /* text begins inside <think> */

/* Parse generated assistant text text[0..len) in format f into *message, a new cJSON
 * object (caller frees with cJSON_Delete):
 *   {"role": "assistant", "content": "..." | null,
 *    "reasoning_content": "..."                       (only when there was reasoning),
 *    "tool_calls": [{"id": "call_N"|model id, "type": "function",
 *                    "function": {"name": "...", "arguments": "<JSON text>"}}, ...]}
 *                                                       (only when there were calls)
 * Arguments are always a JSON object serialised as text, as OpenAI returns them;
 * XML-style parameter values are parsed as JSON when they are valid JSON, else kept
 * as strings.  Text with no recognised markup is returned unchanged as content.
 * Errors: STRATA_E_FORMAT when a tool call is malformed (unterminated, arguments not
 * JSON), naming the format; STRATA_E_NOMEM. */
int strata_chat_parse(enum strata_chat_format f, const char *text, size_t len,
                      unsigned flags, cJSON **message, struct strata_err *err);

#endif
