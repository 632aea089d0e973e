#!/usr/bin/env bash
# Set up .venv on a fresh machine: CPU torch 2.13.0 first (pinned, so nothing pulls a CUDA build),
# then shardpack with its dev extras. Safe to run again; it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
# nginx: the HTTP server with Range requests for the tests (testbed/servers.py, fixture http_server),
# installed only with --with-nginx (scripts/test.sh passes it; the demo does not need it). A Debian
# package, installed only when missing: as root (CI), else through passwordless sudo, else skipped
# with a warning (those tests then skip).
WITH_NGINX=0
[ "${1:-}" = "--with-nginx" ] && WITH_NGINX=1
if [ "$WITH_NGINX" = 1 ] && ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
  if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
  else
    SUDO="none"
  fi
  if [ "$SUDO" = none ]; then
    echo "setup.sh: nginx is missing and cannot be installed as $(id -un); the tests that need it" \
         "will be skipped (install it with: apt-get install nginx)" >&2
  else
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx \
      >/dev/null
  fi
fi
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0" -e ".[dev]"
