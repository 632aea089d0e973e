"""A resume state is bound to the dataset it was saved on (docs/reading.md, "Resume"): the same
samples packed into other shards, or a mixture with one source repacked, are refused in one line
naming both identities; the same dataset re-opened (another process, another world size, a pack
repeated byte for byte, a copy served over HTTP) resumes exactly once; a state saved before
states recorded an identity loads, with a warning."""

import json
import subprocess
import sys
import warnings

import pytest
from torch.utils.data import DataLoader

import shardpack
from shardpack import ShardDataset
from shardpack.loader.batches import collate
from shardpack.read.reader import DatasetReader

from testbed.helpers import make_tree

N = 120


@pytest.fixture
def tree(tmp_path):
    return make_tree(tmp_path / "src", {f"{i:03d}.bin": b"%d" % i for i in range(N)})


def _pack(tree, out, per_shard):
    shardpack.pack(tree, out, workers=1, max_samples=per_shard)
    return out


def _ids(ds, workers=0):
    """(id, repeat) of each sample one pass of ``ds`` yields through a DataLoader."""
    return [(i, r) for b in DataLoader(ds, batch_size=4, num_workers=workers,
                                       collate_fn=collate)
            for i, r in zip(b["__index__"].tolist(), b["__repeat__"].tolist(), strict=True)]


def _state(path, k=8, **kwargs):
    """The state after ``k`` samples, through JSON as a checkpoint holds it."""
    ds = ShardDataset(path, batch_size=4, seed=7, **kwargs)
    return json.loads(json.dumps(ds.state_dict(samples_seen=k)))


def test_the_same_samples_packed_otherwise_are_refused(tree, tmp_path):
    at40, at30 = _pack(tree, tmp_path / "at40", 40), _pack(tree, tmp_path / "at30", 30)
    state = _state(at40)
    fresh = ShardDataset(at30, batch_size=4, seed=7)
    assert len(fresh) == N  # the sample count alone cannot tell them apart
    with pytest.raises(ValueError) as caught:
        fresh.load_state_dict(state)
    text = str(caught.value)
    mine = DatasetReader(at30).manifest.identity
    assert state["dataset"] == DatasetReader(at40).manifest.identity != mine
    assert state["dataset"] in text and mine in text and str(at30) in text
    assert "resume on the dataset the state was saved on" in text
    assert "start epoch 0 afresh" in text and "\n" not in text and len(text) < 400


def test_a_repeated_pack_is_the_same_dataset(tree, tmp_path):
    """pack is deterministic: a second pack of the same tree is byte for byte the first, so a
    state saved on one resumes on the other, exactly."""
    one, two = _pack(tree, tmp_path / "one", 40), _pack(tree, tmp_path / "two", 40)
    assert (one / "shardpack.json").read_bytes() == (two / "shardpack.json").read_bytes()
    whole = [i for i, _ in _ids(ShardDataset(one, batch_size=4, seed=7))]
    fresh = ShardDataset(two, batch_size=4, seed=7)
    fresh.load_state_dict(_state(one))
    assert [i for i, _ in _ids(fresh)] == whole[8:]


def test_another_process_computes_the_same_identity(tree, tmp_path):
    ds = _pack(tree, tmp_path / "ds", 40)
    code = ("import json, sys; from shardpack import ShardDataset; "
            "print(ShardDataset(sys.argv[1]).state_dict(samples_seen=0)['dataset'])")
    out = subprocess.run([sys.executable, "-c", code, str(ds)], capture_output=True,
                         text=True, check=True, timeout=120).stdout.strip()
    assert out == _state(ds)["dataset"]


