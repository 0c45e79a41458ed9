"""Experience-path latency, written where verl users look: the step's ``metrics`` and ``timing_raw``.

What: :class:`PathMeter` times the post-generation ingestion (from the sampled
batch to the advantage written), and records
per stage what the stage itself took. :meth:`PathMeter.publish` writes

- ``timing_raw["conduit/exposed_path"]`` and ``timing_raw["conduit/<stage>"]``
  (verl turns every ``timing_raw`` key into ``timing_s/<key>``),
- ``metrics["conduit/exposed_path_s"]``: the experience path the update waited for,
- ``metrics["conduit/serial_path_s"]``: the sum of the stages' own times, i.e. what
  verl's serial order would have exposed with the same stage costs,
- ``metrics["conduit/hidden_s"]`` and ``metrics["conduit/overlapped_stages"]``.

Why: the gain should be visible in a user's usual dashboard, stage by stage,
without a separate tool.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = ["PathMeter"]


@dataclass
class PathMeter:
    """Per-iteration experience-path timings (one meter per step)."""

    exposed_s: float = 0.0
    stage_s: dict[str, float] = field(default_factory=dict)
    overlapped: int = 0
    plan: str = ""

    @contextmanager
    def exposed(self) -> Iterator[None]:
        """Time a section the trainer waits for (adds to the exposed path)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.exposed_s += time.perf_counter() - t0

    def add_stage(self, name: str, seconds: float) -> None:
        self.stage_s[name] = self.stage_s.get(name, 0.0) + seconds

    def publish(self, metrics: MutableMapping[str, object], timing_raw: MutableMapping[str, float]) -> None:
        serial = sum(self.stage_s.values())
        timing_raw["conduit/exposed_path"] = timing_raw.get("conduit/exposed_path", 0.0) + self.exposed_s
        for name, s in self.stage_s.items():
            timing_raw[f"conduit/{name}"] = timing_raw.get(f"conduit/{name}", 0.0) + s
        metrics["conduit/exposed_path_s"] = self.exposed_s
        metrics["conduit/serial_path_s"] = serial
        metrics["conduit/hidden_s"] = max(0.0, serial - self.exposed_s)
        metrics["conduit/overlapped_stages"] = self.overlapped
