#!/usr/bin/env bash
# Runs tests/python/line_client.py: the published PyPI client `ticketing`
# 0.3.0 (module saro_ticketing, the line dialect) against `ticketing serve`
# processes the driver starts itself on free loopback ports (single mode,
# a server with a client token, and a 3-node cluster).
#
# Usage: scripts/python-line-tests.sh [--only CHECK ...]
# Env:   TICKETING_BIN      test this binary instead of building one
#        CARGO_TARGET_DIR   target dir for our release build (default: <repo>/target)
#        PYLINE_VENV        the venv to create or reuse (default: $CARGO_TARGET_DIR/pyline-venv)
#        PYTHON             interpreter that makes the venv (default: python3; needs >= 3.11)
# Exit:  0 when every check passed.
set -euo pipefail

readonly VERSION="0.3.0"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
venv="${PYLINE_VENV:-$target/pyline-venv}"
python="${PYTHON:-python3}"

die() { echo "python-line-tests: $*" >&2; exit 1; }

if [[ -n "${TICKETING_BIN:-}" ]]; then
    bin="$TICKETING_BIN"
else
    echo "==> building ticketing (release)"
    CARGO_TARGET_DIR="$target" cargo build --release -p ticketing-tokio --bin ticketing \
        --manifest-path "$repo/Cargo.toml"
    bin="$target/release/ticketing"
fi
[[ -x "$bin" ]] || die "no binary at $bin"

echo "==> the published Python client ticketing==$VERSION in $venv"
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "ticketing==$VERSION needs Python 3.11 or newer; $python is $("$python" --version 2>&1)"
if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv" || die "could not create a venv with $python (python3-venv missing?)"
fi
if [[ "$("$venv/bin/python" -m pip show ticketing 2>/dev/null | sed -n 's/^Version: //p')" != "$VERSION" ]]; then
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "ticketing==$VERSION"
fi
"$venv/bin/python" -c 'import saro_ticketing' || die "saro_ticketing does not import"

echo "==> running tests/python/line_client.py"
"$venv/bin/python" "$repo/tests/python/line_client.py" --bin "$bin" "$@"