@pytest.mark.parametrize("new_world,workers", [(1, 2), (3, 0), (4, 1)])
def test_the_same_dataset_resumes_at_another_world_size(tree, tmp_path, new_world, workers):
    ds = _pack(tree, tmp_path / "ds", 40)
    seen, states = [], []
    for rank in range(2):
        running = ShardDataset(ds, batch_size=4, seed=7, rank=rank, world_size=2)
        seen += [i for i, _ in _ids(running)][:12]
        states.append(json.loads(json.dumps(running.state_dict(samples_seen=12))))
    assert states[0] == states[1]
    rest = []
    for rank in range(new_world):
        fresh = ShardDataset(ds, batch_size=4, seed=7, rank=rank, world_size=new_world)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a state with its identity loads without a word
            fresh.load_state_dict(states[0])
        rest += [i for i, rep in _ids(fresh, workers) if not rep]
    assert sorted(seen + rest) == list(range(N))  # each sample exactly once


def test_a_copy_served_over_http_is_the_same_dataset(tree, tmp_path, http_server):
    ds = _pack(tree, tmp_path / "ds", 40)
    whole = [i for i, _ in _ids(ShardDataset(ds, batch_size=4, seed=7))]
    remote = ShardDataset(http_server(ds).url, batch_size=4, seed=7)
    remote.load_state_dict(_state(ds))
    assert [i for i, _ in _ids(remote)] == whole[8:]


def test_a_mixture_with_one_source_repacked_is_refused(tree, tmp_path):
    other = make_tree(tmp_path / "other", {f"o{i:02d}.bin": b"o%d" % i for i in range(30)})
    a, b = _pack(tree, tmp_path / "a", 40), _pack(other, tmp_path / "b", 10)
    b2 = _pack(other, tmp_path / "b2", 15)  # the same 30 samples, 15 a shard
    state = _state([a, b])
    assert state["dataset"] == [DatasetReader(a).manifest.identity,
                                DatasetReader(b).manifest.identity]
    ShardDataset([a, b], batch_size=4, seed=7).load_state_dict(state)  # the same mixture loads
    with pytest.raises(ValueError) as caught:
        ShardDataset([a, b2], batch_size=4, seed=7).load_state_dict(state)
    text = str(caught.value)
    assert "source 1" in text and str(b2) in text and "\n" not in text
    assert state["dataset"][1] in text and DatasetReader(b2).manifest.identity in text


def test_a_state_without_an_identity_loads_with_a_warning(tree, tmp_path):
    """States saved before states recorded the dataset's identity: loaded (their sample count
    and order settings still checked), with a warning that says what cannot be checked."""
    ds = _pack(tree, tmp_path / "ds", 40)
    whole = [i for i, _ in _ids(ShardDataset(ds, batch_size=4, seed=7))]
    old = {k: v for k, v in _state(ds).items() if k != "dataset"}
    fresh = ShardDataset(ds, batch_size=4, seed=7)
    with pytest.warns(UserWarning, match="no dataset identity .* repeat some and skip others"):
        fresh.load_state_dict(old)
    assert [i for i, _ in _ids(fresh)] == whole[8:]


@pytest.mark.parametrize("value", [7, ["x"], "0" * 32, [[1]], {"a": 1}, "x\n" * 1000])
def test_a_crafted_identity_is_refused_in_one_line(tree, tmp_path, value):
    ds = _pack(tree, tmp_path / "ds", 40)
    with pytest.raises(ValueError, match="state was saved with dataset") as caught:
        ShardDataset(ds, batch_size=4, seed=7).load_state_dict({**_state(ds), "dataset": value})
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 600


@pytest.mark.parametrize("value", ["x", ["x"], ["x", "y", "z"], None])
def test_a_crafted_mixture_identity_is_refused_in_one_line(tree, tmp_path, value):
    other = make_tree(tmp_path / "other", {f"o{i:02d}.bin": b"o%d" % i for i in range(30)})
    mix = [_pack(tree, tmp_path / "a", 40), _pack(other, tmp_path / "b", 10)]
    state = _state(mix)
    if value is None:  # the same identities as a tuple: accepted
        ShardDataset(mix, batch_size=4, seed=7).load_state_dict(
            {**state, "dataset": tuple(state["dataset"])})
        return
    with pytest.raises(ValueError, match="state was saved with sources on datasets") as caught:
        ShardDataset(mix, batch_size=4, seed=7).load_state_dict({**state, "dataset": value})
    assert "\n" not in str(caught.value)
