#!/usr/bin/env bash
# Make .bench-loaders-venv: FFCV 1.0.2 and NVIDIA DALI (CPU-only pipelines) for the peers suite.
# Benchmark-only: never a CI or package dependency.
#  1. system packages FFCV's C extension builds against: pkg-config, libturbojpeg, OpenCV (apt).
#  2. torch==2.13.0 FIRST (the CPU wheel pip finds on disk), then kept as a constraint so that
#     no later dependency pulls a CUDA torch.
#  3. FFCV from its sdist (builds with pkg-config; needs numpy/opencv at build time, and pillow,
#     which it imports but does not declare); DALI from the nvidia-dali-cuda120 wheel, whose CPU
#     pipelines (device_id=None) run without a GPU. matplotlib for the plot.
# Usage: benchmarks/suites/setup_loaders.sh [--keep]
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=.bench-loaders-venv
PY=${PYTHON:-python3}

check() {
  "$VENV/bin/python" - <<'PYEOF'
import torch, ffcv, nvidia.dali, matplotlib
print(f"ok: torch {torch.__version__} (cuda: {torch.version.cuda}), ffcv {ffcv.__version__}, "
      f"dali {nvidia.dali.__version__}")
PYEOF
}

if [ "${1:-}" = "--keep" ] && [ -x "$VENV/bin/python" ] && check 2>/dev/null; then
  exit 0
fi
if ! pkg-config --exists libturbojpeg opencv4 2>/dev/null; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q pkg-config libturbojpeg0-dev libopencv-dev
fi
. scripts/torch_venv.sh
fresh_torch_venv "$VENV"
"${PIP[@]}" install -q -c "$PINS" numpy opencv-python-headless pillow numba matplotlib pkgconfig \
  setuptools wheel
"${PIP[@]}" install -q -c "$PINS" --no-build-isolation "ffcv==1.0.2"
"${PIP[@]}" install -q -c "$PINS" "nvidia-dali-cuda120"
check
