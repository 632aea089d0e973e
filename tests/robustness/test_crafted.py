"""Crafted datasets, labels and resume states: whatever a dataset or a saved state holds, the
answer is one line naming what is wrong (docs/format.md, "Samples, keys and fields";
docs/reading.md, "Bad data while reading" and "Resume"), never a traceback, a hang or a silent
wrong key.

Datasets with keys and field names no pack writes are made here by writing the shard, its index
and the manifest directly (:func:`craft`), every hash consistent, so only the key and field-name
rules can catch them."""

import os
import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest

import shardpack
from shardpack import format as fmt
from shardpack.loader.batches import collate
from shardpack.core.errors import FormatError, ShardpackError

from testbed.crafted import craft
from testbed.helpers import make_tree, run_cli, run_subprocess


def _one_error(result, *needles) -> str:
    assert result.exit_code == 2, result.output
    errors = [ln for ln in result.output.splitlines() if ln.startswith("shardpack: error:")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


# -- keys: verify refuses what unpack and export refuse ---------------------------------------

BAD_KEYS = ["../up", "a/../../b", "/abs", "a//b", "", "dir/", "a/./b", ".", "a\x00b",
            "bad\udcffkey"]
GOOD_KEYS = ["ok", "a/b c/ü", "x\ny", "tab\there", "IMG_2019.01.05", "..hidden-dots..x"]


@pytest.mark.parametrize("shard_format", ["tar", "msgpack"])
def test_verify_refuses_every_key_unpack_or_export_refuses(tmp_path, shard_format):
    keys = BAD_KEYS + GOOD_KEYS
    if shard_format == "msgpack":  # a msgpack record's key is UTF-8 text by construction
        keys = [k for k in keys if k != "bad\udcffkey"]
    for n, key in enumerate(keys):
        case = tmp_path / f"case{n}"
        case.mkdir()
        ds = craft(case, [("good", [("bin", b"1")]), (key, [("bin", b"2")])], shard_format)
        refused = []
        for args in (("unpack", ds, case / "u"),
                     ("export", ds, case / "e", "--to", "webdataset"),
                     ("export", ds, case / "p", "--to", "parquet")):
            result = run_cli(*args, ok=None)
            assert "Traceback" not in result.output, (key, result.output)
            if result.exit_code:
                refused.append(_one_error(result, repr(key)))
        verified = run_cli("verify", ds, ok=None)
        problems = [ln for ln in verified.output.splitlines() if ln.startswith("BAD ")]
        why = fmt.unsafe_name_reason(key)
        if refused:  # the same rule as unpack and export: never passed by verify
            assert verified.exit_code == 1, (key, verified.output)
        assert (why is not None) == (key in BAD_KEYS), key
        if why:
            assert verified.exit_code == 1 and len(refused) == 3, (key, verified.output, refused)
            line = f"sample {key!r}: key cannot be written out by unpack or export: {why}"
            assert any(line in p for p in problems), (line, verified.output)
        else:
            assert verified.exit_code == 0 and not refused, (key, verified.output, refused)


def test_key_rule_names_each_case():
    assert fmt.unsafe_name_reason("../x") == "name has an empty, '.' or '..' component"
    assert fmt.unsafe_name_reason("a//b") == "name has an empty, '.' or '..' component"
    assert fmt.unsafe_name_reason("a/") == "name has an empty, '.' or '..' component"
    assert fmt.unsafe_name_reason("/a") == "absolute name"
    assert fmt.unsafe_name_reason("") == "empty name"
    assert fmt.unsafe_name_reason("a\x00") == "name contains NUL"
    assert fmt.unsafe_name_reason(b"k\xff".decode("utf-8", "surrogateescape")) == \
        "name is not valid UTF-8"
    assert fmt.unsafe_name_reason("x\ny") is None  # a file name may hold one: pack keeps it
    assert fmt.unsafe_name_reason("ü/日本") is None


# -- field names: refused when packing and by verify ------------------------------------------

@pytest.mark.parametrize("field", ["__key__", "__index__", "__x__", "__", "a/b", "a\x00b"])
def test_reserved_field_name_in_an_index_is_one_line(tmp_path, field):
    """No pack writes these: verify names the index, and readers refuse it (a field __key__
    would replace every sample's key)."""
    ds = craft(tmp_path, [("k1", [("bin", b"1"), (field, b"2")])])
    verified = run_cli("verify", ds, ok=None)
    assert verified.exit_code == 1, verified.output
    bad = [ln for ln in verified.output.splitlines() if ln.startswith("BAD ")]
    assert len(bad) == 1 and "shard-00000.idx" in bad[0], verified.output
    assert f"index field name {field!r}" in bad[0], bad[0]
    with pytest.raises(FormatError, match=r"shard-00000\.idx: index field name"):
        shardpack.open_dataset(ds)[0]
    _one_error(run_cli("ls", ds, ok=None), "shard-00000.idx", "index field name")


@pytest.mark.parametrize("field", ["a..b", "..", "jpg..", "..json"])
def test_dotdot_field_name_is_refused_by_verify(tmp_path, field):
    """'..' in a field name: refused by pack (below) and verify; datasets packed before the rule
    still read."""
    ds = craft(tmp_path, [("k1", [("bin", b"1"), (field, b"2")])])
    verified = run_cli("verify", ds, ok=None)
    assert verified.exit_code == 1, verified.output
    bad = [ln for ln in verified.output.splitlines() if ln.startswith("BAD ")]
    assert bad == [f"BAD {ds / 'shard-00000.tar'}: field name {field!r} contains '..' (pack "
                   "would refuse it)"], verified.output
    assert shardpack.open_dataset(ds)[0][field] == b"2"


@pytest.mark.parametrize("name,field", [("1.__key__", "__key__"), ("1.__meta__", "__meta__"),
                                        ("1...jpg", "..jpg"), ("1.a..b", "a..b")])
def test_pack_refuses_the_field_names_verify_refuses(tmp_path, name, field):
    src = tmp_path / "src"
    src.mkdir()
    (src / "0.jpg").write_bytes(b"0")
    (src / name).write_bytes(b"1")
    result = run_cli("pack", src, tmp_path / "out", "--layout", "files", "--group",
                     "webdataset", ok=None)
    line = _one_error(result, str(src / name), repr(field))
    assert fmt.check_field_name(field) in line
    assert not (tmp_path / "out" / fmt.MANIFEST_NAME).exists()


@pytest.mark.parametrize("column", ["__key__", "__index__", "a..b", "x/y"])
def test_listing_column_with_a_refused_field_name(tmp_path, column):
    (tmp_path / "1.jpg").write_bytes(b"1")
    listing = tmp_path / "l.csv"
    listing.write_text(f"path,key,{column}\n1.jpg,k,5\n")
    _one_error(run_cli("pack", listing, tmp_path / "out", ok=None), "l.csv:2",
               fmt.check_field_name(column))


# -- ls: one key, one line ---------------------------------------------------------------------

LS_KEYS = {
    "plain/key": "plain/key",
    "x\ny": "$'x\\ny'",
    "cr\rtab\tbs\\q'": "$'cr\\rtab\\tbs\\\\q\\''",
    "esc\x1b[31mred": "$'esc\\x1b[31mred'",
    "del\x7f": "$'del\\x7f'",
    "c1\x85next": "$'c1\\u0085next'",
    "ls\u2028ps\u2029": "$'ls\\u2028ps\\u2029'",
    "raw\udcff\udcfe": "$'raw\\xff\\xfe'",
    "$'quoted'": "$'$\\'quoted\\''",
    "back\\slash": "back\\slash",  # printed as it is: only quoted forms start with $'
    "zwj\u200dü": "zwj\u200dü",
}


def test_ls_never_prints_a_key_over_two_lines(tmp_path):
    keys = list(LS_KEYS)
    ds = craft(tmp_path, [(k, [("bin", b"1"), ("x\ny", b"2")]) for k in keys])
    result = run_cli("ls", ds)
    assert result.output.split("\n")[:-1] == [LS_KEYS[k] for k in keys], result.output
    long = run_cli("ls", "--long", ds).output.split("\n")[:-1]
    assert len(long) == len(keys)
    for key, line in zip(keys, long, strict=True):
        assert line.split("\t") == [LS_KEYS[key], "shard-00000.tar", "bin:1 $'x\\ny':1"], line


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_ls_quoting_is_the_key_again_in_bash(tmp_path):
    """The $'...' form pasted into bash gives back the key's bytes, so `shardpack cat` finds it
    (a key printed as it is is the key itself)."""
    for key, shown in LS_KEYS.items():
        if not shown.startswith("$'"):
            continue
        out = subprocess.run(["bash", "-c", f"printf '%s' {shown}"], capture_output=True,
                             check=True, env={"LC_ALL": "C.UTF-8", "PATH": "/usr/bin:/bin"}
                             ).stdout
        assert out == key.encode("utf-8", "surrogateescape"), (key, shown, out)


# -- labels ------------------------------------------------------------------------------------

def _labelled(tmp_path, labels, shard_format="msgpack", compression="zstd") -> Path:
    """Samples s0, s1, ... with a .bin field and a ``cls`` field holding ``labels`` (bytes):
    a tree of sidecar files, which packs any bytes (a listing refuses a label training could
    not read)."""
    src = tmp_path / "src"
    src.mkdir()
    for i, label in enumerate(labels):
        (src / f"s{i}.bin").write_bytes(b"%d" % i)
        (src / f"s{i}.cls").write_bytes(label)
    out = tmp_path / "ds"
    shardpack.pack(src, out, shard_format=shard_format, compression=compression, workers=1)
    return out


HUGE = b"99999999999999999999"


@pytest.mark.parametrize("batched", [True, False])
def test_label_outside_int64_is_one_line_naming_shard_and_key(tmp_path, batched):
    ds = _labelled(tmp_path, [b"1", HUGE, b"3", b"-99999999999999999999"])
    kwargs = dict(batch_size=4, batched=True) if batched else {}
    dataset = shardpack.ShardDataset(ds, shuffle=False, **kwargs)
    with pytest.raises(FormatError) as caught:
        items = list(dataset)
        if not batched:
            collate(items)
    text = str(caught.value)
    assert "\n" not in text and "sample 's1'" in text and "b'99999999999999999999'" in text
    assert "outside int64" in text
    if batched:
        assert text.startswith(f"{ds / 'shard-00000.spk'}, sample 's1', offset "), text
    else:  # collate in this process: the sample and its place; a worker names the shard too
        assert "item 1 of the batch, sample 1 of the dataset" in text


def test_label_outside_int64_is_skipped_with_on_error_skip(tmp_path):
    ds = _labelled(tmp_path, [b"1", HUGE, b"3", b"4", b"-99999999999999999999", b"6"])
    dataset = shardpack.ShardDataset(ds, shuffle=False, batch_size=3, batched=True,
                                     on_error="skip")
    with pytest.warns(UserWarning, match=r"skipped a bad sample .*'s[14]'.*outside int64"):
        batches = list(dataset)
    assert [list(b["__key__"]) for b in batches] == [["s0", "s2"], ["s3", "s5"]]
    assert [b["cls"].tolist() for b in batches] == [[1, 3], [4, 6]]
    assert dataset.stats["skipped"] == 2


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_label_outside_int64_on_the_gather_path(tmp_path, on_error):
    """Uncompressed local shards: whole batches gathered from the mapped shard."""
    ds = _labelled(tmp_path, [b"1", HUGE, b"3", b"4"], shard_format="tar", compression="none")
    dataset = shardpack.ShardDataset(ds, shuffle=False, batch_size=4, batched=True,
                                     on_error=on_error)
    if on_error == "raise":
        with pytest.raises(FormatError, match=rf"^{ds / 'shard-00000.tar'}, sample 's1', offset "
                                              r"\d+: field 'cls' holds b'9+', a number outside "
                                              "int64"):
            list(dataset)
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = list(dataset)
    assert [b["cls"].tolist() for b in batches] == [[1, 3, 4]]
    assert len(caught) == 1 and "'s1'" in str(caught[0].message), caught


def test_labels_at_the_int64_bounds_are_kept(tmp_path):
    ds = _labelled(tmp_path, [b"9223372036854775807", b"-9223372036854775808"])
    batch = next(iter(shardpack.ShardDataset(ds, shuffle=False, batch_size=2, batched=True)))
    assert batch["cls"].tolist() == [2**63 - 1, -2**63]


# -- collate names the sample ------------------------------------------------------------------

def _sample(key, index, **fields):
    return {"__key__": key, **fields, "__index__": index, "__repeat__": False}


def test_collate_errors_name_the_sample():
    torch = pytest.importorskip("torch")
    cases = [
        ([_sample("a", 0, cls=b"1"), _sample("b", 7, cls=b"x")],
         r"sample 'b': field 'cls' holds b'x', not an integer label \(item 1 of the batch, "
         r"sample 7 of the dataset\)"),
        ([_sample("a", 0, cls=b"1"), _sample("b", 7, cls=HUGE)],
         r"sample 'b': field 'cls' holds b'9+', a number outside int64"),
        ([_sample("a", 0, cls=b"1"), _sample("b", 7, cls=10**12)],  # never bytes(10**12)
         r"sample 'b': field 'cls' holds 1000000000000, a value of type int, not the bytes"),
        ([_sample("a", 0, cls=b"1", jpg=b"j"), _sample("b", 3, jpg=b"k")],
         r"sample 'b': has no field 'cls', which other samples of the batch have"),
        ([_sample("a", 0, img=torch.zeros(3, 4)), _sample("b", 5, img=torch.zeros(3, 5))],
         r"sample 'b': field 'img' cannot be batched with the first sample's \(Tensor "
         r"torch.float32 \(3, 5\) and Tensor torch.float32 \(3, 4\)\).*\(item 1 of the batch"),
        ([_sample("a", 0, meta=1.5), _sample("b", 2)],
         r"sample 'b': has no field 'meta'"),
    ]
    for batch, pattern in cases:
        with pytest.raises(ShardpackError, match=pattern) as caught:
            collate(batch)
        assert "\n" not in str(caught.value)


def test_collate_in_a_worker_names_the_shard(tmp_path):
    torch = pytest.importorskip("torch")
    ds = _labelled(tmp_path, [b"1", b"2", HUGE, b"4"], shard_format="tar", compression="none")
    loader = torch.utils.data.DataLoader(shardpack.ShardDataset(ds, shuffle=False, batch_size=4),
                                         batch_size=4, num_workers=1, collate_fn=collate)
    with pytest.raises(FormatError) as caught:
        list(loader)
    text = str(caught.value)
    assert "\n" not in text and f"{ds / 'shard-00000.tar'}, sample 's2'" in text, text
    assert "outside int64" in text


# -- resume states that cannot belong to the dataset -------------------------------------------

def _states(base: dict) -> list:
    return [
        ({**base, "history": [[1, 0], [2, 0]] * 500_000}, "history has 1,000,000 resume steps"),
        ({**base, "history": [[1, -5]]}, "history step 0 says each of 1 ranks saw -5 samples"),
        ({**base, "history": [[1, 10**9]]}, "a rank's share holds 0 to 40"),
        ({**base, "history": [[2, 15], [2, 15]]}, "30 since the world size last changed"),
        ({**base, "history": [[0, 1]]}, "history step 0 has world size 0"),
        ({**base, "history": [[10**12, 1]]}, "world size 1,000,000,000,000"),
        ({**base, "history": [["1", 0]]}, "history step 0 must be [world, samples_seen]"),
        ({**base, "history": [[1.0, 0]]}, "history step 0 must be [world, samples_seen]"),
        ({**base, "history": [[True, 0]]}, "history step 0 must be [world, samples_seen]"),
        ({**base, "history": [[1, 0, 0]]}, "history step 0 must be [world, samples_seen]"),
        ({**base, "history": "[[1, 0]]"}, "history must be a list"),
        ({**base, "history": [[w, 0] for w in range(1, 3000)]}, "changes the world size so "
                                                                 "often"),
        ({**base, "epoch": -1}, "epoch must be an integer >= 0, found -1"),
        ({**base, "epoch": "0"}, "epoch must be an integer >= 0, found '0'"),
        ({k: v for k, v in base.items() if k != "history"}, "it has no 'history'"),
        ({**base, "worker": {"world": 1, "rank": 0, "num_workers": 1, "worker": 0,
                             "batch_size": 1, "yielded": -3}}, "worker position"),
        ({**base, "worker": {"world": 1}}, "worker must be null or"),
        ({**base, "seed": list(range(10**6))}, "state was saved with seed=[0, 1, 2, 3, 4, 5, "
                                               "...], this dataset has 0"),
        ({**base, "seed": np.arange(3)}, "state was saved with seed=array"),
        ({**base, "shuffle": np.array([True, False])}, "state was saved with shuffle=array"),
        ({**base, "version": np.array([1, 2])}, "unsupported state version"),
        ({**base, "version": [3] * 10**6}, "unsupported state version"),
        ([base], "a ShardDataset state is a dict, found list"),
    ]


def test_impossible_resume_states_are_refused_at_once(tmp_path):
    ds = _labelled(tmp_path, [b"%d" % i for i in range(40)], shard_format="tar",
                   compression="none")
    dataset = shardpack.ShardDataset(ds, batch_size=4)
    base = dataset.state_dict(samples_seen=8)
    dataset.load_state_dict(base)  # the real one loads
    for state, message in _states(base):
        fresh = shardpack.ShardDataset(ds, batch_size=4)
        with pytest.raises(ValueError) as caught:
            fresh.load_state_dict(state)
        text = str(caught.value)
        assert message in text and "\n" not in text and len(text) < 400, (message, text)


def test_samples_seen_must_be_a_count_of_this_ranks_share(tmp_path):
    ds = _labelled(tmp_path, [b"%d" % i for i in range(10)], shard_format="tar",
                   compression="none")
    dataset = shardpack.ShardDataset(ds, world_size=2, rank=0)
    for bad, message in [(-1, "samples_seen=-1: this rank's share of an epoch holds 0 to 5"),
                         (6, "samples_seen=6"), (2.5, "samples_seen must be an integer, found "
                                                     "2.5"), (True, "found True")]:
        with pytest.raises(ValueError, match=message.replace("(", r"\(")):
            dataset.state_dict(samples_seen=bad)
    assert dataset.state_dict(samples_seen=np.int64(5))["history"] == [[2, 5]]


def test_a_local_manifest_past_the_cap_is_refused_unread(tmp_path):
    """A manifest bigger than any real one (a sparse file here, so nothing is written) is one
    line, without reading it into memory."""
    with open(tmp_path / fmt.MANIFEST_NAME, "wb") as f:
        f.truncate(fmt.MANIFEST_CAP + 1)
    with pytest.raises(FormatError, match=rf"manifest is {fmt.MANIFEST_CAP + 1:,} bytes, more "
                                          "than the"):
        shardpack.open_reader(tmp_path)


@pytest.mark.parametrize("flags", [(), ("--resume",)])
def test_a_fifo_in_out_never_blocks_pack(tmp_path, flags):
    """Every local read goes through the regular-file check (shardpack.storage.read_bytes):
    a FIFO as OUT's pack state is one line, not a pack waiting for a writer forever."""
    src = make_tree(tmp_path / "src", {"a/x.bin": b"1", "a/y.bin": b"2"})
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / ".shardpack-pack.json")
    (out / "shard-00000.tar").write_bytes(b"")
    result = run_subprocess("pack", src, out, "-q", *flags, timeout=60)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr
