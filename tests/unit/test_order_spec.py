"""The order as one frozen value: its settings, its state form (the keys and values states have
always had), and ShardDataset's use of it (same state, same order of samples)."""

import json

import numpy as np
import pytest

import shardpack
from shardpack import ShardDataset
from shardpack.order import partition as P
from shardpack.order.spec import STATE_VERSION, Order, check_version

from testbed.helpers import make_tree


def test_order_is_frozen_checked_and_has_a_state_form():
    order = Order(seed=np.int64(3), shuffle=1, block_size=8, window=32, affinity=0)
    assert order == Order(seed=3, shuffle=True, block_size=8, window=32, affinity=False)
    assert order.algorithm == "blocks" and Order(shuffle=False).algorithm == "sequential"
    with pytest.raises(AttributeError):
        order.seed = 4
    state = order.state()
    assert state == {"version": STATE_VERSION, "seed": 3, "shuffle": True, "partial": "pad",
                     "block_size": 8, "shuffle_window": 32, "shard_affinity": False}
    assert Order.from_state(json.loads(json.dumps(state))) == order
    older = {k: v for k, v in state.items() if k != "shard_affinity"}  # from before affinity
    assert Order.from_state(older) == order
    for bad, message in [(dict(partial="half"), "partial must be one of"),
                         (dict(seed="1"), "seed must be an integer"),
                         (dict(block_size=0), "must be >= 1")]:
        with pytest.raises(ValueError, match=message):
            Order(**bad)
    assert Order(shuffle=False, block_size=0).block_size == 0  # unused without a shuffle


def test_saved_versions_and_settings_are_checked():
    order = Order(seed=2)
    state = order.state()
    order.check_saved(state)
    with pytest.raises(ValueError, match="saved with seed=5, this dataset has 2"):
        order.check_saved({**state, "seed": 5})
    with pytest.raises(ValueError, match="expected 3, found 1: .*unshuffled"):
        check_version({**state, "version": 1})
    check_version({**state, "version": 1, "shuffle": False})  # unshuffled: the same order
    with pytest.raises(ValueError, match="found 99: saved by another shardpack"):
        Order.from_state({**state, "version": 99})


def test_spans_follow_affinity_and_the_first_world():
    assert Order().spans(4) == 4 and Order().spans(4, [(8, 10)]) == 8
    assert Order(affinity=False).spans(4, [(8, 10)]) == 1


def test_dataset_builds_one_order_and_keeps_its_state_and_samples(tmp_path):
    src = make_tree(tmp_path / "src", {f"{i:03d}.bin": b"%d" % i for i in range(50)})
    shardpack.pack(src, tmp_path / "ds", workers=1, max_samples=7)
    ds = ShardDataset(tmp_path / "ds", seed=4, block_size=3, shuffle_window=9, world_size=2,
                      rank=1)
    assert ds.order == Order(seed=4, block_size=3, window=9)
    assert (ds.seed, ds.shuffle_window, ds.shard_affinity) == (4, 9, True)
    with pytest.raises(AttributeError, match="part of the dataset's order"):
        ds.seed = 5
    state = ds.state_dict(samples_seen=5)
    assert {k: state[k] for k in ds.order.state()} == ds.order.state()
    assert state["num_samples"] == 50 and state["history"] == [[2, 5]]
    sizes = [s.samples for s in ds.reader.shards]
    want = P.rank_split(P.epoch_order(sizes, seed=4, block_size=3, window=9, spans=2), 2, 1)
    assert [int(s["__index__"]) for s in ds] == want.ids.tolist()
    fresh = ShardDataset(tmp_path / "ds", seed=4, block_size=3, shuffle_window=9,
                         world_size=2, rank=1)
    fresh.load_state_dict(json.loads(json.dumps(state)))
    assert [int(s["__index__"]) for s in fresh] == want.ids[5:].tolist()
