"""``export --to webdataset`` then ``convert`` is an exact round trip, and what a ``webdataset``
user reads from the exported tars (docs/convert.md, "Export")."""

from __future__ import annotations

import io
import json
import tarfile
import urllib.parse
from pathlib import Path

import pytest
from PIL import Image

from shardpack import format as fmt
from shardpack.core.errors import SourceError
from shardpack.interop.convert import convert
from shardpack.interop.export import MARKER_NAME, export
from shardpack.read.reader import open_reader
from shardpack.write.pack import pack

from testbed.helpers import make_tree, run_cli

pytestmark = pytest.mark.timeout(120)

LONG = "x" * 90 + ".v2.final"  # a member name past 100 bytes: a pax header


def image(kind: str, color) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 6), color).save(buf, kind)
    return buf.getvalue()


@pytest.fixture
def dotted(tmp_path) -> Path:
    """An ImageFolder dataset (labels, class names) whose keys have dots and '%' in their last
    part, with upper-case extensions and JSON sidecars, over several shards."""
    files = {
        "cat/IMG_2019.01.05.JPEG": image("JPEG", "red"),
        "cat/IMG_2019.01.05.json": b'{"camera": "x"}',
        "cat/IMG_2019.01.06.PNG": image("PNG", "blue"),
        "cat/plain.jpg": image("JPEG", "green"),
        f"cat/{LONG}.png": image("PNG", "teal"),
        "dog/100%_crop.v2.png": image("PNG", "black"),
        "dog/50%2E.png": image("PNG", "olive"),  # a literal %2E in a key: stays one
        "dog/x.y.JPEG": image("JPEG", "white"),
        "dog/x.y.JSON": b"{}",
        "dog/été.1.png": image("PNG", "navy"),
    }
    make_tree(tmp_path / "src", files)
    out = tmp_path / "ds"
    pack(tmp_path / "src", out, layout="imagefolder", shard_size="2KB", workers=1)
    return out


def samples_of(dataset) -> list[dict]:
    return [dict(s) for s in open_reader(dataset)]


def test_round_trip_is_exact(dotted, tmp_path):
    expected = samples_of(dotted)
    keys = [s["__key__"] for s in expected]
    assert "cat/IMG_2019.01.05" in keys and "dog/100%_crop.v2" in keys
    assert {"JPEG", "PNG", "JSON", "json", "cls"} <= {f for s in expected for f in s}
    summary = export(dotted, tmp_path / "wds", to="webdataset", shard_size="3KB")
    assert summary.files > 1
    assert any("keys have '.' or '%'" in n for n in summary.notes)
    assert any("upper-case letters (JPEG, JSON, PNG)" in n for n in summary.notes)
    back = convert(tmp_path / "wds", tmp_path / "back", workers=1)
    got = samples_of(tmp_path / "back")
    assert got == expected  # same keys, field names, bytes and labels, in the same order
    assert back.samples == len(expected) == 8
    assert open_reader(tmp_path / "back").manifest.classes == ("cat", "dog")
    assert any("keys unescaped, class names restored" in n for n in back.notes)


def test_round_trip_of_one_exported_tar(dotted, tmp_path):
    """A single tar of the export as SRC: the marker beside it still applies."""
    export(dotted, tmp_path / "wds", to="webdataset", shard_size="3KB")
    run_cli("convert", tmp_path / "wds" / "shard-000000.tar", tmp_path / "back", "-q")
    got = samples_of(tmp_path / "back")
    with tarfile.open(tmp_path / "wds" / "shard-000000.tar") as tf:
        members = len(tf.getnames())
    assert got == samples_of(dotted)[:len(got)] and sum(len(s) - 1 for s in got) == members


def test_what_a_webdataset_user_gets(dotted, tmp_path):
    """webdataset 1.0: the key up to the first dot of the file name, the escaped last part
    percent-decodes to the key; field names lower-cased, decoded as images by their names."""
    import webdataset as wds

    expected = samples_of(dotted)
    export(dotted, tmp_path / "wds", to="webdataset", shard_size="3KB")
    urls = [str(p) for p in sorted((tmp_path / "wds").glob("*.tar"))]
    got = list(wds.WebDataset(urls, shardshuffle=False))
    assert len(got) == len(expected)  # one sample per key: no key was split at its dots
    for theirs, ours in zip(got, expected, strict=True):
        head, _, last = theirs["__key__"].rpartition("/")
        assert "." not in last
        assert f"{head}/{urllib.parse.unquote(last)}" == ours["__key__"]
        fields = {k: v for k, v in theirs.items() if not k.startswith("__")}
        assert fields == {k.lower(): v for k, v in ours.items() if k != "__key__"}
    assert [s["__key__"] for s in got if "IMG" in s["__key__"]] == [
        "cat/IMG_2019%2E01%2E05", "cat/IMG_2019%2E01%2E06"]
    decoded = list(wds.WebDataset(urls, shardshuffle=False).decode("pil"))
    first = next(s for s in decoded if s["__key__"] == "cat/IMG_2019%2E01%2E05")
    assert first["jpeg"].size == (8, 6) and first["json"] == {"camera": "x"}
    assert first["cls"] == 0


