#!/usr/bin/env bash
# Wheels of what shardpack needs beyond what the GPU machine has (docs/device.md, "GPU checks"):
# cp312 manylinux x86_64 binary wheels, no dependencies, into .whl/ at the repository root
# (git-ignored; the device tool carries it). The machine has Python 3.12, torch 2.11.0+cu130,
# numpy, msgpack, fsspec, xxhash, click, tqdm, pillow, scikit-image, pytest, pytest-timeout,
# psutil, and probably torchvision 0.26.0; shardpack's other dependencies (pyproject.toml) are
# pinned here. torchvision 0.26.0 goes into .whl/fallback/, installed there only when the
# machine's own torchvision does not import (PyPI's cp312 manylinux wheel of 0.26.0 is the cu130
# build, bundles libnvjpeg and requires torch==2.11.0: the machine's torch). One version of each
# is kept: a wheel not pinned here is removed, a pinned one already there is not downloaded again.
#
#   bash scripts/gpu_wheels.sh      # then, on the machine (docs/device.md has the whole command):
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#       --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
#   python3 -c 'import torchvision.io' || python3 -m pip install -q --no-index --no-deps \
#       --no-compile --no-cache-dir --target /tmp/site .whl/fallback/*.whl
set -euo pipefail
cd "$(dirname "$0")/.."

PINS=(
    zstandard==0.25.0   # compressed shards (reader, writer)
    crc32c==2.9.post0   # shardpack.format, at import
    simplejpeg==1.9.0   # CPU decode, JPEG headers for GPU decode
)
FALLBACK=(
    torchvision==0.26.0  # nvJPEG decode and ResNet-50, where the machine has no working one
)

if python3 -m pip --version >/dev/null 2>&1; then
    PY=python3
elif [ -x .venv/bin/python ] && .venv/bin/python -m pip --version >/dev/null 2>&1; then
    PY=.venv/bin/python
else
    echo "gpu_wheels.sh: no pip (python3 -m pip, .venv/bin/python -m pip)" >&2
    exit 1
fi

# fetch DIR PIN...: each pin's wheel into DIR unless there; anything else in DIR is removed
fetch() {
    local dir=$1 pin name version base ok prefix whl
    shift
    mkdir -p "$dir"
    local keep=()
    for pin in "$@"; do
        name=${pin%%==*}
        version=${pin#*==}
        keep+=("$name-$version-")
        if compgen -G "$dir/$name-$version-cp312-*manylinux*x86_64*.whl" >/dev/null; then
            continue
        fi
        rm -f "$dir/$name"-*.whl
        "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
            --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
            --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            --platform manylinux1_x86_64 -d "$dir" "$pin"
    done
    shopt -s nullglob
    for whl in "$dir"/*; do  # anything not pinned (an old version, another package) goes
        base=${whl#"$dir"/}
        [ "$dir/$base" = .whl/fallback ] && continue
        ok=0
        for prefix in "${keep[@]}"; do
            [[ $base == "$prefix"* ]] && ok=1
        done
        [ "$ok" = 1 ] || { echo "removing $whl"; rm -rf "$whl"; }
    done
}

fetch .whl "${PINS[@]}"
fetch .whl/fallback "${FALLBACK[@]}"
ls -lR .whl
du -sh .whl
