#!/usr/bin/env bash
# Recreate .bench-venv, the venv of the peers (MosaicML streaming's MDSWriter, LitData's optimize;
# webdataset too) that the pack, convert and peers suites run and that tests/integration/test_convert_peers.py
# uses to write its input datasets, from scratch:
#  1. torch==2.13.0 first: the CPU wheel that lies on disk (pip's find-links) and nothing newer;
#     the same pin stays a constraint afterwards, so no dependency can pull a CUDA torch.
#  2. the peers, pinned. Both declare a torchvision requirement; pip then picks torchvision 0.28.0
#     from PyPI, built against the CUDA torch, whose import fails beside the CPU wheel with
#     "RuntimeError: operator torchvision::nms does not exist".
#  3. uninstall torchvision: neither writer needs it. LitData imports it lazily (image/video
#     serializers only; the benchmark writes bytes and ints); streaming imports it only via
#     streaming/__init__.py -> streaming.vision, which benchmarks/suites/writers.py sidesteps by
#     importing streaming.base directly. `pip check` therefore reports torchvision missing: expected.
# With --keep, an existing .bench-venv that passes the import check is kept as it is (scripts/test.sh
# uses this); a missing or broken one is rebuilt.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=.bench-venv
PY=${PYTHON:-python3}

check_peers() {
  "$VENV/bin/python" - <<'PYEOF'
import importlib.util, sys, types
import torch
# as benchmarks/suites/writers.py does: skip streaming/__init__
spec = importlib.util.find_spec("streaming")
pkg = types.ModuleType("streaming"); pkg.__path__ = list(spec.submodule_search_locations)
sys.modules["streaming"] = pkg
from streaming.base import MDSWriter  # noqa: F401
from litdata import optimize  # noqa: F401
import webdataset  # noqa: F401
print(f"ok: torch {torch.__version__} (cuda: {torch.version.cuda}), MDSWriter, optimize, webdataset")
PYEOF
}

if [ "${1:-}" = "--keep" ] && [ -x "$VENV/bin/python" ] && check_peers 2>/dev/null; then
  exit 0
fi
. scripts/torch_venv.sh
fresh_torch_venv "$VENV"
"${PIP[@]}" install -q -c "$PINS" "mosaicml-streaming==0.13.0" "litdata==0.2.76" "webdataset==1.0.2"
"${PIP[@]}" uninstall -q -y torchvision
check_peers
