/* prepare.h - strata-prepare's work: from a model source (local GGUF or
 * split set, http(s) URL, hf:OWNER/REPO/PATH, or a preset of packs/) to a
 * verified pack directory, atomically.
 *
 * Steps: resolve the source files; refuse an existing pack without force;
 * print the plan (files and bytes to fetch, free disk, RAM and VRAM at the
 * chosen context) and refuse when the disk cannot hold it; download into
 * OUT/NAME.strata.partial/ (resumable across runs); build pack.json (and
 * experts.bin); check it opens; rename to OUT/NAME.strata.  A failed run
 * leaves no NAME.strata and no pack.json; downloaded bytes stay in the
 * partial directory for the next run.
 *
 * Presets (packs/FAMILY.json, format in man/strata-pack.5): "family",
 * "description", "repo", "default_model", "arch" (figures for the plan),
 * "models": {QUANT: {"files": [{"src", "size", "approx", "sha256"}]}},
 * optional "mmproj": {"src", "size"}.  A src starting with $STRATA_FIXTURES
 * is a local file under that directory (default: the presets directory's
 * ../../shared/fixtures).
 */
#ifndef STRATA_PREPARE_H
#define STRATA_PREPARE_H

#include <stdint.h>
#include <stdio.h>

#include "err.h"

struct strata_prepare_opts {
    const char *source;      /* local path, URL or hf: source; NULL with family */
    const char *family;      /* preset family (packs/FAMILY.json) */
    const char *model;       /* preset quant; NULL: the preset's default_model */
    const char *presets_dir; /* directory of the presets */
    const char *out_dir;     /* where NAME.strata goes (NULL: ".") */
    const char *name;        /* pack name (NULL: from the preset or file name) */
    int repack;              /* 1: write experts.bin */
    uint32_t n_ctx;          /* context for the memory plan (0: training context) */
    int vision;              /* 1: attach the mmproj (preset, or mmproj*.gguf beside
                                a local model) */
    int low_ram;             /* -1 auto, 0 no, 1 yes */
    int force;               /* replace an existing pack */
    int offline;             /* no network: only files already present */
    int json;                /* summary as JSON on out */
    int plan_only;           /* print the plan and stop */
    const char *sha256;      /* expected hash of a single-file remote source */
    int retries;             /* download retries (< 0: default) */
    unsigned retry_delay_ms; /* first back-off delay (0: default) */
    unsigned stall_s;        /* stall timeout (0: default) */
    FILE *out;               /* plan and summary (stdout) */
    const char *prog;        /* prefix of progress lines */
};

/* Prepare a pack.  Returns 0 or an error code with err naming the file,
 * URL or figure at fault: STRATA_E_INVALID (bad options, pack exists
 * without force, unknown family or model), STRATA_E_NOTFOUND (missing file
 * or shard, HTTP 404, offline without the file), STRATA_E_IO (disk too
 * small: the message gives the bytes needed and free; write failures),
 * STRATA_E_CHECKSUM, STRATA_E_NETWORK, STRATA_E_TIMEOUT, the GGUF reader's
 * errors. */
int strata_prepare_run(const struct strata_prepare_opts *o, struct strata_err *err);

/* List the presets of dir with sizes and memory needs at n_ctx (0: 32768),
 * as text or JSON.  Returns 0, or STRATA_E_IO / STRATA_E_FORMAT naming the
 * preset file. */
int strata_prepare_list(const char *dir, uint32_t n_ctx, int json, FILE *out,
                        struct strata_err *err);

/* Verify a pack (strata_pack_verify) and print the result, as text or JSON.
 * Returns strata_pack_verify's result. */
int strata_prepare_verify(const char *pack, int json, FILE *out, const char *prog,
                          struct strata_err *err);

#endif
