#!/usr/bin/env bash
# Measures leader failover of a 3-node loopback cluster: ROUNDS times,
# kill -9 the leader and time until the next acquire is granted (then the
# killed slot is restarted with empty state and rejoins by itself). Runs the
# default and the fast Raft profile and prints p50/p99 for each.
#
# Usage: scripts/cluster-failover.sh [ROUNDS]      (default 20)
# Env:   CARGO_TARGET_DIR   target dir (default: <repo>/target)
#        PROFILES           profiles to run (default: "fast default")
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
rounds="${1:-20}"
export CARGO_TARGET_DIR="$target"

echo "==> building ticketing and the failover driver (release)"
cargo build --release -p ticketing-tokio --bin ticketing --example cluster_failover \
    --manifest-path "$repo/Cargo.toml"
for profile in ${PROFILES:-fast default}; do
    echo "==> profile $profile, $rounds rounds"
    "$target/release/examples/cluster_failover" "$target/release/ticketing" "$profile" "$rounds"
done
