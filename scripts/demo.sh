#!/usr/bin/env bash
# The demo, from a fresh clone: set up .venv, make a small ImageNet-like tree from the photos that
# ship inside scikit-image, pack it, show it, verify it, stream it back and print the throughput.
# COUNT=20000 bash scripts/demo.sh for a bigger run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
COUNT=${COUNT:-3000}
PY=.venv/bin/python
$PY scripts/make_images.py demo-data/images --count "$COUNT" --classes 10 --overwrite
rm -rf demo-data/shards
.venv/bin/shardpack pack demo-data/images demo-data/shards --shard-size 64MB
.venv/bin/shardpack info demo-data/shards
.venv/bin/shardpack verify demo-data/shards
$PY examples/demo_stream.py demo-data/shards
