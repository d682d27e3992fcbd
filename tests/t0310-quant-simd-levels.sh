#!/usr/bin/env bash
# The quant and matmul unit tests again with the SIMD level forced down by
# STRATA_SIMD (activation quantisation and the default kernels follow it).
tests="${STRATA_BIN:?}/../tests"
n=0
fail=0
for level in scalar avx2; do
    for t in test_quant_dot test_matmul; do
        n=$((n + 1))
        if STRATA_SIMD=$level "$tests/$t" > /dev/null 2>&1; then
            echo "ok $n - $t with STRATA_SIMD=$level"
        else
            echo "not ok $n - $t with STRATA_SIMD=$level"
            fail=1
        fi
    done
done
echo "1..$n"
exit $fail
