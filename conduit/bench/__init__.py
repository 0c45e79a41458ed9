"""Benchmarks of the experience path: ``conduit bench micro`` / ``synthetic`` (issue 6).

- :mod:`~conduit.bench.micro` — ingestion and delivery throughput against the
  peers (TorchRL, cpprb, numpy, plain torch, the memcpy bound), one run;
  :mod:`~conduit.bench.peers` and ``peers_*`` — one module per peer.
- :mod:`~conduit.bench.loop` — the paper's synthetic actor/learner loop: inline,
  Reverb-style, GEAR-style, fixed placements and Conduit's automatic plan;
  :mod:`~conduit.bench.loop_results` — its settings and result records.
- :mod:`~conduit.bench.report`, :mod:`~conduit.bench.report_loop` — ratios,
  targets and tables (pure functions).
- :mod:`~conduit.bench.timing` — interleaved repeats, medians.
- :mod:`~conduit.bench.plot` — figures (matplotlib, from the ``bench`` extra).

Peers are optional (``pip install 'conduit-edp[bench]'``) and imported only
when a benchmark asks for them; one that is missing is reported, not dropped.
``import conduit`` never imports this package.
"""

from __future__ import annotations

from conduit.bench.loop import run_synthetic
from conduit.bench.loop_results import SyntheticResult, SyntheticSettings
from conduit.bench.micro import MicroResult, MicroSettings, run_micro
from conduit.bench.peers import Missing

__all__ = [
    "MicroResult",
    "MicroSettings",
    "Missing",
    "SyntheticResult",
    "SyntheticSettings",
    "run_micro",
    "run_synthetic",
]
