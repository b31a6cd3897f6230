#!/usr/bin/env bash
# A 3-node Ticketing cluster on loopback, for trying cluster mode and for the
# chaos supervisor.
#
#   scripts/cluster-local.sh start          build, bootstrap slots 0-2, wait
#                                           for a leader and name it
#   scripts/cluster-local.sh status         one status line per node
#   scripts/cluster-local.sh kill SLOT      kill -9 one node
#   scripts/cluster-local.sh restart SLOT   kill -9, then start it with empty
#                                           state (it rejoins by itself)
#   scripts/cluster-local.sh stop           SIGTERM every node
#   scripts/cluster-local.sh env            exports for clients
#
# Slot i: clients on 127.0.0.1:$((BASE+i)), peers on $((BASE+1000+i)),
# status on $((BASE+2000+i)), admin HTTP (the status page at /, /metrics,
# /livez, /readyz, /v1/…) on $((BASE+4000+i)); every node is told every
# slot's (--slot-admin), so a follower's lock API redirects to the
# leader's and every page links to every node's. State (identity,
# tokens, pids, logs) lives in $CLUSTER_DIR.
# Env:   CARGO_TARGET_DIR  target dir (default: <repo>/target)
#        CLUSTER_DIR       state dir (default: /tmp/ticketing-cluster)
#        BASE              first client port (default 5225)
#        PROFILE           default | fast (default: default)
#        LOG_LEVEL         node --log-level (default: info)
#        LEADER_WAIT_S     how long start waits for a leader (default: 15)
#        TICKETING_BIN     the binary to run (default: $CARGO_TARGET_DIR/release/ticketing)
#        NO_CLIENT_TOKEN   1: start the cluster with no client token (loopback
#                          no-auth; the 0.3.0 clients' nc_cluster_test needs it)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
dir="${CLUSTER_DIR:-/tmp/ticketing-cluster}"
base="${BASE:-5225}"
bin="${TICKETING_BIN:-$target/release/ticketing}"

die() { echo "cluster-local: $*" >&2; exit 1; }
now_ms() { local us="${EPOCHREALTIME//[.,]/}"; echo $((us / 1000)); }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

slot_args() {
    local i
    for i in 0 1 2; do
        printf -- '--slot 127.0.0.1:%d,127.0.0.1:%d ' $((base + i)) $((base + 1000 + i))
    done
    # Every node knows every admin address: a follower redirects there.
    for i in 0 1 2; do
        printf -- '--slot-admin 127.0.0.1:%d ' $((base + 4000 + i))
    done
}

start_node() { # SLOT [--bootstrap]
    local slot="$1"; shift
    [[ -f "$dir/identity" ]] || die "no cluster in $dir; run: $0 start"
    # An empty client-token file (NO_CLIENT_TOKEN=1) means loopback no-auth.
    local -a client_env=(-u TICKETING_CLIENT_TOKENS)
    if [[ -s "$dir/client-token" ]]; then
        client_env=("TICKETING_CLIENT_TOKENS=$(cat "$dir/client-token")")
    fi
    # shellcheck disable=SC2046
    env "${client_env[@]}" TICKETING_PEER_TOKENS="$(cat "$dir/peer-token")" \
        "$bin" serve --cluster-identity "$(cat "$dir/identity")" --self-slot "$slot" \
        $(slot_args) --status-listen "127.0.0.1:$((base + 2000 + slot))" \
        --admin-listen "127.0.0.1:$((base + 4000 + slot))" \
        --profile "${PROFILE:-default}" --log-level "${LOG_LEVEL:-info}" \
        --state-dir "$dir/state" "$@" \
        >> "$dir/node$slot.log" 2>&1 &
    echo $! > "$dir/node$slot.pid"
    for _ in $(seq 1 100); do
        port_open $((base + 2000 + slot)) && return 0
        kill -0 "$(cat "$dir/node$slot.pid")" 2>/dev/null || { tail -5 "$dir/node$slot.log" >&2; die "node $slot exited"; }
        sleep 0.05
    done
    die "node $slot did not start listening"
}

kill_node() { # SLOT
    local pidfile="$dir/node$1.pid"
    if [[ -f "$pidfile" ]]; then
        local pid; pid="$(cat "$pidfile")"
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        # Not our child when called from another invocation: wait for it.
        while kill -0 "$pid" 2>/dev/null; do sleep 0.01; done
        rm -f "$pidfile"
    fi
}

