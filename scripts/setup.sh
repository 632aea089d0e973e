#!/usr/bin/env bash
# Set up .venv on a fresh machine: CPU torch 2.13.0 first (pinned, so nothing pulls a CUDA build),
# then shardpack with its dev extras. Safe to run again; it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian packages, installed only when missing: as root (CI), else through passwordless sudo, else
# skipped with a warning that says what goes without them.
apt_install() {  # apt_install WHAT-GOES-WITHOUT PACKAGE...
  local without=$1; shift
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo="sudo -n"; else
      echo "setup.sh: cannot install $* as $(id -un): $without (apt-get install $*)" >&2
      return 0
    fi
  fi
  if ! command -v apt-get >/dev/null; then
    echo "setup.sh: no apt-get to install $*: $without" >&2
    return 0
  fi
  if [ -z "${APT_UPDATED:-}" ]; then
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq || {
      echo "setup.sh: apt-get update failed: $without" >&2
      return 0
    }
  fi
  APT_UPDATED=1
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" \
    >/dev/null || echo "setup.sh: installing $* failed: $without" >&2
}
# nginx: the HTTP server with Range requests for the tests (testbed/servers.py, fixture
# http_server), only with --with-nginx (scripts/test.sh passes it; the demo does not need it).
WITH_NGINX=0
[ "${1:-}" = "--with-nginx" ] && WITH_NGINX=1
if [ "$WITH_NGINX" = 1 ] && ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
  apt_install "the tests that need it will be skipped" nginx
fi
# The icon theme is a real tree Debian ships, with links inside, for a test of --follow-links
# (tests/integration/test_real_trees.py); installed with the test server.
if [ "$WITH_NGINX" = 1 ] && [ ! -d /usr/share/icons/Adwaita ]; then
  apt_install "the test of a real icon tree will be skipped" adwaita-icon-theme
fi
# A C compiler and the libjpeg-turbo headers build the region JPEG decoder (setup.py,
# docs/device.md "Region decode"); without them shardpack installs without it and decodes whole
# JPEGs at a DCT scale instead. The libxxhash headers build the batch hash (docs/reading.md,
# "Integrity") and the batch crop of raw pixels (docs/images.md, "Raw pixels"); without them
# samples are hashed one xxhash call each (slower beside busy threads) and raw pixels are cropped
# one sample at a time (the same pixels, slower).
if ! command -v gcc >/dev/null || [ ! -f /usr/include/jpeglib.h ] || \
    [ ! -f /usr/include/xxhash.h ]; then
  apt_install "JPEGs will decode without the region decoder (slower), samples hash one call each" \
    gcc libc6-dev libjpeg62-turbo-dev libxxhash-dev
fi
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
# The Python headers for the extension: a Debian interpreter keeps them in pythonX.Y-dev.
if ! .venv/bin/python -c 'import os, sysconfig, sys; sys.exit(not os.path.exists(
    os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
  apt_install "JPEGs will decode without the region decoder (slower)" \
    "$(.venv/bin/python -c 'import sys; print("python%d.%d-dev" % sys.version_info[:2])')"
fi
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0" -e ".[dev]"
.venv/bin/python -c 'from shardpack.images import jpegcrop; print("setup.sh: region JPEG decode",
    "built" if jpegcrop.available() else "NOT built (see docs/device.md, Region decode)")' || true
.venv/bin/python -c 'from shardpack.images.formats import raw; print("setup.sh: raw pixel batch crop",
    "built" if raw.batch_extension() else "NOT built (see docs/images.md, Raw pixels)")' || true
