"""``shardpack convert --from mds|litdata`` on datasets written by the peers' own writers
(MosaicML streaming's MDSWriter, LitData's optimize).

The peers don't import in .venv (their torchvision breaks beside the CPU torch), so one
subprocess in .bench-venv (benchmarks/suites/setup_peers.sh) writes every input dataset plus
``expected.json``: per dataset and sample, what each column must become.  Without .bench-venv
these tests skip, unless SHARDPACK_REQUIRE_PEERS=1 (CI), where they fail.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from shardpack.interop.convert import convert, detect_format
from shardpack.core.errors import SourceError
from shardpack.read.reader import open_reader
from shardpack.interop.sources.litdata import LitDataSource
from shardpack.interop.sources.mds import MDSSource


ROOT = Path(__file__).resolve().parents[2]
PEER_PY = ROOT / ".bench-venv" / "bin" / "python"
N = 7  # samples per dataset

# column -> field name, the naming rule under test
MDS_FIELDS = {"image": "image.jpg", "mask": "mask.png", "raw": "raw", "caption": "caption.txt",
              "cls": "cls", "meta": "meta.json", "score": "score", "small": "small",
              "vec": "vec.npy", "grid": "grid.npy", "big": "big", "pix": "pix.png",
              "seg.png": "seg.png"}
LD_FIELDS = {"image": "image.jpg", "mask": "mask.png", "raw": "raw", "caption": "caption.txt",
             "cls": "cls", "score": "score", "flag": "flag", "grid": "grid.npy",
             "vec": "vec.npy", "t": "t.npy", "tv": "tv.npy", "tags": "tags.json",
             "rows": "rows.json", "mixed": "mixed.json", "nums": "nums.json", "pix": "pix.png"}
CARRIED = {"image", "mask", "raw", "caption", "meta", "big", "seg.png"}  # MDS: byte ranges

GENERATOR = r'''
import importlib.util, io, json, os, pickle, sys, types
from fractions import Fraction
import numpy as np
import torch
from PIL import Image as PILImage

spec = importlib.util.find_spec("streaming")  # skip streaming/__init__ (it imports torchvision)
pkg = types.ModuleType("streaming"); pkg.__path__ = list(spec.submodule_search_locations)
sys.modules["streaming"] = pkg
from streaming.base import MDSWriter
from streaming.base.format.mds.encodings import mds_encode
from litdata import optimize
from litdata.types import Image as LDImage

OUT, N = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
FILES = os.path.join(OUT, "files"); os.makedirs(FILES)

def hexed(b): return {"hex": bytes(b).hex()}
def text(s): return {"hex": s.encode().hex()}
def npy(a): return {"npy": {"dtype": a.dtype.str, "shape": list(a.shape), "hex": a.tobytes().hex()}}
def png(img): return {"png": {"mode": img.mode, "size": list(img.size), "hex": img.tobytes().hex()}}
def encoded(img, fmt, path):
    img.save(path, fmt); return open(path, "rb").read()

images = []
for i in range(N):
    noise = PILImage.frombytes("RGB", (9 + i, 7),
                               rng.integers(0, 256, 3 * 7 * (9 + i), dtype=np.uint8).tobytes())
    jpg = os.path.join(FILES, f"{i}.jpg"); pngf = os.path.join(FILES, f"{i}.png")
    pix = PILImage.frombytes("RGB", (3, 2), rng.integers(0, 256, 18, dtype=np.uint8).tobytes())
    images.append((jpg, encoded(noise, "JPEG", jpg), pngf, encoded(noise.convert("L"), "PNG", pngf),
                   pix))
expected = {}

# -- MDS --------------------------------------------------------------------------------------
columns = {"image": "jpeg", "mask": "png", "raw": "bytes", "caption": "str", "cls": "int",
           "meta": "json", "score": "float32", "small": "uint8", "vec": "ndarray",
           "grid": "ndarray:int16:2,3", "big": "str_int", "pix": "pil", "seg.png": "bytes"}

def mds_sample(i):
    jpg, jpg_bytes, _, png_bytes, pix = images[i]
    # bytes or PIL
    image = jpg_bytes if i % 2 else PILImage.open(io.BytesIO(jpg_bytes)).convert("RGB")
    return {"image": image, "mask": png_bytes, "raw": bytes(range(i, i + 5)) + b"\0\xff",
            "caption": f"caption {i} \u00e9\u4e2d", "cls": i % 3 - (i == 5) * 10,
            "meta": {"i": i, "tags": ["a", "b"][: i % 2 + 1]}, "score": np.float32(i * 0.25),
            "small": np.uint8(i * 37 % 256), "vec": np.arange(i + 1, dtype=np.float32) * 0.5,
            "grid": (np.arange(6, dtype=np.int16) - 3 * i).reshape(2, 3), "big": 10 ** 12 + i,
            "pix": pix, "seg.png": png_bytes}

def mds_expected(i, s):
    return {"image": hexed(mds_encode("jpeg", s["image"])), "mask": hexed(s["mask"]),
            "raw": hexed(s["raw"]), "caption": text(s["caption"]), "cls": text(str(s["cls"])),
            "meta": {"json": s["meta"]},
            "score": text(repr(i * 0.25)), "small": text(str(i * 37 % 256)), "vec": npy(s["vec"]),
            "grid": npy(s["grid"]), "big": text(str(10 ** 12 + i)), "pix": png(s["pix"]),
            "seg.png": hexed(s["seg.png"])}

for name, compression in (("mds_plain", None), ("mds_zstd", "zstd"), ("mds_gz", "gz:5")):
    samples = [mds_sample(i) for i in range(N)]
    with MDSWriter(out=os.path.join(OUT, name), columns=columns, compression=compression,
                   hashes=["sha1"], size_limit=1 << 12) as w:
        for s in samples:
            w.write(s)
    expected[name] = [mds_expected(i, s) for i, s in enumerate(samples)]
with MDSWriter(out=os.path.join(OUT, "mds_pkl"), columns={"obj": "pkl", "cls": "int"}) as w:
    objs = [Fraction(i, 7) for i in range(N)]
    for i, obj in enumerate(objs):
        w.write({"obj": obj, "cls": i})
expected["mds_pkl"] = [{"obj": hexed(mds_encode("pkl", o)), "cls": text(str(i))}
                       for i, o in enumerate(objs)]

# -- LitData ----------------------------------------------------------------------------------
def ld_sample(i):
    jpg, _, pngf, _, pix = images[i]
    return {"image": PILImage.open(jpg), "mask": LDImage(path=pngf),
            "raw": bytes(range(i, i + 5)) + b"\0\xff", "caption": f"caption {i} \u00e9\u4e2d",
            "cls": i % 3 - (i == 5) * 10, "score": i * 0.1,
            "flag": i % 2 == 0, "grid": (np.arange(6, dtype=np.int16) - 3 * i).reshape(2, 3),
            "vec": np.arange(i + 1, dtype=np.float32) * 0.5,
            "t": torch.arange(6, dtype=torch.float32).reshape(3, 2) * i,
            "tv": torch.arange(i + 2, dtype=torch.int64) - 1, "tags": ["a", "b", "c"][: i % 3 + 1],
            "rows": [{"a": i, "b": "x\u00e9", "c": None, "d": 1.5, "e": True},
                     {"a": -i, "b": "", "c": None, "d": 0.1, "e": False}],
            "mixed": [i, "s", None, [1.5, {"k": "v"}]], "nums": [i, 2 ** 40, -3],
            "pix": pix}

def ld_expected(i):
    jpg, jpg_bytes, _, png_bytes, pix = images[i]
    s = ld_sample(i)
    return {"image": hexed(jpg_bytes), "mask": hexed(png_bytes), "raw": hexed(s["raw"]),
            "caption": text(s["caption"]), "cls": text(str(s["cls"])), "score": text(repr(i * 0.1)),
            "flag": text("1" if i % 2 == 0 else "0"), "grid": npy(s["grid"]), "vec": npy(s["vec"]),
            "t": npy(s["t"].numpy()), "tv": npy(s["tv"].numpy()), "tags": {"json": s["tags"]},
            "rows": {"json": s["rows"]}, "mixed": {"json": s["mixed"]}, "nums": {"json": s["nums"]},
            "pix": png(pix)}

def ld_tuple(i):
    return (bytes([i]) * 3, Fraction(i, 3))

for name, options in (("ld_plain", {}),
                      ("ld_batch", {"compression": "zstd", "compression_batch_size": 2}),
                      ("ld_chunk", {"compression": "zstd", "compression_level": "chunk"}),
                      ("ld_sample", {"compression": "zstd", "compression_level": "sample"})):
    optimize(fn=ld_sample, inputs=list(range(N)), output_dir=os.path.join(OUT, name), chunk_size=3,
             num_workers=1, start_method="fork", verbose=False, **options)
    expected[name] = [ld_expected(i) for i in range(N)]
optimize(fn=ld_tuple, inputs=list(range(N)), output_dir=os.path.join(OUT, "ld_pkl"), chunk_size=3,
         num_workers=1, start_method="fork", verbose=False)
expected["ld_pkl"] = [{"0": hexed(ld_tuple(i)[0]), "1": hexed(pickle.dumps(ld_tuple(i)[1]))}
                      for i in range(N)]
with open(os.path.join(OUT, "expected.json"), "w") as f:
    json.dump(expected, f)
'''


@pytest.fixture(scope="module")
def peers(tmp_path_factory):
    """(folder of peer-written datasets, expected values), made in one .bench-venv run."""
    if not PEER_PY.exists():
        why = f"{PEER_PY} is missing: run benchmarks/suites/setup_peers.sh"
        if os.environ.get("SHARDPACK_REQUIRE_PEERS") == "1":
            pytest.fail(f"SHARDPACK_REQUIRE_PEERS=1 but {why}")
        pytest.skip(why)
    out = tmp_path_factory.mktemp("peers")
    script = out / "make_inputs.py"
    script.write_text(GENERATOR)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    result = subprocess.run([str(PEER_PY), str(script), str(out), str(N)], capture_output=True,
                            text=True, timeout=600, env=env, cwd=out)
    if result.returncode:
        pytest.fail(f"the peers' writers failed:\n{result.stderr[-4000:]}")
    return out, json.loads((out / "expected.json").read_text())


def check_dataset(out: Path, expected: list[dict], names: dict[str, str]) -> None:
    """Every sample of ``out`` holds exactly the expected fields, values and keys, in order."""
    reader = open_reader(out)
    assert len(reader) == len(expected)
    for i, want in enumerate(expected):
        sample = reader.read_sample(i)
        assert sample.pop("__key__") == f"{i:010d}"
        assert sorted(sample) == sorted(names[c] for c in want), i
        for column, spec in want.items():
            got = bytes(sample[names[column]])
            where = f"sample {i} column {column!r}"
            if "hex" in spec:
                assert got == bytes.fromhex(spec["hex"]), where
            elif "json" in spec:
                assert json.loads(got) == spec["json"], where
            elif "npy" in spec:
                array = np.load(io.BytesIO(got), allow_pickle=False)
                assert array.dtype == np.dtype(spec["npy"]["dtype"]), where
                assert list(array.shape) == spec["npy"]["shape"], where
                assert array.tobytes() == bytes.fromhex(spec["npy"]["hex"]), where
            else:
                from PIL import Image

                image = Image.open(io.BytesIO(got))
                assert image.format == "PNG", where
                assert (image.mode, list(image.size)) == (spec["png"]["mode"],
                                                          spec["png"]["size"]), where
                assert image.tobytes() == bytes.fromhex(spec["png"]["hex"]), where


@pytest.mark.parametrize("name", ["mds_plain", "mds_zstd", "mds_gz"])
@pytest.mark.parametrize("workers", [1, 2])
def test_mds(peers, tmp_path, name, workers):
    src, expected = peers
    out = tmp_path / "out"
    summary = convert(src / name, out, from_="mds" if workers == 1 else "auto", workers=workers,
                      shard_size="3KB")
    assert (src / name / "shard.00002.mds" if name == "mds_plain" else
            next((src / name).glob("shard.00002.mds.*"))).exists()  # several source shards
    assert (summary.samples, summary.converted_from) == (N, "mds")
    assert summary.shards > 1 and any("sha1" in n for n in summary.notes)
    check_dataset(out, expected[name], MDS_FIELDS)


@pytest.mark.parametrize("name", ["ld_plain", "ld_batch", "ld_chunk", "ld_sample"])
@pytest.mark.parametrize("workers", [1, 2])
def test_litdata(peers, tmp_path, name, workers):
    src, expected = peers
    out = tmp_path / "out"
    convert(src / name, out, from_="litdata" if workers == 1 else "auto", workers=workers)
    check_dataset(out, expected[name], LD_FIELDS)


def test_layouts_written_by_the_peers(peers):
    """The inputs really use the layouts the tests mean to cover."""
    src, _ = peers
    names = sorted(p.name for p in (src / "mds_zstd").iterdir())
    assert "shard.00000.mds.zstd" in names and not any(n.endswith(".mds") for n in names)
    assert (src / "ld_batch" / "chunk-0-0.bin").read_bytes()[:6] == b"LDFZ01"
    assert (src / "ld_chunk" / "chunk-0-0.zstd.bin").exists()
    config = json.loads((src / "ld_sample" / "index.json").read_text())["config"]
    assert config["compression_level"] == "sample"
    assert "no_header_numpy:9" in config["data_format"] and "pil" in config["data_format"]


def test_detection(peers):
    src, _ = peers
    assert [detect_format(src / n) for n in ("mds_plain", "mds_zstd", "mds_pkl")] == ["mds"] * 3
    assert [detect_format(src / n) for n in ("ld_plain", "ld_chunk", "ld_pkl")] == \
        ["litdata"] * 3


def test_uncompressed_fields_are_byte_ranges(peers):
    """Carried columns of uncompressed shards are ranges of the shard file (the writer reads
    them in large windows); compressed shards' fields are inline; numbers are converted."""
    src, _ = peers
    plain = list(MDSSource(src / "mds_plain"))
    zstd = list(MDSSource(src / "mds_zstd"))
    by_name = {MDS_FIELDS[c]: c for c in MDS_FIELDS}
    for field in plain[3].fields:
        assert (field.offset is not None) == (by_name[field.name] in CARRIED), field.name
    assert all(f.offset is None and f.value is not None for s in zstd for f in s.fields)
    ld = {f.name: f for f in list(LitDataSource(src / "ld_plain"))[4].fields}
    assert ld["image.jpg"].offset is not None and ld["raw"].offset is not None
    assert ld["cls"].value == b"1" and ld["flag"].value == b"1"
    assert all(f.offset is None for f in list(LitDataSource(src / "ld_sample"))[4].fields)


