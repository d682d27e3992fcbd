/* json_util.h - typed member lookups on cJSON objects, shared by the modules
 * that read JSON files (pack.json, resident image metadata). */
#ifndef STRATA_JSON_UTIL_H
#define STRATA_JSON_UTIL_H

#include <stdint.h>

#include <cjson/cJSON.h>

/* Member k of o as a non-negative integer below 2^53 (exact in a double);
 * -1 when it is missing, not a number, negative, fractional or too large. */
int64_t strata_json_get_u(const cJSON *o, const char *k);

/* Member k of o as a string (owned by o); NULL when missing or not a string. */
const char *strata_json_get_s(const cJSON *o, const char *k);

#endif
