/* serve_stdio.h - the engine side of the engine protocol
 * (`strata-generate --serve-stdio`, see proto.h and docs/engine-protocol.md).
 *
 * Reads requests from one descriptor and writes events to another, one JSON
 * object per line, on top of an open engine and vocabulary: prints `ready`,
 * then serves generate (streaming token events, cancellable between tokens),
 * tokenize, detokenize, health and shutdown until shutdown or end of input.
 * A bad request gets an error event and the loop goes on.
 *
 * Test hook: when the environment variable STRATA_TEST_FORCE_OUTPUT_FILE
 * names a non-empty file, every generate request skips the model and emits
 * that file's text (tokenized, special tokens parsed) as its tokens (with
 * logprob 0 when the request asks for logprobs, and no alternatives) and reason
 * "eos" (or "length" at max_tokens).  strata-serve's
 * tests use it to script a model's tool call.  Never set it in production.
 */
#ifndef STRATA_SERVE_STDIO_H
#define STRATA_SERVE_STDIO_H

#include "err.h"

struct strata_engine;
struct strata_spec;
struct strata_vocab;

struct strata_serve_stdio_opts {
    int in_fd;                 /* requests (normally 0) */
    int out_fd;                /* events (normally 1; nothing else may write to it) */
    const char *model_name;    /* reported in ready; NULL = general.name or "model" */
    const char *chat_template; /* template text overriding tokenizer.chat_template, or NULL */
    struct strata_spec *spec;  /* speculative decoding for every generate (spec.h; not
                                  owned; a draft model sits out requests with images), or
                                  NULL; its counters go into each done event */
};

/* in_fd 0, out_fd 1, no overrides. */
void strata_serve_stdio_opts_init(struct strata_serve_stdio_opts *o);

/* Run the loop.  Returns 0 after shutdown or end of input.  Errors:
 * STRATA_E_IO when the event descriptor cannot be written (the server went
 * away), STRATA_E_NOMEM.  Generation failures are reported as error events,
 * not returned. */
int strata_serve_stdio(struct strata_engine *e, const struct strata_vocab *v,
                       const struct strata_serve_stdio_opts *o, struct strata_err *err);

/* Write one error event {"type":"error","code":CODE,"msg":MSG} (no id) to fd: what
 * an engine that refuses to start (e.g. its GPU failed the kernel self-test) says
 * before it exits.  Returns 0, STRATA_E_NOMEM or STRATA_E_IO. */
int strata_serve_stdio_error(int fd, int code, const char *msg, struct strata_err *err);

#endif
