#!/usr/bin/env bash
# Wheels of what shardpack needs beyond what the GPU machine has (docs/device.md, "GPU checks"):
# cp312 manylinux x86_64 binary wheels, no dependencies, into .whl/ at the repository root
# (git-ignored; the device tool carries it). The machine has Python 3.12, torch + torchvision,
# numpy, msgpack, fsspec, xxhash, click, tqdm, pillow, scikit-image, pytest, psutil; shardpack's
# other dependencies (pyproject.toml) are pinned here. One version of each is kept: a wheel not
# in PINS is removed, a pinned one already there is not downloaded again.
#
#   bash tools/gpu_wheels.sh          # then, on the machine: pip install --no-index --target ... .whl/*.whl
set -euo pipefail
cd "$(dirname "$0")/.."

PINS=(
    zstandard==0.25.0   # compressed shards (reader, writer)
    crc32c==2.9.post0   # shardpack.format, at import
    simplejpeg==1.9.0   # CPU decode, JPEG headers for GPU decode
)

if python3 -m pip --version >/dev/null 2>&1; then
    PY=python3
elif [ -x .venv/bin/python ] && .venv/bin/python -m pip --version >/dev/null 2>&1; then
    PY=.venv/bin/python
else
    echo "gpu_wheels.sh: no pip (python3 -m pip, .venv/bin/python -m pip)" >&2
    exit 1
fi

mkdir -p .whl
keep=()
for pin in "${PINS[@]}"; do
    name=${pin%%==*}
    version=${pin#*==}
    keep+=("$name-$version-")
    if compgen -G ".whl/$name-$version-cp312-*manylinux*x86_64*.whl" >/dev/null; then
        continue
    fi
    rm -f ".whl/$name"-*.whl
    "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d .whl "$pin"
done
shopt -s nullglob
for whl in .whl/*; do  # anything not pinned (an old version, another package) goes
    base=${whl#.whl/}
    ok=0
    for prefix in "${keep[@]}"; do
        [[ $base == "$prefix"* ]] && ok=1
    done
    [ "$ok" = 1 ] || { echo "removing $whl"; rm -rf "$whl"; }
done
ls -l .whl
du -sh .whl
