#!/bin/sh
# gpu-build-json.sh - print the BUILD.json of a GPU build to stdout.
# Usage: gpu-build-json.sh cuda|hip COMPILER "ARCHS" LIBDIR
set -eu
backend=$1 compiler=$2 archs=$3 libdir=$4
case $backend in
cuda) version=$("$compiler" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') ;;
hip) version=$("$compiler" --version 2>/dev/null | sed -n 's/^HIP version: //p') ;;
*) echo "gpu-build-json.sh: unknown backend '$backend'" >&2; exit 2 ;;
esac
list=""
for a in $(echo "$archs" | tr ',' ' '); do
    case $backend in cuda) a="sm_$a" ;; esac
    list="$list${list:+, }\"$a\""
done
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
cat <<JSON
{
  "backend": "$backend",
  "compiler": "$compiler",
  "version": "$version",
  "archs": [$list],
  "ptx": $( [ "$backend" = cuda ] && echo true || echo false ),
  "library_dirs": ["$libdir"],
  "runtime_linkage": "$( [ "$backend" = cuda ] && echo static || echo shared )",
  "optional_libraries": [$( [ "$backend" = cuda ] && echo '"libcublas.so.13 (prefill projections; loaded at run time when present)"' )],
  "source_commit": "$commit",
  "built": "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
}
JSON
