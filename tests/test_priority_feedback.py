"""A priority update names its batch the way the framework does: the batch, its slot indices, or nothing.

RLlib updates "the last sampled batch"; SRL and cpprb pass the sampled indices back. Either way the update must
land on the transitions that batch drew (their ids), once, and never on rows written into those slots since.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conduit import Conduit, Mode, Schedule, SemanticsError
from conduit.paths.replay import AWAITING
from tests.helpers import transitions


def prioritized(delivery: Mode = Mode(False, 1), **kw) -> Conduit:
    cfg = dict(policy="off_policy", train_batch_size=4, capacity=16, seed=5, sampler="prioritized", timeout_s=10.0)
    cfg.update(kw)
    return Conduit(pinned=Schedule(Mode(False, 1), delivery), **cfg)


def leaves_of(edp: Conduit, slots: np.ndarray) -> np.ndarray:
    leaves, _ = edp.buffer.priorities_at(slots)
    return leaves


@pytest.mark.parametrize("delivery", [Mode(False, 1), Mode(True, 1)], ids=str)
def test_no_batch_named_is_the_newest_delivered_batch_still_awaiting_its_update(delivery):
    """Prefetched batches not yet delivered do not await; each delivered batch takes one update."""
    with prioritized(delivery) as edp:
        edp.push(transitions(16))
        a, b = edp.pull(), edp.pull()
        assert edp.update_priorities(None, torch.full((4,), 7.0)) == 4
        assert np.allclose(leaves_of(edp, np.unique(b.info.indices)), 7.0 ** 0.6)
        assert edp.update_priorities(None, torch.full((4,), 3.0)) == 4  # then a, the one still awaiting
        assert np.allclose(leaves_of(edp, np.setdiff1d(a.info.indices, b.info.indices)), 3.0 ** 0.6)
        with pytest.raises(SemanticsError, match="no delivered batch awaits priorities"):
            edp.update_priorities(None, torch.ones(4))


def test_slot_indices_name_the_newest_awaiting_batch_that_drew_them_and_keep_its_generation_check():
    with prioritized() as edp:
        edp.push(transitions(16))
        first = edp.pull()
        slots = np.array(first.info.indices)  # what a framework keeps: a plain copy of the indices
        edp.push(transitions(16, start=16))  # every slot holds a new row since the draw
        assert edp.update_priorities(slots, np.full(4, 5.0)) == 0  # nothing lands on the new rows
        # a repeat names the same batch again (SRL's trainer repeats an entry's update as it stops; cpprb takes any):
        # still generation-checked; slots no kept batch drew are refused
        assert edp.update_priorities(slots, np.full(4, 5.0)) == 0
        with pytest.raises(SemanticsError, match="no delivered batch drew these 4 slots"):
            edp.update_priorities(np.array([15, 15, 15, 15]), np.full(4, 5.0))
        b = edp.pull()
        assert edp.update_priorities(np.array(b.info.indices), np.full(4, 2.0)) == 4


def test_a_batch_updated_by_name_awaits_no_more_and_the_list_is_bounded():
    with prioritized(capacity=64, train_batch_size=2) as edp:
        edp.push(transitions(64))
        a, b = edp.pull(), edp.pull()
        edp.update_priorities(b, torch.ones(2))
        assert edp.update_priorities(None, torch.full((2,), 9.0)) == 2  # a, not b again
        only_a = np.setdiff1d(a.info.indices, b.info.indices)
        assert np.allclose(leaves_of(edp, only_a), 9.0 ** 0.6) and only_a.size
        edp.update_priorities(b, torch.ones(2))  # an explicit batch may be updated again
        with pytest.raises(SemanticsError):
            edp.update_priorities(None, torch.ones(2))
        for _ in range(AWAITING + 6):
            edp.pull()
        for _ in range(AWAITING):
            edp.update_priorities(None, torch.ones(2))
        with pytest.raises(SemanticsError):
            edp.update_priorities(None, torch.ones(2))


def test_what_a_delivery_hook_attached_is_not_kept_for_the_update():
    """The awaiting list keeps provenance, not the hook's object (whose batch memory goes back when dropped)."""
    edp = prioritized()

    @edp.register_delivery(input="ExperienceBuffer", output="Learner")
    def attach(exp_in, learn_out):
        learn_out.write(exp_in.read(), attach=object())

    with edp:
        edp.push(transitions(16))
        b = edp.pull()
        assert b.info.attachment is not None
        assert all(info.attachment is None for info in edp.delivery.awaiting)
        assert edp.update_priorities(None, torch.ones(4)) == 4


@pytest.mark.parametrize("bad", [[1.0, float("nan"), 1.0, 1.0], [1.0, -1.0, 1.0, 1.0], [1.0, 1.0]], ids=str)
def test_a_refused_update_leaves_its_batch_awaiting(bad):
    """The priorities are checked before the batch stops awaiting: the corrected retry lands on the same batch."""
    with prioritized() as edp:
        edp.push(transitions(16))
        a, b = edp.pull(), edp.pull()
        with pytest.raises(ValueError):
            edp.update_priorities(None, np.array(bad))
        with pytest.raises(ValueError, match="beta"):
            edp.update_priorities(None, torch.ones(4), beta=2.0)
        assert edp.update_priorities(None, torch.full((4,), 7.0)) == 4  # b, as the refused calls meant
        assert np.allclose(leaves_of(edp, np.unique(b.info.indices)), 7.0 ** 0.6)
        assert [i.pull_index for i in edp.delivery.awaiting if not i.rows.fed_back] == [a.info.pull_index]


def test_a_batch_of_another_buffer_is_refused_and_this_buffers_batch_keeps_awaiting():
    """Two runtimes' batches share slot numbers, pull indices and ids: an update names its buffer's rows only."""
    with prioritized() as demos, prioritized() as online:
        demos.push(transitions(16))
        online.push(transitions(16, start=100))
        theirs, mine = demos.pull(), online.pull()
        before = leaves_of(online, np.unique(mine.info.indices))
        with pytest.raises(SemanticsError, match="another replay buffer"):
            online.update_priorities(theirs, torch.full((4,), 50.0))
        assert np.allclose(leaves_of(online, np.unique(mine.info.indices)), before)
        assert online.update_priorities(None, torch.full((4,), 3.0)) == 4  # its own batch still awaited


def test_a_batch_restored_from_a_checkpoint_belongs_to_the_restored_buffer(tmp_path):
    """The lineage travels with the checkpoint: a restored runtime takes the saved one's batches' updates."""
    with prioritized() as edp:
        edp.push(transitions(16))
        b = edp.pull()
        edp.save(tmp_path / "ckpt")
    with prioritized() as again:
        again.restore(tmp_path / "ckpt")
        assert again.update_priorities(b, torch.full((4,), 6.0)) == 4
        assert np.allclose(leaves_of(again, np.unique(b.info.indices)), 6.0 ** 0.6)


def test_update_priorities_without_prioritized_replay_says_so():
    """Not 'pull a batch first' after a pull: the sampler is what cannot take priorities."""
    with Conduit(policy="off_policy", train_batch_size=4, capacity=16, seed=5, timeout_s=10.0) as edp:
        edp.push(transitions(16))
        b = edp.pull()
        for key in (None, np.array(b.info.indices), b):
            with pytest.raises(SemanticsError, match="sampler='prioritized'"):
                edp.update_priorities(key, torch.ones(4))
