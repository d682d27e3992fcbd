/* test_err.c - error records, the code table and the exit-code mapping. */
#include <string.h>

#include "err.h"
#include "log.h"
#include "tap.h"

static int last_level = -1;
static char last_msg[256];

static void sink(int level, const char *msg, void *ud)
{
    (void)ud;
    last_level = level;
    snprintf(last_msg, sizeof(last_msg), "%s", msg);
}

int main(void)
{
    struct strata_err e = {0};
    int rc = strata_err_set(&e, STRATA_E_FORMAT, "tensor '%s' has %d dims", "x", 5);
    ok(rc == STRATA_E_FORMAT && e.code == STRATA_E_FORMAT, "set returns and stores the code");
    ok(strcmp(e.msg, "tensor 'x' has 5 dims") == 0, "message formatted: %s", e.msg);
    strata_err_wrap(&e, "opening '%s'", "m.gguf");
    ok(strcmp(e.msg, "opening 'm.gguf': tensor 'x' has 5 dims") == 0, "wrap prepends: %s", e.msg);
    ok(strata_err_set(NULL, STRATA_E_IO, "x") == STRATA_E_IO, "NULL record accepted");
    strata_err_clear(&e);
    ok(e.code == STRATA_OK && e.msg[0] == 0, "clear");

    ok(strata_err_exit_code(STRATA_OK) == 0, "ok -> exit 0");
    ok(strata_err_exit_code(STRATA_E_INVALID) == 2, "invalid -> exit 2");
    ok(strata_err_exit_code(STRATA_E_FORMAT) == 3, "format -> exit 3");
    ok(strata_err_exit_code(STRATA_E_GPU) == 4, "gpu -> exit 4");
    ok(strata_err_exit_code(STRATA_E_NOMEM) == 5, "nomem -> exit 5");
    ok(strata_err_exit_code(STRATA_E_IO) == 1, "io -> exit 1");
    ok(strata_err_exit_code(9999) == 1, "unknown code -> exit 1");
    ok(strcmp(strata_err_str(STRATA_E_CHECKSUM), "checksum mismatch") == 0, "code text");
    ok(strcmp(strata_err_str(-3), "unknown error") == 0, "text of an unknown code");

    strata_log_set_sink(sink, NULL);
    strata_log_set_level(STRATA_LOG_WARN);
    strata_log_info("hidden");
    ok(last_level == -1, "info filtered at level warn");
    strata_log_warn("shown %d", 7);
    ok(last_level == STRATA_LOG_WARN && strcmp(last_msg, "shown 7") == 0, "warn reaches sink");
    strata_log_set_sink(NULL, NULL);
    return tap_done();
}
