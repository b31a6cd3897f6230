# Helpers shared by scripts/cluster-bench.sh and scripts/single-bench.sh
# (sourced, not run).

# "p50 704 µs" / "p99 10.1 ms" in LINE → µs.
latency_us() { # NAME LINE
    sed -nE "s/.* $1 ([0-9.]+) (µs|ms).*/\1 \2/p" <<<"$2" |
        awk '{ printf "%.0f", ($2 == "ms") ? $1 * 1000 : $1 }'
}
# "met" or "NOT met": VALUE OP GOAL, OP one of >= <= <. An empty or
# non-numeric VALUE (a run that printed no figure) is "no figure", never
# "met" (awk would read it as 0), and is recorded in $work/no-figure:
# verdict runs in a command substitution, a subshell, so a variable would
# not outlive it. The script ends with `verdicts_complete || exit 1`.
verdict() {
    # awk prints a large non-integral median as 1.00000e+06: a figure too.
    if ! [[ "$1" =~ ^[0-9]+([.][0-9]+)?([eE][+-]?[0-9]+)?$ ]]; then
        echo "no figure"
        echo "${1:-(empty)} $2 $3" >> "${work:?verdict needs \$work}/no-figure"
        return 0
    fi
    awk -v v="$1" -v g="$3" -v op="$2" \
        'BEGIN { ok = (op == ">=") ? v >= g : (op == "<=") ? v <= g : v < g; print ok ? "met" : "NOT met" }'
}
# Fails (status 1, the count on stderr) when any verdict had no figure.
verdicts_complete() {
    [[ -s "$work/no-figure" ]] || return 0
    echo "$(wc -l < "$work/no-figure") goal(s) had no figure: the run is not a measurement" >&2
    return 1
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
# The caller defines `ours` (runs `ticketing bench ARGS...` in the placement
# last set, prefixed by "${on[@]}"), `die`, `echo_bin` and `work`.

# Per placement, the echo's round trip and our client's uncontended
# acquire+release p50 (one task, one key), into the arrays echo_us and
# solo_p50 by placement. PIDS are the server processes to place.
measure_uncontended() { # PID...
    declare -gA echo_us solo_p50
    local placement echo_line solo
    for placement in "${placements[@]}"; do
        place "$placement" "$@"
        echo_line="$("${on[@]}" "$echo_bin" 5000)"
        echo_us[$placement]="$(sed -nE 's/.*p50 ([0-9]+) µs.*/\1/p' <<<"$echo_line")"
        solo="$(ours --clients 1 --keys 1 --ops 5000)"
        grep -q 'ops/s' <<<"$solo" || { echo "$solo" >&2; die "the uncontended run failed"; }
        solo_p50[$placement]="$(latency_us p50 "$(grep '^latency' <<<"$solo")")"
        echo "==> $placement: $echo_line"
        echo "==> $placement: uncontended acquire+release (1 task, 1 key, our client): p50 ${solo_p50[$placement]} µs"
    done
}
# ROUNDS rounds of 64 tasks on 32 keys x OPS pairs in each placement,
# alternated: each run's fields (see bench_fields) appended to
# $work/ours-PLACEMENT.txt, its connection count into the array
# connections by placement.
measure_rounds() { # ROUNDS OPS PID...
    declare -gA connections
    local rounds="$1" ops="$2" round placement out fields rate p50 p99 client_us server_us
    shift 2
    for placement in "${placements[@]}"; do : > "$work/ours-$placement.txt"; done
    for round in $(seq 1 "$rounds"); do
        for placement in "${placements[@]}"; do
            place "$placement" "$@"
            out="$(ours --clients 64 --keys 32 --ops "$ops")"
            fields="$(bench_fields "$out")"
            [[ -n "$fields" ]] || { echo "$out" >&2; die "round $round ($placement) failed or had errors"; }
            read -r rate p50 p99 client_us server_us <<<"$fields"
            connections[$placement]="$(sed -nE 's/.*, ([0-9]+) connections?\).*/\1/p' <<<"$out" | head -n 1)"
            echo "$fields" >> "$work/ours-$placement.txt"
            echo "==> round $round, $placement: $rate ops/s, p50 $p50 µs, p99 $p99 µs, client CPU $client_us µs/op, server CPU $server_us µs/op"
        done
    done
}
# The median of COLUMN (1 rate, 2 p50, 3 p99, 4 client µs, 5 server µs) of
# PLACEMENT's rounds.
med() { awk -v c="$2" '{ print $c }' "$work/ours-$1.txt" | median; } # PLACEMENT COLUMN
