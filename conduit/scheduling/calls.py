"""The runtime's fixed cost per push and per pull: the placement model's per-call term, timed on the runtime.

A push or a pull costs tens of microseconds whatever its size (Python, locks,
bookkeeping, one write or gather call per column), which the per-byte legs of
Alg. 1's model do not count; at small transitions it is most of an iteration.
:func:`runtime_call_costs` times it on the real runtime
(:class:`conduit.Conduit` on host memory, rows of one float): pushes and pulls
alternating, as a loop runs them, with one column and with :data:`COLUMNS`
columns, so that what each further column adds is their difference. Pass it to
:func:`conduit.placement.profile_topology` (``calls=``); the placement layer
cannot import the runtime, which builds on it.
"""

from __future__ import annotations

import statistics
import time

import torch

__all__ = ["COLUMNS", "REPEATS", "runtime_call_costs"]

#: the columns of the second timing (the first has one)
COLUMNS = 6
#: timed push/pull pairs per timing (each call takes tens of microseconds)
REPEATS = 60


def _timings(columns: int, unit_rows: int, batch_rows: int, repeats: int) -> tuple[float, float]:
    from conduit.config import ConduitConfig
    from conduit.runtime import Conduit

    config = ConduitConfig(policy="off_policy", train_batch_size=batch_rows, capacity=4 * batch_rows,
                           learner_device="cpu", storage_device="cpu", seed=0, min_size_to_sample=batch_rows)
    unit = {f"c{i}": torch.ones(unit_rows, 1) for i in range(columns)}
    pushes, pulls = [], []
    with Conduit(config) as edp:
        for _ in range(-(-4 * batch_rows // unit_rows)):
            edp.push(unit)
        edp.flush()
        for k in range(repeats + 1):
            t0 = time.perf_counter()
            edp.push(unit)
            edp.flush()
            t1 = time.perf_counter()
            edp.pull()
            t2 = time.perf_counter()
            if k:  # the first pair warms up
                pushes.append(t1 - t0)
                pulls.append(t2 - t1)
    return statistics.median(pushes), statistics.median(pulls)


def runtime_call_costs(unit_rows: int = 256, batch_rows: int = 512, repeats: int = REPEATS) -> dict[str, float]:
    """``push_call_s``, ``pull_call_s`` (one column) and ``push_column_s``, ``pull_column_s`` (each further one),
    seconds: medians of ``repeats`` pushes of ``unit_rows`` rows and pulls of ``batch_rows``."""
    push1, pull1 = _timings(1, unit_rows, batch_rows, repeats)
    push_n, pull_n = _timings(COLUMNS, unit_rows, batch_rows, repeats)
    per = COLUMNS - 1
    return {"push_call_s": push1, "pull_call_s": pull1,
            "push_column_s": max(0.0, push_n - push1) / per, "pull_column_s": max(0.0, pull_n - pull1) / per}