@pytest.mark.parametrize("name,column", [("mds_pkl", "'obj' uses encoding 'pkl'"),
                                         ("ld_pkl", "'1' uses the 'pickle' serializer")])
def test_pickle_refused_without_flag(peers, tmp_path, name, column):
    src, expected = peers
    with pytest.raises(SourceError) as err:
        convert(src / name, tmp_path / "out", workers=1)
    message = str(err.value)
    assert column in message and "unpickling runs code" in message
    assert "--allow-pickle" in message and "\n" not in message
    assert not (tmp_path / "out").exists()  # refused before anything was written
    convert(src / name, tmp_path / "ok", workers=1, allow_pickle=True)
    names = {"obj": "obj.pkl", "cls": "cls"} if name == "mds_pkl" else {"0": "0", "1": "1.pkl"}
    check_dataset(tmp_path / "ok", expected[name], names)  # the pickled bytes, as they are


def _copy(peers, name, tmp_path) -> Path:
    dst = tmp_path / name
    shutil.copytree(peers[0] / name, dst)
    return dst


def test_truncated_mds_shard_is_named(peers, tmp_path):
    src = _copy(peers, "mds_plain", tmp_path)
    shard = src / "shard.00001.mds"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(SourceError, match=r"shard\.00001\.mds: shard file is \d+ bytes, "
                                          r"index\.json records \d+: truncated"):
        convert(src, tmp_path / "out", from_="mds", workers=1)


