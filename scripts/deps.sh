#!/bin/sh
# deps.sh - install the Debian packages Strata's build needs.
#
# Installs what is missing with apt-get when run as root; otherwise prints
# the exact command and exits 2.  --quiet prints nothing when all is there.
# --gpu adds the HIP compiler (hipcc) used to compile the AMD kernels;
# --fuzz adds clang's libFuzzer runtime.
set -u

quiet=0
want_gpu=0
want_fuzz=0
for a in "$@"; do
    case "$a" in
    --quiet) quiet=1 ;;
    --gpu) want_gpu=1 ;;
    --fuzz) want_fuzz=1 ;;
    *) echo "deps.sh: unknown option '$a'" >&2; exit 2 ;;
    esac
done

pkgs="build-essential pkg-config perl libcjson-dev libstb-dev libcurl4-openssl-dev
libpcre2-dev libutf8proc-dev libmicrohttpd-dev libssl-dev zlib1g-dev curl"
[ $want_gpu = 1 ] && pkgs="$pkgs hipcc libamdhip64-dev"
[ $want_fuzz = 1 ] && pkgs="$pkgs clang libclang-rt-14-dev"

missing=""
for p in $pkgs; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing="$missing $p"
    fi
done
[ -z "$missing" ] && exit 0

if [ "$(id -u)" != 0 ]; then
    echo "deps.sh: missing packages:$missing" >&2
    echo "deps.sh: run: sudo apt-get install -y$missing" >&2
    exit 2
fi
echo "deps.sh: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null 2>&1 || apt-get update -q
# shellcheck disable=SC2086
apt-get install -y -q $missing >/dev/null || apt-get install -y -q $missing
