"""The Conduit runtime: one Experience Data Plane for a training loop.

::

    edp = conduit.Conduit(conduit.ConduitConfig(policy="off_policy", train_batch_size=256, capacity=100_000))

    @edp.register_ingestion(input="Actor", output="ExperienceBuffer")
    def ingest(actor_in, exp_out):
        exp_out.write(actor_in.read())

    with edp:
        for it in range(iterations):
            edp.push(rollout())                 # actors push rollout units
            if edp.ready():
                update(edp.pull())              # learners pull training-ready batches

Actors may push from several threads at once (or from other processes through
:meth:`Conduit.actor_channel`); data-parallel learners pull with their rank.
The paths are built lazily on the first push or pull, so hooks registered
before then are used. Errors from any worker re-raise, with the original
traceback, from the next call; every blocking call has a timeout; ``close()``
is idempotent and joins every thread.

The runtime wires components and holds no policy logic of its own: the buffer
(:mod:`conduit.buffers`) says what differs between off- and on-policy, the paths
(:mod:`conduit.paths`) run ingestion and delivery, :mod:`conduit.checkpoint`
writes and reads their ``state_dict()``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from conduit import build, checkpoint, snapshot
from conduit.batch import Batch
from conduit.buffers.base import ExperienceBuffer
from conduit.config import ConduitConfig
from conduit.core import Policy, Schedule
from conduit.errors import CheckpointError, ConduitError, ConfigError, RuntimeClosed, SemanticsError
from conduit.executor import FailureBox
from conduit.hooks import HookKind, HookRegistry
from conduit.paths.delivery import DeliveryPath
from conduit.paths.ingestion import IngestionPath
from conduit.remote import ActorChannel, ActorLoss
from conduit.replay_face import ReplayFace
from conduit.spec import Data, ExperienceSpec
from conduit.stats import RuntimeStats, collect
from conduit.storage import StoragePolicy
from conduit.trace import Tracer, global_tracer

__all__ = ["Conduit"]

log = logging.getLogger("conduit")

F = TypeVar("F", bound=Callable[..., Any])

class Conduit(ReplayFace):
    """An Experience Data Plane runtime (see the module docstring).

    Args:
        config: the configuration; ``Conduit(policy=..., ...)`` is shorthand for
            ``Conduit(ConduitConfig(policy=..., ...))``.
        spec: the experience spec, when known up front (else inferred from the first push).
        storage: where the buffer's rows live (a :class:`~conduit.storage.StoragePolicy`);
            ``None``: ``config.storage_device`` if pinned, else the placement planner's choice.
        tracer: records a timeline of every operator (default: the process's tracer, off).
        registry: the hooks (default: a fresh registry, filled by ``@edp.register_*``).
    """

    def __init__(
        self,
        config: ConduitConfig | None = None,
        *,
        spec: ExperienceSpec | None = None,
        storage: StoragePolicy | None = None,
        tracer: Tracer | None = None,
        registry: HookRegistry | None = None,
        **fields: Any,
    ) -> None:
        if config is not None and fields:
            raise ConfigError(f"pass either a ConduitConfig or config fields, not both (got {sorted(fields)})")
        self.config = config if config is not None else ConduitConfig(**fields)
        build.check_devices(self.config)
        self.spec_declared = spec
        self.tracer = tracer or global_tracer()
        self.registry = registry or HookRegistry()
        self.schedule = self.config.default_schedule()
        self.storage_policy: StoragePolicy = storage or build.storage_policy(self.config)
        self.failure = FailureBox()
        self._start_lock = threading.Lock()
        self._started = False
        self._closed = False
        self._channels: list[ActorChannel] = []
        #: objects told about every push, pull and annotated phase (the auto planner is one)
        self.observers: list[Any] = []
        self.buffer: ExperienceBuffer | None = None
        self.ingestion: IngestionPath | None = None
        self.delivery: DeliveryPath | None = None
        #: a checkpoint's state that :meth:`restore` read before the runtime started: loaded by :meth:`start`
        self._restoring: Mapping[str, dict[str, Any]] | None = None

    # -- hooks ----------------------------------------------------------------
    def register_ingestion(self, input: str = "Actor", output: str = "ExperienceBuffer") -> Callable[[F], F]:
        """Decorator: the framework's ingestion logic (``fn(actor_in, exp_out)``)."""
        return self.registry.register(HookKind.INGESTION, input, output)

    def register_delivery(self, input: str = "ExperienceBuffer", output: str = "Learner") -> Callable[[F], F]:
        """Decorator: the framework's delivery logic (``fn(exp_in, learn_out)``)."""
        return self.registry.register(HookKind.DELIVERY, input, output)

    # -- construction of the paths ----------------------------------------------
    def start(self) -> Conduit:
        """Build the buffer and both paths (done lazily by the first push/pull)."""
        with self._start_lock:
            if self._closed:
                raise RuntimeClosed("the Conduit runtime is closed")
            if self._started:
                return self
            cfg = self.config
            buffer = build.buffer(cfg, self.storage_policy, self.spec_declared)
            delivery = build.delivery(
                cfg, buffer, self.schedule.delivery, self._hook(HookKind.DELIVERY), self.tracer, self.failure
            )
            ingestion = IngestionPath(
                mode=self.schedule.ingestion, buffer=buffer, hook=self._hook(HookKind.INGESTION),
                tracer=self.tracer, failure=self.failure, timeout=cfg.timeout_s,
                stream_device=build.stream_device(cfg), copy_on_push=cfg.copy_on_push,
            )
            buffer.on_data.append(delivery.notify)
            buffer.on_room.append(ingestion.wake)
            delivery.start()
            self.buffer, self.delivery, self.ingestion = buffer, delivery, ingestion
            self.registry.freeze("the runtime has started; register hooks before the first push/pull")
            if self._restoring is not None:  # before any push or pull: units pending in it meet the hooks
                try:
                    snapshot.apply(buffer, ingestion, delivery, self._restoring)
                except BaseException as e:  # no push or pull runs on a half-restored state: every call says why
                    self._started = True
                    self.failure.set("restoring the checkpoint", e)
                    raise
                self._restoring = None
            self._started = True
            log.info("conduit: started %s, %s", self.config.policy.value, self.schedule)
            return self

    def _hook(self, kind: HookKind) -> Callable[..., Any] | None:
        spec = self.registry.get(kind)
        return spec.fn if spec is not None else None

    def _ensure_started(self) -> None:
        if not self._started:
            self.start()
        self.failure.check()

    # -- the data plane ---------------------------------------------------------
    def push(self, data: Data, *, timeout: float | None = None, copy: bool | None = None) -> None:
        """Push one rollout unit (a mapping ``field -> tensor/array`` with a leading batch dim).

        When it returns, the actor may write into its arrays again: a unit whose
        write the schedule defers is copied first. ``copy=False`` (or
        ``copy_on_push=False`` in the config) hands the arrays over instead —
        no copy on this thread, and they must not be written to before they are
        ingested (``flush()``). ``None``: the config's ``copy_on_push``.
        """
        self._ensure_started()
        assert self.ingestion is not None
        if not self.observers:
            self.ingestion.push(data, timeout, copy)
            return
        t0 = time.perf_counter()
        self.ingestion.push(data, timeout, copy)
        t1 = time.perf_counter()
        for obs in self.observers:
            obs.on_push(data, t0, t1)

    def pull(self, learner: int = 0, *, timeout: float | None = None, rows: int | None = None) -> Batch:
        """The next training-ready batch for data-parallel learner ``learner``; off-policy, ``rows``: one batch of
        that many rows instead of ``train_batch_size``, drawn now on this thread (staged batches keep their turn)."""
        if not self._started:  # _ensure_started's first half: delivery.pull checks for failures itself
            self.start()
        delivery = self.delivery
        assert delivery is not None
        if rows is not None and rows != self.config.train_batch_size:
            return delivery.pull_rows(learner, rows, timeout)
        if not self.observers:
            return delivery.pull(learner, timeout)
        t0 = time.perf_counter()
        batch = delivery.pull(learner, timeout)
        t1 = time.perf_counter()
        for obs in list(self.observers):
            obs.on_pull(batch, t0, t1)
        return batch

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Annotate the loop's own work (``"rollout"``, ``"update"``) for the timeline and the planner.

        ::

            with edp.phase("rollout"):
                unit = env_step(policy)
        """
        t0 = time.perf_counter()
        with self.tracer.span(name, cat="loop"):
            yield
        t1 = time.perf_counter()
        for obs in self.observers:
            obs.on_phase(name, t0, t1)

    def actor_channel(
        self,
        maxsize: int = 8,
        context: str = "spawn",
        *,
        on_actor_lost: Callable[[ActorLoss], None] | None = None,
    ) -> ActorChannel:
        """A channel actor *processes* push through (``channel.actor()`` is picklable, one per process).

        A receiver thread here feeds every unit into :meth:`push`; each actor has at
        most ``maxsize`` units unacknowledged. An actor process that dies does not
        stop the runtime: the loss is logged, counted in :meth:`stats`, listed by
        ``channel.stats()`` and passed to ``on_actor_lost`` (:mod:`conduit.remote`).
        The channel closes with the runtime.
        """
        self._ensure_started()
        channel = ActorChannel(
            self.push, self.failure, maxsize, self.config.timeout_s, context, on_actor_lost=on_actor_lost
        )
        self._channels.append(channel)
        return channel

    def minibatches(self, learner: int = 0, *, timeout: float | None = None) -> Iterator[Batch]:
        """On-policy: every mini-batch of the next iteration, epoch by epoch."""
        if self.config.policy is not Policy.ON_POLICY:
            raise SemanticsError("minibatches() iterates an on-policy iteration; off-policy uses pull()")
        while True:
            batch = self.pull(learner, timeout=timeout)
            yield batch
            if batch.info.last:
                return

    def ready(self, learner: int = 0) -> bool:
        """Whether a pull for ``learner`` can be served now without waiting for more data."""
        self._ensure_started()
        assert self.delivery is not None
        return self.delivery.ready(learner)

    def flush(self, *, timeout: float | None = None) -> None:
        """Ingest every unit pushed so far (partial granularity groups included)."""
        self._ensure_started()
        assert self.ingestion is not None
        self.ingestion.flush(timeout)

    def seal(self) -> int | None:
        """On-policy: end the iteration being pushed now, even if short of train_batch_size."""
        self._ensure_started()
        assert self.ingestion is not None
        return self.ingestion.seal()

    def reschedule(self, schedule: Schedule, *, timeout: float | None = None) -> None:
        """Switch both paths to ``schedule`` while running (what the planner does after profiling).

        Units pushed so far are ingested under the old ingestion mode first;
        batches already staged for learners stay valid (off-policy) or belong to
        the same iteration (on-policy) and keep the mode they were made under;
        a learner waiting in a pull is served by the new mode.
        """
        schedule = build.checked_schedule(self.config, schedule)
        if not self._started:
            self.schedule = schedule
            return
        self.failure.check()
        assert self.ingestion is not None and self.delivery is not None
        deadline = time.monotonic() + (self.config.timeout_s if timeout is None else timeout)
        old = self.ingestion.mode
        self.ingestion.set_mode(schedule.ingestion, max(0.0, deadline - time.monotonic()))
        try:
            self.delivery.set_mode(schedule.delivery, max(0.0, deadline - time.monotonic()))
        except ConduitError:  # delivery could not switch: ingestion goes back, the runtime keeps one schedule
            self.ingestion.set_mode(old, self.config.timeout_s)
            raise
        self.schedule = schedule
        log.info("conduit: rescheduled to %s", schedule)

    @contextlib.contextmanager
    def quiesced(self, timeout: float | None = None) -> Iterator[None]:
        """Hold both paths still between invocations (checkpoints capture this point).

        Units pushed but not yet ingested stay queued (a checkpoint saves them),
        so capturing the state does not change when anything is ingested. ``save``
        and ``state_dict`` may be called inside (by the same thread): they capture
        the point held, so a framework's own bookkeeping read in the block matches it.
        """
        self._ensure_started()
        assert self.ingestion is not None and self.delivery is not None
        with snapshot.quiesced(self.ingestion, self.delivery, timeout):
            yield

    # -- checkpoints --------------------------------------------------------------
    def state_dict(self, *, timeout: float | None = None) -> dict[str, dict[str, Any]]:
        """The buffer's, ingestion's and delivery's state at one consistent point (:mod:`conduit.snapshot`)."""
        self._ensure_started()
        assert self.buffer is not None and self.ingestion is not None and self.delivery is not None
        return snapshot.capture(self.buffer, self.ingestion, self.delivery, timeout)

    def load_state_dict(self, state: Mapping[str, dict[str, Any]]) -> None:
        """Continue from :meth:`state_dict` (into a runtime that has not pushed yet)."""
        self.start()
        self._load(state)

    def _load(self, state: Mapping[str, dict[str, Any]]) -> None:
        assert self.buffer is not None and self.ingestion is not None and self.delivery is not None
        snapshot.apply(self.buffer, self.ingestion, self.delivery, state)

    def save(self, path: str | Path, *, timeout: float | None = None) -> Path:
        """Checkpoint the whole buffer state to ``path`` atomically (see :mod:`conduit.checkpoint`)."""
        state = self.state_dict(timeout=timeout)
        return checkpoint.save(path, snapshot.manifest(self.config, self.spec, self.schedule, state), state)

    def restore(self, path: str | Path, *, fallback: bool = False) -> dict[str, Any]:
        """Load a checkpoint into this fresh runtime; returns its manifest.

        The checkpoint is read and checked now. A runtime that has not started yet
        takes its state when it starts (the first push or pull, or ``start()``), so
        hooks registered meanwhile see the units the checkpoint still holds pending.
        ``fallback``: where the checkpoint is damaged, load the copy an earlier
        interrupted save left beside it (:func:`conduit.checkpoint.read_manifest`).
        """
        manifest, state = checkpoint.load(path, fallback=fallback)
        snapshot.check(path, manifest, state)  # a tampered field is a CheckpointError, before anything is built
        if self._restoring is not None or (self._started and self.buffer is not None and self.buffer.inserted):
            raise CheckpointError("restore into a fresh runtime (this one already holds data)")
        if manifest["policy"] != self.config.policy.value:
            raise CheckpointError(f"checkpoint is {manifest['policy']}, the runtime is {self.config.policy.value}")
        if manifest["spec"] is not None and self.spec_declared is not None:
            if ExperienceSpec.from_json(manifest["spec"]) != self.spec_declared:
                raise CheckpointError("the checkpoint's experience spec differs from the runtime's declared spec")
        if self._started:
            self._load(state)
        else:  # checked now against the buffer this config builds, loaded when the runtime starts
            build.buffer(self.config, self.storage_policy, self.spec_declared).check_state(state["buffer"])
            self._restoring = state
        return manifest

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        *,
        storage: StoragePolicy | None = None,
        registry: HookRegistry | None = None,
        fallback: bool = False,
        **overrides: Any,
    ) -> Conduit:
        """A runtime rebuilt from a checkpoint's config (``overrides`` change fields, e.g. ``storage_device``).

        It has not started: register its hooks (``@edp.register_ingestion``, or pass ``registry``) before the
        first push or pull, which loads the checkpoint's state; units it held pending are ingested through
        them. ``fallback``: see :meth:`restore`.
        """
        where, manifest = checkpoint.read_manifest(path, fallback=fallback)
        config, spec, schedule = snapshot.rebuild(where, manifest, overrides)  # each field checked
        runtime = cls(config, spec=spec, storage=storage, registry=registry)
        if "pinned" not in overrides:  # the schedule it ran under (a planner's choice, or the pinned one)
            runtime.reschedule(schedule)
        runtime.restore(path, fallback=fallback)
        return runtime

    # -- introspection -----------------------------------------------------------
    @property
    def spec(self) -> ExperienceSpec | None:
        return self.buffer.spec if self.buffer is not None else self.spec_declared

    def stats(self) -> RuntimeStats:
        """The runtime's counters now (:class:`~conduit.stats.RuntimeStats`)."""
        return collect(self.ingestion, self.delivery, self.buffer, self._channels)

    def describe(self) -> Mapping[str, Any]:
        """What the runtime runs: config, schedule, spec and operator graphs."""
        return {
            "policy": self.config.policy.value,
            "schedule": self.schedule.to_json(),
            "storage": repr(getattr(self.storage_policy, "active", None) or self.storage_policy),
            "spec": self.spec.to_json() if self.spec else None,
            "ingestion_graph": self.ingestion.graph.describe() if self.ingestion else None,
            "delivery_graph": self.delivery.graph.describe() if self.delivery else None,
        }

    # -- lifecycle -------------------------------------------------------------
    def close(self, timeout: float = 5.0, *, drain: bool = True) -> list[str]:
        """Stop both workers and release storage; idempotent, and returns within ``timeout`` (plus a
        scheduling margin) whatever a hook is doing.

        ``drain`` (default) first ingests units already pushed, like a writer's
        flush, when the runtime is healthy; with ``drain=False`` (or after a
        failure) they are dropped. Rows in the buffer are released either way:
        ``save()`` first to keep them.

        Returns what close left behind, each named with its thread and what it is
        inside (a hook that does not return, in a worker or in a caller's inline
        invocation), also logged as a warning; empty when every thread stopped.
        An invocation still running when the runtime closes ends with
        :class:`~conduit.errors.RuntimeClosed` in its own thread.
        """
        deadline = time.monotonic() + timeout

        def left() -> float:
            return max(0.0, deadline - time.monotonic())

        with self._start_lock:
            if self._closed:
                return []
            if drain and self._started and self.failure.error is None and self.ingestion is not None:
                self.ingestion.drain_within(left())
            self._closed = True
            self.failure.closed = True
        behind: list[str] = []
        for channel in self._channels:
            if not channel.close(left()):
                behind.append("an actor channel's receiver thread did not stop")
        for path in (self.ingestion, self.delivery):
            if path is not None:
                behind += path.close(left())
        if behind:
            log.warning("conduit: close(timeout=%.3gs) left behind: %s", timeout, "; ".join(behind))
        self._release()
        return behind

    def _release(self) -> None:
        """Drop storage and queued data now; reference cycles (threads, callbacks) would keep them for a GC."""
        if self.buffer is not None:
            self.buffer.release()
        if self.ingestion is not None:
            with self.ingestion.cond:
                self.ingestion.queue.clear()
        self.observers.clear()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Conduit:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("running" if self._started else "new")
        return f"Conduit({self.config.policy.value}, {self.schedule}, {state})"
