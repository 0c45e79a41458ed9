"""Benchmarks of the experience path: ``conduit bench micro`` / ``synthetic`` / ``validate``.

The harness ships with the source, not the wheel: from a clone, ``pip install -e ".[bench]"``
makes ``conduit bench ...`` find it, and ``python -m benchmarks ...`` runs the same commands.

- :mod:`~benchmarks.micro` — ingestion and delivery throughput against the
  peers (TorchRL, cpprb, numpy, plain torch, the memcpy bound), one run;
  :mod:`~benchmarks.peers` and ``peers_*`` — one module per peer.
- :mod:`~benchmarks.loop` — the paper's synthetic actor/learner loop: inline,
  Reverb-style, GEAR-style, fixed placements and Conduit's automatic plan;
  :mod:`~benchmarks.loop_results` — its settings and result records.
- :mod:`~benchmarks.report`, :mod:`~benchmarks.report_loop` — ratios,
  targets, tables and the JSON documents (pure functions).
- :mod:`~benchmarks.validate` — the cost model against measurement
  (``conduit bench validate``).
- :mod:`~benchmarks.summary` — BENCHMARKS.md's tables, one per question, from a
  saved ``conduit bench all --save-json`` document (``conduit bench summary``).
- :mod:`~benchmarks.cli` — the typer app behind ``conduit bench``.
- :mod:`~benchmarks.timing` — interleaved repeats, medians.
- :mod:`~benchmarks.plot` — figures (matplotlib, from the ``bench`` extra).
- :mod:`~benchmarks.distributed`, :mod:`~benchmarks.srl_buffer`, :mod:`~benchmarks.verl_trainers`,
  ``verl_path.py`` — the sharded buffer across ranks, SRL's buffers, verl's trainers and a model of its admission.

Peers are optional (``pip install ".[bench]"`` in a clone of Conduit) and imported only
when a benchmark asks for them; one that is missing is reported, not dropped.
``import conduit`` never imports this package.
"""

from __future__ import annotations

from benchmarks.loop import run_synthetic
from benchmarks.loop_results import SyntheticResult, SyntheticSettings
from benchmarks.micro import MicroResult, MicroSettings, run_micro
from benchmarks.peers import Missing

__all__ = [
    "MicroResult",
    "MicroSettings",
    "Missing",
    "SyntheticResult",
    "SyntheticSettings",
    "run_micro",
    "run_synthetic",
]
