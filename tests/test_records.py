"""Nested records in the core (conduit.records via conduit.ext): flattened to the buffer's fields, rebuilt nested."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import conduit
from conduit import records
from conduit.errors import SpecError
from conduit.ext import RecordLayout, build_record, flatten_record, is_record, stack_rows, stack_time_major
from tests.integrations.srl_stub import NamedArray


def _sample(t: int, step: int) -> dict[str, object]:
    return {
        "obs": {"pixels": np.full((t, 3), step, np.float32), "state": {"pos": np.full((t, 2), -step, np.float32)}},
        "action": np.full((t,), step % 4, np.int64),
        "info": None,
    }


def test_a_nested_sample_flattens_in_its_own_order_and_builds_back_with_its_nesting() -> None:
    s = _sample(5, 3)
    pairs = flatten_record(s)
    assert [k for k, _ in pairs] == ["obs.pixels", "obs.state.pos", "action", "info"]
    back = build_record(pairs, dict)
    assert back["info"] is None and back["obs"]["state"]["pos"] is s["obs"]["state"]["pos"]  # no copy
    assert not is_record(np.zeros(2)) and not is_record(None) and is_record({"a": 1})


def test_nested_samples_go_through_a_runtime_as_flat_fields_and_come_back_nested_time_major() -> None:
    """Any workload whose samples nest: the layout of the first sample names the buffer's fields; a pulled
    batch of B samples of [T, ...] is rebuilt as one nested [T, B, ...] sample."""
    t, b = 4, 6
    layout = RecordLayout.of(_sample(t, 0))
    assert layout.numeric == ("obs.pixels", "obs.state.pos", "action") and layout.none == {"info"}
    edp = conduit.Conduit(policy="off_policy", train_batch_size=b, capacity=64, min_size_to_sample=b, seed=0)
    with edp:
        for step in range(16):
            leaves = layout.leaves(_sample(t, step))
            edp.push({k: stack_rows([torch.from_numpy(leaves[k])]) for k in layout.numeric})
        batch = edp.pull()
        drawn = batch.info.ids
        nested = layout.rebuild({k: batch[k].transpose(0, 1) for k in layout.numeric}, dict)
    assert nested["info"] is None
    assert tuple(nested["obs"]["pixels"].shape) == (t, b, 3) and tuple(nested["action"].shape) == (t, b)
    steps = nested["obs"]["pixels"][0, :, 0].numpy()
    assert np.array_equal(steps, drawn.astype(np.float32))  # each column is the sample drawn there, whole
    assert np.array_equal(nested["obs"]["state"]["pos"][:, :, 1].numpy(), -np.tile(steps, (t, 1)))


def test_a_layout_checkpoints_as_plain_values_and_refuses_a_different_sample() -> None:
    layout = RecordLayout.of(_sample(3, 0))
    state = pickle.loads(pickle.dumps(layout.state()))
    assert isinstance(state, dict) and RecordLayout.from_state(state) == layout
    assert RecordLayout.from_state(layout) is layout
    other = _sample(3, 1)
    del other["action"]
    with pytest.raises(SpecError, match="missing \\['action'\\]"):
        layout.leaves(other)
    filled = layout.leaves({**_sample(3, 1), "obs": None})  # a whole record left None: zeros of its shapes
    assert filled["obs.pixels"].shape == (3, 3) and not filled["obs.pixels"].any()


def test_samples_stack_time_major_into_the_memory_handed_out_and_a_record_left_none_is_zero_filled() -> None:
    taken: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}

    def take(shapes: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> dict[str, torch.Tensor]:
        taken.update(shapes)
        return {k: torch.full(shape, -1, dtype=dtype) for k, (shape, dtype) in shapes.items()}

    samples = [_sample(4, step) for step in range(3)]
    samples[1]["obs"] = None  # a whole record left None in one sample
    del samples[2]["action"]  # a field the first sample has and a later one lacks is refused by name
    with pytest.raises(SpecError, match="action"):
        stack_time_major(samples, take)
    samples[2]["action"] = np.full((4,), 2, np.int64)
    samples[2]["tag"] = np.array(["a"] * 4)  # one only a later sample has: left out, as SRL's aggregation does
    names, leaves, blocks = stack_time_major(samples, take)
    assert names == ["obs.pixels", "obs.state.pos", "action", "info"] and leaves == {"info": None}
    assert taken["obs.pixels"] == ((4, 3, 3), torch.float32) and blocks["action"].shape == (4, 3)
    assert blocks["obs.pixels"][:, 0].eq(0).all() and blocks["obs.pixels"][:, 1].eq(0).all()  # zeros for step 1
    assert blocks["obs.pixels"][:, 2].eq(2).all() and blocks["obs.state.pos"][:, 2].eq(-2).all()
    nested = build_record([(k, blocks.get(k, leaves.get(k))) for k in names], dict)
    assert nested["obs"]["state"]["pos"] is blocks["obs.state.pos"]


# -- the common case read column by column: the same result as the general path, or the general path's error ------
_LEAVES = st.sampled_from(["f32", "f32", "i64", "f64", "none", "str", "scalar", "short"])


def _leaf(kind: str, t: int, seed: int) -> object:
    rng = np.random.default_rng(seed)
    return {
        "f32": rng.standard_normal((t, 3)).astype(np.float32), "f64": rng.standard_normal((t, 3)),
        "i64": rng.integers(0, 9, (t,)), "none": None, "str": np.array(["x"] * t),
        "scalar": np.float32(1.0), "short": np.zeros((t - 1, 3), np.float32),
    }[kind]


@st.composite
def _groups(draw: st.DrawFn) -> list[NamedArray]:
    """Groups of SRL-shaped nested records (the stub's ``NamedArray``: ``_fields``, a ``.shape``), mostly alike, at
    times differing in one place: a leaf's kind, a record left None, an extra field."""
    t, b = draw(st.integers(2, 4)), draw(st.integers(1, 5))
    kinds = draw(st.lists(st.sampled_from(["f32", "i64", "none"]), min_size=3, max_size=3))
    odd = draw(st.one_of(st.none(), st.tuples(st.integers(0, b - 1), st.sampled_from(["leaf", "record", "extra"]),
                                              _LEAVES)))
    group = []
    for i in range(b):
        a, c, d = (_leaf(k, t, 10 * i + j) for j, k in enumerate(kinds))
        obs: object = NamedArray(obs=a, mask=c)
        extra = {}
        if odd is not None and odd[0] == i:
            if odd[1] == "leaf":
                a = _leaf(odd[2], t, 99)
                obs = NamedArray(obs=a, mask=c)
            elif odd[1] == "record":
                obs = None
            else:
                extra = {"tag": _leaf(odd[2], t, 98)}
        group.append(NamedArray(obs=obs, action=NamedArray(x=d), reward=_leaf("f32", t, i), **extra))
    return group


def _stacked(fn: object, group: list[NamedArray]) -> object:
    def take(shapes: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> dict[str, torch.Tensor]:
        return {k: torch.full(shape, 7, dtype=dtype) for k, (shape, dtype) in shapes.items()}

    try:
        names, leaves, blocks = fn(group, take)  # type: ignore[operator]
    except Exception as e:  # the error is what is compared
        return type(e)
    return names, {k: (v if v is None else (v.dtype, v.shape, v.tolist())) for k, v in leaves.items()}, \
        {k: (v.dtype, v.tolist()) for k, v in blocks.items()}


@given(_groups())
def test_stacking_srl_records_column_by_column_gives_what_the_general_path_gives(group: list[NamedArray]) -> None:
    assert _stacked(stack_time_major, group) == _stacked(records._stack_general, group)


def test_the_column_path_takes_srl_shaped_records_and_leaves_anything_else_to_the_general_path() -> None:
    same = [NamedArray(obs=NamedArray(x=np.zeros((2, 3), np.float32)), info=None) for _ in range(3)]
    assert records._uniform_columns(same) is not None
    assert records._uniform_columns([{"x": np.zeros(2)}]) is None  # a dict record
    assert records._uniform_columns([*same, NamedArray(obs=None, info=None)]) is None  # a record left None
    mixed = [*same, NamedArray(obs=NamedArray(x=np.zeros((2, 3), np.float64)), info=None)]
    assert records._uniform_columns(mixed) is None  # one sample of another dtype: promoted by the general path
