"""Shared test helpers: build source trees, run the CLI, re-seal tampered datasets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardpack import format as fmt
from shardpack.cli import main

ROOT = Path(__file__).resolve().parents[1]


def make_tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def read_tree(root: Path) -> dict[str, bytes]:
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            out[str(path.relative_to(root))] = path.read_bytes()
    return out


def dataset_files(out: Path) -> dict[str, bytes]:
    """Every file of a dataset folder, by name (for byte-identity checks)."""
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def run_cli(*args, ok: bool | None = True):
    result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    if ok is True:
        assert result.exit_code == 0, result.output
    return result


def run_subprocess(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shardpack.cli", *map(str, args)],
                          capture_output=True, text=True, **kw)


def reseal(out: Path) -> None:
    """After a test tampered with shard bytes on purpose, recompute every hash so only the
    structural checks can catch the tampering (a 'malicious but consistent' dataset)."""
    manifest = json.loads((out / fmt.MANIFEST_NAME).read_text())
    for entry in manifest["shards"]:
        shard = (out / entry["name"]).read_bytes()
        index = fmt.decode_index((out / entry["index"]).read_bytes())
        hashes = [fmt.sample_hash(shard[index.span(i)[0]:index.span(i)[1]])
                  for i in range(index.num_samples)]
        data = fmt.encode_index(
            shard_format=index.shard_format, compression=index.compression,
            shard_bytes=len(shard), shard_hash=bytes.fromhex(fmt.content_hash(shard)),
            plan_digest=index.plan_digest, skipped=index.skipped, fields=index.fields,
            starts=index.starts, raw_sizes=index.raw_sizes, sample_hashes=hashes,
            field_offsets=index.field_offsets, field_sizes=index.field_sizes,
            keys=index.keys())
        (out / entry["index"]).write_bytes(data)
        entry.update(bytes=len(shard), hash=fmt.content_hash(shard), index_bytes=len(data),
                     index_hash=fmt.content_hash(data))
    (out / fmt.MANIFEST_NAME).write_bytes(fmt.encode_manifest(manifest))


@pytest.fixture
def small_tree(tmp_path) -> Path:
    """An ImageFolder-like tree with odd names and an extra json field."""
    files = {
        "cat/0001.jpg": os.urandom(3000),
        "cat/0002.jpg": os.urandom(10),
        "cat/0002.json": b'{"w": 1}',
        "cat/with space.jpg": b"x" * 700,
        "dog/ünïcödé.jpg": os.urandom(1500),
        "dog/empty.jpg": b"",
        "dog/" + "long" * 40 + ".jpg": os.urandom(50),
    }
    return make_tree(tmp_path / "src", files)
