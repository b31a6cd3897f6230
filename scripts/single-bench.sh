#!/usr/bin/env bash
# A single server's figures with our client, measured in one run on one
# server and printed against the goals in docs/performance.md, in two CPU placements
# alternated: "spread" (the scheduler places server and client on every
# core) and "one CPU" (taskset puts both on CPU 0). On this project's VM a
# wake-up of a process on another CPU costs the waker far more than one on
# its own CPU, so the two placements measure that cost against the second
# core's gain (docs/performance.md, "Why the rest is the kernel's").
#
#  1. per placement, the round trip of a tiny TCP echo (tokio both sides,
#     16 bytes) and our client's uncontended acquire+release p50 (one task,
#     one key) over two of them;
#  2. `ticketing bench --clients 64 --keys 32 --ops $OPS`, $ROUNDS times in
#     each placement: ops/s, p50/p99, the client's and the server's CPU
#     per acquire+release (utime+stime from /proc), then the medians.
#
# The published client's figures come from
# `cargo bench -p ticketing-tokio --bench throughput` (run it under
# `taskset -c 0` for the one-CPU placement).
#
# Usage: scripts/single-bench.sh
# Env:   CARGO_TARGET_DIR   target dir (default: <repo>/target)
#        PORT               the server's client port (default 16225; admin
#                           on PORT+1000)
#        ROUNDS             rounds per placement (default 3)
#        OPS                acquire+release pairs per round (default 400000)
#        PLACEMENTS         which placements to run, in order each round
#                           (default "spread one-cpu")
#        TICKETING_BIN      run this build instead of building the tree's
#        NO_BUILD           1: build nothing of this tree
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
export CARGO_TARGET_DIR="$target"
# shellcheck source=scripts/bench-lib.sh
source "$repo/scripts/bench-lib.sh"
port="${PORT:-16225}"
rounds="${ROUNDS:-3}"
ops="${OPS:-400000}"
[[ "$port" =~ ^[0-9]+$ && "$port" -ge 1024 && "$port" -le 64000 ]] || { echo "single-bench: PORT must be 1024-64000" >&2; exit 2; }
[[ "$rounds" =~ ^[1-9][0-9]?$ ]] || { echo "single-bench: ROUNDS must be 1-99" >&2; exit 2; }
[[ "$ops" =~ ^[1-9][0-9]{0,7}$ ]] || { echo "single-bench: OPS must be 1-99999999" >&2; exit 2; }
read_placements
die() { echo "single-bench: $*" >&2; exit 1; }

# Goals (docs/performance.md, single server, our client).
readonly GOAL_SERVER_US=2.0 GOAL_CLIENT_US=4 GOAL_OPS=250000 GOAL_SOLO_RATIO=1.3

if [[ "${NO_BUILD:-}" != 1 ]]; then
    echo "==> building ticketing and the echo (release)" >&2
    cargo build --release -p ticketing-tokio --example echo_round_trip --manifest-path "$repo/Cargo.toml" >&2
    if [[ -z "${TICKETING_BIN:-}" ]]; then
        cargo build --release -p ticketing-tokio --bin ticketing --manifest-path "$repo/Cargo.toml" >&2
    fi
fi
bin="${TICKETING_BIN:-$target/release/ticketing}"
[[ -x "$bin" ]] || die "no binary at $bin"
echo_bin="$target/release/examples/echo_round_trip"
[[ -x "$echo_bin" ]] || die "no echo at $echo_bin (run without NO_BUILD)"

work="$(mktemp -d -t ticketing-sbench.XXXXXX)"
server=""
cleanup() {
    [[ -n "$server" ]] && { kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; }
    rm -rf "$work"
}
trap cleanup EXIT
"$bin" serve --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$((port + 1000))" \
    --state-dir "$work/state" --log-level warn > "$work/server.log" 2>&1 &
server=$!
for _ in $(seq 1 300); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    kill -0 "$server" 2>/dev/null || { cat "$work/server.log" >&2; die "the server exited"; }
    sleep 0.05
done
ours() { # bench args... (in the placement last set)
    "${on[@]}" "$bin" bench --addr "127.0.0.1:$port" --server-pid "$server" "$@" 2>&1
}

echo "==> load: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
# 1. Uncontended, next to the echo, in each placement.
measure_uncontended "$server"

# 2. Our client, ROUNDS times in each placement, alternated.
measure_rounds "$rounds" "$ops" "$server"

echo
echo "single server, our client, $rounds round(s) of $ops pairs per placement (medians), load $(cut -d' ' -f1-3 /proc/loadavg):"
for placement in "${placements[@]}"; do
    rate="$(med "$placement" 1)" p50="$(med "$placement" 2)" p99="$(med "$placement" 3)"
    client_us="$(med "$placement" 4)" server_us="$(med "$placement" 5)"
    case "$placement" in
        spread) echo " spread (the scheduler's placement over $(nproc) cores, ${connections[$placement]} connection(s)):" ;;
        one-cpu) echo " one CPU (server and client on CPU 0, taskset, ${connections[$placement]} connection(s)):" ;;
    esac
    printf '  %-52s %12s   goal %-14s %s\n' "server CPU per acquire+release (µs)" "$server_us" "<= $GOAL_SERVER_US" "$(verdict "$server_us" '<=' "$GOAL_SERVER_US")"
    printf '  %-52s %12s   goal %-14s %s\n' "client CPU per acquire+release (µs)" "$client_us" "<= $GOAL_CLIENT_US" "$(verdict "$client_us" '<=' "$GOAL_CLIENT_US")"
    printf '  %-52s %12s   goal %-14s %s\n' "ops/s" "$rate" ">= $GOAL_OPS" "$(verdict "$rate" '>=' "$GOAL_OPS")"
    printf '  %-52s %12s\n' "acquire+release p50 / p99 (µs)" "$p50 / $p99"
    ratio="$(awk -v p="${solo_p50[$placement]}" -v e="${echo_us[$placement]}" 'BEGIN { printf "%.2f", p / (2 * e) }')"
    printf '  %-52s %12s   goal %-14s %s\n' "uncontended p50 (µs) / two echo round trips (${echo_us[$placement]} µs)" \
        "${solo_p50[$placement]} = ${ratio}x" "<= ${GOAL_SOLO_RATIO}x" "$(verdict "$ratio" '<=' "$GOAL_SOLO_RATIO")"
done
if [[ -f "$work/ours-spread.txt" && -f "$work/ours-one-cpu.txt" ]]; then
    awk -v a="$(med one-cpu 1)" -v b="$(med spread 1)" -v c="$(med one-cpu 5)" -v d="$(med spread 5)" \
        'BEGIN { printf "  one CPU / spread: ops/s %.2f x, server CPU per pair %.2f x\n", a / b, c / d }'
fi
verdicts_complete || exit 1
