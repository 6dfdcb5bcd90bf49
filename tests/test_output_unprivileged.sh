#!/usr/bin/env bash
# The output writer as an unprivileged user (issue 10: as a non-root user /dev/null
# and /dev/stdout failed with "cannot create a temporary file", so output could be
# neither thrown away nor piped). Run as root, the test drops to uid/gid 65534
# (nobody) with setpriv (or runuser); run as another user, it is that user already.
# Where neither is possible it says so and skips (exit 0).
set -u
: "${ATTN:?}" "${ATTN_TEST_DATA_DIR:?}"
fails=0
checks=0
ok() { checks=$((checks + 1)); echo "ok   $*"; }
bad() { checks=$((checks + 1)); fails=$((fails + 1)); echo "FAIL $*"; }

# A world-readable copy of the program and its inputs: the build folder may not be
# reachable by another user. The program links libattn statically.
tmp=$(mktemp -d /tmp/attn_unpriv.XXXXXX); trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"
cp "$ATTN" "$tmp/attn"
d="$ATTN_TEST_DATA_DIR/golden/sdpa_cross_mask"
for f in q k v mask; do cp "$d/$f.npy" "$tmp/$f.npy"; done
chmod 755 "$tmp/attn"; chmod 644 "$tmp"/*.npy
mkdir -m 1777 "$tmp/shared"

if [ "$(id -u)" -ne 0 ]; then
    as_user() { "$@"; }
    who="uid $(id -u) (not root)"
elif command -v setpriv >/dev/null 2>&1 && setpriv --reuid=65534 --regid=65534 --clear-groups true 2>/dev/null; then
    as_user() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
    who="uid 65534 through setpriv"
elif command -v runuser >/dev/null 2>&1 && runuser -u nobody -- true 2>/dev/null; then
    as_user() { runuser -u nobody -- "$@"; }
    who="nobody through runuser"
else
    echo "test_output_unprivileged: skipped: running as root and cannot drop privileges (no setpriv or runuser that works here)"
    exit 0
fi
[ "$(as_user id -u)" -ne 0 ] || { echo "FAIL could not drop root"; exit 1; }
echo "-- as $who"

sdpa() { as_user "$tmp/attn" sdpa --query "$tmp/q.npy" --key "$tmp/k.npy" --value "$tmp/v.npy" \
    --mask "$tmp/mask.npy" "$@"; }

sdpa --output "$tmp/shared/ref.npy" 2>"$tmp/err" \
    && ok "a regular output in a directory the user may write" || bad "regular output: $(cat "$tmp/err")"
sdpa --output /dev/null --attention /dev/zero 2>"$tmp/err" && [ -c /dev/null ] \
    && ok "--output /dev/null works and /dev/null stays a device" || bad "/dev/null: $(cat "$tmp/err")"
sdpa --output /dev/stdout 2>"$tmp/err" | cat >"$tmp/piped.npy"
cmp -s "$tmp/piped.npy" "$tmp/shared/ref.npy" \
    && ok "--output /dev/stdout into a pipe delivers the whole .npy" || bad "/dev/stdout: $(cat "$tmp/err")"
sdpa --output - 2>"$tmp/err" | cat >"$tmp/dash.npy"
cmp -s "$tmp/dash.npy" "$tmp/shared/ref.npy" \
    && ok "--output - into a pipe delivers the whole .npy" || bad "-: $(cat "$tmp/err")"
sdpa --output /dev/full 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] && grep -q "No space left on device" "$tmp/err" \
    && ok "--output /dev/full fails: $(cat "$tmp/err")" || bad "/dev/full: exit $rc, $(cat "$tmp/err")"
sdpa --output /dev/ref_is_not_writable.npy 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] && [ ! -e /dev/ref_is_not_writable.npy ] \
    && ok "an output in a directory the user may not write fails cleanly: $(cat "$tmp/err")" \
    || bad "unwritable directory: exit $rc, $(cat "$tmp/err")"

# A link a third user planted in a shared (sticky) directory is not followed.
if [ "$(id -u)" -eq 0 ]; then
    printf 'victim' >"$tmp/victim"; chmod 666 "$tmp/victim"
    ln -s "$tmp/victim" "$tmp/shared/planted.npy"; chown -h 12345 "$tmp/shared/planted.npy"
    sdpa --output "$tmp/shared/planted.npy" 2>"$tmp/err"; rc=$?
    [ $rc -eq 1 ] && [ "$(cat "$tmp/victim")" = victim ] && grep -q "owned by another user" "$tmp/err" \
        && ok "a symbolic link owned by another user is not followed: $(cat "$tmp/err")" \
        || bad "planted link: exit $rc, victim now '$(cat "$tmp/victim")', $(cat "$tmp/err")"
fi
[ -z "$(find "$tmp" -name '*.tmp.*')" ] && ok "no temporary file is left" \
    || bad "temporary files left: $(find "$tmp" -name '*.tmp.*')"

echo "test_output_unprivileged: $checks checks, $fails failed"
[ $fails -eq 0 ]
