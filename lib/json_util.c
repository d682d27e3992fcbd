/* json_util.c - typed member lookups on cJSON objects. */
#include "json_util.h"

int64_t strata_json_get_u(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v))
        return -1;
    double d = v->valuedouble;
    if (d < 0 || d > 9007199254740992.0 || d != (double)(int64_t)d)
        return -1;
    return (int64_t)d;
}

const char *strata_json_get_s(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}
