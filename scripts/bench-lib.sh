# Helpers shared by scripts/cluster-bench.sh and scripts/single-bench.sh
# (sourced, not run).

# "p50 704 µs" / "p99 10.1 ms" in LINE → µs.
latency_us() { # NAME LINE
    sed -nE "s/.* $1 ([0-9.]+) (µs|ms).*/\1 \2/p" <<<"$2" |
        awk '{ printf "%.0f", ($2 == "ms") ? $1 * 1000 : $1 }'
}
# "met" or "NOT met": VALUE OP GOAL, OP one of >= <= <.
verdict() {
    awk -v v="$1" -v g="$3" -v op="$2" \
        'BEGIN { ok = (op == ">=") ? v >= g : (op == "<=") ? v <= g : v < g; print ok ? "met" : "NOT met" }'
}
# The median of the numbers on stdin, one per line.
median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
# Checks PLACEMENTS ("spread one-cpu" by default) into the array `placements`.
read_placements() {
    read -r -a placements <<<"${PLACEMENTS:-spread one-cpu}"
    [[ ${#placements[@]} -gt 0 ]] || { echo "PLACEMENTS is empty" >&2; exit 2; }
    local placement
    for placement in "${placements[@]}"; do
        [[ "$placement" == spread || "$placement" == one-cpu ]] ||
            { echo "PLACEMENTS takes spread and one-cpu, not '$placement'" >&2; exit 2; }
    done
}
# place spread|one-cpu PID...: moves every thread of the PIDs onto every
# core or onto CPU 0, and sets `on`, the prefix that starts a client in the
# same placement.
place() {
    local cpus pid
    cpus="0-$(($(nproc) - 1))"
    [[ "$1" == one-cpu ]] && cpus=0
    shift
    for pid in "$@"; do taskset -a -p -c "$cpus" "$pid" >/dev/null; done
    on=(taskset -c "$cpus")
}
# Fields of one `ticketing bench` run's output, as "rate p50 p99 client_us
# server_us" (µs), or nothing when it did not finish cleanly.
bench_fields() { # OUTPUT
    local rate latency client_us server_us
    rate="$(sed -nE 's/^[0-9]+ acquire\+release pairs in .*: ([0-9]+) ops\/s.*/\1/p' <<<"$1")"
    [[ -n "$rate" ]] || return 0
    grep -q '^errors' <<<"$1" && return 0
    latency="$(grep '^latency' <<<"$1")"
    client_us="$(sed -nE 's/^client CPU: ([0-9.]+) µs.*/\1/p' <<<"$1")"
    server_us="$(sed -nE 's/^server CPU: ([0-9.]+) µs.*/\1/p' <<<"$1")"
    echo "$rate $(latency_us p50 "$latency") $(latency_us p99 "$latency") $client_us $server_us"
}
