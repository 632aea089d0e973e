#!/usr/bin/env bash
# Set up .venv if needed, lint (ruff, configured in pyproject.toml: the run fails on any finding),
# and run the whole test suite (slow tests included). Extra arguments go to pytest, e.g.
# `bash scripts/test.sh -m "not slow" -x`.
# tests/integration/test_convert_peers.py converts datasets written by the peers' own writers (MDSWriter,
# litdata.optimize), which live in .bench-venv: it is built here when missing or broken (a few
# minutes, once), and SHARDPACK_REQUIRE_PEERS=1 makes those tests fail rather than skip without it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --with-nginx
.venv/bin/python -m ruff check shardpack tests scripts examples benchmarks testbed
bash benchmarks/suites/setup_peers.sh --keep
export SHARDPACK_REQUIRE_PEERS=1
# The region JPEG decoder must be built here (setup.sh installs gcc and the libjpeg headers):
# without it its tests would skip and CI would not notice (tests/unit/test_jpegcrop.py).
export SHARDPACK_REQUIRE_JPEGCROP=1
# The same for the batch hash (setup.sh installs the libxxhash headers): tests/unit/test_hash_ranges.py.
export SHARDPACK_REQUIRE_HASH_RANGES=1
# The test servers: rclone (the dev extra) and nginx (setup.sh --with-nginx) are installed above, so
# a fixture that cannot start one fails its tests rather than skipping them (testbed/plugin.py).
export SHARDPACK_REQUIRE_SERVERS=1
# Any other skip whose reason is not on testbed/skips.py's allowlist (no GPU, a container that
# refuses mounts, ...) fails the run: a fresh machine set up as above can run those tests.
export SHARDPACK_CI_SKIPS=1
exec .venv/bin/python -m pytest "$@"
