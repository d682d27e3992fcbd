#!/usr/bin/env bash
# --spec T on the GPU ($STRATA_BACKEND, default cuda): greedy text byte-identical to
# --spec 0.
#   1. tests/t0900-generate-spec.sh with --backend cuda: T = 1..8, every fixture model,
#      n-gram and draft-model drafts, seeded sampling, statistics, option errors.
#   2. windows of 13 and 17 tokens (--spec 12, 16), and the same text with graphs off
#      (STRATA_NO_GRAPH=1) and with a synchronised launch after each kernel
#      (STRATA_SYNC_DEBUG=1).
#   3. offloaded experts: a --vram-budget-mib whose plan leaves part of the routed
#      experts in host RAM (found with --plan-only), T = 1..8 against --spec 0 under
#      the same budget, n-gram and draft model, every missed expert streamed to the GPU
#      (--pcie-frac 1: every expert product on the GPU kernels, so exact).  With a CPU
#      share (--pcie-frac 0.5) a window sends its busiest misses over PCIe and a decode
#      step may compute the same expert on the CPU, whose 8-bit activations differ from
#      the GPU's in the last bits: reported as a TODO point, not a failure.
. "$(dirname "$0")/../lib.sh"
G="$STRATA_BIN/strata-generate"
M="$STRATA_FIXTURES/models"
BE=${STRATA_BACKEND:-cuda}
check "strata-generate exists" test -x "$G"

# the sub-test's points become ours, prefixed
relay() { # prefix file
    local l
    while IFS= read -r l; do
        case $l in
        "ok "*) check "$1: ${l#ok * - }" true ;;
        "not ok "*) check "$1: ${l#not ok * - }" false ;;
        "#"*) echo "$l" ;;
        esac
    done <"$2"
}

STRATA_REL_BIN=$STRATA_BIN STRATA_SPEC_ARGS="--backend $BE --no-selftest" \
    bash "$STRATA_ROOT/tests/t0900-generate-spec.sh" >"$T/t0900.tap" 2>&1
rc=$?
relay "$BE" "$T/t0900.tap"
check "$BE: t0900 ran to its plan and passed" \
    bash -c "test $rc -eq 0 && grep -q '^1\.\.[1-9]' '$T/t0900.tap'"

P1='def fibonacci(n):
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)


def '
P2='import os
import sys


class Config:
    def __init__(self, path):
        self.path = path
'

gen() { # model prompt n out [args...]
    local m=$1 p=$2 n=$3 out=$4
    shift 4
    "$G" -m "$M/$m" -p "$p" -n "$n" --temp 0 --ignore-eos -t 2 --backend "$BE" --no-selftest \
        "$@" >"$out" 2>"$out.err"
}

# a TAP point marked TODO: shown, not counted as a failure
todo_check() {
    local name=$1
    shift
    _tap_n=$((_tap_n + 1))
    if "$@" >/dev/null 2>&1; then
        echo "ok $_tap_n - $name # TODO exact only where CPU and GPU expert products agree"
    else
        echo "not ok $_tap_n - $name # TODO exact only where CPU and GPU expert products agree"
    fi
}
SAME_CHECK=check

same_for() { # name model prompt n Ts [args...]: --spec T --spec-fixed == --spec 0
    local name=$1 m=$2 p=$3 n=$4 ts=$5 bad=""
    shift 5
    gen "$m" "$p" "$n" "$T/ref" --spec 0 "$@" || bad=" 0(exit)"
    for t in $ts; do
        gen "$m" "$p" "$n" "$T/out" --spec "$t" --spec-fixed "$@" || bad="$bad $t(exit)"
        cmp -s "$T/ref" "$T/out" || bad="$bad $t"
    done
    [ -n "$bad" ] && { echo "# $name: differs at T$bad"; sed 's/^/#   /' "$T/out.err" | tail -4; }
    $SAME_CHECK "$name: greedy --spec $(echo $ts | tr ' ' ,) == --spec 0 (byte-identical)" \
        test -z "$bad" -a -s "$T/ref"
}

same_for "$BE tinycoder Q4_K_M p1 ngram, 13- and 17-token windows" tinycoder-moe-Q4_K_M.gguf \
    "$P1" 64 "12 16"
same_for "$BE tinycoder IQ2_XS p2 draft, 17-token windows" tinycoder-moe-IQ2_XS.gguf "$P2" 48 \
    "16" --draft "$M/tinydraft-qwen3-F16.gguf"
same_for "$BE stories260K, 17-token windows" stories260K.gguf \
    'Once upon a time, there was a little girl named Lily. She' 96 "16"

gen tinycoder-moe-Q4_K_M.gguf "$P1" 64 "$T/g" --spec 6 --spec-fixed
STRATA_NO_GRAPH=1 gen tinycoder-moe-Q4_K_M.gguf "$P1" 64 "$T/ng" --spec 6 --spec-fixed
STRATA_SYNC_DEBUG=1 gen tinycoder-moe-Q4_K_M.gguf "$P1" 64 "$T/sd" --spec 6 --spec-fixed
check "$BE --spec 6: the same text with graphs, STRATA_NO_GRAPH=1 and STRATA_SYNC_DEBUG=1" \
    bash -c "test -s '$T/g' && cmp -s '$T/g' '$T/ng' && cmp -s '$T/g' '$T/sd'"

# offloaded experts: the smallest budget (to 2 MiB) with which the engine runs, if the
# backend's plan then keeps part of the routed experts out of VRAM (it logs when every
# expert fits); a run succeeds from some budget on, so a doubling then a bisection
runs_at() { # model budget
    gen "$1" "def f(" 2 "$T/probe" --vram-budget-mib "$2" -c 512 --pcie-frac 1
}
budget_for() { # model -> the budget in MiB on stdout, or nothing
    local lo=32 hi=64 mid
    while ! runs_at "$1" "$hi"; do
        lo=$hi
        hi=$((hi * 2))
        [ "$hi" -le 8192 ] || return
    done
    while [ $((hi - lo)) -gt 2 ]; do
        mid=$(((lo + hi) / 4 * 2))
        if runs_at "$1" "$mid"; then hi=$mid; else lo=$mid; fi
    done
    runs_at "$1" "$hi" || return
    grep -q "every routed expert fits in VRAM" "$T/probe.err" && return
    echo "$hi"
}
for q in Q4_K_M IQ2_XS; do
    b=$(budget_for tinycoder-moe-$q.gguf)
    check "tinycoder $q: a VRAM budget that offloads part of the experts exists" test -n "$b"
    [ -n "$b" ] || continue
    echo "# tinycoder $q: --vram-budget-mib $b -c 512"
    same_for "$BE tinycoder $q offloaded (budget $b MiB) p1 ngram" tinycoder-moe-$q.gguf "$P1" 40 \
        "1 2 3 4 5 6 7 8" --vram-budget-mib "$b" -c 512 --pcie-frac 1
    grep -i "expert" "$T/ref.err" | head -4 | sed 's/^/#   /'
    same_for "$BE tinycoder $q offloaded (budget $b MiB) p2 draft" tinycoder-moe-$q.gguf "$P2" 32 \
        "1 4 8" --vram-budget-mib "$b" -c 512 --pcie-frac 1 --draft "$M/tinydraft-qwen3-F16.gguf"
    SAME_CHECK=todo_check
    same_for "$BE tinycoder $q offloaded (budget $b MiB), CPU share 0.5, p1 ngram" \
        tinycoder-moe-$q.gguf "$P1" 40 "2 4 8" --vram-budget-mib "$b" -c 512 --pcie-frac 0.5
    SAME_CHECK=check
done
done_testing