def test_corrupt_compressed_mds_shard_is_named(peers, tmp_path):
    src = _copy(peers, "mds_zstd", tmp_path)
    shard = src / "shard.00001.mds.zstd"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2:] = bytes(len(data) - len(data) // 2)  # same size, garbage body
    shard.write_bytes(bytes(data))
    with pytest.raises(SourceError, match=r"shard\.00001\.mds\.zstd: (cannot decompress|"
                                          r"decompresses to)"):
        convert(src, tmp_path / "out", from_="mds", workers=1)


def test_decompression_is_bounded_by_the_index(peers, tmp_path):
    src = _copy(peers, "mds_zstd", tmp_path)
    index = json.loads((src / "index.json").read_text())
    index["shards"][0]["raw_data"]["bytes"] -= 100
    (src / "index.json").write_text(json.dumps(index))
    # refused from the zstd frame header, before decompressing (a frame without a content
    # size: decompression stops one byte past the index's size,
    # tests/robustness/test_hostile_sources.py)
    with pytest.raises(SourceError, match=r"shard\.00000\.mds\.zstd: the index records \d+ "
                                          r"decompressed bytes, the zstd frame header says \d+"):
        convert(src, tmp_path / "out", from_="mds", workers=1)


def test_unknown_mds_encoding_and_version(peers, tmp_path):
    src = _copy(peers, "mds_plain", tmp_path)
    index = json.loads((src / "index.json").read_text())
    index["shards"][0]["column_encodings"][0] = "avif"
    (src / "index.json").write_text(json.dumps(index))
    with pytest.raises(SourceError, match=r"column 'big': unknown MDS encoding 'avif': expected "
                                          r"one of .*jpeg"):
        convert(src, tmp_path / "out", from_="mds", workers=1)
    index["version"] = 3
    (src / "index.json").write_text(json.dumps(index))
    with pytest.raises(SourceError, match="expected version 2 .* found version 3"):
        convert(src, tmp_path / "out", from_="mds", workers=1)


def test_truncated_and_corrupt_litdata_chunks_are_named(peers, tmp_path):
    src = _copy(peers, "ld_plain", tmp_path)
    chunk = src / "chunk-0-1.bin"
    chunk.write_bytes(chunk.read_bytes()[:-3])
    with pytest.raises(SourceError, match=r"chunk-0-1\.bin: chunk file is \d+ bytes, "
                                          r"index\.json records \d+"):
        convert(src, tmp_path / "out", from_="litdata", workers=1)
    src = _copy(peers, "ld_batch", tmp_path)
    chunk = src / "chunk-0-0.bin"
    data = bytearray(chunk.read_bytes())
    data[-20:] = bytes(20)
    chunk.write_bytes(bytes(data))
    with pytest.raises(SourceError, match=r"chunk-0-0\.bin frame \d+: (cannot decompress|"
                                          r"decompresses to)"):
        convert(src, tmp_path / "out2", from_="litdata", workers=1)


def test_unsupported_litdata_serializer(peers, tmp_path):
    src = _copy(peers, "ld_plain", tmp_path)
    index = json.loads((src / "index.json").read_text())
    index["config"]["data_format"][0] = "jpeg_array"
    (src / "index.json").write_text(json.dumps(index))
    with pytest.raises(SourceError, match=r"key 'image': unsupported LitData serializer "
                                          r"'jpeg_array': expected one of"):
        convert(src, tmp_path / "out", from_="litdata", workers=1)


@pytest.mark.parametrize("name,fields", [("mds_plain", MDS_FIELDS), ("ld_batch", LD_FIELDS)])
def test_remote_sources(peers, tmp_path, s3_server, http_server, name, fields):  # noqa: F811
    src, expected = peers
    bucket = s3_server.create_bucket()
    s3_server.upload_dir(src / name, bucket, name)
    convert(f"s3://{bucket}/{name}", tmp_path / "s3", workers=2,
            storage_options=s3_server.storage_options)
    check_dataset(tmp_path / "s3", expected[name], fields)
    # plain HTTP, no folder listings (nginx answers 403): index.json is enough
    server = http_server(src)
    convert(f"{server.url}/{name}", tmp_path / "http", workers=1)
    check_dataset(tmp_path / "http", expected[name], fields)


def test_litdata_decompression_is_bounded_by_the_index(peers, tmp_path):
    src = _copy(peers, "ld_chunk", tmp_path)
    index = json.loads((src / "index.json").read_text())
    index["chunks"][1]["chunk_bytes"] -= 50
    (src / "index.json").write_text(json.dumps(index))
    with pytest.raises(SourceError, match=r"chunk-0-1\.zstd\.bin: the index records \d+ "
                                          r"decompressed bytes, the zstd frame header says \d+"):
        convert(src, tmp_path / "out", from_="litdata", workers=1)


def test_bad_sample_is_named_or_skipped(peers, tmp_path):
    """A sample whose column sizes don't add up: an error naming shard and sample, or with
    skip_bad skipped and counted while the others convert."""
    src = _copy(peers, "mds_plain", tmp_path)
    shard = src / "shard.00000.mds"
    data = bytearray(shard.read_bytes())
    n = int.from_bytes(data[:4], "little")
    second = int.from_bytes(data[8:12], "little")  # offsets[1]: where sample 1 starts
    data[second] ^= 1  # the first variable column size of sample 1
    shard.write_bytes(bytes(data))
    with pytest.raises(SourceError, match=r"shard\.00000\.mds: sample 1: column sizes add up"):
        convert(src, tmp_path / "out", from_="mds", workers=1)
    summary = convert(src, tmp_path / "ok", from_="mds", workers=1, on_error="skip")
    assert summary.samples == N - 1 and summary.skipped == {"corrupt": 1}
    reader = open_reader(tmp_path / "ok")
    raws = [bytes(reader.read_sample(i)["raw"]) for i in range(N - 1)]
    wanted = peers[1]["mds_plain"]
    assert n >= 2 and raws == [bytes.fromhex(wanted[i]["raw"]["hex"]) for i in range(N) if i != 1]
