/* jinja.h - a small, bounded interpreter for the Jinja2 subset chat templates use.
 *
 * Renders a template the way Python's jinja2 does when configured as Hugging Face's
 * apply_chat_template configures it: trim_blocks and lstrip_blocks on,
 * keep_trailing_newline off, loop controls (break/continue) enabled, the default
 * Undefined, no autoescape, and the filters/globals transformers adds (tojson with
 * ensure_ascii=False by default, raise_exception, strftime_now).
 *
 * The template text is untrusted (it comes from a downloaded model file), so every
 * render is bounded: evaluation steps, loop iterations, call depth, output bytes and
 * working memory.  Exceeding a bound fails with STRATA_E_LIMIT and a message naming the
 * template line and column.  Nothing the template does can touch files, the
 * environment or the process.
 */
#ifndef STRATA_JINJA_H
#define STRATA_JINJA_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "err.h"

struct strata_jinja; /* a parsed template; immutable, may be rendered concurrently */

/* Bounds of one render.  A zero field means "use the default" (in brackets). */
struct strata_jinja_limits {
    uint64_t max_steps;      /* expression/statement evaluations [20,000,000] */
    uint64_t max_loop_iters; /* iterations of all loops together [5,000,000] */
    int max_depth;           /* nested macro calls + expression nesting [200] */
    size_t max_output;       /* bytes of rendered text [64 MiB] */
    size_t max_memory;       /* bytes of working memory (values, strings) [256 MiB] */
};

struct strata_jinja_opts {
    struct strata_jinja_limits limits;
    /* The time strftime_now() formats, in UTC seconds; 0 means the current time.
     * Rendered in local time as transformers does (datetime.now()). */
    time_t now;
};

/* Parse template text src[0..len) (UTF-8; \r\n is read as \n).  name is used in error
 * messages ("template 'NAME' line L column C: ...").  On success *out owns the parsed
 * template (free with strata_jinja_free).
 * Errors: STRATA_E_FORMAT for a syntax error (unterminated tag, unknown statement,
 * unbalanced blocks, a filter or test jinja2 does not have, used outside an if as
 * jinja2's compiler refuses it), naming line and column; STRATA_E_NOMEM;
 * STRATA_E_LIMIT when nesting is deeper than the parser allows (about 200
 * parentheses, 1000 levels of expression tree). */
int strata_jinja_parse(struct strata_jinja **out, const char *src, size_t len,
                       const char *name, struct strata_err *err);

void strata_jinja_free(struct strata_jinja *t);

/* Render t with the variables in vars (a cJSON object: each member becomes a template
 * variable; JSON numbers that are integral and below 2^53 become ints, others floats).
 * vars may be NULL.  opts may be NULL (defaults).  On success *out is a malloc'ed,
 * NUL-terminated string (caller frees) and *out_len its length (out_len may be NULL).
 * Errors: STRATA_E_TEMPLATE when the template calls raise_exception(msg): err->msg is
 * exactly msg; STRATA_E_LIMIT when a bound is exceeded; STRATA_E_INVALID for a runtime
 * error (undefined attribute of an undefined value, bad operand types, unknown filter),
 * each naming the template line and column; STRATA_E_NOMEM. */
int strata_jinja_render(const struct strata_jinja *t, const cJSON *vars,
                        const struct strata_jinja_opts *opts, char **out, size_t *out_len,
                        struct strata_err *err);

#endif
