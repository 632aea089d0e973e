#!/usr/bin/env bash
# Set up .venv if needed and run the whole test suite (slow tests included). Extra arguments go to
# pytest, e.g. `bash tools/test.sh -m "not slow" -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec .venv/bin/python -m pytest "$@"
