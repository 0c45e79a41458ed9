"""Several learners, one sharded buffer: DQN/SAC's replay over the learner actors.

With ``num_learners >= 2`` (off-policy, bounded mode) each learner actor holds a
shard of one Experience Buffer, a rank of :mod:`conduit.distributed` over the
process group RLlib's learner group already forms (gloo on CPU, NCCL where the
learners are on GPUs; the shard builds its own groups over it). The algorithm's
``training_step`` keeps RLlib's order and replaces only the buffer's three calls
(see docs/rllib.md and docs/design.md, "What each adapter maps"):

1. sample the env runners (RLlib's ``synchronous_parallel_sample``), fold each
   step into an n-step row on the driver (:class:`~.nstep.NStepFolder`: the
   episodes' open tails must meet in one place) and hand every learner the rows
   through Ray's object store; the rows are dealt round-robin over the learners,
   each pushing its own, so every env step lands in exactly one shard (``add``);
2. every learner pulls its batch (``train_batch_size_per_learner`` rows) with one
   buffer's distribution over every shard (``sampling="global"``, collective) or
   from its own shard (``"local"``), then runs RLlib's own ``Learner.update`` on
   it: DDP's all-reduce keeps the learners' weights equal (``sample`` + ``update``);
3. each learner sends its TD errors to the shards that hold the rows
   (``update_priorities``), then the env runners get the new weights as in RLlib.

Only public RLlib calls drive the learners (``LearnerGroup.foreach_learner``);
each learner keeps its shard in its own ``__dict__`` under :data:`SHARD`. Every
collective is bounded by the options' ``timeout_s``, and a learner actor that
dies makes the next call raise :class:`conduit.RuntimeFailed` naming it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils import force_list
from ray.rllib.utils.metrics import TD_ERROR_KEY
from ray.rllib.utils.numpy import convert_to_numpy

import conduit
from conduit import RuntimeFailed, SemanticsError
from conduit.ext import NStepFolder

from .bounded_store import learner_columns
from .episodes import LEARNER_COLUMNS, chunk_from_episode

__all__ = ["SHARD", "SHARD_DIR", "ShardedReplay", "shard_settings", "training_step", "wants_shards"]

#: where a learner keeps its shard (``learner.__dict__[SHARD]``)
SHARD = "conduit_shard"
#: the shards' directory inside an algorithm checkpoint
SHARD_DIR = "conduit_shards"


def wants_shards(config: Any) -> bool:
    """Whether an algorithm with this config shards its buffer over the learners: ``sharded`` as
    ``enable_conduit`` was told, by default with two or more learner actors in the bounded mode."""
    rb = getattr(config, "replay_buffer_config", None) or {}
    opts = rb.get("conduit") if isinstance(rb, dict) else None
    if not opts:
        return False
    sharded = opts.get("sharded")
    if sharded is None:
        return config.num_learners >= 2 and opts.get("staleness", "bounded") == "bounded"
    if sharded and config.num_learners < 2:
        raise conduit.ConfigError(
            f"enable_conduit: sharded=True needs num_learners >= 2 (the config has {config.num_learners}); "
            "with one learner the buffer lives in the algorithm's process"
        )
    return bool(sharded)


def shard_settings(config: Any) -> dict[str, Any]:
    """What every learner's shard is built from (plain values: it travels to the actors)."""
    rb = dict(config.replay_buffer_config)
    opts = dict(rb.get("conduit") or {})
    seed = opts.get("seed") if opts.get("seed") is not None else config.seed
    return {
        "capacity": int(rb.get("capacity", 50_000)),
        "prioritized": "Prioritized" in str(rb.get("type", "")),
        "alpha": float(rb.get("alpha", 0.6)),
        "beta": float(rb.get("beta") if rb.get("beta") is not None else 0.4),
        "batch_size": int(config.train_batch_size_per_learner),
        "n_step": int(config.n_step),
        "sampling": str(opts.get("sampling", "global")),
        "seed": seed,
        "timeout_s": float(opts.get("timeout_s", 60.0)),
    }


