"""Fast checks of scripts/make_images.py (the test-image generator)."""
import hashlib
import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest
from PIL import Image

TOOL = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "make_images.py"


def _load():
    spec = importlib.util.spec_from_file_location("make_images_tool", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


mi = _load()


def _tree(root):
    """{relative path: sha256} of every file under root."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(pathlib.Path(root).rglob("*")) if p.is_file()}


def test_layout_sizes_and_determinism(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    r = mi.make_images(str(a), 30, classes=4, seed=3, workers=1)
    assert r["count"] == 30 and r["classes"] == 4
    classes = sorted(p.name for p in a.iterdir())
    assert len(classes) == 4 and classes[0].startswith("n0")
    files = sorted(a.rglob("*.jpg"))
    assert len(files) == 30 and r["bytes"] == sum(f.stat().st_size for f in files)
    # round-robin: image i lives in class i % 4, names are zero padded global indices
    assert (a / classes[1] / "000005.jpg").is_file()
    assert [len(list((a / c).iterdir())) for c in classes] == [8, 8, 7, 7]
    for f in files:
        with Image.open(f) as im:
            im.load()  # decodes fully
            assert im.format == "JPEG" and im.mode == "RGB"
            assert 280 <= min(im.size) and max(im.size) <= 640
    assert 40_000 < r["bytes"] / 30 < 200_000  # ~100 KB on average
    # same arguments, different worker count -> byte-identical tree
    mi.make_images(str(b), 30, classes=4, seed=3, workers=2)
    assert _tree(a) == _tree(b)
    # another seed -> different images
    mi.make_images(str(b), 30, classes=4, seed=4, workers=2, overwrite=True)
    assert _tree(a).keys() == _tree(b).keys() and _tree(a) != _tree(b)


def test_tiny(tmp_path):
    r = mi.make_images(str(tmp_path / "t"), 50, classes=3, tiny=True, workers=2)
    files = sorted((tmp_path / "t").rglob("*.jpg"))
    assert len(files) == 50 and len({p.parent.name for p in files}) == 3
    assert 700 < r["bytes"] / 50 < 1400
    with Image.open(files[0]) as im:
        im.load()
        assert im.size == (32, 32)


def test_cli_refuses_non_empty_out(tmp_path):
    (tmp_path / "junk").mkdir()
    proc = subprocess.run([sys.executable, str(TOOL), str(tmp_path), "--count", "2"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "not empty" in proc.stderr
    with pytest.raises(FileExistsError):
        mi.make_images(str(tmp_path), 2)
    assert os.listdir(tmp_path) == ["junk"]
