#!/usr/bin/env bash
# The published client's steady-state benchmark (nc_bench_test: 64 tasks,
# 32 keys × 1,250 acquire+release, every grant checked for overlap) against
# a 3-node loopback cluster, through its TICKETING_BENCH_* settings
# (MODE=cluster). Prints ops/s and acquire+release latency p50/p99.
#
# Usage: scripts/cluster-bench.sh
# Env:   CARGO_TARGET_DIR   target dir (default: <repo>/target)
#        BASE               first client port (default 15225; the benchmark
#                           refuses 5225)
#        PROFILE            Raft profile (default: default)
set -euo pipefail
readonly VERSION="0.4.0"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
export CARGO_TARGET_DIR="$target"
nc_target="${NC_TARGET_DIR:-$target/published-nc}"
cargo_home="${CARGO_HOME:-$HOME/.cargo}"
export BASE="${BASE:-15225}" PROFILE="${PROFILE:-default}" LOG_LEVEL="${LOG_LEVEL:-warn}"
work="$(mktemp -d -t ticketing-cbench.XXXXXX)"
export CLUSTER_DIR="$work/cluster"
cluster="$repo/scripts/cluster-local.sh"
die() { echo "cluster-bench: $*" >&2; exit 1; }
cleanup() { "$cluster" stop >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT

manifest="$(compgen -G "$cargo_home/registry/src/*/ticketing-$VERSION/Cargo.toml" | head -n 1 || true)"
[[ -n "$manifest" ]] || die "published crate ticketing-$VERSION not unpacked; run scripts/published-nc-tests.sh once"
crate="$work/ticketing-$VERSION"
cp -R "$(dirname "$manifest")" "$crate"
(cd "$crate" && CARGO_TARGET_DIR="$nc_target" cargo test --release --features tracing \
    --test nc_bench_test --no-run) >&2

"$cluster" start
# Measure the steady state, not the first election.
has_leader() { local lines; lines="$("$cluster" status)"; [[ "$lines" == *role=leader* ]]; }
for _ in $(seq 1 300); do
    has_leader && break
    sleep 0.1
done
has_leader || die "no leader after 30 s"
eval "$("$cluster" env)"
export TICKETING_BENCH_ENDPOINTS="$TICKETING_CHAOS_ADDRS"
export TICKETING_BENCH_TOKEN="$TICKETING_CLIENT_TOKEN"
export TICKETING_BENCH_IDENTITY="$TICKETING_IDENTITY_FINGERPRINT"
export TICKETING_BENCH_MODE=cluster TICKETING_BENCH_NAMESPACE=cbench TICKETING_BENCH_LATENCY=1
(cd "$crate" && RUST_LOG=info CARGO_TARGET_DIR="$nc_target" cargo test --release --features tracing \
    --test nc_bench_test -- --include-ignored --nocapture --exact steady_state_bench) \
    2>&1 | sed -E 's/\x1b\[[0-9;]*m//g' | tee "$work/bench.log" | grep -E 'total in|latency usec|test result|panicked'
sed -nE 's/.*= ([0-9]+) total in ([0-9.]+)ms.*/\1 \2/p' "$work/bench.log" | while read -r ops ms; do
    awk -v o="$ops" -v m="$ms" 'BEGIN { printf "==> cluster steady state: %d acquire+release in %.1f ms = %.0f ops/s\n", o, m, o / (m / 1000) }'
done
grep -q 'test result: ok' "$work/bench.log" || die "benchmark failed"
