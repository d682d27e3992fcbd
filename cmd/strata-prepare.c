/* strata-prepare - prepare models for Strata; inspect GGUF files. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "err.h"
#include "gguf.h"
#include "gguf_dump.h"
#include "log.h"
#include "pack.h"
#include "prepare.h"
#include "synth.h"

#ifndef STRATA_VERSION
#define STRATA_VERSION "0.1.0"
#endif

static const char usage_text[] =
    "usage: strata-prepare [options] SOURCE     (a GGUF file or first shard, an http(s)\n"
    "                                            URL, or hf:OWNER/REPO/PATH)\n"
    "       strata-prepare [options] --family F [--model QUANT]\n"
    "       strata-prepare --list [--context N] [--json]\n"
    "       strata-prepare --verify PACK [--json]\n"
    "       strata-prepare --inspect FILE [--json]\n"
    "       strata-prepare --synth SHAPE[:LAYERS[:FTYPE]] [--force] FILE.gguf\n"
    "       strata-prepare --help | --version\n"
    "\n"
    "  --out DIR            create NAME.strata in DIR (default: .)\n"
    "  --name NAME          pack name (default: from the preset or the file name)\n"
    "  --native             read the GGUF files in place (default)\n"
    "  --repack             also write experts.bin: one aligned record per expert\n"
    "  --context N          context length for the memory plan\n"
    "  --vision yes|no      attach the vision projector (mmproj) (default: no)\n"
    "  --low-ram auto|yes|no  keep experts in the page cache, not resident RAM\n"
    "  --family F           use the preset packs/F.json; --model QUANT picks the file(s)\n"
    "  --list               list the presets with their sizes and memory needs\n"
    "  --verify PACK        re-check every checksum and the index of a pack\n"
    "  --force              replace an existing pack\n"
    "  --offline            use only files already downloaded\n"
    "  --sha256 HEX         expected SHA-256 of a downloaded single file\n"
    "  --plan               print the plan and stop\n"
    "  --presets DIR        preset directory (default: $STRATA_PRESETS, or packs/)\n"
    "  --retries N          download retries after a failure (default 4)\n"
    "  --retry-delay MS     first retry delay, doubling (default 1000)\n"
    "  --stall-timeout S    give up an attempt after S seconds without data (default 60)\n"
    "  --inspect FILE  print a GGUF file's (or a split set's) metadata and tensors\n"
    "  --synth S       write a synthetic model: random quantised weights in the tensor\n"
    "                  layout of shape S (qwen3-30b-a3b, qwen3-coder-30b-a3b,\n"
    "                  qwen3-moe-tiny, llama-tiny), LAYERS of them (default: the\n"
    "                  shape's), FTYPE Q4_K_M (llama.cpp's mix, default) or one block\n"
    "                  type (Q8_0, Q4_K, IQ2_XS, ...); it runs, but its text is noise\n"
    "  --json          print JSON instead of text (summary, --list, --verify, --inspect)\n"
    "  -h, --help      show this help\n"
    "  --version       show the version\n";

/* --synth SHAPE[:LAYERS[:FTYPE]] FILE: a synthetic model (lib/synth.h), written to
 * FILE.part and renamed, so no half-written FILE is ever left. */
static int run_synth(const char *spec, const char *path, int force)
{
    struct strata_err err = {0};
    char shape[64], ftype[32] = "Q4_K_M", *end = NULL;
    const char *c1 = strchr(spec, ':');
    size_t ls = c1 ? (size_t)(c1 - spec) : strlen(spec);
    long layers = 0;
    if (ls == 0 || ls >= sizeof shape)
        goto bad;
    memcpy(shape, spec, ls);
    shape[ls] = 0;
    if (c1) {
        errno = 0;
        layers = strtol(c1 + 1, &end, 10);
        if (errno || end == c1 + 1 || layers < 1 || layers > 1000 || (*end && *end != ':'))
            goto bad;
        if (*end == ':' && (!end[1] || strlen(end + 1) >= sizeof ftype))
            goto bad;
        if (*end == ':')
            snprintf(ftype, sizeof ftype, "%s", end + 1);
    }
    if (!force && access(path, F_OK) == 0) {
        fprintf(stderr, "strata-prepare: '%s' exists (--force replaces it)\n", path);
        return STRATA_EXIT_USAGE;
    }
    char part[PATH_MAX];
    if (snprintf(part, sizeof part, "%s.part", path) >= (int)sizeof part) {
        fprintf(stderr, "strata-prepare: path too long: '%s'\n", path);
        return STRATA_EXIT_USAGE;
    }
    struct strata_synth_opts o = {shape, (int)layers, ftype, 42};
    /* the weights are made in memory before they are written: refuse what the machine
     * cannot hold rather than be killed for it */
    uint64_t need = 0, avail = strata_mem_available();
    int rc = strata_synth_size(&o, &need, &err);
    if (!rc && avail && need > avail / 10 * 9) {
        fprintf(stderr, "strata-prepare: --synth %s makes %.1f GiB of weights in memory before "
                "writing them; %.1f GiB of RAM is available: use fewer LAYERS\n", spec,
                need / 1073741824.0, avail / 1073741824.0);
        return STRATA_EXIT_USAGE;
    }
    if (!rc)
        rc = strata_synth_write(&o, part, &err);
    if (!rc && rename(part, path) != 0)
        rc = strata_err_set(&err, STRATA_E_IO, "cannot rename '%s' to '%s': %s", part, path,
                            strerror(errno));
    if (rc) {
        unlink(part);
        strata_log_error("%s", err.msg);
        return strata_err_exit_code(rc);
    }
    if (layers)
        printf("%s: synthetic %s, %ld layer%s, %s\n", path, shape, layers, layers == 1 ? "" : "s",
               ftype);
    else
        printf("%s: synthetic %s, all its layers, %s\n", path, shape, ftype);
    return STRATA_EXIT_OK;
bad:
    fprintf(stderr, "strata-prepare: bad --synth '%s' (SHAPE[:LAYERS[:FTYPE]], LAYERS 1..1000)\n",
            spec);
    return STRATA_EXIT_USAGE;
}

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

