/* strata-serve - an OpenAI-compatible HTTP server that supervises one engine
 * process per model (see man/strata-serve.1, docs/engine-protocol.md). */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "log.h"
#include "server.h"
#include "spec.h"

static const char usage_text[] =
    "usage: strata-serve -m MODEL [-m MODEL ...] [--host ADDR] [--port N]\n"
    "                    [--api-key KEY] [--ctx N] [--parallel N] [--threads N]\n"
    "                    [--prefill N] [--backend NAME] [--device N] [--no-selftest]\n"
    "                    [--chat-template FILE] [--watchdog SECS] [--load-timeout SECS]\n"
    "                    [--engine PROGRAM] [--engine-arg ARG ...] [-v] [-- ENGINE-ARGS]\n"
    "                    [--mmproj FILE (after its -m)] [--allow-image-urls]\n"
    "                    [--spec T] [--spec-mode M] [--draft MODEL] [--spec-fixed]\n";

static volatile sig_atomic_t stop_flag;

static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

enum {
    OPT_HOST = 256,
    OPT_PORT,
    OPT_KEY,
    OPT_CTX,
    OPT_PARALLEL,
    OPT_ENGINE,
    OPT_ENGINE_ARG,
    OPT_TEMPLATE,
    OPT_WATCHDOG,
    OPT_LOAD_TIMEOUT,
    OPT_PASS,
    OPT_MMPROJ,
    OPT_ALLOW_URLS,
    OPT_NO_SELFTEST,
    OPT_SPEC,
    OPT_SPEC_MODE,
    OPT_SPEC_FIXED,
};

