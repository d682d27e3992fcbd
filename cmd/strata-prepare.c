/* strata-prepare - prepare models for Strata; inspect GGUF files. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "err.h"
#include "gguf.h"
#include "gguf_dump.h"
#include "log.h"

#ifndef STRATA_VERSION
#define STRATA_VERSION "0.1.0"
#endif

static const char usage_text[] =
    "usage: strata-prepare --inspect FILE [--json]\n"
    "       strata-prepare --help | --version\n"
    "\n"
    "  --inspect FILE  print a GGUF file's (or a split set's) metadata and tensors\n"
    "  --json          with --inspect: print JSON instead of text\n"
    "  -h, --help      show this help\n"
    "  --version       show the version\n";

/* --inspect: dump the metadata and tensor list of a GGUF file or split set. */
static int run_inspect(const char *path, int json)
{
    struct strata_err err = {0};
    struct strata_gguf *g = NULL;
    cJSON *doc = NULL;
    char *text = NULL;
    int rc = strata_gguf_open(&g, path, &err);
    if (rc)
        goto out;
    if (!json) {
        rc = strata_gguf_dump_text(g, stdout, NULL, &err);
        goto out;
    }
    if ((rc = strata_gguf_dump_json(g, NULL, &doc, &err)))
        goto out;
    if (!(text = cJSON_Print(doc))) {
        rc = strata_err_set(&err, STRATA_E_NOMEM, "out of memory printing JSON");
        goto out;
    }
    if (puts(text) == EOF || fflush(stdout) != 0)
        rc = strata_err_set(&err, STRATA_E_IO, "cannot write to stdout");
out:
    if (rc)
        strata_log_error("%s", err.msg);
    free(text);
    cJSON_Delete(doc);
    strata_gguf_close(g);
    return rc ? strata_err_exit_code(rc) : STRATA_EXIT_OK;
}

int main(int argc, char **argv)
{
    enum { OPT_VERSION = 256, OPT_JSON, OPT_INSPECT };
    static const struct option longopts[] = {
        {"inspect", required_argument, NULL, OPT_INSPECT},
        {"json", no_argument, NULL, OPT_JSON},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, OPT_VERSION},
        {NULL, 0, NULL, 0},
    };
    const char *inspect = NULL;
    int json = 0, c;

    strata_log_set_prog("strata-prepare");
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case OPT_INSPECT: inspect = optarg; break;
        case OPT_JSON: json = 1; break;
        case OPT_VERSION: printf("strata-prepare %s\n", STRATA_VERSION); return STRATA_EXIT_OK;
        case 'h': fputs(usage_text, stdout); return STRATA_EXIT_OK;
        default: fputs(usage_text, stderr); return STRATA_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "strata-prepare: unexpected argument '%s'\n", argv[optind]);
        fputs(usage_text, stderr);
        return STRATA_EXIT_USAGE;
    }
    if (inspect)
        return run_inspect(inspect, json);
    if (json) {
        fputs("strata-prepare: --json needs --inspect\n", stderr);
        return STRATA_EXIT_USAGE;
    }
    fputs(usage_text, stderr);
    return STRATA_EXIT_USAGE;
}
