/* server.h - strata-serve: an OpenAI-compatible HTTP server in front of
 * supervised engine processes.
 *
 * For each model the server starts `parallel` engine children
 * (`strata-generate --serve-stdio -m MODEL ...`, see proto.h and
 * docs/engine-protocol.md), waits until each has printed `ready`, then opens
 * the HTTP port (GNU libmicrohttpd).  Requests are queued per model and
 * handed to an idle engine; an engine that exits or stays silent past the
 * watchdog fails its in-flight request with its exit status and last log
 * lines and is restarted with back-off while the others keep serving.
 */
#ifndef STRATA_SERVER_H
#define STRATA_SERVER_H

#include <signal.h>
#include <stddef.h>

#include "err.h"

struct strata_server_opts {
    const char *host;          /* listen address; NULL = "127.0.0.1" */
    int port;                  /* 0 = a free port chosen by the kernel */
    const char *api_key;       /* Bearer key every request (but /health) must carry;
                                  NULL = none (then only loopback peers unless the
                                  host is not a loopback address) */
    const char *const *models; /* [n_models] GGUF or pack paths; ids are the file
                                  names without .gguf / .strata */
    int n_models;
    int n_ctx;                 /* passed to the engine as --ctx (0 = engine default) */
    int parallel;              /* engine processes per model (>= 1) */
    const char *engine;        /* engine program; NULL = strata-generate next to the
                                  running program, else from PATH */
    const char *const *engine_args; /* [n_engine_args] extra engine flags, passed through */
    int n_engine_args;
    const char *chat_template; /* template file overriding the model's, or NULL */
    double watchdog_s;         /* silence of a busy engine before it is killed (> 0) */
    double load_timeout_s;     /* silence of a loading engine before it is killed */
    size_t max_body;           /* largest request body in bytes (larger: 413) */
    int n_threads;             /* unused by the thread-per-connection model; reserved */
    int max_connections;       /* concurrent HTTP connections */
    double conn_timeout_s;     /* idle keep-alive connection timeout */
    const char *const *mmprojs; /* [n_models] vision projector per model, entries NULL
                                   when none; NULL = no model has one */
    int allow_image_urls;      /* fetch http(s) image_url parts (else data: URLs only) */
};

/* Defaults: 127.0.0.1, port 8080, parallel 1, watchdog 120 s, load timeout
 * 600 s, max body 10 MiB (10485760 bytes), 256 connections, 60 s idle timeout. */
void strata_server_opts_init(struct strata_server_opts *o);

/* Run the server until *stop becomes nonzero (set it from a signal handler).
 * Logs "listening on http://HOST:PORT" once every engine is ready.  Errors:
 * STRATA_E_INVALID (bad option, naming it), STRATA_E_IO (spawning an engine,
 * binding the port), STRATA_E_FORMAT / STRATA_E_NOTFOUND when an engine exits
 * before its first ready (the message carries its exit status and last log
 * lines). */
int strata_server_run(const struct strata_server_opts *o, volatile sig_atomic_t *stop,
                      struct strata_err *err);

#endif