static int parse_int(const char *opt, const char *s, long lo, long hi, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) {
        fprintf(stderr, "strata-serve: %s must be an integer in %ld..%ld, not '%s'\n", opt, lo,
                hi, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"model", required_argument, NULL, 'm'},
        {"mmproj", required_argument, NULL, OPT_MMPROJ},
        {"allow-image-urls", no_argument, NULL, OPT_ALLOW_URLS},
        {"host", required_argument, NULL, OPT_HOST},
        {"port", required_argument, NULL, OPT_PORT},
        {"api-key", required_argument, NULL, OPT_KEY},
        {"ctx", required_argument, NULL, OPT_CTX},
        {"parallel", required_argument, NULL, OPT_PARALLEL},
        {"engine", required_argument, NULL, OPT_ENGINE},
        {"engine-arg", required_argument, NULL, OPT_ENGINE_ARG},
        {"chat-template", required_argument, NULL, OPT_TEMPLATE},
        {"watchdog", required_argument, NULL, OPT_WATCHDOG},
        {"load-timeout", required_argument, NULL, OPT_LOAD_TIMEOUT},
        {"threads", required_argument, NULL, OPT_PASS},
        {"prefill", required_argument, NULL, OPT_PASS},
        {"backend", required_argument, NULL, OPT_PASS},
        {"device", required_argument, NULL, OPT_PASS},
        {"no-selftest", no_argument, NULL, OPT_NO_SELFTEST},
        {"spec", required_argument, NULL, OPT_SPEC},
        {"spec-mode", required_argument, NULL, OPT_SPEC_MODE},
        {"draft", required_argument, NULL, OPT_PASS},
        {"spec-fixed", no_argument, NULL, OPT_SPEC_FIXED},
        {"verbose", no_argument, NULL, 'v'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct strata_server_opts o;
    struct strata_err err = {0};
    const char **models = calloc((size_t)argc, sizeof(*models));
    const char **mmprojs = calloc((size_t)argc, sizeof(*mmprojs));
    const char **eargs = calloc((size_t)argc * 2 + 1, sizeof(*eargs));
    char **owned = calloc((size_t)argc, sizeof(*owned));
    int n_owned = 0, rc = STRATA_EXIT_USAGE, c, idx = 0;
    if (!models || !eargs || !owned || !mmprojs) {
        fprintf(stderr, "strata-serve: out of memory\n");
        rc = STRATA_EXIT_NOMEM;
        goto out;
    }
    strata_log_set_prog("strata-serve");
    strata_server_opts_init(&o);
    o.models = models;
    o.mmprojs = mmprojs;
    o.engine_args = eargs;
    const char *env_key = getenv("STRATA_API_KEY");
    if (env_key && *env_key)
        o.api_key = env_key;
    while ((c = getopt_long(argc, argv, "m:vh", longopts, &idx)) != -1) {
        switch (c) {
        case 'm':
            models[o.n_models++] = optarg;
            break;
        case OPT_MMPROJ:
            if (!o.n_models || mmprojs[o.n_models - 1]) {
                fprintf(stderr, "strata-serve: --mmproj %s must follow its model's -m (one per "
                        "model)\n", optarg);
                goto usage;
            }
            mmprojs[o.n_models - 1] = optarg;
            break;
        case OPT_ALLOW_URLS:
            o.allow_image_urls = 1;
            break;
        case OPT_HOST:
            o.host = optarg;
            break;
        case OPT_PORT:
            if (parse_int("--port", optarg, 0, 65535, &o.port))
                goto usage;
            break;
        case OPT_KEY:
            if (!*optarg) {
                fprintf(stderr, "strata-serve: --api-key must not be empty\n");
                goto usage;
            }
            o.api_key = optarg;
            break;
        case OPT_CTX:
            if (parse_int("--ctx", optarg, 0, 1 << 24, &o.n_ctx))
                goto usage;
            break;
        case OPT_PARALLEL:
            if (parse_int("--parallel", optarg, 1, 64, &o.parallel))
                goto usage;
            break;
        case OPT_ENGINE:
            o.engine = optarg;
            break;
        case OPT_ENGINE_ARG:
            eargs[o.n_engine_args++] = optarg;
            break;
        case OPT_TEMPLATE:
            o.chat_template = optarg;
            break;
        case OPT_WATCHDOG:
        case OPT_LOAD_TIMEOUT: {
            int v;
            if (parse_int(c == OPT_WATCHDOG ? "--watchdog" : "--load-timeout", optarg, 1,
                          86400, &v))
                goto usage;
            if (c == OPT_WATCHDOG)
                o.watchdog_s = v;
            else
                o.load_timeout_s = v;
            break;
        }
        case OPT_NO_SELFTEST: /* the engines skip the GPU kernel self-test */
            eargs[o.n_engine_args++] = "--no-selftest";
            break;
        case OPT_SPEC: { /* speculative decoding in every engine (docs/speculative.md) */
            int t;
            if (parse_int("--spec", optarg, 0, STRATA_SPEC_MAX, &t))
                goto usage;
            eargs[o.n_engine_args++] = "--spec";
            eargs[o.n_engine_args++] = optarg;
            break;
        }
        case OPT_SPEC_MODE:
            if (strata_spec_mode_parse(optarg) < 0) {
                fprintf(stderr, "strata-serve: --spec-mode must be auto, ngram, draft or mtp, "
                        "not '%s'\n", optarg);
                goto usage;
            }
            eargs[o.n_engine_args++] = "--spec-mode";
            eargs[o.n_engine_args++] = optarg;
            break;
        case OPT_SPEC_FIXED:
            eargs[o.n_engine_args++] = "--spec-fixed";
            break;
        case OPT_PASS: {
            size_t n = strlen(longopts[idx].name) + 3;
            char *flag = malloc(n);
            if (!flag)
                goto usage;
            snprintf(flag, n, "--%s", longopts[idx].name);
            owned[n_owned++] = flag;
            eargs[o.n_engine_args++] = flag;
            eargs[o.n_engine_args++] = optarg;
            break;
        }
        case 'v':
            strata_log_set_level(STRATA_LOG_DEBUG);
            break;
        case 'h':
            fputs(usage_text, stdout);
            rc = STRATA_EXIT_OK;
            goto out;
        default:
            goto usage;
        }
    }
    for (int i = optind; i < argc; i++)
        eargs[o.n_engine_args++] = argv[i];
    if (!o.n_models) {
        fprintf(stderr, "strata-serve: no model given (-m MODEL)\n");
        goto usage;
    }

    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (strata_server_run(&o, &stop_flag, &err)) {
        fprintf(stderr, "strata-serve: error: %s\n", err.msg);
        rc = err.code == STRATA_E_CANCELLED ? STRATA_EXIT_OK : strata_err_exit_code(err.code);
        goto out;
    }
    rc = STRATA_EXIT_OK;
    goto out;
usage:
    fputs(usage_text, stderr);
    rc = STRATA_EXIT_USAGE;
out:
    for (int i = 0; i < n_owned; i++)
        free(owned[i]);
    free(owned);
    free(models);
    free(mmprojs);
    free(eargs);
    return rc;
}
