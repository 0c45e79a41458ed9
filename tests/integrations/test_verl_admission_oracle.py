"""Conduit's admission sampler against verl's own samplers as the oracle, on real TransferQueue.

Each scenario writes the same prompt tags and trajectories to TransferQueue (as
verl's agent loop writes them), runs verl's ``ReplayBuffer`` (sync) or
``ReplayBufferAsync`` (async) through the same calls, records which uids each
call delivered, how many prompts each refilled and what is left in the queue
(what it evicted), wipes the queue, writes the same state again and runs
Conduit's ``ConduitAdmissionBuffer``. The two records must be equal. Where
Conduit is stricter than verl (a finished group of the wrong size, a uid
offered again) the test names the verl behaviour it is compared with.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")

from conduit.integrations.verl.sampler import ConduitAdmissionBuffer
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

from conduit import ConfigError

N = 2  # rollout.n
KW = {"group_size": N, "mini_batch_groups": 1, "dp_size": 2, "batch_groups": 4, "poll_interval": 0.01,
      "timeout_s": 15}

pytestmark = pytest.mark.timeout(120)


def put_group(tq, uid: str, step: int, status: str, rows: int = N) -> None:
    """A prompt's tag and, once terminal, its trajectories ``{uid}_{session}_0``, as verl's agent loop writes them."""
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    if status in ("finished", "failure") and rows:
        keys = [f"{uid}_{s}_0" for s in range(rows)]
        fields = list_of_dict_to_tensordict([{"input_ids": torch.arange(4) + s} for s in range(rows)])
        tags = [{"status": "success", "global_steps": step, "seq_len": 4, "data_source": "gsm8k"} for _ in keys]
        tq.kv_batch_put(keys=keys, partition_id="train", fields=fields, tags=tags)
    tq.kv_put(key=uid, partition_id="train", fields=None,
              tag={"is_prompt": True, "status": status, "global_steps": step})


def wipe(tq) -> None:
    for partition, items in (tq.kv_list() or {}).items():
        if items:
            tq.kv_clear(keys=list(items), partition_id=partition)


class Refill:
    """verl's ``refill_fn``: ``k`` fresh prompts, registered pending at the current step (``_submit_batch_to_rollout``)."""

    def __init__(self, tq) -> None:
        self.tq, self.step, self.calls = tq, 0, []

    def __call__(self, k: int) -> int:
        self.calls.append(k)
        for i in range(k):
            put_group(self.tq, f"refill{len(self.calls)}x{i}", self.step, "pending")
        return k


def verl_sampler(mode: str, thr, strategy: str):
    cls = ReplayBuffer if mode == "sync" else ReplayBufferAsync
    return lambda refill: cls(mode, {}, thr, strategy, {}, poll_interval=0.01, refill_fn=refill)


def conduit_sampler(mode: str, thr, strategy: str, **kw):
    return lambda refill: ConduitAdmissionBuffer(mode, {}, thr, strategy, {**KW, **kw}, refill_fn=refill)


def play(tq, make, state, calls, later=()) -> tuple:
    """Write ``state`` [(uid, step, status, rows)], run ``calls`` [(step, batch_size)] on a fresh sampler.

    ``later`` [(delay_s, uid, step, status, rows)] is written by a thread while the calls run. Returns, per call,
    (step, delivered uids, rows, whether every ``later`` write had happened), the refills, and the prompts left.
    """
    wipe(tq)
    for g in state:
        put_group(tq, *g)
    refill = Refill(tq)
    sampler = make(refill)
    done = threading.Event()

    def writer() -> None:
        t0 = time.monotonic()
        for delay, *g in later:
            time.sleep(max(0.0, t0 + delay - time.monotonic()))
            put_group(tq, *g)
        done.set()

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    out = []
    try:
        for step, size in calls:
            refill.step = step
            batch, _ = sampler.sample(step, "train", size)
            out.append((step, sorted({k.split("_")[0] for k in batch.keys}), len(batch.keys), done.is_set()))
    finally:
        t.join(30)
    left = {k: tag["status"] for k, tag in (tq.kv_list() or {}).get("train", {}).items() if tag.get("is_prompt")}
    wipe(tq)
    return out, refill.calls, left


