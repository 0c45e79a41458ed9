"""What a rank's push checks before it counts a unit: the core's own validation, against the group's one spec.

A single-process push refuses a bad write with :class:`~conduit.errors.SpecError`
at the push, before anything is counted or queued (:mod:`conduit.paths.ingestion`).
A sharded buffer keeps that promise on every rank and under every routing: a
unit routed to another rank's shard is checked here, at its push, exactly as the
core checks it (:meth:`conduit.spec.ExperienceSpec.validate`: fields, dtypes and
the casts that keep every value, trailing shapes, one leading size, ``finite``,
...), so it never travels to be refused there.

**One spec for the group.** Every rank checks against the same spec: the one
declared (the ranks' declarations must agree: checked at construction), or,
where none was declared, the one the group's first unit set. Pushes join no
collective, so the group agrees through its store instead
(:meth:`conduit.distributed.group.RankGroup.propose`): a rank's first unit
proposes its layout; the first proposal to reach the store, from whichever rank,
is the group's, as the first write that validates is one buffer's. A rank whose
first unit has another layout gets ``SpecError`` at that push, and nothing
changed: no rank's shard ever holds rows of another layout, and no pull fails
for it. That is at most one request per rank and runtime, made by its first push
(bounded: ``timeout_s``); with a declared spec no push communicates at all.

With an ingestion hook the unit a push checks is the hook's input, and the spec
agreed is that input's (fields, dtypes and ranks; trailing sizes free: the core's
rule); the hook runs where the unit is ingested, and the buffer's spec (its
output) is checked there, and compared over the group at each sync.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from conduit.distributed.options import Routing
from conduit.distributed.sampling import proportional_route
from conduit.errors import SpecError
from conduit.spec import Data, ExperienceSpec, as_tensors, batch_size_of

__all__ = ["GroupSpec", "Router", "spec_text"]


def spec_text(spec: ExperienceSpec | None) -> str:
    """A spec as the ranks compare it (canonical JSON; ``""``: none)."""
    return "" if spec is None else json.dumps(spec.to_json(), sort_keys=True)


class GroupSpec:
    """The group's experience spec, and the check a push makes against it (module docstring).

    Args:
        group: the ranks (:class:`conduit.distributed.group.RankGroup`), whose store settles the first layout.
        declared: the spec declared at construction (the same on every rank).
        growable: the config's growable fields (an inferred spec marks them as the core's does).
    """

    def __init__(self, group: Any, declared: ExperienceSpec | None, growable: frozenset[str]) -> None:
        self.group = group
        #: the rows' spec: declared, agreed at a push, or a restored checkpoint's (None: none yet)
        self.spec = declared
        #: with an ingestion hook: the hook's input spec, agreed likewise
        self.inputs: ExperienceSpec | None = None
        self.growable = growable
        self._lock = threading.Lock()

    def check(self, data: Data, *, hooked: bool = False) -> dict[str, torch.Tensor]:
        """``data`` checked as the core's push checks it, against the group's spec (the hook's input spec where
        ``hooked``); returns its tensors, cast to the spec's dtypes. Raises ``SpecError`` having changed nothing
        (but the group's spec, which a rank's first unit that validates sets, as on one buffer)."""
        spec = self.spec_for(data, hooked=hooked)
        try:
            return spec.validate(data)
        except SpecError as e:
            raise SpecError(f"{e} (the group's {'hook input' if hooked else 'experience'} spec: "
                            f"{spec.describe()})") from None

    def spec_for(self, data: Data, *, hooked: bool = False) -> ExperienceSpec:
        """The spec ``data`` must match: the group's, agreed now from ``data``'s layout where there is none yet."""
        spec = self.inputs if hooked else self.spec
        return spec if spec is not None else self._agree(data, hooked)

    def learn(self, spec: ExperienceSpec | None) -> None:
        """Take ``spec`` as the group's where none is known (the shards', a restored checkpoint's: every rank's)."""
        with self._lock:
            if self.spec is None and spec is not None:
                self.spec = spec

    def settle(self, keys: np.ndarray, current: ExperienceSpec | None) -> None:
        """Collective where some shards have a spec and others none (every rank decides alike, on the gathered
        spec ``keys``): learn it; ``SpecError`` on every rank where the shards hold different ones."""
        known = keys[keys > 0]
        if known.size and (known != known[0]).any():
            raise SpecError(f"the ranks' shards hold different experience specs (spec keys {keys.tolist()})")
        if known.size and known.size < keys.size:
            specs = self.group.gather_object(current.to_json() if current else None, "sync (the spec)")
            if current is None:
                self.learn(ExperienceSpec.from_json(next(s for s in specs if s is not None)))

    def _agree(self, data: Data, hooked: bool) -> ExperienceSpec:
        if not isinstance(data, Mapping):
            raise SpecError(f"a write must be a mapping of field -> tensor, got {type(data).__name__}")
        tensors = as_tensors(data)
        if batch_size_of(tensors) == 0:
            raise SpecError("empty write: the leading (batch) dimension is 0 for every field")
        mine = ExperienceSpec.infer(tensors, frozenset(tensors) if hooked else self.growable)
        mine.validate(tensors)  # dense, on a device: a layout worth proposing
        try:  # the other ranks read it back from its JSON: a layout they cannot is refused here, at its push
            ExperienceSpec.from_json(mine.to_json())
        except SpecError as e:
            raise SpecError(f"this unit's layout cannot be shared over the group: {e}") from None
        with self._lock:
            known = self.inputs if hooked else self.spec
            if known is not None:
                return known
            text = spec_text(mine)
            held = self.group.propose("input spec" if hooked else "spec", text)
            spec = mine if held == text else ExperienceSpec.from_json(json.loads(held))
            if hooked:
                self.inputs = spec
            else:
                self.spec = spec
        return spec


class Router:
    """Which shard a pushed unit goes to (:class:`~conduit.distributed.options.Routing`): this rank's, the next
    in turn, or the one furthest below its share of the rows routed so far (capacity-proportional)."""

    def __init__(self, routing: Routing, rank: int, capacities: tuple[int, ...] | list[int]) -> None:
        self.routing, self.rank, self.capacities = routing, rank, tuple(capacities)
        self.share = np.asarray(self.capacities, dtype=np.float64) / sum(self.capacities)
        self.routed = np.zeros(len(self.capacities), dtype=np.float64)
        self.last = rank  # round robin: the shard the last unit went to

    def route(self, rows: int) -> int:
        """The shard a unit of ``rows`` goes to (the caller serialises calls). ``SpecError``, nothing changed,
        where the unit exceeds that shard's capacity (on this rank's own shard, its push says so)."""
        if self.routing is Routing.LOCAL:
            return self.rank
        routed = self.routed.copy()
        dest = ((self.last + 1) % len(self.capacities) if self.routing is Routing.ROUND_ROBIN
                else proportional_route(routed, self.share, rows))
        if dest != self.rank and rows > self.capacities[dest]:
            raise SpecError(f"a write of {rows} rows exceeds the capacity of shard {dest} ({self.capacities[dest]} "
                            f"rows), where routing={self.routing.value} sends it")
        self.last, self.routed = dest, routed
        return dest
