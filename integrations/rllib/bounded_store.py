"""The bounded mode: Conduit's runtime behind RLlib's replay-buffer calls.

``add()`` folds episode chunks into n-step-ready rows (:mod:`.nstep`) and pushes
them into a :class:`conduit.Conduit` (off-policy replay). ``sample()`` pulls a
batch from its delivery path; the registered delivery hook turns gathered rows
into the learner's columns. Whether ingestion and delivery overlap the rollout
and the update (the delivery worker drawing batch k+1 while the learner trains
on k, at most ``max_staleness`` batches ahead) is Conduit's schedule's call, or
pinned with ``prefetch``. RLlib's ``update_priorities`` names no batch: the
runtime's ``update_priorities(None, ...)`` is for the newest delivered batch still
awaiting its update, and lands on that batch's own transitions (dropped for slots
overwritten since: the core's generation check).

The runtime starts at the first ``sample()`` (it learns the batch size there):
rows added during RLlib's warm-up wait as numpy arrays and enter the buffer in
one write, so the first batch is never drawn from a nearly empty buffer.

The buffer's state is RLlib-shaped: its rows oldest first and their priorities, read
back from Conduit's own checkpoint (``Conduit.state_dict``) with
:func:`conduit.ext.stored_in_order`, so a restore may change the capacity or the batch
size; a restore loads them into the fresh runtime (``Conduit.load_rows``) before any draw.

The core API used: ``Conduit`` (config, ``register_delivery``, ``start``, ``push``,
``pull``, ``flush``, ``update_priorities``, ``set_beta``, ``use_rng``, ``load_rows``,
``state_dict``, ``close``) and its ``ReplayBuffer``'s ``size``; a ``sample()`` of another batch size than
the first is ``pull(rows=...)``.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

import conduit
from conduit import BatchInfo, Reader, SemanticsError, Writer
from conduit.ext import HostGatherStoragePolicy, NStepFolder, ReplayBuffer, stored_in_order

from .episodes import LEARNER_COLUMNS, Chunk, PreparedBatch, learner_dtype
from .options import BufferOptions

__all__ = ["BoundedStore", "learner_columns"]


def learner_columns(data: dict[str, torch.Tensor], weights: np.ndarray | None, n_step: int) -> dict[str, torch.Tensor]:
    """Gathered ring rows -> the columns RLlib's learner connector builds (plus float64 extras)."""
    rows = int(data["rewards"].shape[0])
    device = data["rewards"].device
    w = torch.from_numpy(np.asarray(weights)) if weights is not None else torch.ones(rows, dtype=torch.float64)
    return {
        "obs": data["obs"].to(learner_dtype(data["obs"].dtype)),
        "new_obs": data["new_obs"].to(learner_dtype(data["new_obs"].dtype)),
        "actions": data["actions"].to(learner_dtype(data["actions"].dtype)),
        "rewards": data["rewards"].to(torch.float32),
        "terminateds": data["terminateds"],
        "truncateds": data["truncateds"],
        "weights": w.to(device=device, dtype=torch.float32),
        "n_step": torch.full((rows,), n_step, dtype=torch.int64, device=device),
        "returns64": data["rewards"],
        "weights64": w.to(device=device, dtype=torch.float64),
        "t_started": data["t"],
    }


def _prepared(cols: dict[str, torch.Tensor]) -> PreparedBatch:
    extras = {
        "returns": cols["returns64"], "weights": cols["weights64"], "n_step": cols["n_step"],
        "terminated": cols["terminateds"], "truncated": cols["truncateds"], "t_started": cols["t_started"],
    }
    return PreparedBatch({k: cols[k] for k in LEARNER_COLUMNS}, extras)


