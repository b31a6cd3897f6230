#!/usr/bin/env bash
# Runs the published Rust clients' own integration tests against our server,
# both dialects on the same port:
#   - `ticketing` 0.4.0 (wire v3): nc_example_simple_test, nc_bank_test,
#     nc_bench_test (steady_state_bench, burst_40k_tasks);
#   - `ticketing` 0.3.0 (line dialect): nc_example_simple_test, nc_bank_test,
#     nc_bench_test;
# all on one `ticketing serve` on 127.0.0.1:5225 (the address those tests
# hard-code); then each version's nc_cluster_test on a 3-node loopback
# cluster (5225-5227; 0.4.0 with a client token and the cluster identity,
# 0.3.0 with none, as its test has no way to pass one); then interop/: both
# clients hammering the same keys at once, on one server and on a 3-node
# cluster across a leader kill (free ports).
#
# Usage: scripts/published-nc-tests.sh
# Env:   TICKETING_BIN         test this binary instead of building one
#        CARGO_TARGET_DIR      target dir for our release build (default: <repo>/target)
#        NC_TARGET_DIR         target dir for the published crates' tests
#                              (default: $CARGO_TARGET_DIR/published-nc)
#        NC_SERVER_LOG_LEVEL   server --log-level (default: warn)
#        NC_TEST_TIMEOUT_S     limit on each test run, seconds (default: 300)
# Exit:  0 when every test passed and every server stopped cleanly; non-zero otherwise.
set -euo pipefail

readonly V3_VERSION="0.4.0"
readonly LINE_VERSION="0.3.0"
readonly ADDR="127.0.0.1:5225"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
nc_target="${NC_TARGET_DIR:-$target/published-nc}"
cargo_home="${CARGO_HOME:-$HOME/.cargo}"

