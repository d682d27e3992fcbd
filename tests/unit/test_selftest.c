/* test_selftest.c - the kernel self-test harness with a table of fake kernels: passes,
 * wrong results, runtime faults, crashes, hangs and failing device start-up are each
 * reported against the right case, and the cases after them still run. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "selftest.h"
#include "serve_stdio.h"
#include "tap.h"

static int k_pass(int dev, int arg, char *shapes, size_t sc, char *msg, size_t mc)
{
    (void)msg;
    (void)mc;
    snprintf(shapes, sc, "n=%d dev=%d pid=%ld", arg, dev, (long)getpid());
    return 0;
}

static int k_wrong(int dev, int arg, char *shapes, size_t sc, char *msg, size_t mc)
{
    (void)dev;
    snprintf(shapes, sc, "n=%d", arg);
    snprintf(msg, mc, "max error 12.5 at %d", arg);
    return STRATA_SELFTEST_WRONG;
}

static int k_fault(int dev, int arg, char *shapes, size_t sc, char *msg, size_t mc)
{
    (void)dev;
    (void)arg;
    snprintf(shapes, sc, "pid=%ld", (long)getpid());
    snprintf(msg, mc, "unspecified launch failure");
    return STRATA_SELFTEST_FAULT;
}

static int k_crash(int dev, int arg, char *shapes, size_t sc, char *msg, size_t mc)
{
    (void)dev;
    (void)arg;
    (void)msg;
    (void)mc;
    snprintf(shapes, sc, "rows=3");
    fprintf(stderr, "about to crash\n");
    raise(SIGABRT); /* (the sanitizers take SIGSEGV over and report slowly) */
    return 0;
}

static int k_hang(int dev, int arg, char *shapes, size_t sc, char *msg, size_t mc)
{
    (void)dev;
    (void)arg;
    (void)msg;
    (void)mc;
    snprintf(shapes, sc, "n_tok=1");
    printf("spinning\n");
    fflush(stdout);
    for (;;)
        pause();
    return 0;
}

static int init_ok(int dev, char *msg, size_t mc)
{
    (void)dev;
    (void)msg;
    (void)mc;
    return 0;
}

static int init_fail(int dev, char *msg, size_t mc)
{
    snprintf(msg, mc, "no device %d: no CUDA-capable device is detected", dev);
    return 1;
}

static int init_hang(int dev, char *msg, size_t mc)
{
    (void)dev;
    (void)msg;
    (void)mc;
    for (;;)
        pause();
    return 0;
}

/* Fails once the fault case has run (a flag file in the temporary directory), to
 * model a device that does not come back. */
static char flag_path[256];
static int init_once(int dev, char *msg, size_t mc)
{
    (void)dev;
    if (access(flag_path, F_OK) == 0) {
        snprintf(msg, mc, "device is lost");
        return 1;
    }
    FILE *f = fopen(flag_path, "w");
    if (f)
        fclose(f);
    return 0;
}

static const struct strata_selftest_result *find(const struct strata_selftest_report *r,
                                                 const char *k)
{
    for (int i = 0; i < r->n; i++)
        if (strcmp(r->r[i].kernel, k) == 0)
            return &r->r[i];
    return NULL;
}

