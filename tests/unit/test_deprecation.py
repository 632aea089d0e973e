"""The old spellings of the Python API still work, each with a DeprecationWarning that names the
new one; and the suite's own configuration makes such a warning an error when a test does not
ask for it (pyproject.toml, filterwarnings), so that no test, benchmark or script uses them."""

from __future__ import annotations

import json
import warnings

import pytest

import shardpack
from shardpack.inspect.preview import PreviewOptions, preview
from shardpack.inspect.verify import verify
from shardpack.interop.unpack import unpack


@pytest.fixture
def ds(small_tree, tmp_path):
    out = tmp_path / "ds"
    shardpack.pack(small_tree, out, workers=1)
    return out


def test_pack_format_and_skip_bad_still_work(small_tree, tmp_path):
    (small_tree / "cat" / "broken.jpg").write_bytes(b"")
    with pytest.warns(DeprecationWarning, match="format= is deprecated, use shard_format="):
        with pytest.warns(DeprecationWarning, match="skip_bad= is deprecated, use on_error="):
            summary = shardpack.pack(small_tree, tmp_path / "old", format="msgpack",
                                     skip_bad=True, workers=1)
    manifest = json.loads((tmp_path / "old" / "shardpack.json").read_text())
    assert manifest["shard_format"] == "msgpack" and sum(summary.skipped.values()) == 1
    with pytest.warns(DeprecationWarning, match="skip_bad= is deprecated, use on_error="):
        assert shardpack.PackOptions(skip_bad=True).on_error == "skip"
    with pytest.raises(TypeError, match="got both"):
        shardpack.pack(small_tree, tmp_path / "both", format="tar", shard_format="tar")


def test_url_keyword_still_names_the_dataset(ds, tmp_path):
    with pytest.warns(DeprecationWarning, match="url= is deprecated, use dataset="):
        assert len(shardpack.open_reader(url=str(ds)).shards) == 1
    with pytest.warns(DeprecationWarning, match="url= is deprecated, use dataset="):
        assert len(shardpack.DatasetReader(url=str(ds))) == 6
    with pytest.warns(DeprecationWarning, match="url= is deprecated, use dataset="):
        assert verify(url=str(ds)).ok
    with pytest.warns(DeprecationWarning, match="url= is deprecated, use dataset="):
        assert unpack(url=str(ds), out=tmp_path / "files") > 0


def test_storage_options_by_position_still_taken(ds, tmp_path):
    with pytest.warns(DeprecationWarning, match="storage_options passed by position"):
        assert len(shardpack.DatasetReader(str(ds), {})) == 6
    with pytest.warns(DeprecationWarning, match="storage_options passed by position"):
        assert len(shardpack.open_reader(str(ds), {}).shards) == 1
    with pytest.warns(DeprecationWarning, match="pass storage_options by keyword"):
        assert verify(str(ds), {}).ok
    with pytest.warns(DeprecationWarning, match="pass storage_options by keyword"):
        assert unpack(str(ds), tmp_path / "files", {}) > 0
    with pytest.warns(DeprecationWarning, match="pass storage_options by keyword"):
        preview(str(ds), tmp_path / "sheet.png", PreviewOptions(n=2), {})
    assert (tmp_path / "sheet.png").stat().st_size > 0


def test_an_old_spelling_not_asked_for_fails_the_suite(small_tree, tmp_path, pytestconfig):
    if pytestconfig.getoption("pythonwarnings"):
        pytest.skip("-W on the command line comes before pyproject.toml's filterwarnings")
    # pyproject.toml's filterwarnings, in force in every test: without it this only warns
    with pytest.raises(DeprecationWarning, match="format= is deprecated"):
        shardpack.pack(small_tree, tmp_path / "ds", format="tar", workers=1)
    assert not (tmp_path / "ds").exists()
    # the filter goes by the module the warning is attributed to: ours fail, a third-party
    # library's warning about its own internals is only recorded
    with pytest.raises(DeprecationWarning):
        warnings.warn_explicit("old", DeprecationWarning, "x.py", 1, module="tests.unit.x")
    with warnings.catch_warnings(record=True) as seen:
        warnings.warn_explicit("old", DeprecationWarning, "lib.py", 1, module="somelib.x")
    assert [str(w.message) for w in seen] == ["old"]
