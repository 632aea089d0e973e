"""shardpack convert from WebDataset tar shards (written by the webdataset library itself and by
GNU tar), format detection, the CLI, remote sources, and resume after SIGKILL."""

import io
import json
import os
import random
import signal
import subprocess
import sys
import tarfile
import time

import pytest
import webdataset as wds

import shardpack
from shardpack import format as fmt
from shardpack.interop.convert import convert, detect_format
from shardpack.core.errors import SourceError
from shardpack.read.reader import DatasetReader

from testbed import imagegen
from testbed.helpers import dataset_files, fake_jpeg, make_tree, run_cli


def _samples(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"__key__": f"part{i % 3}/s{i:04d}",
             "jpg": fake_jpeg(rng.randint(32, 5000), seed=seed * 100_000 + i),
             "cls": str(i % 7).encode(), "json": json.dumps({"i": i}).encode()}
            for i in range(n)]


def _write_wds(folder, samples, pattern="shard-%06d.tar", maxcount=25) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(folder / pattern), maxcount=maxcount, verbose=0) as sink:
        for s in samples:
            sink.write(dict(s))


def _read(out) -> dict:
    return {s["__key__"]: s for s in DatasetReader(out)}


def _same(got: dict, samples: list[dict]) -> None:
    assert list(got) == [s["__key__"] for s in samples]  # order kept
    for s in samples:
        assert {k: v if k == "__key__" else bytes(v) for k, v in got[s["__key__"]].items()} == s


@pytest.mark.parametrize("shard_format,compression,workers",
                         [("tar", "none", 1), ("tar", "none", 2), ("msgpack", "zstd", 2)])
def test_webdataset_writer_output_converts_identically(tmp_path, shard_format, compression,
                                                       workers):
    samples = _samples(120)
    _write_wds(tmp_path / "wds", samples)
    summary = convert(tmp_path / "wds", tmp_path / "out", shard_format=shard_format,
                      compression=compression, workers=workers, shard_size="100KB")
    assert summary.samples == 120 and summary.shards > 1
    _same(_read(tmp_path / "out"), samples)
    manifest = json.loads((tmp_path / "out" / fmt.MANIFEST_NAME).read_text())
    assert manifest["source"]["from"] == "webdataset" and manifest["layout"] == "webdataset"
    assert run_cli("verify", tmp_path / "out", "-q").exit_code == 0


def test_gzipped_shards_and_a_single_file(tmp_path):
    samples = _samples(40, seed=1)
    _write_wds(tmp_path / "wds", samples, pattern="shard-%06d.tar.gz", maxcount=15)
    assert len(list((tmp_path / "wds").glob("*.tar.gz"))) == 3
    convert(tmp_path / "wds", tmp_path / "out", workers=1)
    _same(_read(tmp_path / "out"), samples)
    # one shard given as a file: just its samples
    _write_wds(tmp_path / "one", samples[:10], maxcount=100)
    single = tmp_path / "one" / "shard-000000.tar"
    assert detect_format(single) == "webdataset"
    convert(single, tmp_path / "out1", workers=1)
    _same(_read(tmp_path / "out1"), samples[:10])


def test_gnu_tar_of_a_tree_with_directories_long_names_and_hidden(tmp_path):
    long = "d" * 120
    files = {f"a/{i}.jpg": fake_jpeg(100 + i) for i in range(5)}
    files[f"{long}/x.png"] = imagegen.ALL_VALID["png_rgb"][0]
    files["a/.DS_Store"] = b"junk"
    make_tree(tmp_path / "tree", files)
    (tmp_path / "wds").mkdir()
    subprocess.run(["tar", "-cf", str(tmp_path / "wds" / "all.tar"), "--format=gnu", "-C",
                    str(tmp_path / "tree"), "."], check=True)
    summary = convert(tmp_path / "wds", tmp_path / "out", workers=1)
    got = _read(tmp_path / "out")
    assert got.keys() == {f"a/{i}" for i in range(5)} | {f"{long}/x"}
    assert all(got[f"a/{i}"]["jpg"] == files[f"a/{i}.jpg"] for i in range(5))
    assert got[f"{long}/x"]["png"] == files[f"{long}/x.png"]
    assert summary.hidden == 1
    assert any("directory entries" in n for n in summary.notes)
    manifest = json.loads((tmp_path / "out" / fmt.MANIFEST_NAME).read_text())
    assert manifest["source"]["notes"] == summary.notes


