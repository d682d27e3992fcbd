#!/bin/bash
# strata-load: usage, refusals (memory, checksum, a second loader), --detach
# with a pid file, --unload by pack path, SIGTERM, and engines ignoring a
# stale or mismatched image with a message.  Every path leaves /dev/shm clean.
. "$(dirname "$0")/lib.sh"

LOAD=$STRATA_BIN/strata-load
GEN=$STRATA_BIN/strata-generate
PREP=$STRATA_BIN/strata-prepare
NAMES=()
PIDS=()

cleanup() {
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
    for n in "${NAMES[@]}"; do rm -f /dev/shm/"$n".meta /dev/shm/"$n".data /dev/shm/"$n".pid; done
    rm -rf "$T"
}
trap cleanup EXIT

# a pack of a model of its own (see t0800), repacked: two data files
mkdir -p "$T/src"
cp "$STRATA_FIXTURES/models/tinycoder-moe-Q4_K_M.gguf" "$T/src/tiny.gguf"
head -c 64 /dev/urandom >>"$T/src/tiny.gguf"
"$PREP" --repack --out "$T" --name tiny "$T/src/tiny.gguf" >/dev/null 2>&1
P=$T/tiny.strata
check "repacked pack prepared" test -f "$P/experts.bin"

# usage
check "no argument: usage, exit 2" bash -c "'$LOAD' 2>/dev/null; test \$? = 2"
check "--json without --status: exit 2" bash -c "'$LOAD' --json '$P' 2>/dev/null; test \$? = 2"
check "--pid-file without --detach: exit 2" \
    bash -c "'$LOAD' --pid-file x '$P' 2>/dev/null; test \$? = 2"
check "--help: exit 0, synopsis" bash -c "'$LOAD' --help | grep -q 'strata-load --unload'"
check "not a pack: exit 3, named" \
    bash -c "'$LOAD' '$T/src' 2>&1 >/dev/null | grep -q \"'$T/src' is not a pack\"; \
             '$LOAD' '$T/src' 2>/dev/null; test \$? = 3"

# --detach: the name on stdout, a pid file, a live loader
"$LOAD" -q --detach --pid-file "$T/load.pid" "$P" >"$T/name" 2>"$T/d.err"
rc=$?
NAME=$(cat "$T/name")
NAMES+=("$NAME")
LP=$(cat "$T/load.pid" 2>/dev/null)
[ -n "$LP" ] && PIDS+=("$LP")
check "--detach: exit 0 once ready" test "$rc" = 0
check "--detach: pid file names a live strata-load" \
    bash -c "kill -0 '$LP' && grep -q strata-load /proc/'$LP'/comm"
"$LOAD" --status --json >"$T/st.json"
check "--status: the daemon is the loader, 2 files" \
    jq -e --arg n "$NAME" --argjson p "$LP" \
    '.[] | select(.name == $n) | .loader_pid == $p and .n_files == 2 and .state == "ready"' \
    "$T/st.json"

# a second loader of the same pack is refused
"$LOAD" -q "$P" >/dev/null 2>"$T/dup.err"
rc=$?
check "second loader: exit 1, says already resident" \
    bash -c "test $rc = 1 && grep -q 'already resident as $NAME' '$T/dup.err'"

# attached engine on a repacked pack (experts.bin from the image)
STRATA_NO_RESIDENT=1 "$GEN" -m "$P" -p "def fib(n):" -n 16 --temp 0 >"$T/base.txt" 2>/dev/null
"$GEN" -m "$P" -p "def fib(n):" -n 16 --temp 0 >"$T/att.txt" 2>"$T/att.err"
check "repacked: attached, same text" \
    bash -c "grep -q 'attached to resident image $NAME' '$T/att.err' && cmp -s '$T/base.txt' '$T/att.txt'"

# a mismatched image: its header names another identity (the identity is at
# byte 40 of NAME.meta, after magic, version, state, pid, n_files, created and
# size); the engine reads the files and says why
cp "/dev/shm/$NAME.meta" "$T/meta.orig"
printf '0000000000000000' | dd of="/dev/shm/$NAME.meta" bs=1 seek=40 conv=notrunc 2>/dev/null
"$GEN" -m "$P" -p "def fib(n):" -n 16 --temp 0 >"$T/mm.txt" 2>"$T/mm.err"
check "mismatched image: ignored with a message" \
    grep -q "ignoring resident image $NAME: it does not match the pack" "$T/mm.err"
check "mismatched image: not attached, same text" \
    bash -c "! grep -q 'attached to' '$T/mm.err' && cmp -s '$T/base.txt' '$T/mm.txt'"
cat "$T/meta.orig" >"/dev/shm/$NAME.meta"