def same(tq, mode, thr, strategy, state, calls, later=(), verl_state=None) -> tuple:
    """verl's record and Conduit's on the same state and calls: asserted equal, verl's returned."""
    want = play(tq, verl_sampler(mode, thr, strategy), verl_state or state, calls, later)
    got = play(tq, conduit_sampler(mode, thr, strategy), state, calls, later)
    assert got == want
    return want


# -- 2. staleness: verl's span and strategy ---------------------------------------------------------------------


@pytest.mark.parametrize("thr", [2, 3])
def test_drop_evicts_exactly_what_verl_evicts_at_the_boundary(tq_clean, thr: int) -> None:
    """At step 5 with threshold ``thr``: the group whose span is ``thr + 1`` is evicted (and refilled), by both."""
    step = 5
    state = [("edge", step - thr, "finished", N),  # span thr + 1: stale by one version
             ("fresh0", step - thr + 1, "finished", N), ("fresh1", step - thr + 1, "finished", N),
             ("now0", step, "finished", N), ("now1", step, "finished", N)]
    out, refills, left = same(tq_clean, "separate_async", thr, "drop", state, [(step, 2), (step, 2)])
    assert [o[1] for o in out] == [["fresh0", "fresh1"], ["now0", "now1"]] and refills == [1]
    assert "edge" not in left  # evicted from the queue


def test_wait_keeps_the_stale_group_for_training_and_blocks_on_an_old_inflight_group(tq_clean) -> None:
    """verl's dropless ``wait``: nothing evicted for staleness; sampling waits for the in-flight group at the bound."""
    step = 5
    state = [("old", 2, "finished", N), ("now", step, "finished", N), ("late", 4, "running", 0)]
    later = [(0.3, "late", 4, "finished", N)]
    out, refills, left = same(tq_clean, "separate_async", 2, "wait", state, [(step, 2)], later)
    assert out == [(step, ["late", "old"], 2 * N, True)]  # blocked until "late" finished; "old" trained, not lost
    assert refills == [] and left == {"now": "finished"}


# -- 3. whole groups of rollout.n: failed and short groups ------------------------------------------------------


def test_a_failed_group_is_evicted_and_refilled_as_verls_async_buffer_does(tq_clean) -> None:
    state = [("0fail", 1, "failure", 1), ("b", 1, "finished", N), ("c", 1, "finished", N), ("d", 1, "running", 0)]
    out, refills, left = same(tq_clean, "separate_async", None, "drop", state, [(1, 2)])
    assert out == [(1, ["b", "c"], 2 * N, True)] and refills == [1] and "0fail" not in left


def test_a_short_finished_group_is_never_delivered_it_is_evicted_like_a_failed_one(tq_clean) -> None:
    """A finished group of N - 1 trajectories (an empty session): 3 rows would not split over dp=2. Conduit treats
    it as verl's async buffer treats a failed group (the oracle: the same state with that group marked failed)."""
    state = [("0short", 1, "finished", N - 1), ("b", 1, "finished", N), ("c", 1, "finished", N), ("d", 1, "running", 0)]
    as_failed = [("0short", 1, "failure", N - 1), *state[1:]]
    out, refills, left = same(tq_clean, "separate_async", None, "drop", state, [(1, 2)], verl_state=as_failed)
    assert out[0][2] % 2 == 0 and out[0][1] == ["b", "c"] and refills == [1] and "0short" not in left