# -- what runs in each learner actor ------------------------------------------------------------
class _Shard:
    """One learner's rank of the sharded buffer and the learner-side steps of ``training_step``."""

    def __init__(self, settings: dict[str, Any]) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise SemanticsError("the sharded buffer needs the learner group's process group (num_learners >= 2)")
        self.settings = settings
        self.n_step = int(settings["n_step"])
        self.prioritized = bool(settings["prioritized"])
        edp = conduit.distributed.Conduit(
            policy="off_policy", train_batch_size=settings["batch_size"], capacity=settings["capacity"],
            sampler="prioritized" if self.prioritized else "uniform",
            prioritized=conduit.PrioritizedReplay(alpha=settings["alpha"], beta=settings["beta"]),
            min_size_to_sample=settings["batch_size"], seed=settings["seed"], timeout_s=settings["timeout_s"],
            sampling=settings["sampling"],
        )
        n_step = self.n_step

        @edp.register_delivery(input="ExperienceBuffer", output="Learner")
        def to_learner(exp_in: conduit.Reader, learn_out: conduit.Writer) -> None:
            cols = learner_columns(exp_in.read(), exp_in.info.get("weights"), n_step)
            learn_out.write({k: cols[k] for k in LEARNER_COLUMNS})

        self.edp = edp.start()
        self.rank, self.world = edp.rank, edp.world
        self.sampled = 0  # rows this learner pulled since its shard started

    def push(self, rows: dict[str, np.ndarray], first: int) -> int:
        """Push this rank's rows of a driver's batch: row ``i`` is the group's row ``first + i``, dealt round-robin."""
        n = len(rows["rewards"])
        mine = (first + np.arange(n)) % self.world == self.rank
        count = int(mine.sum())
        if count:
            self.edp.push({k: v[mine] for k, v in rows.items()})
        return count

    def train(self, learner: Any, timesteps: dict[str, Any]) -> tuple[dict[str, Any], int, float, float]:
        """Pull, update, send the priorities; RLlib's results, the rows pulled, and the seconds the pull and the
        priority update took."""
        t0 = time.perf_counter()
        batch = self.edp.pull()
        pulled = time.perf_counter() - t0
        self.sampled += batch.size
        module_id = next(iter(learner.module.keys()))
        data = MultiAgentBatch({module_id: SampleBatch(dict(batch))}, env_steps=batch.size)
        results = learner.update(batch=data, timesteps=timesteps)
        td = []
        for module_results in results.values():
            if isinstance(module_results, dict) and TD_ERROR_KEY in module_results:
                found = module_results.pop(TD_ERROR_KEY)
                items = found.peek() if hasattr(found, "peek") else found
                td.extend(np.asarray(convert_to_numpy(x)).reshape(-1) for x in force_list(items))
        t0 = time.perf_counter()
        if self.prioritized and td:
            self.edp.update_priorities(batch, np.concatenate(td))
        return results, batch.size, pulled, time.perf_counter() - t0


def _start(learner: Any, settings: dict[str, Any]) -> int:
    learner.__dict__[SHARD] = shard = _Shard(settings)
    return shard.rank


def _shard(learner: Any) -> _Shard:
    shard = learner.__dict__.get(SHARD)
    if shard is None:
        raise SemanticsError("this learner holds no Conduit shard (the algorithm did not start the sharded buffer)")
    return shard


def _push(learner: Any, rows: Any, first: int) -> int:
    return _shard(learner).push(ray.get(rows) if isinstance(rows, ray.ObjectRef) else rows, first)


def _train(learner: Any, timesteps: dict[str, Any]) -> tuple[dict[str, Any], int, float, float]:
    return _shard(learner).train(learner, timesteps)


def _counts(learner: Any) -> dict[str, Any]:
    shard = _shard(learner)
    stats = shard.edp.stats()  # collective: the group's counters after moving what is in flight
    return {"rank": shard.rank, "stats": stats, "sampled": shard.sampled}


def _save(learner: Any, path: str) -> str:
    return str(_shard(learner).edp.save(path))


def _restore(learner: Any, path: str) -> int:
    """Load the shards into a fresh rank (collective): a learner that trained already closes its own first, as
    an algorithm restored in place drops the buffer it had."""
    old = _shard(learner)
    old.edp.close()
    learner.__dict__[SHARD] = shard = _Shard(old.settings)
    shard.edp.restore(path)
    return shard.rank


def _close(learner: Any) -> None:
    shard = learner.__dict__.pop(SHARD, None)
    if shard is not None:
        shard.edp.close()


