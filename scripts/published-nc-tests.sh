#!/usr/bin/env bash
# Runs the published `ticketing` 0.4.0 client's own integration tests against
# our server: nc_example_simple_test, nc_bank_test, nc_bench_test on a single
# `ticketing serve` on 127.0.0.1:5225 (the address those tests hard-code),
# then nc_cluster_test on a 3-node loopback cluster (5225-5227).
#
# Usage: scripts/published-nc-tests.sh
# Env:   CARGO_TARGET_DIR      target dir for our release build (default: <repo>/target)
#        NC_TARGET_DIR         target dir for the published crate's tests
#                              (default: $CARGO_TARGET_DIR/published-nc)
#        NC_SERVER_LOG_LEVEL   server --log-level (default: warn)
# Exit:  0 when every test passed and the server stopped cleanly; non-zero otherwise.
set -euo pipefail

readonly VERSION="0.4.0"
readonly ADDR="127.0.0.1:5225"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
nc_target="${NC_TARGET_DIR:-$target/published-nc}"
cargo_home="${CARGO_HOME:-$HOME/.cargo}"

die() { echo "published-nc-tests: $*" >&2; exit 1; }

# The published tests hard-code this port; a server already there would be
# tested instead of ours (or the bind would fail), so stop right here.
if (exec 3<>"/dev/tcp/127.0.0.1/5225") 2>/dev/null; then
    die "something is already listening on $ADDR; stop it first"
fi

work="$(mktemp -d -t ticketing-nc.XXXXXX)"
server_pid=""
cleanup() {
    if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
        kill -TERM "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    if [[ -d "$work/cluster" ]]; then
        CLUSTER_DIR="$work/cluster" CARGO_TARGET_DIR="$target" \
            "$repo/scripts/cluster-local.sh" stop >/dev/null 2>&1 || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

echo "==> building ticketing (release)"
CARGO_TARGET_DIR="$target" cargo build --release -p ticketing-tokio --bin ticketing \
    --manifest-path "$repo/Cargo.toml"
bin="$target/release/ticketing"
[[ -x "$bin" ]] || die "no binary at $bin"

echo "==> locating the published crate ticketing $VERSION"
find_crate() {
    compgen -G "$cargo_home/registry/src/*/ticketing-$VERSION/Cargo.toml" | head -n 1 || true
}
manifest="$(find_crate)"
if [[ -z "$manifest" ]]; then
    # Not unpacked yet: let cargo download and unpack it via a throwaway project.
    fetcher="$work/fetch"
    mkdir -p "$fetcher/src"
    printf '[package]\nname = "nc-fetch"\nversion = "0.0.0"\nedition = "2021"\n\n[dependencies]\nticketing = "=%s"\n' \
        "$VERSION" > "$fetcher/Cargo.toml"
    : > "$fetcher/src/lib.rs"
    cargo fetch --manifest-path "$fetcher/Cargo.toml"
    manifest="$(find_crate)"
    [[ -n "$manifest" ]] || die "cargo fetch did not unpack ticketing-$VERSION"
fi
src="$(dirname "$manifest")"
# Work on a copy: the registry copy must stay pristine.
crate="$work/ticketing-$VERSION"
cp -R "$src" "$crate"
echo "    $src -> $crate"

echo "==> starting ticketing serve on $ADDR"
"$bin" serve --listen "$ADDR" --log-level "${NC_SERVER_LOG_LEVEL:-warn}" \
    > "$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/5225") 2>/dev/null; then break; fi
    kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log" >&2; die "server exited at start"; }
    sleep 0.1
done
(exec 3<>"/dev/tcp/127.0.0.1/5225") 2>/dev/null || die "server did not start listening"

echo "==> running the published client's tests"
# Each test of nc_bench_test runs in its own process: the tests of that file
# share static counters and a broker that lives on the first test's runtime,
# so a second test in the same process (in turn or side by side) fails for
# reasons of the harness, not the server.
nc_test() {
    (
        cd "$crate"
        CARGO_TARGET_DIR="$nc_target" RUST_LOG=info TICKETING_BENCH_LATENCY=1 \
            cargo test --release --features tracing "$@"
    ) 2>&1 | tee -a "$work/test.log"
}
status=0
nc_test --test nc_example_simple_test --test nc_bank_test --test nc_bench_test --test nc_cluster_test --no-run || status=$?
if [[ "$status" -eq 0 ]]; then
    nc_test --test nc_example_simple_test --test nc_bank_test \
        -- --include-ignored --nocapture || status=$?
    for bench in steady_state_bench burst_40k_tasks; do
        nc_test --test nc_bench_test \
            -- --include-ignored --nocapture --exact "$bench" || status=$?
    done
fi

echo "==> bench figures"
grep -E 'total in|latency usec|burst completed|test result' "$work/test.log" \
    | sed -E 's/\x1b\[[0-9;]*m//g' || true
# ops/s from "<n> total in <ms>ms" lines.
sed -E 's/\x1b\[[0-9;]*m//g' "$work/test.log" \
    | sed -nE 's/.*= ([0-9]+) total in ([0-9.]+)ms.*/\1 \2/p' \
    | while read -r ops ms; do
        awk -v o="$ops" -v m="$ms" 'BEGIN { printf "    steady state: %d acquire+release in %.1f ms = %.0f ops/s\n", o, m, o / (m / 1000) }'
    done

echo "==> stopping the server"
kill -TERM "$server_pid"
server_status=0
wait "$server_pid" || server_status=$?
server_pid=""
if [[ "$server_status" -ne 0 ]]; then
    echo "server exited with $server_status; its log:" >&2
    cat "$work/server.log" >&2
    status=1
elif [[ -s "$work/server.log" ]]; then
    echo "    server log (warnings and above):"
    sed 's/^/    /' "$work/server.log"
fi

echo "==> nc_cluster_test against a 3-node cluster on loopback"
cluster_dir="$work/cluster"
cluster() {
    CARGO_TARGET_DIR="$target" CLUSTER_DIR="$cluster_dir" PROFILE=fast LOG_LEVEL=warn \
        "$repo/scripts/cluster-local.sh" "$@"
}
if cluster start; then
    # The cluster is up once some node reports itself leader.
    for _ in $(seq 1 100); do
        if cluster status 2>/dev/null | grep -q "role=leader"; then break; fi
        sleep 0.1
    done
    (
        eval "$(cluster env)"
        nc_test --test nc_cluster_test -- --include-ignored --nocapture
    ) || status=$?
    cluster stop || status=$?
else
    status=1
fi

if [[ "$status" -ne 0 ]]; then
    die "FAILED (status $status)"
fi
echo "==> all published nc tests passed"