# a stale image: a data file changed (mtime) since it was loaded
touch -d '2001-01-01' "$P/experts.bin"
"$GEN" -m "$P" -p "def fib(n):" -n 16 --temp 0 >"$T/st.txt" 2>"$T/st.err"
check "stale image: ignored with a message naming the file" \
    grep -q "ignoring resident image $NAME: stale ('.*experts.bin' changed" "$T/st.err"
check "stale image: same text from the files" cmp "$T/base.txt" "$T/st.txt"

# --unload by pack path stops the daemon and removes everything
check "--unload PACK" "$LOAD" --unload "$P"
# (exited: gone, or a zombie when nothing reaps orphans in this container)
check "--unload: the daemon exited" \
    bash -c "! kill -0 '$LP' 2>/dev/null || grep -q ') Z' /proc/'$LP'/stat"
check "--unload: nothing left in /dev/shm" bash -c "! ls /dev/shm/$NAME.* 2>/dev/null"

# a split set: every shard is read from the image (random bytes after each
# shard's data, which the GGUF reader ignores, make the image this run's own)
TOOL="$STRATA_BIN/../helpers/packtool"
mkdir -p "$T/split"
"$TOOL" split "$STRATA_FIXTURES/models/tinycoder-moe-Q4_K_M.gguf" 3 "$T/split/tc" >/dev/null 2>&1
for f in "$T"/split/tc-0000[123]-of-00003.gguf; do head -c 32 /dev/urandom >>"$f"; done
"$PREP" --out "$T" --name sp "$T/split/tc-00001-of-00003.gguf" >/dev/null 2>&1
SN=$("$LOAD" -q --detach "$T/sp.strata" 2>"$T/sp.err")
NAMES+=("$SN")
[ -f "/dev/shm/$SN.pid" ] && PIDS+=("$(cat "/dev/shm/$SN.pid")")
STRATA_NO_RESIDENT=1 "$GEN" -m "$T/sp.strata" -p "def fib(n):" -n 16 --temp 0 >"$T/sp0.txt" 2>/dev/null
"$GEN" -m "$T/sp.strata" -p "def fib(n):" -n 16 --temp 0 >"$T/sp1.txt" 2>"$T/sp1.err"
check "split set: 3 files in the image" grep -q "ready: .*(3 files)" "$T/sp.err"
check "split set: attached, same text" \
    bash -c "grep -q 'attached to resident image $SN' '$T/sp1.err' && cmp -s '$T/sp0.txt' '$T/sp1.txt' && test -s '$T/sp1.txt'"
check "split set: default pid file, --unload" \
    bash -c "test -s '/dev/shm/$SN.pid' && '$LOAD' --unload '$SN' 2>/dev/null && ! ls /dev/shm/$SN.* 2>/dev/null"

# not enough memory: refused with the numbers, nothing created
"$LOAD" --reserve-mib 1000000000 "$P" >/dev/null 2>"$T/nomem.err"
rc=$?
check "memory refusal: exit 5" test "$rc" = 5
check "memory refusal: the numbers" grep -q 'needs .* GiB of memory; MemAvailable is .* GiB' "$T/nomem.err"
check "memory refusal: nothing in /dev/shm" bash -c "! ls /dev/shm/$NAME.* 2>/dev/null"

# a checksum mismatch while loading: named, exit 3, nothing left
printf 'X' | dd of="$T/src/tiny.gguf" bs=1 seek=1000000 conv=notrunc 2>/dev/null
"$LOAD" -q "$P" >/dev/null 2>"$T/sum.err"
rc=$?
check "checksum mismatch: exit 3" test "$rc" = 3
check "checksum mismatch: names the file" grep -q "tiny.gguf': sha256 .* does not match" "$T/sum.err"
check "checksum mismatch: nothing left in /dev/shm" bash -c "! ls /dev/shm/$NAME.* 2>/dev/null"

# SIGTERM to a foreground loader removes the image
cp "$STRATA_FIXTURES/models/tinycoder-moe-Q4_K_M.gguf" "$T/src/b.gguf"
head -c 64 /dev/urandom >>"$T/src/b.gguf"
"$PREP" --out "$T" --name b "$T/src/b.gguf" >/dev/null 2>&1
"$LOAD" -q "$T/b.strata" >"$T/bname" 2>"$T/b.err" &
BP=$!
PIDS+=("$BP")
for _ in $(seq 300); do [ -s "$T/bname" ] && break; sleep 0.1; done
BN=$(cat "$T/bname")
NAMES+=("$BN")
check "foreground loader: image present" test -e "/dev/shm/$BN.data"
kill -TERM "$BP"
wait "$BP"
rc=$?
check "SIGTERM: loader exits 0" test "$rc" = 0
check "SIGTERM: image removed" bash -c "! ls /dev/shm/$BN.* 2>/dev/null"

done_testing
