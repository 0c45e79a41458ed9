"""After ``push`` returns, the actor's arrays are its own again (unless it hands them over).

An actor that refills one preallocated rollout buffer (CleanRL-style storage, a
vectorized env writing into fixed arrays) must get every unit into the buffer as
it was when pushed, whatever the schedule defers. Each test pauses the ingestion
worker around the push and the refill, so the refill always lands before the
write: without the copy these tests fail every time, not by chance.
"""

from __future__ import annotations

import contextlib
from fractions import Fraction

import numpy as np
import pytest
import torch

from conduit import Conduit, Mode, Schedule
from conduit.config import Policy

ROWS, DIM, UNITS = 8, 3, 6


def _off(schedule: Schedule, **kw: object) -> Conduit:
    return Conduit(
        policy=Policy.OFF_POLICY, train_batch_size=4, capacity=64, rollout_unit_size=ROWS, pinned=schedule,
        timeout_s=10.0, **kw,
    )


def _push_refilling(edp: Conduit, actor: dict, copy: bool | None = None) -> None:
    """Push UNITS units from one buffer the actor refills with k (and scribbles on right after each push)."""
    obs = actor["obs"]
    for k in range(UNITS):
        obs[:] = k
        with _worker_paused(edp):
            edp.push(actor, copy=copy)
            obs[:] = -1  # the actor's next rollout starts writing before ingestion ran
        edp.flush()  # (a group of g > 1 waits for its last unit: flush writes the part group)


def _worker_paused(edp: Conduit) -> contextlib.AbstractContextManager[None]:
    """Hold the ingestion worker between invocations (inline paths run in push itself: nothing to hold)."""
    edp.start()
    return edp.ingestion.paused() if edp.schedule.ingestion.overlap else contextlib.nullcontext()


def _stored_units(edp: Conduit) -> list[float]:
    """The first obs value of each of the last UNITS units written to the ring."""
    rows = edp.buffer.storage.read(edp.buffer.inserted - UNITS * ROWS, UNITS * ROWS)["obs"]
    units = rows.reshape(UNITS, ROWS * DIM)
    assert (units == units[:, :1]).all(), "a unit's rows were torn"
    return units[:, 0].tolist()


OFF_SCHEDULES = [
    Schedule(Mode(False, 1), Mode(False, 1)),
    Schedule(Mode(False, 2), Mode(False, 1)),
    Schedule(Mode(True, 1), Mode(False, 1)),
    Schedule(Mode(True, 2), Mode(True, 1)),
    Schedule(Mode(True, 3), Mode(False, 1)),
]


@pytest.mark.parametrize("schedule", OFF_SCHEDULES, ids=str)
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_an_actor_refilling_one_buffer_gets_every_unit_stored_as_pushed(schedule: Schedule, kind: str) -> None:
    obs = np.zeros((ROWS, DIM), np.float32) if kind == "numpy" else torch.zeros(ROWS, DIM)
    actor = {"obs": obs, "reward": np.ones(ROWS, np.float32) if kind == "numpy" else torch.ones(ROWS)}
    with _off(schedule) as edp:
        _push_refilling(edp, actor)
        assert _stored_units(edp) == [float(k) for k in range(UNITS)]


def test_handing_over_skips_the_copy_and_the_actor_must_not_write_until_ingested() -> None:
    # copy=False is the documented contract for actors building fresh arrays: the runtime reads them later
    actor = {"obs": torch.zeros(ROWS, DIM), "reward": torch.ones(ROWS)}
    with _off(Schedule(Mode(True, 1), Mode(False, 1))) as edp:
        _push_refilling(edp, actor, copy=False)
        assert _stored_units(edp) == [-1.0] * UNITS  # every refill landed before the deferred write
    with _off(Schedule(Mode(True, 1), Mode(False, 1)), copy_on_push=False) as edp:
        _push_refilling(edp, actor)
        assert _stored_units(edp) == [-1.0] * UNITS
        _push_refilling(edp, actor, copy=True)  # a per-call copy overrides the config
        assert _stored_units(edp) == [float(k) for k in range(UNITS)]


def test_a_push_written_before_it_returns_copies_nothing() -> None:
    # inline g=1 writes at once: the copy would be pure cost
    actor = {"obs": torch.zeros(ROWS, DIM), "reward": torch.ones(ROWS)}
    with _off(Schedule(Mode(False, 1), Mode(False, 1))) as edp:
        clones = 0
        original = torch.Tensor.clone

        def counting_clone(t: torch.Tensor, *a: object, **kw: object) -> torch.Tensor:
            nonlocal clones
            clones += 1
            return original(t, *a, **kw)

        torch.Tensor.clone = counting_clone  # type: ignore[method-assign]
        try:
            for k in range(UNITS):
                actor["obs"][:] = k
                edp.push(actor)
        finally:
            torch.Tensor.clone = original  # type: ignore[method-assign]
        assert clones == 0
        assert _stored_units(edp) == [float(k) for k in range(UNITS)]


@pytest.mark.parametrize("g", [Fraction(1, 2), Fraction(1, 4)])
def test_on_policy_pipelined_ingestion_keeps_each_unit_as_pushed(g: Fraction) -> None:
    per_iter = 2  # units per iteration
    edp = Conduit(
        policy=Policy.ON_POLICY, train_batch_size=per_iter * ROWS, rollout_unit_size=ROWS, num_minibatches=4,
        pinned=Schedule(Mode(True, g), Mode(True, Fraction(1, 4))), timeout_s=10.0,
    )
    actor = {"obs": np.zeros((ROWS, DIM), np.float32), "reward": np.ones(ROWS, np.float32)}
    with edp:
        for it in range(3):
            for u in range(per_iter):
                actor["obs"][:] = 10 * it + u
                with _worker_paused(edp):
                    edp.push(actor)
                    actor["obs"][:] = -1
                edp.flush()
            seen = sorted(torch.cat([mb["obs"][:, 0] for mb in edp.minibatches()]).tolist())
            assert seen == sorted([float(10 * it + u) for u in range(per_iter)] * ROWS)