/* ---- packs: prepare, --list, --verify ---------------------------------- */

enum {
    OPT_PACK_FIRST = 512, OPT_OUT = OPT_PACK_FIRST, OPT_NAME, OPT_REPACK, OPT_NATIVE,
    OPT_CONTEXT, OPT_VISION, OPT_LOW_RAM, OPT_FAMILY, OPT_MODEL, OPT_LIST, OPT_VERIFY,
    OPT_FORCE, OPT_OFFLINE, OPT_SHA256, OPT_PLAN, OPT_PRESETS, OPT_RETRIES, OPT_RETRY_DELAY,
    OPT_STALL,
};

#define PACK_LONGOPTS                                                                      \
    {"out", required_argument, NULL, OPT_OUT}, {"name", required_argument, NULL, OPT_NAME}, \
    {"repack", no_argument, NULL, OPT_REPACK}, {"native", no_argument, NULL, OPT_NATIVE},   \
    {"context", required_argument, NULL, OPT_CONTEXT},                                     \
    {"vision", required_argument, NULL, OPT_VISION},                                       \
    {"low-ram", required_argument, NULL, OPT_LOW_RAM},                                     \
    {"family", required_argument, NULL, OPT_FAMILY},                                       \
    {"model", required_argument, NULL, OPT_MODEL}, {"list", no_argument, NULL, OPT_LIST},   \
    {"verify", required_argument, NULL, OPT_VERIFY},                                       \
    {"force", no_argument, NULL, OPT_FORCE}, {"offline", no_argument, NULL, OPT_OFFLINE},  \
    {"sha256", required_argument, NULL, OPT_SHA256}, {"plan", no_argument, NULL, OPT_PLAN}, \
    {"presets", required_argument, NULL, OPT_PRESETS},                                     \
    {"retries", required_argument, NULL, OPT_RETRIES},                                     \
    {"retry-delay", required_argument, NULL, OPT_RETRY_DELAY},                             \
    {"stall-timeout", required_argument, NULL, OPT_STALL},

struct pack_args {
    struct strata_prepare_opts o;
    int list;
    const char *verify;
    int bad;
};

static int parse_uint(const char *opt, const char *v, unsigned long max, unsigned long *out)
{
    char *e;
    errno = 0;
    unsigned long x = strtoul(v, &e, 10);
    if (!*v || *e || errno || x > max || v[0] == '-') {
        fprintf(stderr, "strata-prepare: --%s: '%s' is not a number up to %lu\n", opt, v, max);
        return -1;
    }
    *out = x;
    return 0;
}

static int parse_choice(const char *opt, const char *v, int with_auto, int *out)
{
    if (!strcmp(v, "yes"))
        *out = 1;
    else if (!strcmp(v, "no"))
        *out = 0;
    else if (with_auto && !strcmp(v, "auto"))
        *out = -1;
    else {
        fprintf(stderr, "strata-prepare: --%s: expected yes|no%s, got '%s'\n", opt,
                with_auto ? "|auto" : "", v);
        return -1;
    }
    return 0;
}

/* One pack option; 0 when c is not one. */
static int pack_opt(int c, const char *v, struct pack_args *a)
{
    unsigned long x = 0;
    switch (c) {
    case OPT_OUT: a->o.out_dir = v; break;
    case OPT_NAME: a->o.name = v; break;
    case OPT_REPACK: a->o.repack = 1; break;
    case OPT_NATIVE: a->o.repack = 0; break;
    case OPT_CONTEXT:
        a->bad |= parse_uint("context", v, 1ul << 24, &x) != 0;
        a->o.n_ctx = (uint32_t)x;
        break;
    case OPT_VISION: a->bad |= parse_choice("vision", v, 0, &a->o.vision) != 0; break;
    case OPT_LOW_RAM: a->bad |= parse_choice("low-ram", v, 1, &a->o.low_ram) != 0; break;
    case OPT_FAMILY: a->o.family = v; break;
    case OPT_MODEL: a->o.model = v; break;
    case OPT_LIST: a->list = 1; break;
    case OPT_VERIFY: a->verify = v; break;
    case OPT_FORCE: a->o.force = 1; break;
    case OPT_OFFLINE: a->o.offline = 1; break;
    case OPT_SHA256: a->o.sha256 = v; break;
    case OPT_PLAN: a->o.plan_only = 1; break;
    case OPT_PRESETS: a->o.presets_dir = v; break;
    case OPT_RETRIES:
        a->bad |= parse_uint("retries", v, 100, &x) != 0;
        a->o.retries = (int)x;
        break;
    case OPT_RETRY_DELAY:
        a->bad |= parse_uint("retry-delay", v, 600000, &x) != 0;
        a->o.retry_delay_ms = (unsigned)x;
        break;
    case OPT_STALL:
        a->bad |= parse_uint("stall-timeout", v, 86400, &x) != 0 || x == 0;
        a->o.stall_s = (unsigned)x;
        break;
    default: return 0;
    }
    return 1;
}

