"""The paper's hook interface: decorators, endpoints, defaults."""

from __future__ import annotations

import pytest
import torch

import conduit
from conduit import Conduit, HookError
from tests.helpers import transitions


def test_module_level_decorators_return_the_function_unchanged():
    def ingest(actor_in, exp_out):
        exp_out.write(actor_in.read())

    assert conduit.register_ingestion(input="Actor", output="ExperienceBuffer")(ingest) is ingest
    assert conduit.default_registry().get(conduit.hooks.HookKind.INGESTION).fn is ingest


def test_wrong_endpoints_are_rejected_with_the_expected_names():
    with pytest.raises(HookError, match="input='Actor' to output='ExperienceBuffer'"):
        conduit.register_ingestion(input="Learner", output="ExperienceBuffer")
    with pytest.raises(HookError, match="input='ExperienceBuffer' to output='Learner'"):
        conduit.register_delivery(input="ExperienceBuffer", output="Actor")


def test_hooks_must_take_two_endpoints():
    with pytest.raises(HookError, match="two positional arguments"):
        conduit.register_delivery(input="ExperienceBuffer", output="Learner")(lambda x: x)


def test_module_level_hooks_drive_the_default_runtime():
    seen = []

    @conduit.register_ingestion(input="Actor", output="ExperienceBuffer")
    def ingest(actor_in, exp_out):
        d = actor_in.read()
        seen.append(d["tid"].tolist())
        exp_out.write({**d, "reward": d["reward"] * 2})

    @conduit.register_delivery(input="ExperienceBuffer", output="Learner")
    def deliver(exp_in, learn_out):
        d = exp_in.read()
        learn_out.write({**d, "obs": d["obs"] + 100})

    edp = conduit.init(policy="off_policy", train_batch_size=4, capacity=16, seed=0)
    conduit.push(transitions(8))
    conduit.default_runtime().flush()
    b = conduit.pull()
    assert seen == [list(range(8))]
    assert torch.all(b["reward"] == 2)
    assert torch.all(b["obs"] == b["tid"].float().unsqueeze(1) + 100)
    assert edp is conduit.default_runtime()
    conduit.shutdown()
    assert edp.closed


def test_runtime_bound_hooks_are_separate_from_module_level_ones():
    @conduit.register_ingestion(input="Actor", output="ExperienceBuffer")
    def module_hook(actor_in, exp_out):  # pragma: no cover - must not run
        raise AssertionError("module-level hook used by a private runtime")

    with Conduit(policy="off_policy", train_batch_size=2, capacity=8) as edp:
        edp.push(transitions(4))
        edp.flush()
        assert edp.pull().size == 2


def test_unregistered_hooks_are_the_identity():
    with Conduit(policy="off_policy", train_batch_size=4, capacity=8, seed=0) as edp:
        data = transitions(8)
        edp.push(data)
        edp.flush()
        b = edp.pull()
        assert torch.equal(b["obs"], data["obs"][b["tid"]])


def test_an_ingestion_hook_may_filter_rows_out():
    edp = Conduit(policy="off_policy", train_batch_size=2, capacity=16)

    @edp.register_ingestion(input="Actor", output="ExperienceBuffer")
    def keep_even(actor_in, exp_out):
        d = actor_in.read()
        mask = d["tid"] % 2 == 0
        if mask.any():
            exp_out.write({k: v[mask] for k, v in d.items()})

    with edp:
        edp.push(transitions(6))
        edp.push({k: v[1:2] for k, v in transitions(6).items()})  # tid 1 only: filtered whole
        edp.flush()
        assert edp.stats().ingested_rows == 3
        assert sorted(edp.buffer.contents()["tid"].tolist()) == [0, 2, 4]


def test_registering_after_start_is_refused():
    edp = Conduit(policy="off_policy", train_batch_size=2, capacity=8)
    with edp:
        edp.push(transitions(2))
        with pytest.raises(HookError, match="register hooks before the first push/pull"):
            edp.register_ingestion(input="Actor", output="ExperienceBuffer")(lambda a, b: None)


def test_delivery_hook_that_changes_row_count_is_an_error():
    edp = Conduit(policy="off_policy", train_batch_size=4, capacity=8, pinned=conduit.Schedule(
        conduit.Mode(False, 1), conduit.Mode(False, 1)))

    @edp.register_delivery(input="ExperienceBuffer", output="Learner")
    def halve(exp_in, learn_out):
        d = exp_in.read()
        learn_out.write({k: v[:2] for k, v in d.items()})

    with edp:
        edp.push(transitions(8))
        with pytest.raises(conduit.RuntimeFailed, match="must keep one output row per input row"):
            edp.pull()


@pytest.mark.parametrize("overlap,g", [(False, 1), (True, 1), (True, 2)])
def test_a_delivery_hook_attaches_one_object_to_each_batch_it_writes(overlap, g):
    """``write(data, attach=obj)``: the learner gets ``obj`` as ``batch.info.attachment`` with that very batch, however
    many batches one invocation draws (a framework builds its own batch type on the delivery worker)."""
    edp = Conduit(policy="off_policy", train_batch_size=4, capacity=32, seed=0, pinned=conduit.Schedule(
        conduit.Mode(False, 1), conduit.Mode(overlap, g)))

    @edp.register_delivery(input="ExperienceBuffer", output="Learner")
    def per_batch(exp_in, learn_out):
        d = exp_in.read()
        for start in range(0, len(d["tid"]), 4):
            part = {k: v[start : start + 4] for k, v in d.items()}
            learn_out.write(part, attach={"tids": part["tid"].tolist()})

    with edp:
        edp.push(transitions(32))
        edp.flush()
        for _ in range(5):
            b = edp.pull()
            assert b.info.attachment == {"tids": b["tid"].tolist()}


def test_attachments_need_one_write_per_batch_and_a_delivery_hook():
    edp = Conduit(policy="off_policy", train_batch_size=2, capacity=16, seed=0, pinned=conduit.Schedule(
        conduit.Mode(False, 1), conduit.Mode(False, 2)))

    @edp.register_delivery(input="ExperienceBuffer", output="Learner")
    def whole(exp_in, learn_out):  # two batches' rows in one write, with one object
        learn_out.write(exp_in.read(), attach="both")

    with edp:
        edp.push(transitions(8))
        with pytest.raises(conduit.RuntimeFailed, match="one training batch per write"):
            edp.pull()

    edp = Conduit(policy="off_policy", train_batch_size=2, capacity=16)

    @edp.register_ingestion(input="Actor", output="ExperienceBuffer")
    def tag(actor_in, exp_out):
        exp_out.write(actor_in.read(), attach="rows")

    with edp:
        with pytest.raises(conduit.RuntimeFailed, match="only a delivery hook attaches"):
            edp.push(transitions(4))
            edp.flush()
