#!/usr/bin/env bash
# setup.sh - build Strata, prepare a model pack and write a script that runs it.
#
#   scripts/setup.sh --backend cpu|cuda|hip --family F --model QUANT
#                    [--context N] [--vision yes|no] [--out DIR] [--port N]
#                    [--native|--repack] [--offline] [--no-build] [--run-dir DIR]
#
# Builds the programs for the backend (make, make cuda or make hip), runs
# strata-prepare for the preset (packs/F.json, see `bin/strata-prepare --list`)
# into DIR (default: ./packs-data), and writes ./run-F-QUANT.sh, which starts
# strata-serve on the pack (or strata-generate while the server is not built)
# with the backend, context and port chosen here.  $STRATA_BIN overrides the
# directory of the programs.  GPU backends get a
# repacked pack (one contiguous record per expert, for the expert cache)
# unless --native is given.  Run it again to resume an interrupted download.
set -eu

usage() {
    sed -n '3,9p' "$0" | sed 's/^# \{0,1\}//'
    exit "${1:-2}"
}

root=$(cd "$(dirname "$0")/.." && pwd)
backend="" family="" model="" context="" vision="no" out="" port=8080
layout="" offline="" build=1 run_dir=""
while [ $# -gt 0 ]; do
    case "$1" in
    --backend) backend=${2-}; shift 2 ;;
    --family) family=${2-}; shift 2 ;;
    --model) model=${2-}; shift 2 ;;
    --context) context=${2-}; shift 2 ;;
    --vision) vision=${2-}; shift 2 ;;
    --out) out=${2-}; shift 2 ;;
    --port) port=${2-}; shift 2 ;;
    --native) layout=--native; shift ;;
    --repack) layout=--repack; shift ;;
    --offline) offline=--offline; shift ;;
    --no-build) build=0; shift ;;
    --run-dir) run_dir=${2-}; shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "setup.sh: unknown option '$1'" >&2; usage ;;
    esac
done
case "$backend" in
cpu | cuda | hip) ;;
*) echo "setup.sh: --backend must be cpu, cuda or hip" >&2; usage ;;
esac
[ -n "$family" ] && [ -n "$model" ] || { echo "setup.sh: --family and --model are required" >&2; usage; }
case "$vision" in yes | no) ;; *) echo "setup.sh: --vision must be yes or no" >&2; usage ;; esac
if [ -n "$context" ]; then
    case "$context" in '' | *[!0-9]*) echo "setup.sh: --context must be a number" >&2; usage ;; esac
fi
case "$port" in '' | *[!0-9]*) echo "setup.sh: --port must be a number" >&2; usage ;; esac
[ -n "$out" ] || out="$root/packs-data"
[ -n "$run_dir" ] || run_dir="$root"
# relative to where setup.sh was started, before it moves to the source tree
mkdir -p "$out" "$run_dir"
out=$(cd "$out" && pwd)
run_dir=$(cd "$run_dir" && pwd)
[ -n "$layout" ] || { [ "$backend" = cpu ] && layout=--native || layout=--repack; }

cd "$root"
top="${STRATA_BIN:-$root/bin}"
bindir="$top"
[ "$backend" = cuda ] && bindir="$top/cuda"
[ "$backend" = hip ] && bindir="$top/hip"
if [ "$build" = 1 ]; then
    echo "setup.sh: building ($backend)" >&2
    jobs=$(nproc 2>/dev/null || echo 2)
    case "$backend" in
    cpu) make -j"$jobs" ;;
    cuda) make -j"$jobs" && make -j"$jobs" cuda ;;
    hip) make -j"$jobs" && make -j"$jobs" hip ;;
    esac
fi
prep="$top/strata-prepare"
[ -x "$prep" ] || { echo "setup.sh: $prep is missing (build first)" >&2; exit 1; }

name="$family-$model"
pack="$out/$name.strata"
if [ -e "$pack/pack.json" ]; then
    echo "setup.sh: $pack exists; keeping it (remove it or run strata-prepare --force)" >&2
else
    args=(--family "$family" --model "$model" --out "$out" "$layout" --vision "$vision")
    [ -n "$context" ] && args+=(--context "$context")
    [ -n "$offline" ] && args+=("$offline")
    STRATA_PRESETS="${STRATA_PRESETS:-$root/packs}" "$prep" "${args[@]}"
fi

run="$run_dir/run-$name.sh"
ctx_args=""
[ -n "$context" ] && ctx_args="--ctx $context"
server="$bindir/strata-serve"
[ -x "$server" ] || server="$top/strata-serve"
{
    echo "#!/bin/sh"
    echo "# run-$name.sh - written by scripts/setup.sh: $family $model on $backend."
    if [ -x "$server" ]; then
        echo "# Serves the OpenAI-compatible API on http://127.0.0.1:\${PORT:-$port}/v1"
        echo "exec \"$server\" -m \"$pack\" --backend $backend $ctx_args --port \"\${PORT:-$port}\" \"\$@\""
    else
        echo "# strata-serve is not built: runs the generator (prompt with -p or on stdin)"
        gen="$bindir/strata-generate"
        [ -x "$gen" ] || gen="$top/strata-generate"
        echo "exec \"$gen\" -m \"$pack\" --backend $backend $ctx_args \"\$@\""
    fi
} >"$run.tmp"
chmod +x "$run.tmp"
mv "$run.tmp" "$run"
echo "setup.sh: wrote $run" >&2