/* The presets: $STRATA_PRESETS, else packs/ of the source tree or install
 * prefix next to this program, else ./packs. */
static const char *presets_dir(char *buf, size_t n)
{
    const char *env = getenv("STRATA_PRESETS");
    char exe[PATH_MAX];
    ssize_t l;
    if (env && *env)
        return env;
    l = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (l > 0) {
        exe[l] = 0;
        char *sl = strrchr(exe, '/');
        if (sl)
            *sl = 0;
        static const char *const rel[] = {"/../packs", "/../share/strata/packs",
                                          "/../../../packs"};
        for (size_t i = 0; i < sizeof(rel) / sizeof(rel[0]); i++) {
            snprintf(buf, n, "%s%s", exe, rel[i]);
            if (access(buf, R_OK) == 0)
                return buf;
        }
    }
    return "packs";
}

/* Prepare a pack, list presets or verify a pack, as the options say. */
static int run_pack(struct pack_args *a, const char *source, int json)
{
    struct strata_err err = {0};
    char pbuf[PATH_MAX + 64];
    int rc;
    a->o.source = source;
    a->o.json = json;
    a->o.out = stdout;
    a->o.prog = "strata-prepare";
    if (!a->o.presets_dir)
        a->o.presets_dir = presets_dir(pbuf, sizeof(pbuf));
    if (a->list)
        rc = strata_prepare_list(a->o.presets_dir, a->o.n_ctx, json, stdout, &err);
    else if (a->verify)
        rc = strata_prepare_verify(a->verify, json, stdout, "strata-prepare", &err);
    else
        rc = strata_prepare_run(&a->o, &err);
    if (rc)
        strata_log_error("%s", err.msg);
    return rc ? strata_err_exit_code(rc) : STRATA_EXIT_OK;
}

int main(int argc, char **argv)
{
    enum { OPT_VERSION = 256, OPT_JSON, OPT_INSPECT, OPT_SYNTH };
    static const struct option longopts[] = {
        {"inspect", required_argument, NULL, OPT_INSPECT},
        {"synth", required_argument, NULL, OPT_SYNTH},
        {"json", no_argument, NULL, OPT_JSON},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, OPT_VERSION},
        PACK_LONGOPTS
        {NULL, 0, NULL, 0},
    };
    const char *inspect = NULL, *synth = NULL;
    int json = 0, c;
    struct pack_args pa = {.o = {.low_ram = -1, .retries = -1}};

    strata_log_set_prog("strata-prepare");
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case OPT_INSPECT: inspect = optarg; break;
        case OPT_SYNTH: synth = optarg; break;
        case OPT_JSON: json = 1; break;
        case OPT_VERSION: printf("strata-prepare %s\n", STRATA_VERSION); return STRATA_EXIT_OK;
        case 'h': fputs(usage_text, stdout); return STRATA_EXIT_OK;
        default:
            if (pack_opt(c, optarg, &pa))
                break;
            fputs(usage_text, stderr);
            return STRATA_EXIT_USAGE;
        }
    }
    if (pa.bad)
        return STRATA_EXIT_USAGE;
    if (synth) {
        if (optind != argc - 1 || inspect || json) {
            fputs("strata-prepare: --synth SHAPE[:LAYERS[:FTYPE]] takes one FILE.gguf and no "
                  "other mode\n", stderr);
            return STRATA_EXIT_USAGE;
        }
        return run_synth(synth, argv[optind], pa.o.force);
    }
    if (!inspect && !pa.list && !pa.verify && optind == argc - 1 && !pa.o.family)
        return run_pack(&pa, argv[optind], json);
    if (optind < argc) {
        fprintf(stderr, "strata-prepare: unexpected argument '%s'\n", argv[optind]);
        fputs(usage_text, stderr);
        return STRATA_EXIT_USAGE;
    }
    if (inspect)
        return run_inspect(inspect, json);
    if (pa.list || pa.verify || pa.o.family)
        return run_pack(&pa, NULL, json);
    if (json) {
        fputs("strata-prepare: --json needs --inspect\n", stderr);
        return STRATA_EXIT_USAGE;
    }
    fputs(usage_text, stderr);
    return STRATA_EXIT_USAGE;
}
