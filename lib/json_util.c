/* json_util.c - typed member lookups on cJSON objects. */
#include "json_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int strata_json_read_text(const char *path, char **out, struct strata_err *err)
{
    int rc = 0;
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n;
    if (!f)
        return strata_err_set(err, errno == ENOENT ? STRATA_E_NOTFOUND : STRATA_E_IO,
                              "cannot open '%s': %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET)) {
        rc = strata_err_set(err, STRATA_E_IO, "cannot read '%s'", path);
        goto out;
    }
    if (n > (256l << 20)) {
        rc = strata_err_set(err, STRATA_E_FORMAT, "'%s' is too large (%ld bytes)", path, n);
        goto out;
    }
    if (!(buf = malloc((size_t)n + 1))) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        rc = strata_err_set(err, STRATA_E_IO, "cannot read '%s'", path);
        goto out;
    }
    buf[n] = 0;
    *out = buf;
    buf = NULL;
out:
    free(buf);
    fclose(f);
    return rc;
}