def test_verls_own_sampleable_count_and_wait_see_the_same_rules(tq_clean) -> None:
    """separate_async's hybrid switch calls ``get_sampleable_count`` / ``wait_for_sampleable`` (verl's code) on the
    custom sampler: they go through the same eviction rules (a short group counted as verl counts a failed one)."""
    state = [("edge", 3, "finished", N), ("fail", 5, "failure", 1), ("short", 5, "finished", N - 1),
             ("a", 4, "finished", N), ("b", 5, "finished", N)]
    as_failed = [*state[:2], ("short", 5, "failure", N - 1), *state[3:]]
    counts = []
    for make, st in ((verl_sampler("separate_async", 2, "drop"), as_failed),
                     (conduit_sampler("separate_async", 2, "drop"), state)):
        wipe(tq_clean)
        for g in st:
            put_group(tq_clean, *g)
        refill = Refill(tq_clean)
        refill.step = 5
        buf = make(refill)
        counts.append(buf.get_sampleable_count(5, "train"))
        uids, _ = buf.wait_for_sampleable(5, "train", 2)
        left = {k for k, t in (tq_clean.kv_list() or {}).get("train", {}).items() if t.get("is_prompt")}
        counts.append((sorted(uids), refill.calls, sorted(left)))
    assert counts[:2] == counts[2:]
    assert counts[:2] == [2, (["a", "b"], [3], ["a", "b", "refill1x0", "refill1x1", "refill1x2"])]


def test_sync_delivers_a_failed_group_as_verls_sync_sampler_does(tq_clean) -> None:
    """verl's sync trainer cannot refill part of a batch (it fetches prompts a train batch at a time): its sampler
    hands a failed group over and pads it downstream. Conduit's sync sampler is verl's there too."""
    state = [("a", 1, "finished", N), ("b", 1, "failure", 1), ("c", 1, "finished", N), ("d", 1, "finished", N)]
    out, refills, left = same(tq_clean, "sync", 8, "drop", state, [(1, 4)])
    assert out == [(1, ["a", "b", "c", "d"], 3 * N + 1, True)] and refills == [] and left == {}


def test_a_group_with_more_than_n_trajectories_is_refused(tq_clean) -> None:
    put_group(tq_clean, "big", 1, "finished", N + 1)
    put_group(tq_clean, "b", 1, "finished", N)
    buf = ConduitAdmissionBuffer("separate_async", {}, None, "drop", KW, refill_fn=Refill(tq_clean))
    with pytest.raises(ValueError, match="more than group_size"):
        buf.sample(1, "train", 2)


def test_a_sync_batch_verl_samples_is_accepted_whatever_the_admission_unit(tq_clean) -> None:
    """Sync hands the step over whole (verl's ``ReplayBuffer``): a train batch of 3 groups is taken as verl takes
    it, though admission units (async only) would be lcm(dp=2, 2 x 2 rows) = 2 groups (it was refused)."""
    state = [(u, 1, "finished", N) for u in "abc"]
    out, _, _ = same(tq_clean, "sync", 8, "drop", state, [(1, 3)])
    assert out[0][1] == ["a", "b", "c"]
    ConduitAdmissionBuffer("sync", {}, None, "drop", {**KW, "mini_batch_groups": 2, "batch_groups": 3})


def test_async_samples_of_partial_units_are_refused_at_construction() -> None:
    """parameter_sync_step samples per step, each batch_groups / parameter_sync_step groups: refused when that is not
    whole admission units, at construction (it raised at the first sample, after a generation)."""
    kw = {**KW, "group_size": 1, "dp_size": 8, "mini_batch_groups": 4, "batch_groups": 16}
    with pytest.raises(ConfigError, match=r"parameter_sync_step=4.*admission units of 8"):
        ConduitAdmissionBuffer("separate_async", {"parameter_sync_step": 4}, None, "drop", kw)
    ConduitAdmissionBuffer("separate_async", {"parameter_sync_step": 2}, None, "drop", kw)


def test_a_timeout_over_groups_short_of_group_size_names_them(tq_clean) -> None:
    """A group_size above the rollout's n: every finished group is short, evicted and refilled until the timeout,
    which says so (it named nothing)."""
    for u in "ab":
        put_group(tq_clean, u, 1, "finished", N)
    buf = ConduitAdmissionBuffer("separate_async", {}, None, "drop", {**KW, "group_size": N + 1, "timeout_s": 1.0},
                                 refill_fn=Refill(tq_clean))
    with pytest.raises(TimeoutError, match=rf"evicted as failed or short of group_size={N + 1}.*rollout's n"):
        buf.sample(1, "train", 2)