int main(void)
{
    static struct strata_selftest_report rep;
    struct strata_err err = {0};
    struct strata_selftest_opts o = {.timeout_ms = 300, .init_timeout_ms = 500};
    char sum[512];

    static const struct strata_selftest_case cases[] = {
        {"add", k_pass, 7},      {"rms_norm", k_wrong, 5}, {"get_rows", k_pass, 1},
        {"matvec Q4_K", k_fault, 0}, {"argmax", k_pass, 2}, {"topk", k_crash, 0},
        {"attention", k_hang, 0}, {"moe_route", k_pass, 3},
    };
    struct strata_selftest_table t = {"cuda", cases, 8, init_ok, NULL};
    int rc = strata_selftest_run_table(&t, 1, &o, &rep, &err);
    ok(rc == 0 && rep.ran && rep.n == 8, "table ran: rc %d, %d results %s", rc, rep.n, err.msg);
    ok(rep.n_failed == 4, "four failures counted (%d)", rep.n_failed);
    ok(strcmp(rep.api, "cuda") == 0 && rep.device == 1, "api and device recorded");
    const struct strata_selftest_result *a = find(&rep, "add"), *g = find(&rep, "get_rows");
    ok(a && a->pass && strstr(a->shapes, "n=7 dev=1"), "passing case with its shapes: %s",
       a ? a->shapes : "?");
    const struct strata_selftest_result *w = find(&rep, "rms_norm");
    ok(w && !w->pass && strstr(w->error, "max error 12.5 at 5") && strcmp(w->shapes, "n=5") == 0,
       "wrong results: %s", w ? w->error : "?");
    ok(g && g->pass, "the case after wrong results runs in the same process");
    const struct strata_selftest_result *f = find(&rep, "matvec Q4_K"), *am = find(&rep, "argmax");
    ok(f && !f->pass && strstr(f->error, "unspecified launch failure"), "fault: %s",
       f ? f->error : "?");
    ok(am && am->pass, "the case after a fault passes");
    long p1 = a ? atol(strstr(a->shapes, "pid=") + 4) : 0;
    long p2 = am ? atol(strstr(am->shapes, "pid=") + 4) : 0;
    ok(p1 && p2 && p1 != p2 && p1 != getpid(),
       "cases run outside this process, and a new one after a fault (%ld, %ld)", p1, p2);
    const struct strata_selftest_result *c = find(&rep, "topk");
    ok(c && !c->pass && strstr(c->error, "died") && strstr(c->error, "about to crash") &&
           strcmp(c->shapes, "rows=3") == 0,
       "crash named with its signal and output: %s [%s]", c ? c->error : "?",
       c ? c->shapes : "?");
    const struct strata_selftest_result *h = find(&rep, "attention");
    ok(h && !h->pass && strstr(h->error, "did not finish within 300 ms") &&
           strstr(h->error, "spinning"),
       "hang killed at its deadline: %s", h ? h->error : "?");
    const struct strata_selftest_result *m = find(&rep, "moe_route");
    ok(m && m->pass, "the case after a hang runs");

    strata_selftest_summary(&rep, sum, sizeof(sum));
    ok(strstr(sum, "failed for 4 of 8 kernels: rms_norm [n=5]: max error 12.5") &&
           strstr(sum, "and 3 more"),
       "summary names the first failure: %s", sum);

    /* all pass */
    struct strata_selftest_table tp = {"hip", cases, 1, init_ok, NULL};
    rc = strata_selftest_run_table(&tp, 0, &o, &rep, &err);
    strata_selftest_summary(&rep, sum, sizeof(sum));
    ok(rc == 0 && rep.n_failed == 0 && strcmp(sum, "kernel self-test passed (1 kernels)") == 0,
       "all pass: %s", sum);

    /* the device cannot start */
    struct strata_selftest_table ti = {"cuda", cases, 8, init_fail, NULL};
    rc = strata_selftest_run_table(&ti, 3, &o, &rep, &err);
    ok(rc == 0 && rep.n == 1 && rep.n_failed == 1 && strcmp(rep.r[0].kernel, "init") == 0 &&
           strstr(rep.r[0].error, "no device 3"),
       "init failure is one result: %s", rep.r[0].error);
    struct strata_selftest_table th = {"cuda", cases, 8, init_hang, NULL};
    rc = strata_selftest_run_table(&th, 0, &o, &rep, &err);
    ok(rc == 0 && rep.n == 1 && strstr(rep.r[0].error, "start-up did not finish within 500 ms"),
       "init hang killed: %s", rep.r[0].error);

    /* a device that does not come back after a fault */
    snprintf(flag_path, sizeof(flag_path), "%s/strata-selftest-%ld",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (long)getpid());
    unlink(flag_path);
    struct strata_selftest_table tl = {"cuda", cases, 5, init_once, NULL};
    rc = strata_selftest_run_table(&tl, 0, &o, &rep, &err);
    unlink(flag_path);
    ok(rc == 0 && rep.n == 5 && rep.n_failed == 3 && rep.r[0].pass &&
           strcmp(rep.r[0].kernel, "add") == 0 && strstr(rep.r[4].error, "device is lost"),
       "lost device: earlier results kept, the rest not run: %s", rep.r[4].error);

    /* a CPU build has no table */
    if (!strata_selftest_gpu_table()) {
        rc = strata_selftest_gpu(0, &o, &rep, &err);
        strata_selftest_summary(&rep, sum, sizeof(sum));
        ok(rc == 0 && !rep.ran && strstr(sum, "not run: this build has no GPU kernels"),
           "CPU build: %s", sum);
    }

    /* the error event an engine sends when it refuses its device */
    int pfd[2];
    char ev[512] = "";
    if (pipe(pfd) == 0) {
        rc = strata_serve_stdio_error(pfd[1], STRATA_E_GPU, "cuda device 0: kernel self-test "
                                      "failed for 1 of 2 kernels: rms_norm [n=5]: \"x\"", &err);
        close(pfd[1]);
        ssize_t n = read(pfd[0], ev, sizeof(ev) - 1);
        ev[n > 0 ? n : 0] = '\0';
        close(pfd[0]);
    }
    ok(rc == 0 && strstr(ev, "\"type\":\"error\"") && strstr(ev, "\"code\":\"gpu\"") &&
           strstr(ev, "rms_norm [n=5]: \\\"x\\\"") && !strstr(ev, "\"id\"") &&
           ev[strlen(ev) - 1] == '\n',
       "error event line: %s", ev);
    return tap_done();
}
