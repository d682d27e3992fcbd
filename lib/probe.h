/* probe.h - what this machine offers Strata: CPU, memory, GPU runtimes,
 * devices, PCIe bandwidth, and whether each device can run this build.
 *
 * GPU runtimes are never linked: they are dlopen()ed inside a child process
 * with a watchdog, so a runtime that crashes or hangs in its initialisation
 * is reported (with what it printed) instead of taking the probe down.  A
 * query that fails marks its field unknown (-1 / empty) and the probe goes
 * on; a device is never hidden because one of its queries failed.
 *
 * Fault injection for tests (environment STRATA_PROBE_INJECT, comma list):
 *   no-runtime    behave as if no GPU runtime library could be loaded
 *   query-fail    every per-device query fails (fields become unknown)
 *   hang          the device child hangs (exercises the watchdog)
 *   crash         the device child dies of SIGSEGV
 *   fake-cuda     report one fake CUDA device (sm_90, 8 GiB) without a GPU
 *   selftest-pass run a fake two-kernel self-test table instead of the build's
 *   selftest-fail the same with its second kernel failing (with selftest-pass: the
 *                 reporting of the kernel self-test, tested without a GPU)
 *
 * Kernel self-test (selftest.h): in a GPU build every supported device of the
 * build's API runs it after the queries; a device that fails it becomes
 * STRATA_PROBE_FAILED with the summary as its reason and is not usable.
 */
#ifndef STRATA_PROBE_H
#define STRATA_PROBE_H

#include <stdint.h>
#include <stdio.h>

#include "err.h"
#include "selftest.h"

#define STRATA_PROBE_MAX_DEVICES 16
#define STRATA_PROBE_MAX_LIBS 8

struct strata_probe_cpu {
    char model[128];
    int n_cpus;               /* online logical CPUs */
    int sse42, avx, avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512vnni, avx512bf16;
    uint64_t ram_total;       /* bytes, /proc/meminfo MemTotal */
    uint64_t ram_available;   /* bytes, MemAvailable */
    uint64_t hugepages_total; /* pages of hugepage_size */
    uint64_t hugepages_free;
    uint64_t hugepage_size;   /* bytes */
    char thp[32];             /* transparent hugepages mode: always/madvise/never */
    double mem_read_gbs;      /* measured streaming read, all CPUs; -1 when skipped */
};

struct strata_probe_lib {
    char name[64];   /* soname that was tried */
    char path[512];  /* where it was loaded from, when loaded */
    int loaded;
    char error[256]; /* dlerror() when not loaded */
};

enum strata_probe_status {
    STRATA_PROBE_SUPPORTED = 0,
    STRATA_PROBE_UNSUPPORTED,
    STRATA_PROBE_NOT_VISIBLE,
    STRATA_PROBE_UNKNOWN,
    STRATA_PROBE_FAILED,      /* supported, but failed the kernel self-test */
};

struct strata_probe_device {
    char api[8];          /* "cuda" or "hip" */
    int index;            /* runtime ordinal; -1 when not visible */
    char name[128];       /* "" when unknown */
    char arch[32];        /* "sm_90", "gfx1100"; "" when unknown */
    char pci_bus_id[32];  /* "0000:3b:00.0"; "" when unknown */
    int64_t vram_total;   /* bytes; -1 unknown */
    int64_t vram_free;
    int n_sm;             /* multiprocessors / compute units; -1 unknown */
    int warp_size;        /* 32 or 64; -1 unknown */
    int integrated;       /* 1, 0, or -1 unknown */
    int status;           /* enum strata_probe_status */
    char reason[256];     /* why unsupported / not visible / unknown */
    /* bandwidths in GB/s (1e9 bytes/s); -1 when not measured */
    double h2d_pinned, d2h_pinned, h2d_pageable, d2h_pageable;
    double h2d_both, d2h_both; /* both directions at once, pinned */
    char link[64];        /* "PCIe gen 5 x16" where the platform says; "" */
    char query_error[256];/* first failing runtime call and its message */
    struct strata_selftest_report selftest; /* .ran = 0 with .not_run when not run */
};

struct strata_probe_report {
    struct strata_probe_cpu cpu;
    struct strata_probe_lib libs[STRATA_PROBE_MAX_LIBS];
    int n_libs;
    int cuda_driver_version;  /* e.g. 13000; -1 unknown / absent */
    int cuda_runtime_version;
    int hip_runtime_version;
    struct strata_probe_device devices[STRATA_PROBE_MAX_DEVICES];
    int n_devices;
    char child_error[256];    /* a GPU query child that crashed or hung */
    char build_backends[64];  /* backends this build has kernels for ("cpu", "cpu cuda") */
    char build_archs[256];    /* archs compiled into the GPU plugins, from BUILD.json */
    double pcie_frac;         /* what the engine would choose; -1 without a GPU */
    int usable_devices;       /* devices that are supported (and passed the self-test) */
    int selftest_ran;         /* the self-test ran on at least one device */
    char selftest_note[160];  /* why it did not run on any device ("" when it did) */
};

struct strata_probe_opts {
    int quick;          /* skip bandwidth measurements */
    int timeout_ms;     /* watchdog for the GPU query child; 0 = 20000 */
    const char *exe_dir;/* directory of the running program (BUILD.json, plugins) */
    int no_selftest;    /* skip the kernel self-test */
    int selftest_timeout_ms; /* deadline of each self-test kernel; 0 = 3000 */
};

/* Fill *r.  Returns 0; errors in individual queries are recorded in the
 * report, not returned.  STRATA_E_NOMEM / STRATA_E_IO only when the probe
 * itself cannot run (no memory, cannot fork). */
int strata_probe_run(struct strata_probe_report *r, const struct strata_probe_opts *o,
                     struct strata_err *err);

/* The readable report. */
void strata_probe_print(FILE *f, const struct strata_probe_report *r);

/* The report as JSON (schema "strata-probe/1", documented in
 * man/strata-probe.1); a malloc'ed string the caller frees, NULL on OOM. */
char *strata_probe_json(const struct strata_probe_report *r);

/* Streaming read bandwidth of host memory in GB/s, n_threads readers over
 * bytes of memory (at least 64 MiB recommended); -1 on failure. */
double strata_probe_mem_read_gbs(uint64_t bytes, int n_threads);

/* Share of the bytes of missed experts the engine sends over PCIe rather
 * than computing on the CPU, so both finish together:
 * f = pcie / (pcie + cpu), from bandwidths in the same unit.  Both paths
 * read each expert byte once (DESIGN.md "Memory plan").  -1 when either
 * bandwidth is unknown. */
double strata_probe_pcie_frac(double pcie_gbs, double cpu_gbs);

const char *strata_probe_status_name(int status);

#endif
