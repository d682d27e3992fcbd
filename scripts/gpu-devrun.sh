#!/bin/sh
# gpu-devrun.sh - pack what a GPU machine needs to run the GPU tests and benchmarks
# into devrun/ (git-ignored): the programs of a GPU build (stripped, xz-compressed),
# the shared libraries they need beyond the C runtime, and the named fixtures.
#   scripts/gpu-devrun.sh BUILD_DIR GPU_BIN_DIR FIXTURE...   (FIXTURE relative to
#   $STRATA_FIXTURES, e.g. models/stories260K.gguf)
# Then run scripts/gpu-run.sh there.  DEVRUN=DIR packs into DIR instead of devrun/.
set -eu
b=$1 bindir=$2
shift 2
fx=${STRATA_FIXTURES:-../shared/fixtures}
d=${DEVRUN:-devrun}
rm -rf "$d"
mkdir -p "$d"/stage/bin "$d"/stage/lib "$d"/fixtures
for f in "$bindir"/strata-* "$b"/gpu-tests/*; do
    [ -x "$f" ] && strip -o "$d/stage/bin/$(basename "$f")" "$f"
done
# every program's libraries (strata-serve and strata-embed need libmicrohttpd too)
for f in "$d"/stage/bin/*; do ldd "$f" 2>/dev/null; done | awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -v -E 'lib(c|m|dl|rt|pthread|stdc\+\+|gcc_s)\.so' |
    while read -r l; do cp -L "$l" "$d"/stage/lib/; done
tar -C "$d"/stage -cJf "$d"/bin.tar.xz bin lib
rm -rf "$d"/stage
for f in "$@"; do
    mkdir -p "$d/fixtures/$(dirname "$f")"
    cp "$fx/$f" "$d/fixtures/$f"
done
du -sh "$d"
