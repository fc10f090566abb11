#!/usr/bin/env bash
# Create/refresh the benchmark virtualenvs under bench/.venvs/ from the pinned
# bench/requirements-*.txt. Idempotent: a venv is rebuilt only when its
# requirements file changed (sha256 stamp). Usage: bash bench/setup_venvs.sh [venv ...]
set -euo pipefail
BENCH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENVS="${BENCH_VENVS:-$BENCH/.venvs}"  # override only to test the pins elsewhere
PY="${PYTHON:-python3}"
NICE="${BENCH_NICE:-19}"
mkdir -p "$VENVS"

want=("$@")
[ ${#want[@]} -eq 0 ] && want=(tools peers petastorm pqloader-extras)

for v in "${want[@]}"; do
  req="$BENCH/requirements-$v.txt"
  stamp="$VENVS/.$v.sha256"
  sum="$(sha256sum "$req" | cut -d' ' -f1)"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sum" ]; then
    continue
  fi
  echo "[setup] $v <- $(basename "$req")" >&2
  if [ "$v" = "pqloader-extras" ]; then
    rm -rf "$VENVS/$v"
    nice -n "$NICE" "$PY" -m pip install -q --no-deps --target "$VENVS/$v" -r "$req"
  else
    rm -rf "$VENVS/$v"
    "$PY" -m venv "$VENVS/$v"
    nice -n "$NICE" "$VENVS/$v/bin/pip" install -q --no-deps -r "$req"
  fi
  echo "$sum" > "$stamp"
done