def test_sample_dumps_for_verls_rollout_skip_as_verls_own_sample(tq_clean) -> None:
    """verl's ``skip.rollout_tq`` dumps each sampled batch through the decorator on its ``sample``: Conduit's has it."""
    from verl.utils.skip.skip_manager import SkipManager

    class Recorder:  # verl's RolloutTqSkip, recording what it would dump
        steps = (1,)

        def __init__(self) -> None:
            self.saved: list[tuple[int, int]] = []

        def is_enabled(self) -> bool:
            return True

        def should_save(self, step: int, partition_id: str = "train") -> bool:
            return True

        def prepare_data(self, step: int, batch: Any, global_steps: int) -> None:
            self.saved.append((step, len(batch.keys)))

    saved = []
    kept = SkipManager.skip_instances, SkipManager.step
    try:
        for make in (lambda: ReplayBufferAsync("separate_async", {}, None, "drop", {}, poll_interval=0.01),
                     lambda: ConduitAdmissionBuffer("separate_async", {}, None, "drop",
                                                    {**KW, "dp_size": 1, "batch_groups": 2})):
            wipe(tq_clean)
            recorder = Recorder()
            SkipManager.skip_instances, SkipManager.step = {"rollout_tq": recorder}, 1
            for u in "ab":
                put_group(tq_clean, u, 1, "finished", N)
            make().sample(1, "train", 2)
            saved.append(recorder.saved)
    finally:
        SkipManager.skip_instances, SkipManager.step = kept
    assert saved[0] == saved[1] == [(1, 2 * N)]


# -- 4. sync stays on-policy: what verl's trainer does with what ``sample`` returns -------------------------------


