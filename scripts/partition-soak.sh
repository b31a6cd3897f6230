#!/usr/bin/env bash
# Measures how fast a 3-node loopback cluster heals after its leader is
# isolated by a real partition (nftables input drops, each node under its
# own uid; see runtime-tokio/tests/partition.rs): for each cut length, the
# time from the heal until every node follows the current leader again.
# Runs the ignored soak test there; needs root and nft.
#
# Usage: scripts/partition-soak.sh [CUTS_S] [ROUNDS]   (default "5,30,60" 1)
# Env:   PARTITION_SOAK_PROFILE   Raft profile, fast (default) or default
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ "$(id -u)" != 0 ]] || ! command -v nft >/dev/null 2>&1; then
    echo "partition-soak: needs root and nft (apt-get install nftables)" >&2
    exit 1
fi
export PARTITION_SOAK_CUTS_S="${1:-5,30,60}"
export PARTITION_SOAK_ROUNDS="${2:-1}"
export PARTITION_SOAK_PROFILE="${PARTITION_SOAK_PROFILE:-fast}"
echo "==> cuts ${PARTITION_SOAK_CUTS_S} s, ${PARTITION_SOAK_ROUNDS} round(s) each, profile ${PARTITION_SOAK_PROFILE}"
cargo test --manifest-path "$repo/Cargo.toml" --locked -p ticketing-tokio --test partition \
    -- --ignored --exact soak_heal_after_leader_isolation --nocapture 2>&1 \
    | grep -E '^(soak |test result|thread .* panicked|SKIPPED)|assert'
