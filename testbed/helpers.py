"""Helpers shared by the tests and the benchmarks: build source trees, run the CLI, re-seal
tampered datasets, look at processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from shardpack import format as fmt
from shardpack.cli.main import main

ROOT = Path(__file__).resolve().parents[1]


def fake_jpeg(size: int, seed: int | None = None) -> bytes:
    """Exactly ``size`` bytes (at least 32) that pass the packer's quick image check: the
    markers of a 1x1 JPEG around random comment bytes.  For tests about packing mechanics,
    where a .jpg field's bytes only need to survive intact (not decode)."""
    import random

    head = b"\xff\xd8" + b"\xff\xc0\x00\x0b\x08\x00\x01\x00\x01\x01\x01\x11\x00"
    tail = b"\xff\xda\x00\x08\x01\x01\x00\x00\x3f\x00" + b"\x00\xff\xd9"
    room = size - len(head) - len(tail)
    if room < 4:
        raise ValueError(f"fake_jpeg needs at least {len(head) + len(tail) + 4} bytes")
    rnd = random.Random(seed)
    parts = [head]
    while room:
        take = min(room, 65535 + 2)
        if room - take and room - take < 4:  # leave no remainder too small for a segment
            take -= 4
        body = rnd.randbytes(take - 4) if seed is not None else os.urandom(take - 4)
        parts.append(b"\xff\xfe" + (take - 2).to_bytes(2, "big") + body)
        room -= take
    return b"".join(parts) + tail


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


# Run in the measured child: the shardpack CLI, then its own peak RSS (VmHWM) into a file
_PEAK_PROBE = """
import atexit, resource, runpy, sys
import shardpack.cli.main  # what the command imports first, before any limit
if sys.argv[2] != "-":  # address space: what the interpreter maps now, plus the headroom
    with open("/proc/self/status") as status:
        size = next(int(l.split()[1]) for l in status if l.startswith("VmSize:")) * 1024
    limit = size + int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
def _report(path=sys.argv[1]):
    with open("/proc/self/status") as status:
        peak = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    with open(path, "w") as f:
        f.write(peak)
atexit.register(_report)
sys.argv = ["shardpack"] + sys.argv[3:]
runpy.run_module("shardpack.cli", run_name="__main__", alter_sys=True)
"""


def peak_rss(*args, preexec_fn=None, headroom: int | None = None,
             timeout: float = 600) -> tuple[subprocess.CompletedProcess, int | None]:
    """``python -m shardpack.cli ARGS`` in a child process, and the child's own peak RSS in
    bytes (None if it died before reporting).  The peak is the child's VmHWM, read by the child
    at exit: a child's ``ru_maxrss`` starts at its parent's size (Linux carries the high-water
    mark of the forked image over exec), so measured from a test process grown by earlier
    tests it says more about the tests than about the command.

    Args:
        args: the command line after ``shardpack``.
        preexec_fn: run in the child before exec (a resource limit, say).
        headroom: bytes of address space the command may map beyond what the interpreter and
            the CLI's imports map (``RLIMIT_AS``, set once they are imported); None: no limit.
        timeout: seconds before the child is killed.
    """
    import tempfile

    with tempfile.NamedTemporaryFile("r", suffix=".peak") as report:
        limit = "-" if headroom is None else str(headroom)
        result = subprocess.run([sys.executable, "-c", _PEAK_PROBE, report.name, limit,
                                 *map(str, args)], capture_output=True, text=True,
                                timeout=timeout, preexec_fn=preexec_fn)
        found = report.read().strip()
    return result, int(found) * 1024 if found else None


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


def proc_files(name: str) -> dict[int, bytes]:
    """``/proc/<pid>/<name>`` of every process now (those that vanish while read are left
    out): for tests that find or kill processes a library started."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                out[int(entry)] = Path(f"/proc/{entry}/{name}").read_bytes()
            except OSError:
                continue
    return out
