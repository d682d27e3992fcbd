/* json_util.h - reading small JSON files and typed member lookups on cJSON
 * objects, shared by the modules that read them (pack.json, resident image
 * metadata). */
#ifndef STRATA_JSON_UTIL_H
#define STRATA_JSON_UTIL_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "err.h"

/* Member k of o as a non-negative integer below 2^53 (exact in a double);
 * -1 when it is missing, not a number, negative, fractional or too large. */
int64_t strata_json_get_u(const cJSON *o, const char *k);

/* Member k of o as a string (owned by o); NULL when missing or not a string. */
const char *strata_json_get_s(const cJSON *o, const char *k);

/* Read a whole small text file (at most 256 MiB) into *out, NUL-terminated,
 * malloc'ed (the caller frees).  Errors: STRATA_E_NOTFOUND (no such file),
 * STRATA_E_IO (cannot read: names it), STRATA_E_FORMAT (too large),
 * STRATA_E_NOMEM. */
int strata_json_read_text(const char *path, char **out, struct strata_err *err);

#endif
