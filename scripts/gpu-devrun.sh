#!/bin/sh
# gpu-devrun.sh - pack what a GPU machine needs to run the GPU tests and benchmarks
# into devrun/ (git-ignored): the programs of a GPU build (stripped, xz-compressed),
# the shared libraries they need beyond the C runtime, and the named fixtures.
#   scripts/gpu-devrun.sh BUILD_DIR GPU_BIN_DIR FIXTURE...   (FIXTURE relative to
#   $STRATA_FIXTURES, e.g. models/stories260K.gguf)
# Then run scripts/gpu-run.sh there.
set -eu
b=$1 bindir=$2
shift 2
fx=${STRATA_FIXTURES:-../shared/fixtures}
rm -rf devrun
mkdir -p devrun/stage/bin devrun/stage/lib devrun/fixtures
for f in "$bindir"/strata-* "$b"/gpu-tests/*; do
    [ -x "$f" ] && strip -o "devrun/stage/bin/$(basename "$f")" "$f"
done
ldd devrun/stage/bin/strata-generate | awk '$3 ~ /^\// {print $3}' |
    grep -v -E 'lib(c|m|dl|rt|pthread|stdc\+\+|gcc_s)\.so' |
    while read -r l; do cp -L "$l" devrun/stage/lib/; done
tar -C devrun/stage -cJf devrun/bin.tar.xz bin lib
rm -rf devrun/stage
for f in "$@"; do
    mkdir -p "devrun/fixtures/$(dirname "$f")"
    cp "$fx/$f" "devrun/fixtures/$f"
done
du -sh devrun
