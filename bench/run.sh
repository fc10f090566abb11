#!/usr/bin/env bash
# Entry point of `make bench`: set up the pinned venvs, then run the driver.
#   bash bench/run.sh [--scale small|medium|large] [--systems ...] [--workloads ...] [--tune] ...
# The driver runs with the main venv's python (it only needs the standard library).
# BENCH_NICE=19 (default 0) runs everything at low CPU priority.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash bench/setup_venvs.sh
PY="$ROOT/.venv/bin/python"
[ -x "$PY" ] || { echo "[bench] $PY missing: pqloader rows will fail; driver uses python3" >&2; PY=python3; }
nice -n "${BENCH_NICE:-0}" "$PY" bench/run.py "$@"
# Side by side on one Petastorm dataset (image + ndarray codecs): Petastorm's make_reader +
# DataLoader vs pqloader.petastorm's, import changed -> docs/benchmarks_petastorm.md.
# Skipped with --report-only or BENCH_PETASTORM_COMPAT=0.
case " $* " in *" --report-only "*) exit 0 ;; esac
[ "${BENCH_PETASTORM_COMPAT:-1}" = 0 ] && exit 0
exec nice -n "${BENCH_NICE:-0}" "$PY" bench/petastorm_compat.py
