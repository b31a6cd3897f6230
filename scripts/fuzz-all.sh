#!/usr/bin/env bash
# Runs every cargo-fuzz target of fuzz/ for SECONDS each, one after the
# other (the CPU is shared), on a scratch copy of its committed corpus, and
# prints one line per target: executions, coverage (libFuzzer's `cov`
# edges and `ft` features), corpus size, and findings (crash, timeout,
# leak or OOM files written to fuzz/artifacts/<target>/).
#
# Usage: scripts/fuzz-all.sh SECONDS [TARGET...]
# Needs: the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`).
# Env:   FUZZ_MAX_LEN   -max_len for every target (default 4096)
#        FUZZ_KEEP=1    merge what was found into the committed corpora
#                       (then minimise them with `cargo fuzz cmin`)
# Exit:  non-zero when a target reported a finding or failed to run.
set -euo pipefail

if [[ $# -lt 1 || ! "$1" =~ ^[0-9]+$ ]]; then
    echo "usage: $0 SECONDS [TARGET...]" >&2
    exit 2
fi
readonly seconds="$1"
shift
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo/fuzz"
readonly max_len="${FUZZ_MAX_LEN:-4096}"

if [[ $# -gt 0 ]]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo +nightly fuzz list)
fi

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
if ! cargo +nightly fuzz build >"$scratch/build.log" 2>&1; then
    cat "$scratch/build.log" >&2
    exit 1
fi
failed=0
printf '%-22s %12s %8s %8s %8s %s\n' target execs cov ft corpus findings
for target in "${targets[@]}"; do
    work="$scratch/$target"
    mkdir -p "$work" "artifacts/$target"
    if [[ -d "corpus/$target" ]]; then
        cp -r "corpus/$target/." "$work/"
    fi
    before="$(find "artifacts/$target" -type f | wc -l)"
    log="$scratch/$target.log"
    status=0
    cargo +nightly fuzz run "$target" "$work" -- \
        -max_total_time="$seconds" -max_len="$max_len" -print_final_stats=1 \
        >"$log" 2>&1 || status=$?
    after="$(find "artifacts/$target" -type f | wc -l)"
    # The last status line libFuzzer printed: "#N ... cov: C ft: F corp: K/..."
    line="$(grep -E '^#[0-9]+' "$log" | tail -n 1 || true)"
    execs="$(grep -oE '^stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || true)"
    [[ -n "$execs" ]] || execs="$(sed -nE 's/^#([0-9]+).*/\1/p' <<<"$line")"
    cov="$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<<"$line")"
    ft="$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<<"$line")"
    corp="$(sed -nE 's/.* corp: ([0-9]+).*/\1/p' <<<"$line")"
    findings=$((after - before))
    note="$findings"
    if [[ $findings -gt 0 ]]; then
        note="$findings (see fuzz/artifacts/$target/)"
        failed=1
    elif [[ $status -ne 0 ]]; then
        note="run failed (exit $status): tail of the log follows"
        failed=1
    fi
    printf '%-22s %12s %8s %8s %8s %s\n' "$target" "${execs:-?}" "${cov:-?}" "${ft:-?}" \
        "${corp:-?}" "$note"
    if [[ $status -ne 0 && $findings -eq 0 ]]; then
        tail -n 20 "$log" >&2
    fi
    if [[ "${FUZZ_KEEP:-0}" == 1 ]]; then
        mkdir -p "corpus/$target"
        cargo +nightly fuzz run "$target" "corpus/$target" "$work" -- -merge=1 \
            -max_len="$max_len" >/dev/null 2>&1 || true
    fi
done
exit "$failed"