class BoundedStore:
    """n-step rows in a Conduit replay ring, delivered by its (prefetching) delivery path."""

    def __init__(self, capacity: int, *, prioritized: bool, alpha: float, beta: float, options: BufferOptions) -> None:
        if isinstance(options.n_step, tuple):
            raise conduit.ConfigError(
                f"n_step={options.n_step}: a random n-step range cannot be folded at ingestion; "
                "use staleness='exact' for it"
            )
        self.capacity = capacity
        self.prioritized = prioritized
        self.alpha = alpha
        self.beta = beta
        self._beta = beta  # the importance-sampling exponent the buffer draws with
        self.options = options
        self.folder = NStepFolder(options.n_step, options.gamma)
        self.edp: conduit.Conduit | None = None
        self.pending: list[dict[str, np.ndarray]] = []
        self.restore: dict[str, Any] | None = None
        self._rng = np.random.default_rng(options.seed)
        self.rows_total = 0
        self.episode_last_row: OrderedDict[str, int] = OrderedDict()
        #: the state when the runtime closed (RLlib's algorithm may save its buffer after ``stop()``)
        self._final: dict[str, Any] | None = None

    # -- the rng RLlib users set for reproducibility -------------------------------
    @property
    def rng(self) -> np.random.Generator:
        return self._rng  # the runtime draws with this one (use_rng at start and at each set)

    def _buffer(self) -> ReplayBuffer | None:
        buf = self.edp.buffer if self.edp is not None else None
        assert buf is None or isinstance(buf, ReplayBuffer)
        return buf

    @rng.setter
    def rng(self, value: np.random.Generator) -> None:
        self._rng = value
        if self.edp is not None and not self.edp.closed:  # (a closed runtime draws no more; a restart takes it)
            self.edp.use_rng(value)

    # -- add ------------------------------------------------------------------------
    def add(self, chunks: list[Chunk]) -> int:
        if self.edp is not None and self.edp.closed:  # refused before anything is counted
            raise conduit.RuntimeClosed("add: this replay buffer was closed (its algorithm stopped)")
        rows = self.folder.fold(chunks)
        if rows is None:
            return 0
        n = len(rows["rewards"])
        self.rows_total += n
        for c in chunks:
            self.episode_last_row[c.id] = self.rows_total
            self.episode_last_row.move_to_end(c.id)
        while self.episode_last_row and next(iter(self.episode_last_row.values())) <= self.rows_total - self.capacity:
            self.episode_last_row.popitem(last=False)
        if n > self.capacity:  # older rows would be overwritten by this very write
            rows = {k: v[n - self.capacity :] for k, v in rows.items()}
        if self.edp is None:
            self.pending.append(rows)
        else:
            self.edp.push(rows)
        return n

    def __len__(self) -> int:
        return min(self.capacity, self.rows_total)

    @property
    def num_episodes(self) -> int:
        return len(self.episode_last_row)

    # -- runtime ----------------------------------------------------------------------
    def start(self, batch_size: int) -> None:
        o = self.options
        cfg = conduit.ConduitConfig(
            policy="off_policy", train_batch_size=batch_size, capacity=self.capacity,
            sampler="prioritized" if self.prioritized else "uniform",
            prioritized=conduit.PrioritizedReplay(alpha=self.alpha, beta=self.beta),
            learner_device=o.learner_device, storage_device=o.storage_device, max_staleness=o.max_staleness,
            min_size_to_sample=1,  # as RLlib's buffer: a sample() from any rows there are (warm-up is RLlib's)
            pinned=conduit.SchedulePin(delivery_overlap=o.prefetch), seed=o.seed, timeout_s=o.timeout_s,
        )
        host_only = o.storage_device in (None, "cpu") and o.learner_device == "cpu"
        # on a CPU-only learner keep rows in host memory with the contention-proof gather;
        # otherwise Conduit's placement decides where they live
        edp = conduit.Conduit(cfg, storage=HostGatherStoragePolicy("cpu") if host_only else None)
        n_step = self.folder.n

        @edp.register_delivery(input="ExperienceBuffer", output="Learner")
        def to_learner(exp_in: Reader, learn_out: Writer) -> None:
            learn_out.write(learner_columns(exp_in.read(), exp_in.info.get("weights"), n_step))

        edp.start()
        self.edp = edp
        weakref.finalize(self, edp.close)  # a buffer dropped unclosed stops its runtime's workers with it
        self._beta = self.beta  # the new runtime's sampler starts at the configured exponent
        edp.use_rng(self._rng)
        restore, self.restore = self.restore, None
        if self.pending:  # the warm-up's rows (a restore's first, with their priorities) in one write
            rows = {k: np.concatenate([p[k] for p in self.pending]) for k in self.pending[0]}
            self.pending = []
            keep = restore is not None and self.prioritized
            if len(rows["rewards"]):
                edp.load_rows(rows, leaves=restore["leaves"] if keep else None,
                              max_priority=float(restore["max_priority"]) if keep else 1.0)

    # -- sample ---------------------------------------------------------------------------
    def sample(self, batch_size: int, beta: float) -> tuple[PreparedBatch, BatchInfo]:
        if self.edp is None:
            self.start(batch_size)
        edp = self.edp
        buf = self._buffer()
        assert edp is not None and buf is not None
        if self.prioritized and beta != self._beta:
            edp.set_beta(beta)  # applies from the next draw
            self._beta = beta
        if buf.size == 0:
            edp.flush()  # rows may still be on their way in
            if buf.size == 0:
                raise SemanticsError("cannot sample from an empty replay buffer: add episodes first")
        # the first sample()'s batch size is the runtime's pull; another is one batch of that size, drawn now
        batch = edp.pull(timeout=self.options.timeout_s, rows=batch_size)
        return _prepared(batch.to_dict()), batch.info

    def update_priorities(self, priorities: np.ndarray) -> int:
        """For the newest delivered batch still awaiting its update (the runtime keeps which: RLlib's "the last
        sampled batch"); SemanticsError when none awaits."""
        if self.edp is None:
            raise SemanticsError("update_priorities: no sampled batch awaits priorities; call sample() first")
        return self.edp.update_priorities(None, priorities)

    # -- persistence ------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        if self._final is not None:
            return self._final
        out: dict[str, Any] = {"folder": self.folder.state(), "rows_total": self.rows_total,
                               "episode_last_row": list(self.episode_last_row.items())}
        if self.edp is None or self.edp.buffer is None:
            rows = {k: np.concatenate([p[k] for p in self.pending]) for k in self.pending[0]} if self.pending else {}
            out.update(rows=rows, restore=self.restore, rng=self._rng.bit_generator.state)
            return out
        self.edp.flush()
        checkpoint = self.edp.state_dict(timeout=self.options.timeout_s)["buffer"]
        stored = stored_in_order(checkpoint)
        restore = {"leaves": stored.leaves, "max_priority": stored.max_priority} if self.prioritized else None
        out.update(rows={k: v.cpu().numpy() for k, v in stored.rows.items()}, restore=restore, rng=checkpoint["rng"])
        return out

    def load(self, state: dict[str, Any]) -> None:
        self.close(keep=False)
        self.edp, self._final = None, None
        self.folder.load(state["folder"])
        self.rows_total = int(state["rows_total"])
        self.episode_last_row = OrderedDict(state["episode_last_row"])
        self.pending = [state["rows"]] if state["rows"] else []
        self.restore = state["restore"]
        rng = np.random.default_rng()
        rng.bit_generator.state = state["rng"]
        self._rng = rng

    def contents(self) -> dict[str, np.ndarray]:
        """Stored rows, oldest first (tests, inspection)."""
        return dict(self.state()["rows"])

    def close(self, keep: bool = True) -> None:
        """Stop the runtime (idempotent); with ``keep``, its state first, for a save after the algorithm stopped
        (the runtime releases its rows)."""
        if self.edp is None or self.edp.closed:
            return
        if keep:
            try:
                self._final = self.state()
            except conduit.RuntimeFailed:  # a failed runtime has no state to keep; its error was raised already
                pass
        self.edp.close()