# -- the driver's side ----------------------------------------------------------------------
class ShardedReplay:
    """The driver's handle on the learners' shards: what ``training_step`` calls instead of a buffer."""

    def __init__(self, algo: Any) -> None:
        config = algo.config
        if isinstance(config.n_step, tuple | list):
            raise conduit.ConfigError(
                f"enable_conduit: n_step={tuple(config.n_step)} is a random range; the sharded buffer folds a "
                "fixed n-step return at ingestion: use a fixed n_step"
            )
        self.group = algo.learner_group
        self.settings = shard_settings(config)
        self.timeout_s = float(self.settings["timeout_s"])
        self.folder = NStepFolder(int(config.n_step), float(config.gamma))
        self.added = 0
        self.pushed = 0
        self.sampled = 0  # rows the learners pulled
        #: the slowest learner's pull and priority update in the last ``train`` (RLlib's buffer timers)
        self.sample_s = self.update_prios_s = 0.0
        #: the totals logged so far (RLlib's per-iteration counts are what came since)
        self.logged: dict[str, int] = {}
        self.pull_s = 0.0
        self.learners = len(self.group)
        self.ranks = self._call(_start, "start", settings=self.settings)

    def _call(self, fn: Any, what: str, *, bound: float | None = None, **kwargs: Any) -> list[Any]:
        """``fn`` on every learner, bounded: the results in learner order, or RuntimeFailed naming the failed."""
        wait = bound if bound is not None else 2 * self.timeout_s + 10.0
        results = self.group.foreach_learner(fn, timeout_seconds=wait, **kwargs)
        got: dict[int, Any] = {}
        failed: dict[int, BaseException] = {}
        for r in results:
            if r.ok:
                got[r.actor_id] = r.get()
            else:
                failed[r.actor_id] = r.get()
        if failed:
            first = failed[min(failed)]
            raise RuntimeFailed(f"sharded buffer, {what} on learner actor(s) {sorted(failed)}",
                                first if isinstance(first, BaseException) else RuntimeError(str(first)))
        if len(got) < self.learners:
            silent = self.learners - len(got)
            late = TimeoutError(f"{silent} of {self.learners} learner actors gave no answer in {wait:.0f} s")
            raise RuntimeFailed(f"sharded buffer, {what}", late)
        return [got[k] for k in sorted(got)]

    # -- the buffer's three calls -------------------------------------------------------------
    def add(self, episodes: list[Any]) -> int:
        """Fold the episodes into rows and push each row into one shard; returns the rows pushed."""
        rows = self.folder.fold([chunk_from_episode(e) for e in episodes])
        self.added += sum(len(e) for e in episodes)
        if rows is None or not len(rows["rewards"]):
            return 0
        ref = ray.put(rows)
        n = sum(self._call(_push, "add", rows=ref, first=self.pushed))
        self.pushed += n
        return n

    def train(self, timesteps: dict[str, Any]) -> list[dict[str, Any]]:
        """Every learner pulls its batch and updates on it (RLlib's ``Learner.update``); their results.
        :attr:`pull_s` adds up the slowest learner's pull of each update (the learners wait for it)."""
        out = self._call(_train, "update", timesteps=timesteps)
        self.sampled += sum(rows for _, rows, _, _ in out)
        self.sample_s = max(pulled for _, _, pulled, _ in out)
        self.update_prios_s = max(prios for _, _, _, prios in out)
        self.pull_s += self.sample_s
        return [results for results, _, _, _ in out]

    # -- counters, checkpoints, lifecycle --------------------------------------------------------
    def shard_counts(self) -> list[dict[str, Any]]:
        """Per shard: its rank, the group's :class:`~conduit.distributed.DistributedStats` and the rows it
        sampled (collective over the learners)."""
        return self._call(_counts, "stats")

    def metrics(self) -> dict[str, Any]:
        """RLlib's ``replay_buffer/*`` counters, summed over the shards."""
        counts = self.shard_counts()
        stats = counts[0]["stats"]
        return {
            "num_env_steps_added": self.added,
            "num_env_steps_stored": int(sum(stats.shard_rows)),
            "num_env_steps_sampled": self.sampled,
            "num_env_steps_ingested": int(sum(stats.ingested_rows)),
        }

    def log_metrics(self, metrics: Any) -> None:
        """Log :meth:`metrics` under RLlib's ``replay_buffer`` key (at the iteration's end: it is collective),
        reduced as RLlib's buffer reduces them: steps added and sampled as the sums since the last iteration
        that sampled and as ``*_lifetime`` sums, the rows stored (and ingested) as they are now. As RLlib's,
        only an iteration that sampled the buffer reports them."""
        from ray.rllib.utils.metrics import REPLAY_BUFFER_RESULTS

        if self.sampled == self.logged.get("num_env_steps_sampled", 0):
            return
        totals = self.metrics()
        for key in ("num_env_steps_added", "num_env_steps_sampled"):
            since = totals.pop(key) - self.logged.get(key, 0)
            self.logged[key] = self.logged.get(key, 0) + since
            metrics.log_value((REPLAY_BUFFER_RESULTS, key), since, reduce="sum")
            metrics.log_value((REPLAY_BUFFER_RESULTS, f"{key}_lifetime"), since, reduce="lifetime_sum")
        for key, value in totals.items():
            metrics.log_value((REPLAY_BUFFER_RESULTS, key), value, reduce="item")

    def save(self, path: str | Path) -> None:
        target = str(Path(path) / SHARD_DIR)
        self._call(_save, "save", path=target)

    def restore(self, path: str | Path) -> None:
        source = Path(path) / SHARD_DIR
        if source.is_dir():
            self._call(_restore, "restore", path=str(source))

    def state(self) -> dict[str, Any]:
        return {"folder": self.folder.state(), "added": self.added, "pushed": self.pushed, "sampled": self.sampled,
                "logged": self.logged}

    def load(self, state: dict[str, Any]) -> None:
        self.folder.load(state["folder"])
        self.added, self.pushed = int(state["added"]), int(state["pushed"])
        self.logged = dict(state.get("logged", {}))
        self.sampled = int(state.get("sampled", self.logged.get("num_env_steps_sampled", 0)))

    def close(self) -> None:
        try:
            self.group.foreach_learner(_close, timeout_seconds=self.timeout_s)
        except Exception:  # (closing after a failure: the actors may be gone)
            pass



