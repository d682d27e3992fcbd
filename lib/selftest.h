/* selftest.h - the GPU kernel self-test: every kernel the GPU backend uses runs on small
 * random inputs and is compared with the CPU reference, each under a deadline, so that
 * a broken kernel (wrong results, a fault such as "unspecified launch failure", a hang)
 * is named in seconds, before a model is loaded.  strata-probe reports it per device;
 * strata-generate and strata-serve's engines run it at start on a GPU backend.
 *
 * The harness here is plain C and runs a table of cases in a child process: the
 * parent never touches the GPU runtime, so a case that crashes the process, faults
 * the device context or never returns is reported as failed (with the signal, the
 * runtime's message or the deadline) and the remaining cases run in a fresh child.
 * GPU builds (STRATA_WITH_GPU) get their table from kernels/selftest.cu; CPU builds
 * have none and say so.
 */
#ifndef STRATA_SELFTEST_H
#define STRATA_SELFTEST_H

#include <stddef.h>

#include "err.h"

#define STRATA_SELFTEST_MAX 128

/* One case's outcome. */
struct strata_selftest_result {
    char kernel[24];  /* "rms_norm", "matvec Q4_K" */
    char shapes[72];  /* "n=37 rows=5" */
    int pass;         /* 1 passed, 0 failed */
    double ms;        /* wall time of the case, milliseconds */
    char error[176];  /* why it failed: the difference, the runtime's message, a signal */
};

struct strata_selftest_report {
    int ran;          /* 1 when the table was run on the device */
    char not_run[160];/* why not, when !ran */
    char api[8];      /* "cuda" or "hip" ("" when !ran) */
    int device;       /* runtime ordinal */
    int n, n_failed;
    struct strata_selftest_result r[STRATA_SELFTEST_MAX];
};

/* A case returns 0 when the kernel matched the reference, STRATA_SELFTEST_WRONG when
 * it ran but its results differ (msg says where and by how much), and
 * STRATA_SELFTEST_FAULT when the runtime reported an error (msg: its message); after a
 * fault the remaining cases run in a new process, since the device context may be
 * unusable.  shapes gets a short description of the inputs.  arg is the case's own
 * parameter (e.g. a block type). */
#define STRATA_SELFTEST_WRONG 1
#define STRATA_SELFTEST_FAULT 2
struct strata_selftest_case {
    const char *kernel;
    int (*run)(int dev, int arg, char *shapes, size_t shapes_cap, char *msg, size_t msg_cap);
    int arg;
};

struct strata_selftest_table {
    const char *api;                        /* "cuda" or "hip" */
    const struct strata_selftest_case *cases;
    int n_cases;                            /* <= STRATA_SELFTEST_MAX - 1 */
    /* Called once in each child before its first case: select device dev and create
     * its context.  0, or nonzero with msg (the device cannot be used at all). */
    int (*init)(int dev, char *msg, size_t msg_cap);
    /* The targets compiled into this image, space-separated ("sm_90 compute_90",
     * "gfx1030 gfx1100"); NULL or "" when unknown. */
    const char *archs;
};

struct strata_selftest_opts {
    int timeout_ms;      /* deadline of each case; 0 = 3000 */
    int init_timeout_ms; /* deadline of init (runtime start-up); 0 = 30000 */
};

/* Run table t on device dev into *rep (overwritten).  A failing init fills one result
 * named "init" and stops.  Returns 0 when the table ran (whatever its results:
 * rep->n_failed counts the failures); STRATA_E_NOMEM / STRATA_E_IO when the harness
 * itself cannot run (no shared memory, cannot fork or make a pipe).  Never prints to
 * stdout or stderr: what the child prints is captured and ends up in the errors. */
int strata_selftest_run_table(const struct strata_selftest_table *t, int dev,
                              const struct strata_selftest_opts *o,
                              struct strata_selftest_report *rep, struct strata_err *err);

/* The table of this build's GPU backend, NULL in a CPU build. */
const struct strata_selftest_table *strata_selftest_gpu_table(void);

/* Run the GPU table on device dev; in a CPU build fill rep with ran = 0 and why, and
 * return 0.  Errors as strata_selftest_run_table. */
int strata_selftest_gpu(int dev, const struct strata_selftest_opts *o,
                        struct strata_selftest_report *rep, struct strata_err *err);

/* One line for a message: "kernel self-test passed (N kernels)", or
 * "kernel self-test failed for K of N kernels: KERNEL [SHAPES]: ERROR (and M more)",
 * or "kernel self-test not run: WHY".  Always NUL-terminates buf (cap > 0). */
void strata_selftest_summary(const struct strata_selftest_report *rep, char *buf, size_t cap);

#endif
