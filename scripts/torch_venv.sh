# Sourced (not run) by the benchmark venv scripts (benchmarks/suites/setup_peers.sh,
# benchmarks/suites/setup_loaders.sh): one way to start a side venv with the pinned CPU torch.
#
# fresh_torch_venv VENV: delete VENV, make it anew with $PY, install torch==2.13.0 FIRST (the CPU
# wheel pip finds on disk), then leave for the caller:
#   PIP   the venv's pip, as an array: "${PIP[@]}" install ...
#   PINS  a constraints file holding the torch pin: pass -c "$PINS" to every later install, so
#         no dependency can pull a CUDA torch (removed when the calling script exits).
fresh_torch_venv() {
  rm -rf "$1"
  "$PY" -m venv "$1"
  PIP=("$1/bin/python" -m pip --disable-pip-version-check)
  PINS=$(mktemp)
  trap 'rm -f "$PINS"' EXIT
  echo "torch==2.13.0" >"$PINS"
  "${PIP[@]}" install -q "torch==2.13.0"
}
