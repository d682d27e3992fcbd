/* test_probe.c - the machine report: CPU section, JSON schema, and the
 * failure paths of the GPU runtime queries (injected through
 * STRATA_PROBE_INJECT). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "probe.h"
#include "tap.h"

static cJSON *run_json(const char *inject, struct strata_probe_report *r)
{
    if (inject)
        setenv("STRATA_PROBE_INJECT", inject, 1);
    else
        unsetenv("STRATA_PROBE_INJECT");
    struct strata_probe_opts o = {.quick = 1, .timeout_ms = 3000};
    struct strata_err err = {0};
    if (strata_probe_run(r, &o, &err) != 0) {
        diag("probe failed: %s", err.msg);
        return NULL;
    }
    char *s = strata_probe_json(r);
    cJSON *j = s ? cJSON_Parse(s) : NULL;
    free(s);
    return j;
}

/* The probe with exe_dir dir (a BUILD.json there) and the self-test options. */
static cJSON *run_json_opts(const char *inject, const char *dir, int no_selftest,
                            struct strata_probe_report *r)
{
    setenv("STRATA_PROBE_INJECT", inject, 1);
    struct strata_probe_opts o = {.quick = 1, .timeout_ms = 3000, .exe_dir = dir,
                                  .no_selftest = no_selftest, .selftest_timeout_ms = 3000};
    struct strata_err err = {0};
    if (strata_probe_run(r, &o, &err) != 0) {
        diag("probe failed: %s", err.msg);
        return NULL;
    }
    char *s = strata_probe_json(r);
    cJSON *j = s ? cJSON_Parse(s) : NULL;
    free(s);
    return j;
}

static const cJSON *dev0(const cJSON *j)
{
    return cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "devices"), 0);
}

static int is_num_or_null(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return v && (cJSON_IsNumber(v) || cJSON_IsNull(v));
}

