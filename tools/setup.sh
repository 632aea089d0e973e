#!/usr/bin/env bash
# Set up .venv on a fresh machine: CPU torch 2.13.0 first (pinned, so nothing pulls a CUDA build),
# then shardpack with its dev extras. Safe to run again; it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0" -e ".[dev]"
