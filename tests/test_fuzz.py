"""Fuzzing bad input: every malformed write raises SpecError and changes nothing."""

from __future__ import annotations

import copy

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from conduit import Conduit, ExperienceSpec, FieldSpec, Mode, Schedule, SpecError
from tests.helpers import transitions

SPEC = ExperienceSpec(
    {
        "obs": FieldSpec("obs", (4,), torch.float32, finite=True),
        "action": FieldSpec("action", (), torch.int64),
        "reward": FieldSpec("reward", (), torch.float32, finite=True),
        "done": FieldSpec("done", (), torch.bool),
        "tid": FieldSpec("tid", (), torch.int64, contiguous=True),
    }
)

CORRUPTIONS = [
    "missing", "extra", "shape", "rank", "dtype", "leading", "empty", "nan", "inf", "noncontiguous", "too_big",
    "object", "scalar", "not_a_mapping", "meta_device",
]


def corrupt(kind: str, n: int, field: str, rng: np.random.Generator):
    d = transitions(n)
    if kind == "missing":
        del d[field]
    elif kind == "extra":
        d["unexpected"] = torch.zeros(n)
    elif kind == "shape":
        d["obs"] = torch.zeros(n, 5)
    elif kind == "rank":
        d["obs"] = torch.zeros(n, 4, 1)
    elif kind == "dtype":
        d["action"] = torch.zeros(n, dtype=torch.float32)  # float -> int64 is not a safe cast
    elif kind == "leading":
        d[field] = d[field][: max(0, n - 1)] if n > 1 else torch.cat([d[field], d[field]])
    elif kind == "empty":
        d = {k: v[:0] for k, v in d.items()}
    elif kind == "nan":
        d["obs"][rng.integers(0, n), 0] = float("nan")
    elif kind == "inf":
        d["reward"][rng.integers(0, n)] = float("inf")
    elif kind == "noncontiguous":  # (a one-element tensor is always contiguous)
        d = transitions(max(n, 2))
        d["tid"] = torch.arange(2 * max(n, 2), dtype=torch.int64)[::2]
    elif kind == "too_big":
        d = transitions(5000)
    elif kind == "object":
        d["obs"] = np.array([object()] * n)
    elif kind == "scalar":
        d["reward"] = torch.tensor(1.0)
    elif kind == "not_a_mapping":
        return [1, 2, 3]
    elif kind == "meta_device":
        d["obs"] = torch.empty(n, 4, device="meta")
    return d


def snapshot(edp: Conduit):
    buf = edp.buffer
    contents = {k: v.clone() for k, v in buf.contents().items()}
    return (
        contents, buf.inserted, buf.table.state_dict(), copy.deepcopy(buf.rng.bit_generator.state),
        buf.sampler.state_dict(), edp.stats().pushed_units, edp.stats().ingested_rows,
    )


def same(a, b) -> bool:
    ca, cb = a[0], b[0]
    if ca.keys() != cb.keys() or any(not torch.equal(ca[k], cb[k]) for k in ca):
        return False
    ta, tb = a[2], b[2]
    if any(not np.array_equal(ta[k], tb[k]) for k in ("ids", "times_sampled", "valid")):
        return False
    sa, sb = a[4], b[4]
    if sa.keys() != sb.keys() or any(not np.array_equal(np.asarray(sa[k]), np.asarray(sb[k])) for k in sa):
        return False
    return a[1] == b[1] and a[3] == b[3] and a[5:] == b[5:] and {k: ta[k] for k in ("count", "high", "pos")} == {
        k: tb[k] for k in ("count", "high", "pos")
    }


@given(
    kinds=st.lists(st.sampled_from(CORRUPTIONS), min_size=1, max_size=6),
    n=st.integers(1, 12),
    field=st.sampled_from(["obs", "action", "reward", "done", "tid"]),
    sampler=st.sampled_from(["uniform", "prioritized"]),
    overlap=st.booleans(),
)
def test_malformed_writes_raise_and_change_nothing(kinds, n, field, sampler, overlap):
    edp = Conduit(
        policy="off_policy", train_batch_size=4, capacity=64, seed=0, spec=SPEC, sampler=sampler,
        pinned=Schedule(Mode(overlap, 1), Mode(False, 1)), timeout_s=5.0,
    )
    rng = np.random.default_rng(0)
    with edp:
        edp.push(transitions(8))
        edp.flush()
        edp.pull()
        for kind in kinds:
            before = snapshot(edp)
            try:
                edp.push(corrupt(kind, n, field, rng))
            except SpecError as e:
                msg = str(e)
                assert msg  # names what is wrong
            else:
                raise AssertionError(f"{kind} write was accepted")
            edp.flush()
            assert same(before, snapshot(edp)), kind
        edp.push(transitions(4, start=100))  # and the runtime still works
        edp.flush()
        assert 100 in edp.buffer.contents()["tid"].tolist()


def test_error_messages_name_field_expected_and_received():
    edp = Conduit(policy="off_policy", train_batch_size=4, capacity=64, spec=SPEC)
    rng = np.random.default_rng(0)
    expectations = {
        "shape": "field 'obs': expected trailing shape (4,), received (5,)",
        "dtype": "field 'action': expected dtype int64, received float32",
        "nan": "field 'obs': expected finite values, received 1 NaN/inf",
        "noncontiguous": "field 'tid': expected a contiguous tensor",
        "too_big": "exceeds the buffer capacity of 64 rows",
        "meta_device": "field 'obs': expected a tensor on the host or a GPU, received one on meta",
    }
    with edp:
        for kind, fragment in expectations.items():
            try:
                edp.push(corrupt(kind, 6, "obs", rng))
            except SpecError as e:
                assert fragment in str(e), (kind, str(e))
            else:
                raise AssertionError(kind)