def trainer_steps(tq, make, mode: str, sync_steps: int, steps: int = 2) -> list:
    """verl's own ``PPOTrainer.step`` (``parameter_sync_step`` samples of ``train_batch_size / parameter_sync_step``);
    each step submits 4 prompts; two finish at once, the other two once the first sample returned (or after 0.5 s)."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1 import PPOTrainerSync
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    wipe(tq)
    tr = object.__new__(PPOTrainerSync)
    tr.config = OmegaConf.create({"data": {"train_batch_size": 4}})
    tr.parameter_sync_step = sync_steps
    tr.replay_buffer = make(Refill(tq))
    first_back = threading.Event()
    record: list = []
    writers: list[threading.Thread] = []

    def prepare_step() -> dict:  # verl's _submit_batch_to_rollout + a generation that finishes out of order
        s = tr.global_steps
        uids = [f"s{s}{c}" for c in "abcd"]
        for u in uids:
            put_group(tq, u, s, "pending")
        first_back.clear()

        def generate() -> None:
            for u in (uids[2], uids[0]):
                put_group(tq, u, s, "finished")
            first_back.wait(0.5)
            for u in (uids[3], uids[1]):
                put_group(tq, u, s, "finished")

        writers.append(threading.Thread(target=generate, daemon=True))
        writers[-1].start()
        return {}

    def step_once(metrics: dict, timing_raw: dict, sample_batch_size: int):
        batch, _ = tr.replay_buffer.sample(tr.global_steps, "train", sample_batch_size)
        record.append((tr.global_steps, sorted({k.split("_")[0] for k in batch.keys})))
        first_back.set()
        return batch

    tr.prepare_step, tr._step_once = prepare_step, step_once
    for s in range(1, steps + 1):
        tr.global_steps = s
        batch = PPOTrainer.step(tr, {}, {})
        tq.kv_clear(keys=batch.keys, partition_id="train")  # as verl's fit does after the step
        writers[-1].join(10)
    wipe(tq)
    return record


def test_sync_trains_each_steps_groups_at_that_step_as_verls_sampler(tq_clean) -> None:
    want = trainer_steps(tq_clean, verl_sampler("sync", 8, "drop"), "sync", 1)
    got = trainer_steps(tq_clean, conduit_sampler("sync", 8, "drop"), "sync", 1)
    assert got == want == [(1, ["s1a", "s1b", "s1c", "s1d"]), (2, ["s2a", "s2b", "s2c", "s2d"])]


def test_async_early_mini_batches_belong_to_their_step_as_verls(tq_clean) -> None:
    """separate_async, parameter_sync_step=2: the first mini-batch goes while half the step still generates."""
    want = trainer_steps(tq_clean, verl_sampler("separate_async", 2, "drop"), "separate_async", 2)
    got = trainer_steps(tq_clean, conduit_sampler("separate_async", 2, "drop"), "separate_async", 2)
    assert got == want == [(1, ["s1a", "s1c"]), (1, ["s1b", "s1d"]), (2, ["s2a", "s2c"]), (2, ["s2b", "s2d"])]


# -- 1. exactly once per uid: across calls, steps and restarts --------------------------------------------------


def test_a_uid_offered_again_after_delivery_is_refused_not_delivered_twice(tq_clean) -> None:
    for u in ("a", "b", "c", "d"):
        put_group(tq_clean, u, 1, "finished")
    buf = ConduitAdmissionBuffer("separate_async", {}, None, "drop", KW, refill_fn=Refill(tq_clean))
    first, _ = buf.sample(1, "train", 2)
    assert sorted({k.split("_")[0] for k in first.keys}) == ["a", "b"]
    put_group(tq_clean, "a", 1, "finished")  # its prompt tag comes back (verl's sampler would deliver it again)
    with pytest.raises(ValueError, match="already admitted"):
        buf.sample(1, "train", 2)


def test_an_interrupted_sample_delivers_nothing_and_a_restart_delivers_each_group_once(tq_clean) -> None:
    kw = {**KW, "timeout_s": 0.2}
    put_group(tq_clean, "a", 1, "finished")
    put_group(tq_clean, "b", 1, "running")
    buf = ConduitAdmissionBuffer("separate_async", {}, None, "drop", kw, refill_fn=Refill(tq_clean))
    with pytest.raises(TimeoutError):
        buf.sample(1, "train", 2)  # one of two: nothing handed over, nothing committed
    put_group(tq_clean, "b", 1, "finished")
    got, _ = buf.sample(1, "train", 2)
    assert sorted({k.split("_")[0] for k in got.keys}) == ["a", "b"] and buf.admission.total == 2
    for u in ("c", "d"):
        put_group(tq_clean, u, 1, "finished")
    fresh = ConduitAdmissionBuffer("separate_async", {}, None, "drop", kw, refill_fn=Refill(tq_clean))  # a restart
    again, _ = fresh.sample(1, "train", 2)
    assert sorted({k.split("_")[0] for k in again.keys}) == ["c", "d"]


# -- the documented plug-in path ---------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:.*load_extern_type.*:FutureWarning")
def test_the_documented_custom_sampler_path_resolves_as_verls_loader_does() -> None:
    """``trainer.v1.sampler.custom_sampler.path=pkg://conduit.integrations.verl.sampler`` (the package's docstring),
    through verl's own ``load_extern_type`` (pkg:// -> import the module, getattr the name) and verl's builder."""
    import re

    import conduit.integrations.verl as pkg
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1 import PPOTrainerSeparateAsync, PPOTrainerSync
    from verl.utils.import_utils import load_extern_object

    path = re.search(r"custom_sampler\.path=(\S+)", pkg.__doc__).group(1)
    name = re.search(r"custom_sampler\.name=(\S+)", pkg.__doc__).group(1)
    assert path == "pkg://conduit.integrations.verl.sampler"
    cls = load_extern_object(path, name)  # what verl's (deprecated) load_extern_type calls
    assert cls is ConduitAdmissionBuffer and issubclass(cls, ReplayBufferAsync)
    for mode, trainer_cls in (("sync", PPOTrainerSync), ("separate_async", PPOTrainerSeparateAsync)):
        tr = object.__new__(trainer_cls)
        tr.trainer_mode = mode
        tr.config = OmegaConf.create({"trainer": {"v1": {mode: {}, "sampler": {
            "max_off_policy_threshold": 2, "max_off_policy_strategy": "wait",
            "custom_sampler": {"path": path, "name": name}, "sampler_kwargs": KW}}}})
        buf = trainer_cls._build_replay_buffer(tr)
        assert type(buf) is ConduitAdmissionBuffer
        cfg = buf.admission.config
        assert (cfg.on_policy, cfg.max_staleness, cfg.strategy) == (mode == "sync", 2, "wait")