def test_fields_differing_only_in_case_get_a_note(tmp_path):
    make_tree(tmp_path / "src", {"a.jpg": image("JPEG", "red"), "a.JPG": image("JPEG", "blue")})
    pack(tmp_path / "src", tmp_path / "ds", layout="files", workers=1)
    summary = export(tmp_path / "ds", tmp_path / "wds", to="webdataset")
    assert any("1 samples hold fields whose names differ only in case" in n
               for n in summary.notes)
    convert(tmp_path / "wds", tmp_path / "back", workers=1)
    assert samples_of(tmp_path / "back") == samples_of(tmp_path / "ds")


def test_other_tars_keep_their_names(dotted, tmp_path):
    """Only the tars the marker lists are unescaped: another writer's tar beside them, or the
    same tars without the marker, are read as their names say."""
    wds_dir = tmp_path / "wds"
    export(dotted, wds_dir, to="webdataset")
    with tarfile.open(wds_dir / "zz-other.tar", "w") as tf:
        info = tarfile.TarInfo("other/a%2Eb.txt")
        info.size = 2
        tf.addfile(info, io.BytesIO(b"hi"))
    convert(wds_dir, tmp_path / "back", workers=1)
    keys = [s["__key__"] for s in samples_of(tmp_path / "back")]
    assert keys[-1] == "other/a%2Eb" and "cat/IMG_2019.01.05" in keys
    (wds_dir / MARKER_NAME).unlink()
    (wds_dir / "zz-other.tar").unlink()
    convert(wds_dir, tmp_path / "plain", workers=1)
    keys = [s["__key__"] for s in samples_of(tmp_path / "plain")]
    assert "cat/IMG_2019%2E01%2E05" in keys and "cat/IMG_2019.01.05" not in keys
    assert open_reader(tmp_path / "plain").manifest.classes is None


@pytest.mark.parametrize("marker", [b"not json", b'{"format": "shardpack-export", "to": '
                                                 b'"webdataset", "files": [1]}', b"[]"])
def test_a_damaged_marker_is_one_error(dotted, tmp_path, marker):
    export(dotted, tmp_path / "wds", to="webdataset")
    (tmp_path / "wds" / MARKER_NAME).write_bytes(marker)
    with pytest.raises(SourceError, match="not the marker shardpack export writes") as info:
        convert(tmp_path / "wds", tmp_path / "back", workers=1)
    assert MARKER_NAME in str(info.value) and "remove" in str(info.value)
    result = run_cli("convert", tmp_path / "wds", tmp_path / "back2", ok=False)
    assert result.exit_code != 0 and "Traceback" not in result.output


def test_escape_undone_exactly():
    """unescape_key_part inverts tar_member_name's escape of a key's last part, for any text."""
    import random

    rng = random.Random(7)
    alphabet = ".%2E5a/_é"
    for _ in range(2000):
        key = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 12))).strip("/")
        key = "/".join(p for p in key.split("/") if p) or "k"
        name = fmt.tar_member_name(key, "jpg")
        head, _, base = name.rpartition("/")
        stem = base.partition(".")[0]
        assert base == f"{stem}.jpg"  # the first dot of the file name ends the key
        assert (f"{head}/" if head else "") + fmt.unescape_key_part(stem) == key


def test_marker_records_what_convert_reads(dotted, tmp_path):
    export(dotted, tmp_path / "wds", to="webdataset", shard_size="3KB")
    marker = json.loads((tmp_path / "wds" / MARKER_NAME).read_text())
    assert marker["files"] == sorted(p.name for p in (tmp_path / "wds").glob("*.tar"))
    assert marker["classes"] == ["cat", "dog"] and marker["to"] == "webdataset"