def training_step(algo: Any, shards: ShardedReplay) -> None:
    """DQN/SAC's new-stack ``training_step`` (RLlib 2.60's order, its metrics and timers), with the driver's
    buffer calls replaced by the learners' shards: rows to the shards, each learner pulling and updating,
    priorities sent where the rows live."""
    from ray.rllib.algorithms.dqn.dqn import calculate_rr_weights
    from ray.rllib.execution.rollout_ops import synchronous_parallel_sample
    from ray.rllib.utils.metrics import (
        ALL_MODULES,
        ENV_RUNNER_RESULTS,
        ENV_RUNNER_SAMPLING_TIMER,
        LEARNER_RESULTS,
        LEARNER_UPDATE_TIMER,
        NUM_AGENT_STEPS_SAMPLED_LIFETIME,
        NUM_ENV_STEPS_SAMPLED_LIFETIME,
        REPLAY_BUFFER_ADD_DATA_TIMER,
        REPLAY_BUFFER_SAMPLE_TIMER,
        REPLAY_BUFFER_UPDATE_PRIOS_TIMER,
        SYNCH_WORKER_WEIGHTS_TIMER,
        TIMERS,
    )

    config, metrics = algo.config, algo.metrics
    store_weight, sample_and_train_weight = calculate_rr_weights(config)
    for _ in range(store_weight):
        with metrics.log_time((TIMERS, ENV_RUNNER_SAMPLING_TIMER)):
            episodes, env_runner_results = synchronous_parallel_sample(
                worker_set=algo.env_runner_group, concat=True, sample_timeout_s=config.sample_timeout_s,
                _uses_new_env_runners=True, _return_metrics=True,
            )
        metrics.aggregate(env_runner_results, key=ENV_RUNNER_RESULTS)
        with metrics.log_time((TIMERS, REPLAY_BUFFER_ADD_DATA_TIMER)):
            shards.add(episodes)
    if config.count_steps_by == "agent_steps":
        current_ts = sum(metrics.peek((ENV_RUNNER_RESULTS, NUM_AGENT_STEPS_SAMPLED_LIFETIME), default={}).values())
    else:
        current_ts = metrics.peek((ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), default=0)
    if current_ts < config.num_steps_sampled_before_learning_starts or shards.pushed < shards.settings["batch_size"]:
        return
    learner_results: list[dict[str, Any]] = []
    for _ in range(sample_and_train_weight):
        with metrics.log_time((TIMERS, LEARNER_UPDATE_TIMER)):
            learner_results = shards.train({
                NUM_ENV_STEPS_SAMPLED_LIFETIME: metrics.peek((ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME)),
                NUM_AGENT_STEPS_SAMPLED_LIFETIME: metrics.peek((ENV_RUNNER_RESULTS, NUM_AGENT_STEPS_SAMPLED_LIFETIME)),
            })
            metrics.aggregate(learner_results, key=LEARNER_RESULTS)
        # RLlib's buffer timers, reduced as its own ``log_time`` reduces them: the slowest learner's pull and
        # priority update (both run inside the learners' update, which the learner timer also counts)
        metrics.log_value((TIMERS, REPLAY_BUFFER_SAMPLE_TIMER), shards.sample_s, reduce="ema")
        metrics.log_value((TIMERS, REPLAY_BUFFER_UPDATE_PRIOS_TIMER), shards.update_prios_s, reduce="ema")
    with metrics.log_time((TIMERS, SYNCH_WORKER_WEIGHTS_TIMER)):
        algo.env_runner_group.sync_weights(
            from_worker_or_learner_group=algo.learner_group,
            policies=set(learner_results[0].keys()) - {ALL_MODULES}, global_vars=None, inference_only=True,
        )
