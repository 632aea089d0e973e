"""``shardpack preview`` (contact sheet, HTML page), ``info --stats`` (class histogram, field
sizes, image sizes from headers, imbalance warnings) and ``bench --plot``."""

from __future__ import annotations

import io
import json
import re
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import shardpack
from shardpack import format as fmt
from shardpack.core.errors import ShardpackError
from shardpack.inspect.preview import BORDER, PreviewOptions, layout, preview
from shardpack.read.reader import DatasetReader
from shardpack.inspect.stats import StatsOptions, dataset_stats

from testbed.helpers import fake_jpeg, make_tree, run_cli
from testbed.imagegen import ramp_photo as _photo

SIZES = [(160, 120), (120, 160), (200, 100), (90, 90), (150, 110)]
CLASSES = {"ant": 5, "bee": 3, "cow": 2}
BROKEN = "cow/broken"


def _photo_tree(root: Path) -> tuple[Path, dict]:
    files, sizes, seed = {}, {}, 0
    for name, count in CLASSES.items():
        for i in range(count):
            w, h = SIZES[seed % len(SIZES)]
            kind = "PNG" if seed % 4 == 3 else "JPEG"
            rel = f"{name}/{i:03d}.{'png' if kind == 'PNG' else 'jpg'}"
            files[rel] = _photo(seed, w, h, kind)
            sizes[rel.rsplit(".", 1)[0]] = (w, h)
            seed += 1
    files[BROKEN + ".jpg"] = fake_jpeg(3000, seed=1)  # passes no decode (packed with check none)
    return make_tree(root, files), sizes


@pytest.fixture(scope="module")
def photo_ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("preview")
    src, sizes = _photo_tree(root / "src")
    shardpack.pack(src, root / "ds", max_samples=4, check="none", workers=1)
    return root / "ds", sizes


def _cells(path: Path, opts: PreviewOptions, count: int):
    sheet = Image.open(path)
    sheet.load()
    lay = layout(count, opts)
    return sheet, lay, [np.asarray(sheet.crop(lay.box(i)), dtype=np.float64)
                        for i in range(count)]


