/* test_selftest.c - the kernel self-test of this GPU build passes on device 0, kernel by
 * kernel (make check-gpu).  A deliberately broken kernel is checked by
 * tests/gpu/selftest-break.sh, which needs its own build. */
#include <stdio.h>
#include <string.h>

#include "selftest.h"
#include "tap.h"

int main(void)
{
    static struct strata_selftest_report rep;
    struct strata_err err = {0};
    struct strata_selftest_opts o = {0, 0};
    int rc = strata_selftest_gpu(0, &o, &rep, &err);
    if (rc == 0 && rep.ran && rep.n == 1 && strcmp(rep.r[0].kernel, "init") == 0 &&
        strstr(rep.r[0].error, "no CUDA-capable device")) {
        printf("1..0 # SKIP no GPU device: %s\n", rep.r[0].error);
        return 0;
    }
    ok(rc == 0 && rep.ran, "self-test ran on %s device 0 %s", rep.api, err.msg);
    ok(rep.n > 60, "%d kernels tested (every block type for get_rows, matvec, matmul)", rep.n);
    double ms = 0;
    for (int i = 0; i < rep.n; i++) {
        const struct strata_selftest_result *r = &rep.r[i];
        ms += r->ms;
        ok(r->pass, "%s [%s] %.1f ms%s%s", r->kernel, r->shapes, r->ms, r->pass ? "" : ": ",
           r->error);
    }
    char sum[512];
    strata_selftest_summary(&rep, sum, sizeof(sum));
    diag("%s; %.2f s in the cases", sum, ms / 1000);
    return tap_done();
}