int main(void)
{
    static struct strata_probe_report r;

    /* the CPU section */
    cJSON *j = run_json("no-runtime", &r);
    ok(j != NULL, "report with no GPU runtime is valid JSON");
    ok(r.cpu.n_cpus >= 1, "cpu count %d", r.cpu.n_cpus);
    ok(r.cpu.ram_total > r.cpu.ram_available / 2 && r.cpu.ram_total > (64u << 20),
       "ram total %llu bytes", (unsigned long long)r.cpu.ram_total);
    ok(r.cpu.model[0] != '\0', "cpu model '%s'", r.cpu.model);
    ok(!r.cpu.avx2 || r.cpu.avx, "avx2 implies avx");
    ok(!r.cpu.avx512bw || r.cpu.avx512f, "avx512bw implies avx512f");
    ok(r.n_devices == 0 && r.usable_devices == 0, "no runtime: no devices");
    ok(r.pcie_frac < 0, "no GPU: no pcie_frac");
    int all_missing = r.n_libs > 0;
    for (int i = 0; i < r.n_libs; i++)
        all_missing &= !r.libs[i].loaded && strstr(r.libs[i].error, "injected") != NULL;
    ok(all_missing, "every runtime library reported missing, with the reason");
    if (j) {
        const cJSON *schema = cJSON_GetObjectItemCaseSensitive(j, "schema");
        ok(cJSON_IsString(schema) && strcmp(schema->valuestring, "strata-probe/1") == 0,
           "schema strata-probe/1");
        const cJSON *cpu = cJSON_GetObjectItemCaseSensitive(j, "cpu");
        ok(cJSON_IsObject(cpu) && cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(cpu, "cpus")) &&
               cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(cpu, "simd")) &&
               is_num_or_null(cpu, "mem_read_gbs") &&
               cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(cpu, "hugepages")),
           "cpu object: cpus, simd, mem_read_gbs, hugepages");
        ok(cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(j, "libraries")), "libraries array");
        ok(cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(j, "devices")) &&
               cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "devices")) == 0,
           "devices empty");
        const cJSON *be = cJSON_GetObjectItemCaseSensitive(j, "backend");
        ok(cJSON_IsString(be) && strcmp(be->valuestring, "cpu") == 0, "backend cpu");
        ok(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "pcie_frac")), "pcie_frac null");
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "selftest");
        const cJSON *why = cJSON_GetObjectItemCaseSensitive(st, "reason");
        ok(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(st, "run")) && cJSON_IsString(why) &&
               strstr(why->valuestring, "no GPU kernels (CPU build"),
           "selftest: not run, and why (%s)", cJSON_IsString(why) ? why->valuestring : "?");
    }
    cJSON_Delete(j);

    /* a device whose queries all fail is listed, with unknown fields */
    j = run_json("fake-cuda,query-fail", &r);
    ok(r.n_devices == 1, "failing device still listed (%d)", r.n_devices);
    ok(r.devices[0].status == STRATA_PROBE_UNKNOWN && r.devices[0].vram_total < 0 &&
           strstr(r.devices[0].reason, "injected") != NULL,
       "failing device: status unknown, vram unknown, reason '%s'", r.devices[0].reason);
    if (j) {
        const cJSON *d = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "devices"), 0);
        ok(d && cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(d, "vram_total_bytes")) &&
               strcmp(cJSON_GetObjectItemCaseSensitive(d, "status")->valuestring, "unknown") == 0,
           "unknown fields are null in JSON");
    }
    cJSON_Delete(j);

    /* a device with no kernels in this build is unsupported, with the fix */
    j = run_json("fake-cuda", &r);
    ok(r.n_devices == 1 && r.devices[0].status == STRATA_PROBE_UNSUPPORTED &&
           strstr(r.devices[0].reason, "make cuda") != NULL,
       "CPU-only build: device unsupported, says how to rebuild ('%s')", r.devices[0].reason);
    ok(r.usable_devices == 0, "no usable devices");
    cJSON_Delete(j);

    /* the runtime hangs: the watchdog ends it */
    j = run_json("hang", &r);
    ok(j != NULL && strstr(r.child_error, "did not finish") != NULL,
       "hung runtime reported: '%s'", r.child_error);
    if (j) {
        const cJSON *rt = cJSON_GetObjectItemCaseSensitive(j, "runtime");
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(rt, "error");
        ok(cJSON_IsString(e), "runtime.error in JSON");
    }
    cJSON_Delete(j);

    /* the runtime crashes */
    j = run_json("crash", &r);
    ok(j != NULL && strstr(r.child_error, "crashed") != NULL, "crashed runtime reported: '%.60s'",
       r.child_error);
    cJSON_Delete(j);

    /* the kernel self-test's reporting, with a fake table on a fake supported device */
    char dir[] = "/tmp/strata-probe-XXXXXX";
    int have_dir = mkdtemp(dir) != NULL;
    char path[64];
    snprintf(path, sizeof(path), "%s/BUILD.json", dir);
    FILE *bf = have_dir ? fopen(path, "w") : NULL;
    if (bf) {
        fputs("{\"backend\": \"cuda\", \"archs\": [\"sm_90\"]}\n", bf);
        fclose(bf);
    }
    j = run_json_opts("fake-cuda,selftest-pass", dir, 0, &r);
    ok(r.n_devices == 1 && r.devices[0].status == STRATA_PROBE_SUPPORTED && r.usable_devices == 1 &&
           r.selftest_ran && r.devices[0].selftest.n == 2 && r.devices[0].selftest.n_failed == 0,
       "self-test passes: device usable (status %s, %d kernels)",
       strata_probe_status_name(r.devices[0].status), r.devices[0].selftest.n);
    const cJSON *d = dev0(j);
    const cJSON *sa = cJSON_GetObjectItemCaseSensitive(d, "selftest");
    const cJSON *k1 = cJSON_GetArrayItem(sa, 1);
    ok(cJSON_GetArraySize(sa) == 2 && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(k1, "pass")) &&
           strcmp(cJSON_GetObjectItemCaseSensitive(k1, "kernel")->valuestring, "matvec Q4_K") == 0 &&
           cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(k1, "error")) &&
           cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(d, "selftest_not_run")) &&
           cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j,
                        "selftest"), "run")),
       "JSON: a selftest array per device, one entry per kernel");
    cJSON_Delete(j);

    j = run_json_opts("fake-cuda,selftest-fail", dir, 0, &r);
    ok(r.devices[0].status == STRATA_PROBE_FAILED && r.usable_devices == 0 &&
           strstr(r.devices[0].reason, "failed for 1 of 2 kernels: matvec Q4_K [n=65 dev=0]"),
       "a failing kernel makes the device unusable, named: %s", r.devices[0].reason);
    d = dev0(j);
    k1 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(d, "selftest"), 1);
    const cJSON *ke = cJSON_GetObjectItemCaseSensitive(k1, "error");
    ok(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(k1, "pass")) && cJSON_IsString(ke) &&
           strstr(ke->valuestring, "injected") &&
           strcmp(cJSON_GetObjectItemCaseSensitive(d, "status")->valuestring, "failed") == 0,
       "JSON: the failing kernel with its error, device status failed");
    cJSON_Delete(j);

    j = run_json_opts("fake-cuda,selftest-fail", dir, 1, &r);
    ok(r.devices[0].status == STRATA_PROBE_SUPPORTED && r.usable_devices == 1 &&
           !r.devices[0].selftest.ran && strstr(r.devices[0].selftest.not_run, "--no-selftest"),
       "--no-selftest: not run, device usable");
    ke = cJSON_GetObjectItemCaseSensitive(dev0(j), "selftest_not_run");
    ok(cJSON_IsString(ke) && strstr(ke->valuestring, "skipped"), "JSON: selftest_not_run says so");
    cJSON_Delete(j);
    if (have_dir) {
        unlink(path);
        rmdir(dir);
    }
    unsetenv("STRATA_PROBE_INJECT");

    double bw = strata_probe_mem_read_gbs(32u << 20, 2);
    ok(bw > 0.1 && bw < 10000, "memory read bandwidth %.1f GB/s", bw);
    ok(fabs(strata_probe_pcie_frac(55, 55) - 0.5) < 1e-12, "pcie_frac equal bandwidths = 0.5");
    ok(fabs(strata_probe_pcie_frac(25, 75) - 0.25) < 1e-12, "pcie_frac 25/(25+75)");
    ok(strata_probe_pcie_frac(-1, 10) < 0 && strata_probe_pcie_frac(10, 0) < 0,
       "pcie_frac unknown without both bandwidths");
    return tap_done();
}
