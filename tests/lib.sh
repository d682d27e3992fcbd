# lib.sh - TAP helpers for the shell tests (sourced).
#
#   check "name" CMD ARGS...   one test point: passes when CMD exits 0
#   done_testing               prints the plan; exit status 1 if any failed
#   $T                         a private temporary directory, removed at exit
#   $STRATA_BIN, $STRATA_ROOT, $STRATA_FIXTURES as set by `make check`
: "${STRATA_ROOT:=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
: "${STRATA_BIN:=$STRATA_ROOT/bin}"
: "${STRATA_FIXTURES:=$STRATA_ROOT/../shared/fixtures}"
export STRATA_ROOT STRATA_BIN STRATA_FIXTURES
T=$(mktemp -d "${TMPDIR:-/tmp}/strata-test.XXXXXX")
trap 'rm -rf "$T"' EXIT
_tap_n=0
_tap_failed=0

check() {
    local name=$1
    shift
    _tap_n=$((_tap_n + 1))
    if "$@" >/dev/null 2>&1; then
        echo "ok $_tap_n - $name"
    else
        echo "not ok $_tap_n - $name"
        _tap_failed=$((_tap_failed + 1))
    fi
}

done_testing() {
    echo "1..$_tap_n"
    [ "$_tap_failed" -eq 0 ]
    exit $?
}
