#!/usr/bin/env bash
# Chaos run: a 3-node loopback cluster (scripts/cluster-local.sh) under the
# published client's nc_cluster_chaos_test load while a supervisor kills -9
# and restarts (with empty state, so under a new generation) random nodes.
# The supervisor only kills when the cluster is settled (one leader, three
# voters, no learner), so a majority is always up; it stops the old process
# before starting its replacement, as the test requires. Passes when the
# test's RESULT line says excl=0 fence=0 fatal=0.
#
# Usage: scripts/cluster-chaos.sh
# Env:   CARGO_TARGET_DIR   target dir (default: <repo>/target)
#        CHAOS_SECS         load duration (default 60)
#        CHAOS_MIN_GAP      seconds between restarts, at least (default 3)
#        PROFILE            Raft profile of the nodes (default: fast)
#        BASE               first client port (default 5225)
set -euo pipefail
readonly VERSION="0.4.0"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
export CARGO_TARGET_DIR="$target"
nc_target="${NC_TARGET_DIR:-$target/published-nc}"
cargo_home="${CARGO_HOME:-$HOME/.cargo}"
secs="${CHAOS_SECS:-60}"
gap="${CHAOS_MIN_GAP:-3}"
export PROFILE="${PROFILE:-fast}" BASE="${BASE:-5225}" LOG_LEVEL="${LOG_LEVEL:-warn}"
work="$(mktemp -d -t ticketing-chaos.XXXXXX)"
export CLUSTER_DIR="$work/cluster"
cluster="$repo/scripts/cluster-local.sh"

die() { echo "cluster-chaos: $*" >&2; exit 1; }
cleanup() {
    "$cluster" stop >/dev/null 2>&1 || true
    [[ -n "${KEEP_WORK:-}" ]] || rm -rf "$work"
}
trap cleanup EXIT

manifest="$(compgen -G "$cargo_home/registry/src/*/ticketing-$VERSION/Cargo.toml" | head -n 1 || true)"
[[ -n "$manifest" ]] || die "published crate ticketing-$VERSION not unpacked; run scripts/published-nc-tests.sh once"
# Work on a copy: the registry copy must stay pristine, and its code is
# never copied into this repository.
crate="$work/ticketing-$VERSION"
cp -R "$(dirname "$manifest")" "$crate"

echo "==> building the published client's chaos test"
(cd "$crate" && CARGO_TARGET_DIR="$nc_target" cargo test --release --test nc_cluster_chaos_test --no-run) >&2

echo "==> starting the cluster (profile $PROFILE)"
"$cluster" start
eval "$("$cluster" env)"
export TICKETING_CHAOS_SECS="$secs"

settled() {
    local lines; lines="$("$cluster" status)"
    [[ "$(grep -c 'role=leader' <<<"$lines")" -eq 1 ]] || return 1
    [[ "$(grep -c 'voter=1' <<<"$lines")" -eq 3 ]] || return 1
    [[ "$(grep 'role=leader' <<<"$lines")" == *'learners= '* ]] || return 1
    [[ "$(grep 'role=leader' <<<"$lines" | sed -E 's/.*voters=([^ ]*).*/\1/' | tr ',' '\n' | wc -l)" -eq 3 ]]
}

echo "==> running nc_cluster_chaos_test for ${secs}s while restarting random nodes"
(cd "$crate" && CARGO_TARGET_DIR="$nc_target" cargo test --release --test nc_cluster_chaos_test \
    -- --ignored --nocapture) > "$work/test.log" 2>&1 &
test_pid=$!
restarts=0
started=$(date +%s)
while kill -0 "$test_pid" 2>/dev/null; do
    sleep "$gap"
    kill -0 "$test_pid" 2>/dev/null || break
    # Leave the last seconds quiet so the test ends on a settled cluster.
    (( $(date +%s) - started < secs - 5 )) || continue
    settled || continue
    slot=$((RANDOM % 3))
    "$cluster" restart "$slot" >/dev/null
    restarts=$((restarts + 1))
    echo "    restarted slot $slot ($restarts so far)"
done
status=0
wait "$test_pid" || status=$?
echo "==> $restarts restarts; test exit status $status"
grep -E 'RESULT|test result|panicked' "$work/test.log" | sed -E 's/\x1b\[[0-9;]*m//g' || true
"$cluster" status
result="$(grep 'RESULT' "$work/test.log" || true)"
if [[ "$status" -ne 0 || -z "$result" ]] || ! grep -q 'excl=0 fence=0 fatal=0' <<<"$result"; then
    tail -30 "$work/test.log" >&2
    die "FAILED"
fi
echo "==> chaos passed: excl=0 fence=0 fatal=0"
