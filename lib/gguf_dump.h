/* gguf_dump.h - print a GGUF's (or split set's) metadata and tensor list,
 * as text or as JSON (cJSON), the way gguf-py's gguf_dump does.
 *
 * Text layout (one item per line, stable for scripts):
 *   file: PATH
 *   version: 3
 *   alignment: 32
 *   shards: N
 *     shard 0: PATH (SIZE bytes, data at OFFSET)
 *   metadata: N keys
 *     KEY: TYPE = VALUE          arrays as "array[ELEM; N] = [a, b, ...]"
 *   tensors: N
 *     INDEX: NAME TYPE [ne0, ne1, ...] BYTES bytes @ OFFSET (shard S)
 * Strings are quoted with C escapes; long arrays show their first items
 * and "... (N more)".
 *
 * JSON: {"file", "version", "alignment", "shards": [{"path", "size",
 * "data_offset"}], "metadata": [{"key", "type", "value"} or for arrays
 * {"key", "type": "array", "elem_type", "n", "value": [first items],
 * "truncated": bool}], "tensors": [{"name", "type", "shape": [ne...],
 * "n_elements", "n_bytes", "offset", "shard"}]}.  Integers are exact
 * (written as raw JSON numbers, including u64 values above 2^53).
 */
#ifndef STRATA_GGUF_DUMP_H
#define STRATA_GGUF_DUMP_H

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>

#include "err.h"
#include "gguf.h"

struct strata_gguf_dump_opts {
    uint64_t max_array_items; /* items shown per array; 0 = all */
    uint64_t max_str_bytes;   /* bytes shown per string in text; 0 = all */
};

/* Defaults: 8 array items, 120 string bytes. */
#define STRATA_GGUF_DUMP_OPTS_DEFAULT {8, 120}

/* Write the text dump to out.  opts NULL = defaults.  Returns 0 or
 * STRATA_E_IO when writing fails. */
int strata_gguf_dump_text(const struct strata_gguf *g, FILE *out,
                          const struct strata_gguf_dump_opts *opts, struct strata_err *err);

/* Build the JSON document (caller frees with cJSON_Delete).  opts NULL =
 * defaults (max_str_bytes is ignored: JSON strings are complete).  Returns 0
 * or STRATA_E_NOMEM. */
int strata_gguf_dump_json(const struct strata_gguf *g, const struct strata_gguf_dump_opts *opts,
                          cJSON **out, struct strata_err *err);

#endif