die() { echo "published-nc-tests: $*" >&2; exit 1; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# The published tests hard-code this port; a server already there would be
# tested instead of ours (or the bind would fail), so stop right here.
if port_open 5225; then
    die "something is already listening on $ADDR; stop it first"
fi

work="$(mktemp -d -t ticketing-nc.XXXXXX)"
server_pid=""
cleanup() {
    if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
        kill -TERM "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    local c
    for c in "$work"/cluster-*; do
        [[ -d "$c" ]] || continue
        CLUSTER_DIR="$c" CARGO_TARGET_DIR="$target" \
            "$repo/scripts/cluster-local.sh" stop >/dev/null 2>&1 || true
    done
    rm -rf "$work"
}
trap cleanup EXIT

if [[ -n "${TICKETING_BIN:-}" ]]; then
    bin="$TICKETING_BIN"
else
    echo "==> building ticketing (release)"
    CARGO_TARGET_DIR="$target" cargo build --release -p ticketing-tokio --bin ticketing \
        --manifest-path "$repo/Cargo.toml"
    bin="$target/release/ticketing"
fi
[[ -x "$bin" ]] || die "no binary at $bin"

# Copies the published crate VERSION (fetched through a throwaway project if
# cargo has not unpacked it yet) to $work/ticketing-VERSION: the registry
# copy must stay pristine.
fetch_crate() {
    local version="$1" manifest
    find_crate() {
        compgen -G "$cargo_home/registry/src/*/ticketing-$version/Cargo.toml" | head -n 1 || true
    }
    manifest="$(find_crate)"
    if [[ -z "$manifest" ]]; then
        local fetcher="$work/fetch-$version"
        mkdir -p "$fetcher/src"
        printf '[package]\nname = "nc-fetch"\nversion = "0.0.0"\nedition = "2021"\n\n[dependencies]\nticketing = "=%s"\n' \
            "$version" > "$fetcher/Cargo.toml"
        : > "$fetcher/src/lib.rs"
        cargo fetch --manifest-path "$fetcher/Cargo.toml" >&2
        manifest="$(find_crate)"
        [[ -n "$manifest" ]] || die "cargo fetch did not unpack ticketing-$version"
    fi
    cp -R "$(dirname "$manifest")" "$work/ticketing-$version"
    echo "    $(dirname "$manifest") -> $work/ticketing-$version" >&2
}

echo "==> locating the published crates ticketing $V3_VERSION and $LINE_VERSION"
fetch_crate "$V3_VERSION"
fetch_crate "$LINE_VERSION"

# One line per test run, printed at the end.
results=()
status=0
# nc_test VERSION NAME CARGO-TEST-ARGS...: runs the published crate's tests,
# logs to $work/test-VERSION.log and records NAME as passed or failed. A run
# that outlives NC_TEST_TIMEOUT_S (a request the server never answers hangs
# these clients for ever) is killed and counts as failed.
nc_test() {
    local version="$1" name="$2"; shift 2
    local rc=0 limit="${NC_TEST_TIMEOUT_S:-300}"
    [[ "$name" != build ]] || limit=1800
    (
        cd "$work/ticketing-$version"
        CARGO_TARGET_DIR="$nc_target" RUST_LOG=info TICKETING_BENCH_LATENCY=1 \
            timeout --kill-after=10 "$limit" cargo test --release --features tracing "$@"
    ) 2>&1 | tee -a "$work/test-$version.log" || rc=$?
    if [[ "$rc" -eq 0 ]]; then
        results+=("ok     $version $name")
    else
        results+=("FAILED $version $name (exit $rc)")
        status=1
    fi
}

echo "==> building the published crates' tests"
nc_test "$V3_VERSION" "build" --no-run \
    --test nc_example_simple_test --test nc_bank_test --test nc_bench_test --test nc_cluster_test
nc_test "$LINE_VERSION" "build" --no-run \
    --test nc_example_simple_test --test nc_bank_test --test nc_bench_test --test nc_cluster_test
[[ "$status" -eq 0 ]] || die "the published crates' tests did not build"

start_server() {
    "$bin" serve --listen "$ADDR" --log-level "${NC_SERVER_LOG_LEVEL:-warn}" \
        --state-dir "$work/state-single" > "$work/server.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 1 100); do
        if port_open 5225; then return 0; fi
        kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log" >&2; die "server exited at start"; }
        sleep 0.1
    done
    die "server did not start listening"
}

stop_server() {
    kill -TERM "$server_pid"
    local server_status=0
    wait "$server_pid" || server_status=$?
    server_pid=""
    if [[ "$server_status" -ne 0 ]]; then
        echo "server exited with $server_status; its log:" >&2
        cat "$work/server.log" >&2
        results+=("FAILED server exited with $server_status")
        status=1
    elif [[ -s "$work/server.log" ]]; then
        echo "    server log (warnings and above):"
        sed 's/^/    /' "$work/server.log"
    fi
}

echo "==> starting ticketing serve on $ADDR"
start_server

echo "==> the published $V3_VERSION client's tests (wire v3)"
nc_test "$V3_VERSION" "nc_example_simple_test nc_bank_test" \
    --test nc_example_simple_test --test nc_bank_test -- --include-ignored --nocapture
# Each test of 0.4.0's nc_bench_test runs in its own process: the tests of
# that file share static counters and a broker that lives on the first
# test's runtime, so a second test in the same process (in turn or side by
# side) fails for reasons of the harness, not the server.
for bench in steady_state_bench burst_40k_tasks; do
    nc_test "$V3_VERSION" "nc_bench_test $bench" \
        --test nc_bench_test -- --include-ignored --nocapture --exact "$bench"
done

echo "==> the published $LINE_VERSION client's tests (line dialect), same server"
nc_test "$LINE_VERSION" "nc_example_simple_test nc_bank_test" \
    --test nc_example_simple_test --test nc_bank_test -- --include-ignored --nocapture
nc_test "$LINE_VERSION" "nc_bench_test" --test nc_bench_test -- --include-ignored --nocapture

echo "==> stopping the server"
stop_server

# cluster_test VERSION [NO_CLIENT_TOKEN]: nc_cluster_test of VERSION on a
# fresh 3-node loopback cluster.
cluster_test() {
    local version="$1" no_token="${2:-}"
    local dir="$work/cluster-$version"
    cluster() {
        CARGO_TARGET_DIR="$target" CLUSTER_DIR="$dir" PROFILE=fast LOG_LEVEL=warn \
            NO_BUILD=1 NO_CLIENT_TOKEN="$no_token" TICKETING_BIN="$bin" \
            "$repo/scripts/cluster-local.sh" "$@"
    }
    echo "==> $version nc_cluster_test against a 3-node cluster on loopback"
    if ! cluster start; then
        results+=("FAILED $version nc_cluster_test (cluster did not start)")
        status=1
        return
    fi
    # `start` returned once a node reported itself leader.
    eval "$(cluster env)"
    nc_test "$version" "nc_cluster_test" --test nc_cluster_test -- --include-ignored --nocapture
    unset TICKETING_IDENTITY_FINGERPRINT TICKETING_CLIENT_TOKEN TICKETING_CHAOS_ADDRS
    if ! cluster stop; then
        results+=("FAILED $version cluster stop")
        status=1
    fi
    local log
    for log in "$dir"/node*.log; do
        if [[ -s "$log" ]]; then
            echo "    $(basename "$log") (warnings and above):"
            sed 's/^/    /' "$log"
        fi
    done
}
cluster_test "$V3_VERSION"
cluster_test "$LINE_VERSION" 1

echo "==> interop/: $V3_VERSION (v3) and $LINE_VERSION (line) clients on the same keys at once"
interop_rc=0
TICKETING_BIN="$bin" CARGO_TARGET_DIR="$target/interop" \
    timeout --kill-after=10 1200 cargo test --release --locked --manifest-path "$repo/interop/Cargo.toml" -- --nocapture \
    2>&1 | tee "$work/interop.log" || interop_rc=$?
if [[ "$interop_rc" -eq 0 ]]; then
    results+=("ok     interop mixed_dialects")
else
    results+=("FAILED interop mixed_dialects (exit $interop_rc)")
    status=1
fi

echo "==> results"
printf '    %s\n' "${results[@]}"

echo "==> bench figures"
for version in "$V3_VERSION" "$LINE_VERSION"; do
    [[ -f "$work/test-$version.log" ]] || continue
    echo "    ticketing $version:"
    grep -E 'total in|latency usec|burst completed' "$work/test-$version.log" \
        | sed -E 's/\x1b\[[0-9;]*m//g; s/^/      /' || true
    # ops/s from "<n> total in <ms>ms" lines.
    sed -E 's/\x1b\[[0-9;]*m//g' "$work/test-$version.log" \
        | sed -nE 's/.*= ([0-9]+) total in ([0-9.]+)ms.*/\1 \2/p' \
        | while read -r ops ms; do
            awk -v o="$ops" -v m="$ms" -v v="$version" 'BEGIN { printf "      %s: %d acquire+release in %.1f ms = %.0f ops/s\n", v, o, m, o / (m / 1000) }'
        done
done
grep -E '^mixed dialects' "$work/interop.log" | sed 's/^/    /' || true

if [[ "$status" -ne 0 ]]; then
    die "FAILED (status $status)"
fi
echo "==> all published nc tests passed"