# Polls every node's admin listener (`ticketing status --json`: one JSON
# object per node and line) until one reports itself leader, for at most
# LEADER_WAIT_S seconds; prints which slot leads, or says why it gave up
# and fails.
wait_for_leader() {
    local wait_s="${LEADER_WAIT_S:-15}" i admin line
    local -a admins=()
    for i in 0 1 2; do admins+=(--admin "127.0.0.1:$((base + 4000 + i))"); done
    # Milliseconds: $SECONDS ticks on whole seconds, so a 1 s wait could
    # end at once.
    local deadline_ms=$(($(now_ms) + wait_s * 1000))
    while (($(now_ms) < deadline_ms)); do
        # Exits non-zero until every node is ready: only the lines matter.
        line="$("$bin" status "${admins[@]}" --json 2>/dev/null | grep '"role":"leader"' || true)"
        if [[ -n "$line" ]]; then
            admin="$(sed -E 's/.*"admin":"127\.0\.0\.1:([0-9]+)".*/\1/' <<<"$line")"
            i=$((admin - base - 4000))
            echo "==> leader: slot $i (clients 127.0.0.1:$((base + i)), admin http://127.0.0.1:$admin)" >&2
            return 0
        fi
        for i in 0 1 2; do
            kill -0 "$(cat "$dir/node$i.pid")" 2>/dev/null || { tail -5 "$dir/node$i.log" >&2; die "node $i exited before a leader was elected"; }
        done
        sleep 0.1 # the polling interval, not a wait for the election
    done
    status >&2
    die "no leader elected within ${wait_s} s (LEADER_WAIT_S); the nodes still run (node logs in $dir; $0 stop ends them)"
}

status() {
    local i
    for i in 0 1 2; do
        if port_open $((base + 2000 + i)); then
            (exec 3<>"/dev/tcp/127.0.0.1/$((base + 2000 + i))"; cat <&3)
        else
            echo "slot=$i down"
        fi
    done
}

case "${1:-}" in
    start)
        for i in 0 1 2; do
            ! port_open $((base + i)) || die "port $((base + i)) is in use; stop it first"
        done
        if [[ "${NO_BUILD:-}" != 1 && -z "${TICKETING_BIN:-}" ]]; then
            echo "==> building ticketing (release)" >&2
            CARGO_TARGET_DIR="$target" cargo build --release -p ticketing-tokio --bin ticketing \
                --manifest-path "$repo/Cargo.toml" >&2
        fi
        mkdir -p "$dir"
        rm -f "$dir"/node*.log "$dir"/node*.pid
        # A new cluster is a new identity (fencing domain), always.
        "$bin" identity > "$dir/identity"
        "$bin" token > "$dir/peer-token"
        if [[ "${NO_CLIENT_TOKEN:-}" == 1 ]]; then
            : > "$dir/client-token"
        else
            echo "client-$("$bin" identity | cut -c1-32)" > "$dir/client-token"
        fi
        for i in 0 1 2; do start_node "$i" --bootstrap; done
        echo "==> 3 nodes started; clients: 127.0.0.1:$base-$((base + 2)); status pages: http://127.0.0.1:$((base + 4000))/ to $((base + 4002))/; state in $dir" >&2
        wait_for_leader
        ;;
    status) status ;;
    kill) kill_node "${2:?slot}" ;;
    restart)
        kill_node "${2:?slot}"
        start_node "$2"
        ;;
    stop)
        for i in 0 1 2; do
            if [[ -f "$dir/node$i.pid" ]]; then
                kill -TERM "$(cat "$dir/node$i.pid")" 2>/dev/null || true
            fi
        done
        for i in 0 1 2; do
            if [[ -f "$dir/node$i.pid" ]]; then
                pid="$(cat "$dir/node$i.pid")"
                while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
                rm -f "$dir/node$i.pid"
            fi
        done
        ;;
    env)
        echo "export TICKETING_IDENTITY_FINGERPRINT=$(cat "$dir/identity")"
        if [[ -s "$dir/client-token" ]]; then
            echo "export TICKETING_CLIENT_TOKEN=$(cat "$dir/client-token")"
        else
            echo "unset TICKETING_CLIENT_TOKEN"
        fi
        echo "export TICKETING_CHAOS_ADDRS=127.0.0.1:$base,127.0.0.1:$((base + 1)),127.0.0.1:$((base + 2))"
        ;;
    *) sed -n '2,26p' "$0"; exit 2 ;;
esac
