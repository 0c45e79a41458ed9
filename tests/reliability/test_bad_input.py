"""Promise: bad input changes nothing — not the buffer, not the counters, not the runtime's health.

Every unit is checked at its ``push`` before anything is queued, with or without
a hook, under every schedule; a value a cast would lose is refused (or clamped
where the field says so); a tensor that requires grad is stored as data.
"""

from __future__ import annotations

import datetime

import numpy as np
import pytest
import torch

from conduit import Conduit, ExperienceSpec, FieldSpec, Mode, Schedule, SpecError

SCHEDULES = {
    "inline": Schedule(Mode(False, 1), Mode(False, 1)),
    "inline-g2": Schedule(Mode(False, 2), Mode(False, 1)),
    "overlapped": Schedule(Mode(True, 1), Mode(False, 1)),
}

GOOD = {"x": np.zeros((2, 3), np.float32), "k": np.zeros((2,), np.int32)}
BAD = {
    "complex dtype": {"x": np.zeros((2, 3), np.complex64), "k": np.zeros((2,), np.int32)},
    "sparse tensor": {"x": torch.zeros(2, 3).to_sparse(), "k": torch.zeros(2, dtype=torch.int32)},
    "strings": {"x": np.array([["a"] * 3] * 2), "k": np.zeros((2,), np.int32)},
    "datetimes": {"x": np.zeros((2, 3), np.float32), "k": np.array([datetime.datetime(2026, 1, 1)] * 2, "datetime64[s]")},
    "int64 beyond int32": {"x": np.zeros((2, 3), np.float32), "k": np.array([1, 2**40 + 7], np.int64)},
    "uint64 beyond int32": {"x": np.zeros((2, 3), np.float32), "k": np.array([1, 2**63 + 5], np.uint64)},
    "float64 beyond float32": {"x": np.full((2, 3), 1e300), "k": np.zeros((2,), np.int32)},
    "a missing field": {"x": np.zeros((2, 3), np.float32)},
    "ragged leading dims": {"x": np.zeros((2, 3), np.float32), "k": np.zeros((3,), np.int32)},
    "a python string": {"x": "not data", "k": np.zeros((2,), np.int32)},
}


def _state(edp: Conduit) -> tuple:
    s = edp.stats()
    contents = edp.buffer.contents() if edp.buffer.size else {}
    return (s.pushed_units, s.pushed_rows, s.ingested_rows, edp.buffer.size, edp.buffer.inserted,
            {k: v.clone() for k, v in contents.items()}, edp.buffer.rng.bit_generator.state["state"]["state"])


def _same(a: tuple, b: tuple) -> bool:
    return a[:5] == b[:5] and a[6] == b[6] and a[5].keys() == b[5].keys() and all(torch.equal(a[5][k], b[5][k]) for k in a[5])


@pytest.mark.parametrize("schedule", SCHEDULES, ids=str)
@pytest.mark.parametrize("hook", [False, True], ids=["no-hook", "pass-through-hook"])
@pytest.mark.parametrize("case", BAD, ids=str)
def test_a_bad_push_raises_specerror_and_changes_nothing(case, hook, schedule):
    edp = Conduit(policy="off_policy", train_batch_size=2, capacity=64, pinned=SCHEDULES[schedule], seed=0)
    if hook:
        @edp.register_ingestion()
        def passthrough(actor_in, exp_out):  # the Quickstart's shape
            exp_out.write(actor_in.read())

    with edp:
        edp.push(GOOD)
        edp.push(GOOD)
        edp.flush()
        before = _state(edp)
        with pytest.raises(SpecError) as err:
            edp.push(BAD[case])
        assert "field" in str(err.value) or "fields" in str(err.value) or "dimension" in str(err.value)
        edp.flush()
        assert _same(_state(edp), before)
        edp.push(GOOD)  # the runtime is healthy
        edp.flush()
        assert edp.failure.error is None and edp.stats().ingested_rows == before[2] + 2


def test_a_hook_whose_output_the_declared_spec_refuses_raises_at_that_push_inline():
    """The first unit itself cannot be stored (the declared spec wants float32, the hook passes int64 strings
    of bits through): inline at g = 1 the push raises SpecError and the runtime stays healthy."""
    spec = ExperienceSpec.of(x=((3,), "float32"))
    edp = Conduit(policy="off_policy", train_batch_size=2, capacity=64, spec=spec, pinned=SCHEDULES["inline"])

    @edp.register_ingestion()
    def passthrough(actor_in, exp_out):
        exp_out.write(actor_in.read())

    with edp:
        with pytest.raises(SpecError, match="field 'x'"):
            edp.push({"x": np.zeros((2, 3), np.complex64)})
        assert edp.failure.error is None and edp.stats().pushed_units == 0
        edp.push({"x": np.zeros((2, 3), np.float64)})  # a different input spec now: the first accepted unit's
        edp.flush()
        assert edp.stats().ingested_rows == 2


def test_values_beyond_the_target_are_clamped_where_the_field_says_so():
    spec = ExperienceSpec.of(k=FieldSpec("k", (), torch.int32, clamp=True), x=FieldSpec("x", (), torch.float16, clamp=True))
    with Conduit(policy="off_policy", train_batch_size=2, capacity=8, spec=spec) as edp:
        edp.push({"k": np.array([2**40, -(2**40)], np.int64), "x": np.array([1e6, -1e6])})
        got = edp.buffer.contents()
        assert got["k"].tolist() == [2**31 - 1, -(2**31)]
        assert got["x"].tolist() == [65504.0, -65504.0]


def test_casts_that_keep_every_value_are_accepted():
    spec = ExperienceSpec.of(k=((), "int32"), x=((), "float32"))
    with Conduit(policy="off_policy", train_batch_size=2, capacity=8, spec=spec) as edp:
        edp.push({"k": np.array([2**31 - 1, -(2**31)], np.int64), "x": np.array([0.1, np.nan])})
        got = edp.buffer.contents()
        assert got["k"].tolist() == [2**31 - 1, -(2**31)] and got["x"][0].item() == pytest.approx(0.1)


@pytest.mark.parametrize("hook", [False, True], ids=["no-hook", "hook"])
@pytest.mark.parametrize("schedule", SCHEDULES, ids=str)
def test_a_tensor_that_requires_grad_is_stored_as_data(hook, schedule):
    edp = Conduit(policy="off_policy", train_batch_size=2, capacity=8, pinned=SCHEDULES[schedule])
    if hook:
        @edp.register_ingestion()
        def passthrough(actor_in, exp_out):
            exp_out.write(actor_in.read())

    with edp:
        w = torch.ones(3, requires_grad=True)
        for _ in range(2):
            edp.push({"x": torch.ones(2, 3) * w})
        edp.flush()
        batch = edp.pull()
        assert batch["x"].grad_fn is None and not batch["x"].requires_grad
        assert not edp.buffer.storage.tensors["x"].requires_grad
