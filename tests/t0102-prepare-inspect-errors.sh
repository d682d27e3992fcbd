#!/usr/bin/env bash
# strata-prepare: options, usage errors, and hostile or missing input files.
. "$(dirname "$0")/lib.sh"
P="$STRATA_BIN/strata-prepare"

out=$("$P" --help); rc=$?
check "--help exits 0" test $rc -eq 0
check "--help: usage on stdout" grep -q '^usage: strata-prepare' <<<"$out"
check "--help: shows --inspect" grep -q '  strata-prepare --inspect FILE \[--json\]' <<<"$out"
out=$("$P" --version); rc=$?
check "--version exits 0" test $rc -eq 0
check "--version prints the name" grep -q '^strata-prepare [0-9]' <<<"$out"

"$P" --bogus >/dev/null 2>"$T/err"; rc=$?
check "unknown option exits 2" test $rc -eq 2
check "unknown option: usage on stderr" grep -q '^usage:' "$T/err"
"$P" >/dev/null 2>"$T/err"; rc=$?
check "no arguments exits 2" test $rc -eq 2
"$P" --json >/dev/null 2>"$T/err"; rc=$?
check "--json alone exits 2" test $rc -eq 2
check "--json alone: says why" grep -q 'needs --inspect' "$T/err"
"$P" --inspect a.gguf extra >/dev/null 2>"$T/err"; rc=$?
check "extra argument exits 2" test $rc -eq 2
check "extra argument named" grep -q "unexpected argument 'extra'" "$T/err"
"$P" --inspect >/dev/null 2>"$T/err"; rc=$?
check "--inspect without FILE exits 2" test $rc -eq 2

refused() { # NAME FILE EXIT MESSAGE
    "$P" --inspect "$2" >"$T/out" 2>"$T/err"
    local rc=$?
    check "$1: exit $3" test $rc -eq "$3"
    check "$1: message" grep -qF "$4" "$T/err"
    check "$1: prefixed with the program name" grep -q '^strata-prepare: ' "$T/err"
    check "$1: nothing on stdout" test ! -s "$T/out"
}
refused "missing file" "$T/nope.gguf" 1 "cannot open '$T/nope.gguf': No such file or directory"
refused "directory" "$T" 1 "'$T' is not a regular file"
: >"$T/empty.gguf"
refused "empty file" "$T/empty.gguf" 3 "'$T/empty.gguf': not a gguf file (empty)"
refused "not gguf" "$STRATA_ROOT/Makefile" 3 "not a gguf file (no 'GGUF' magic)"
printf 'GGUF\001\000\000\000' >"$T/v1.gguf"
head -c 24 /dev/zero >>"$T/v1.gguf"
refused "version 1" "$T/v1.gguf" 3 "gguf version 1 is not supported"
head -c 5000 "$STRATA_FIXTURES/models/stories260K.gguf" >"$T/cut.gguf"
refused "truncated model" "$T/cut.gguf" 3 "'$T/cut.gguf': "
head -c 1185000 "$STRATA_FIXTURES/models/stories260K.gguf" >"$T/short.gguf"
refused "model cut in its data" "$T/short.gguf" 3 "runs past the end of the file"
done_testing