def _tar(path, members) -> None:
    """members: (name, bytes) or (name, tarfile.TarInfo type, linkname)."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for name, *rest in members:
            info = tarfile.TarInfo(name)
            if len(rest) == 1:
                info.size = len(rest[0])
                tf.addfile(info, io.BytesIO(rest[0]))
            else:
                info.type, info.linkname = rest
                tf.addfile(info)


def test_bad_sources_name_the_shard_and_member(tmp_path):
    (tmp_path / "dup").mkdir()
    _tar(tmp_path / "dup" / "a.tar", [("k1.jpg", b"1"), ("k2.jpg", b"2")])
    _tar(tmp_path / "dup" / "b.tar", [("k1.jpg", b"3")])
    with pytest.raises(SourceError, match=r"b\.tar: member 'k1\.jpg'.*duplicate sample key 'k1'"):
        convert(tmp_path / "dup", tmp_path / "o1", workers=1)
    assert not (tmp_path / "o1" / fmt.MANIFEST_NAME).exists()
    summary = convert(tmp_path / "dup", tmp_path / "o2", workers=1, on_error="skip", check="none")
    assert summary.samples == 2 and summary.skipped == {"duplicate": 1}

    (tmp_path / "link").mkdir()
    _tar(tmp_path / "link" / "a.tar", [("k1.jpg", b"1"), ("k2.jpg", tarfile.SYMTYPE, "/etc/x")])
    with pytest.raises(SourceError, match=r"member 'k2\.jpg'.*is a symlink, not a regular file"):
        convert(tmp_path / "link", tmp_path / "o3", workers=1)

    (tmp_path / "twice").mkdir()
    _tar(tmp_path / "twice" / "a.tar", [("k1.jpg", b"1"), ("k1.jpg", b"2")])
    with pytest.raises(SourceError, match=r"field twice"):
        convert(tmp_path / "twice", tmp_path / "o4", workers=1)

    (tmp_path / "unsafe").mkdir()
    _tar(tmp_path / "unsafe" / "a.tar", [("../evil.jpg", b"1")])
    with pytest.raises(SourceError, match=r"sample key '\.\./evil'"):
        convert(tmp_path / "unsafe", tmp_path / "o5", workers=1)

    (tmp_path / "trunc").mkdir()
    _tar(tmp_path / "trunc" / "a.tar", [(f"k{i}.jpg", fake_jpeg(5000)) for i in range(4)])
    data = (tmp_path / "trunc" / "a.tar").read_bytes()
    (tmp_path / "trunc" / "a.tar").write_bytes(data[:9000])
    with pytest.raises(SourceError, match=r"a\.tar.*(truncat|past the end)"):
        convert(tmp_path / "trunc", tmp_path / "o6", workers=1)
    assert not (tmp_path / "o6" / fmt.MANIFEST_NAME).exists()


def test_detection_and_cli(tmp_path):
    _write_wds(tmp_path / "wds", _samples(30))
    make_tree(tmp_path / "folders", {"cat/1.jpg": fake_jpeg(40), "dog/2.jpg": fake_jpeg(40)})
    assert detect_format(tmp_path / "wds") == "webdataset"
    assert detect_format(tmp_path / "folders") == "imagefolder"
    (tmp_path / "wds" / "x.parquet").write_bytes(b"PAR1")
    with pytest.raises(SourceError, match="both tar and parquet"):
        detect_format(tmp_path / "wds")
    (tmp_path / "wds" / "x.parquet").unlink()
    make_tree(tmp_path / "mixed", {"a.txt": b"x", "b/c.txt": b"y"})
    with pytest.raises(SourceError, match="cannot tell the source format.*pass --from"):
        detect_format(tmp_path / "mixed")

    out = run_cli("convert", tmp_path / "wds", tmp_path / "out", "-q").output
    assert "converted 30 samples from webdataset" in out
    out = run_cli("convert", tmp_path / "folders", tmp_path / "out2", "-q").output
    assert "packed 2 samples" in out
    assert DatasetReader(tmp_path / "out2").manifest.classes == ("cat", "dog")
    bad = run_cli("convert", tmp_path / "mixed", tmp_path / "out3", ok=None)
    assert bad.exit_code == 2 and len(bad.output.strip().splitlines()) == 1
    assert "cannot tell the source format" in bad.output
    bad = run_cli("convert", tmp_path / "wds", tmp_path / "out", ok=None)  # out not empty
    assert bad.exit_code == 2 and "not empty" in bad.output
    assert "--allow-pickle" in run_cli("convert", "--help").output


def test_remote_sources_s3_and_http(tmp_path, s3_server, http_server):
    samples = _samples(50, seed=4)
    _write_wds(tmp_path / "wds", samples, maxcount=20)
    bucket = s3_server.create_bucket()
    s3_server.upload_dir(tmp_path / "wds", bucket, "wds")
    convert(f"s3://{bucket}/wds", tmp_path / "out", workers=2,
            storage_options=s3_server.storage_options)
    _same(_read(tmp_path / "out"), samples)
    server = http_server(tmp_path / "wds")
    convert(f"{server.url}/shard-000001.tar", tmp_path / "out2", workers=1)
    _same(_read(tmp_path / "out2"), samples[20:40])


def test_a_source_changed_after_indexing_is_refused(tmp_path, monkeypatch):
    from shardpack.interop.sources import webdataset as source_module

    samples = _samples(10)
    _write_wds(tmp_path / "wds", samples, maxcount=100)
    shard = tmp_path / "wds" / "shard-000000.tar"
    original = source_module.WebDatasetSource.samples

    def touching(self):
        for item in original(self):
            yield item
        os.utime(shard, ns=(time.time_ns(), time.time_ns() + 10**9))  # after the listing

    monkeypatch.setattr(source_module.WebDatasetSource, "samples", touching)
    with pytest.raises(SourceError, match="changed during the conversion"):
        convert(tmp_path / "wds", tmp_path / "out", workers=1)


def _convert_cmd(src, out, *extra):
    return [sys.executable, "-m", "shardpack.cli", "convert", str(src), str(out),
            "--shard-size", "400KB", "--workers", "2", "-q", *extra]


@pytest.mark.slow
def test_sigkill_mid_convert_then_resume_is_byte_identical(tmp_path):
    rng = random.Random(5)
    samples = [{"__key__": f"k{i:05d}", "jpg": fake_jpeg(rng.randint(20_000, 60_000), seed=i)}
               for i in range(700)]
    _write_wds(tmp_path / "wds", samples, maxcount=200)
    reference = tmp_path / "reference"
    convert(tmp_path / "wds", reference, shard_size="400KB", workers=2)
    out = tmp_path / "out"
    kills = 0
    for _ in range(4):
        extra = ("--resume",) if out.exists() else ()
        before = len(list(out.glob("*.idx"))) if out.exists() else 0
        proc = subprocess.Popen(_convert_cmd(tmp_path / "wds", out, *extra),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.time() + 60
        while time.time() < deadline and proc.poll() is None and \
                len(list(out.glob("*.idx"))) < before + rng.randint(2, 6):
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if (out / fmt.MANIFEST_NAME).exists():
            break
        kills += 1
        time.sleep(0.3)  # pool workers die with the parent (PR_SET_PDEATHSIG)
    assert kills >= 2, "the conversion was too fast to be interrupted: raise the data size"
    if not (out / fmt.MANIFEST_NAME).exists():
        done = subprocess.run(_convert_cmd(tmp_path / "wds", out, "--resume"),
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert "complete shards kept" in done.stdout
    assert dataset_files(out) == dataset_files(reference)
    # a resume from another source is refused, naming what differs
    out2 = tmp_path / "out2"
    proc = subprocess.Popen(_convert_cmd(tmp_path / "wds", out2), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None and not list(out2.glob("*.idx")):
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if not (out2 / fmt.MANIFEST_NAME).exists():
        other = tmp_path / "other"
        _write_wds(other, samples[:5])
        result = run_cli("convert", other, out2, "--resume", "-q", "--shard-size", "400KB",
                         ok=None)
        assert result.exit_code == 2 and "different source" in result.output


def test_python_api_is_exported():
    assert shardpack.convert is convert
    assert "convert" in shardpack.__all__ and "export" in shardpack.__all__