def test_sheet_is_a_png_of_the_layout_with_drawn_images_and_a_marked_broken_cell(photo_ds,
                                                                                tmp_path):
    ds, sizes = photo_ds
    total = sum(CLASSES.values()) + 1
    opts = PreviewOptions(n=64, first=True, cell=64, columns=4)
    summary = preview(ds, tmp_path / "sheet.png", opts)
    assert summary.cells == total and summary.read == total and summary.marked == 1
    assert BROKEN in summary.reasons[0] and "cannot decode JPEG" in summary.reasons[0]
    sheet, lay, cells = _cells(tmp_path / "sheet.png", opts, total)
    assert sheet.format == "PNG" and sheet.size == lay.size == (4 * 68 + 4, lay.size[1])
    keys = [s["__key__"] for s in DatasetReader(ds)]  # stored order (--first)
    for key, pixels in zip(keys, cells, strict=True):
        if key == BROKEN:
            edge = pixels[lay.cell // 2, 1]  # the left border, half-way down
            assert tuple(edge) == (210, 30, 30), edge
            assert pixels[BORDER + 4:, BORDER + 4:].std() > 10  # the reason, in red text
        else:
            w, h = sizes[key]
            scale = lay.cell / max(w, h)
            tw, th = round(w * scale), round(h * scale)
            x, y = (lay.cell - tw) // 2, (lay.cell - th) // 2
            inner = pixels[y + 2:y + th - 2, x + 2:x + tw - 2]
            assert inner.std(axis=(0, 1)).max() > 20, key  # the decoded image, drawn


def test_html_page_holds_keys_labels_and_inline_images(photo_ds, tmp_path):
    ds, sizes = photo_ds
    out = tmp_path / "page.html"
    summary = preview(ds, out, PreviewOptions(n=64, html=True, seed=5))
    page = out.read_text()
    text = re.sub(r"<[^>]+>", "\n", page)  # the page's text, without tags
    lines = {line.strip() for line in text.splitlines()}
    for key in [*sizes, BROKEN]:
        assert key in lines, key
    for name in CLASSES:
        assert name in lines
    assert page.count('src="data:image/jpeg;base64,') == summary.cells - 1 == len(sizes)
    assert "http" not in page and "cannot decode JPEG" in page  # self-contained; the reason
    for match in re.findall(r'src="data:image/jpeg;base64,([^"]+)"', page)[:3]:
        import base64

        assert Image.open(io.BytesIO(base64.b64decode(match))).format == "JPEG"


def test_selection_seed_first_key_and_class(photo_ds, tmp_path):
    ds, _ = photo_ds
    reader = DatasetReader(ds)
    stored = [reader.index(s).key(r) for s in range(len(reader.shards))
              for r in range(reader.index(s).num_samples)]

    def keys(**kw):
        out = tmp_path / "p.html"
        preview(ds, out, PreviewOptions(html=True, **kw))
        return re.findall(r'<div class="key">([^<]+)</div>', out.read_text())

    assert keys(n=4, first=True) == stored[:4]
    a, b, c = keys(n=5, seed=1), keys(n=5, seed=1), keys(n=5, seed=2)
    assert a == b and a != c and len(set(a)) == 5
    assert sorted(keys(n=64, key_prefix="bee/")) == [k for k in stored if k.startswith("bee/")]
    assert set(keys(n=64, class_name="cow")) == {"cow/000", "cow/001", BROKEN}
    assert keys(n=64, class_name="ant", key_prefix="ant/00", first=True) == \
        [k for k in stored if k.startswith("ant/00")]
    with pytest.raises(ShardpackError, match="no such class"):
        preview(ds, tmp_path / "x.png", PreviewOptions(class_name="dog"))
    with pytest.raises(ShardpackError, match="no sample matches --key 'zzz'"):
        preview(ds, tmp_path / "x.png", PreviewOptions(key_prefix="zzz"))


@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_labels_inside_samples_select_and_count(tmp_path, compression):
    """A WebDataset-style tree: labels come from .cls sidecars, no class list; --class matches
    the label value, read from the samples; the histogram reads them too.  Uncompressed, the
    labels are read alone (a few bytes each) and only the chosen samples whole."""
    files = {}
    for i in range(12):
        files[f"{i:04d}.jpg"] = _photo(i, 64, 48)
        files[f"{i:04d}.cls"] = str(i % 3 if i != 11 else 7).encode()
    files["0012.jpg"] = _photo(12, 64, 48)  # no label at all
    src = make_tree(tmp_path / "src", files)
    ds = tmp_path / "ds"
    shardpack.pack(src, ds, max_samples=5, workers=1, shard_format="msgpack",
                   compression=compression)
    out = tmp_path / "p.html"
    summary = preview(ds, out, PreviewOptions(html=True, class_name="1"))
    if compression == "none":
        reader = DatasetReader(ds)
        whole = sum(b - a for s in range(len(reader.shards))
                    for a, b in map(reader.index(s).span, range(reader.index(s).num_samples)))
        assert summary.nbytes < 0.45 * whole, (summary.nbytes, whole)  # 4 of 13 samples
    got = re.findall(r'<div class="key">([^<]+)</div>', out.read_text())
    assert sorted(got) == ["0001", "0004", "0007", "0010"]
    assert set(re.findall(r'<div class="label">([^<]+)</div>', out.read_text())) == {"1"}
    result = run_cli("preview", ds, "--class", "7", "--out", tmp_path / "seven.png")
    assert "note: only 1 samples of class '7' in the dataset" in result.output
    with pytest.raises(ShardpackError, match="no sample of class '9' in the dataset"):
        preview(ds, tmp_path / "x.png", PreviewOptions(class_name="9"))
    stats = dataset_stats(DatasetReader(ds), StatsOptions(sample=100))
    cc = stats.classes
    assert cc.source == ("labels" if compression == "zstd" else "label-spans")
    assert not cc.sampled and cc.outside == {"(no label)": 1}
    assert dict(zip(cc.names, cc.counts, strict=True)) == {"0": 4, "1": 4, "2": 3, "7": 1}
    assert stats.images.checked == (compression == "zstd")  # headers alone: not checked
    assert sorted(set(stats.images.sizes)) == [(64, 48)]
    sampled = dataset_stats(DatasetReader(ds), StatsOptions(sample=5)).classes
    assert sampled.sampled and sampled.read == 5 and sum(sampled.counts) + 1 >= 5


def test_histogram_sizes_and_headers_match_the_dataset(photo_ds):
    ds, sizes = photo_ds
    reader = DatasetReader(ds)
    stats = dataset_stats(reader, StatsOptions(sample=1000))
    m = reader.manifest
    cc = stats.classes
    assert cc.source == "keys" and cc.names == list(m.classes) == sorted(CLASSES)
    labels = Counter(m.classes[int(s["cls"])] for s in DatasetReader(ds))  # every sample read
    counted = dict(zip(cc.names, cc.counts, strict=True))
    assert counted == dict(labels) == {"ant": 5, "bee": 3, "cow": 3}
    assert sum(cc.counts) == m.num_samples and not cc.sampled
    samples = list(DatasetReader(ds))
    image_sizes = [len(s.get("jpg") or s.get("png")) for s in samples]
    jpg = next(f for f in stats.fields if f.field == "jpg")
    want = [len(s["jpg"]) for s in samples if "jpg" in s]
    assert jpg.samples == len(want) and jpg.total == sum(want)
    assert jpg.points["min"] == min(want) and jpg.points["max"] == max(want)
    assert jpg.points["p50"] == int(np.percentile(want, 50, method="nearest"))
    assert sum(f.total for f in stats.fields if f.field in ("jpg", "png")) == sum(image_sizes)
    im = stats.images
    assert not im.checked and im.read == len(samples)
    # headers only: the broken JPEG's header is whole (a 1x1 frame), its data is not
    assert Counter(im.sizes) == Counter([*sizes.values(), (1, 1)]) and not im.unreadable
    assert im.formats == Counter({"JPEG": 9, "PNG": 2})


def test_imbalance_warnings(tmp_path):
    files = {f"big{c}/{i:03d}.jpg": fake_jpeg(40, seed=i) for c in (0, 1) for i in range(150)}
    files["rare/000.jpg"] = fake_jpeg(40, seed=7)
    src = make_tree(tmp_path / "src", files)
    (src / "zempty").mkdir()
    shardpack.pack(src, tmp_path / "ds", workers=1, allow_empty_classes=True)
    result = run_cli("info", tmp_path / "ds", "--stats")
    out = result.output
    assert "1 of 4 classes have no samples: 'zempty'" in out
    assert "1 classes have under 1% of the median class's 150 samples: 'rare' (1)" in out
    assert re.search(r"  big0 +150  #{40}\n", out) and re.search(r"  rare +1  #?\n", out)
    data = json.loads(run_cli("info", tmp_path / "ds", "--stats", "--json").output)["stats"]
    assert data["classes"]["counts"] == [150, 150, 1, 0] and len(data["warnings"]) == 2


def test_corrupt_sample_is_a_marked_cell_naming_the_hash(photo_ds, tmp_path):
    import shutil

    ds = tmp_path / "ds"
    shutil.copytree(photo_ds[0], ds)
    reader = DatasetReader(ds)
    index = reader.index(0)
    start, end = index.span(1)
    shard = ds / reader.shards[0].name
    data = bytearray(shard.read_bytes())
    data[end - 600] ^= 0xFF  # inside the image, so only the sample hash can tell
    shard.write_bytes(bytes(data))
    summary = preview(ds, tmp_path / "s.png", PreviewOptions(n=3, first=True))
    assert summary.marked == 1 and index.key(1) in summary.reasons[0]
    assert "do not match the index hash" in summary.reasons[0]


def test_remote_preview_reads_only_the_samples_it_shows(photo_ds, http_server, tmp_path):
    ds, _ = photo_ds
    server = http_server(ds)
    reader = DatasetReader(ds)
    summary = preview(server.url, tmp_path / "r.png", PreviewOptions(n=3, seed=4))
    assert summary.cells == 3
    shard_names = {s.name for s in reader.shards}
    shard_bytes = sum(s.bytes for s in reader.shards)
    shard_requests = [r for r in server.requests() if r["path"].lstrip("/") in shard_names]
    assert len(shard_requests) == 3 and all(r["range"] for r in shard_requests)
    served = sum(r["bytes"] for r in shard_requests)
    assert served == summary.nbytes < shard_bytes / 3
    result = run_cli("info", server.url, "--stats", "--sample", "4")
    assert "a random 4 of 11 samples (a sample)" in result.output
    heads = server.requests()[-4:]  # after the manifest and the indexes
    assert all(r["range"] and r["bytes"] <= 16 << 10 for r in heads)


def test_cli_preview_info_plot_and_bench_plot(photo_ds, tmp_path):
    ds, _ = photo_ds
    result = run_cli("preview", ds, "--out", tmp_path / "s.png", "--n", "4", "--cell", "48")
    assert "wrote" in result.output and Image.open(tmp_path / "s.png").format == "PNG"
    result = run_cli("info", ds, "--plot", tmp_path / "hist.png")
    assert "histogram 3 classes" in result.output
    assert Image.open(tmp_path / "hist.png").size[0] >= 600
    result = run_cli("bench", ds, "--workers", "0", "--batch-size", "4", "--step-ms", "1",
                     "--plot", tmp_path / "bench.png", "-q")
    assert "wait/step" in result.output and Image.open(tmp_path / "bench.png").format == "PNG"


def _one_line_error(result, *words):
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    for word in words:
        assert word in lines[0], result.output


def test_cli_errors_are_one_line(photo_ds, tmp_path, monkeypatch):
    ds, _ = photo_ds
    _one_line_error(run_cli("preview", tmp_path / "nothing", ok=None), "no shardpack dataset")
    _one_line_error(run_cli("preview", ds, "--class", "dog", ok=None), "no such class", "ant")
    _one_line_error(run_cli("preview", ds, "--out", tmp_path / "no" / "s.png", ok=None),
                    "cannot write", "No such file")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    for args in (["info", ds, "--stats", "--plot", tmp_path / "h.png"],
                 ["bench", ds, "--plot", tmp_path / "b.png"]):
        _one_line_error(run_cli(*args, ok=None), "needs matplotlib", "shardpack[plot]")
    assert not (tmp_path / "h.png").exists() and not (tmp_path / "b.png").exists()


def test_manifest_field_order_is_unchanged_by_stats(photo_ds):
    """--stats reads the indexes; the manifest's own lines stay as they were."""
    ds, _ = photo_ds
    plain = run_cli("info", ds).output
    assert run_cli("info", ds, "--stats").output.startswith(plain)
    assert json.loads((ds / fmt.MANIFEST_NAME).read_text())["classes"] == sorted(CLASSES)


def test_long_headers_unreadable_ones_and_the_image_field_rule(tmp_path, http_server):
    """A JPEG whose header runs past the first read is read again, further; a header nothing
    parses is named; of jpg + seg.png the jpg is drawn; jpg + png is a marked cell."""
    import os

    big = Image.open(io.BytesIO(_photo(1, 80, 60)))
    buf = io.BytesIO()
    big.save(buf, "JPEG", icc_profile=os.urandom(40_000))  # header > 16 KB (APP2 segments)
    files = {"a.jpg": buf.getvalue(), "b.jpg": _photo(2, 70, 50),
             "b.seg.png": _photo(3, 10, 10, "PNG"), "c.jpg": b"<html><body>gone</body></html>",
             "d.jpg": _photo(4, 30, 20), "d.png": _photo(5, 30, 20, "PNG")}
    src = make_tree(tmp_path / "src", files)
    shardpack.pack(src, tmp_path / "ds", check="none", workers=1)
    server = http_server(tmp_path / "ds")
    im = dataset_stats(DatasetReader(server.url), StatsOptions()).images
    assert sorted(im.sizes) == [(70, 50), (80, 60)] and im.fields == {"jpg": 2}
    assert im.unreadable == ["'c': not a JPEG image: content looks like HTML"]
    assert im.no_image == 1  # d: two image fields, none the obvious one
    shard = DatasetReader(tmp_path / "ds").shards[0].name
    reads = [r["bytes"] for r in server.requests(shard)]
    # a: 16 KB, then the rest of its header (near: read on from 16 KB, not again from 0)
    assert sorted(reads)[-2:] == sorted([16 << 10, len(files["a.jpg"]) - (16 << 10)])
    summary = preview(tmp_path / "ds", tmp_path / "p.png", PreviewOptions(first=True))
    assert [r.split(":")[0] for r in summary.reasons] == ["'c'", "'d'"]
    assert "choose with --field" in summary.reasons[1] and "HTML" in summary.reasons[0]
    summary = preview(tmp_path / "ds", tmp_path / "p.png", PreviewOptions(field="png"))
    assert summary.marked == 3 and any("no field 'png'" in r for r in summary.reasons)


def test_timeline_rates_and_waits():
    from shardpack.inspect.bench import Timeline

    line = Timeline()
    for i, wait in enumerate([0.5, 0.01, 0.03, 0.02]):
        line.add(1.0 + 0.5 * i, 10, wait)
    assert line.rates(1).tolist() == [10.0, 20.0, 20.0, 20.0]
    assert line.rates(2).tolist() == [10.0, 20.0 / 1.5, 20.0, 20.0]
    assert "p50 20.0 ms" in line.wait_line() and "(500 ms)" in line.wait_line()


def test_a_truncated_shard_is_one_line_not_a_traceback(tmp_path):
    src = make_tree(tmp_path / "src", {f"c{i % 2}/{i:02d}.jpg": _photo(i, 60, 40)
                                       for i in range(12)})
    shardpack.pack(src, tmp_path / "ds", workers=1)
    shard = sorted((tmp_path / "ds").glob("*.tar"))[0]
    shard.write_bytes(shard.read_bytes()[:2000])
    for args in (["preview", tmp_path / "ds", "--out", tmp_path / "s.png", "--first"],
                 ["info", tmp_path / "ds", "--stats"]):
        result = run_cli(*args, ok=None)
        assert result.exit_code == 2, result.output
        lines = [ln for ln in result.output.splitlines() if ln.startswith("shardpack: error")]
        assert len(lines) == 1 and "Traceback" not in result.output, result.output


def test_a_big_photo_is_shown_at_its_own_size_from_a_reduced_decode(tmp_path, monkeypatch):
    """A 1600x1200 JPEG is decoded at a DCT scale that still covers the cell (not in full),
    and the page shows the header's size, not the decoded one."""
    from shardpack.images import content as images
    from shardpack.inspect import preview as preview_mod

    src = make_tree(tmp_path / "src", {"cat/big.jpg": _photo(7, 1600, 1200, "JPEG")})
    shardpack.pack(src, tmp_path / "ds", workers=1)
    decoded = []
    real = images.decode_rgb

    def spy(data, min_side=0):
        decoded.append(real(data, min_side=min_side).shape)
        return real(data, min_side=min_side)

    monkeypatch.setattr(preview_mod, "decode_rgb", spy)
    out = tmp_path / "page.html"
    preview(tmp_path / "ds", out, PreviewOptions(html=True, cell=96))
    (h, w, _), = decoded
    assert 96 <= min(h, w) and h <= 300 and w <= 400  # 1/8 or 1/4 scale, not 1200x1600
    assert "1600x1200" in out.read_text()
