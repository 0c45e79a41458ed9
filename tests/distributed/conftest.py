"""Fixtures for the distributed tests: real torch.distributed (gloo over 127.0.0.1) groups of spawned ranks.

Starting a group costs seconds on two cores, so each world size runs every
scenario in one group (:func:`tests.distributed.workers.scenarios`) once per
session, and the tests check its results. The 4-rank group saves a checkpoint
the 2-rank group restores; before them a 3-rank group's save is stalled and
killed on rank 0 where the 4-rank group saves next (:mod:`tests.distributed.promises`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch.multiprocessing as mp

from conduit.distributed import launch
from tests.distributed import promises, workers

#: wall time of each group's run, for the report
TIMINGS: dict[str, float] = {}


def spawn(fn: Any, world: int, *args: Any) -> None:
    """``torch.multiprocessing.spawn`` of ``fn(rank, world, port, *args)`` on a fresh local port."""
    mp.spawn(fn, args=(world, launch.free_port(), *args), nprocs=world, join=True)


#: every group the session spawns, run once for whichever test (here or in tests/reliability) asks first
RUNS: dict[str, Any] = {}


def run_groups(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A save stalled then killed on rank 0 of 3 ranks (``stalled``: the others' reports, the temporary it left),
    then every scenario at 4 ranks (saving a checkpoint where the killed save was: the next save) and at 2 ranks
    (restoring it): ``worlds``."""
    if RUNS:
        return RUNS
    root = tmp_path_factory.mktemp("distributed")
    ck = str(root / "ck")
    t0 = time.monotonic()
    stalled = promises.run_stalled_save(root)
    TIMINGS["stalled_save"] = time.monotonic() - t0
    out: dict[int, dict[str, Any]] = {}
    for world, mode in ((4, "save"), (2, "restore")):
        path = root / f"world{world}.json"
        t0 = time.monotonic()
        spawn(workers.scenarios, world, str(path), ck, mode)
        TIMINGS[f"world{world}"] = time.monotonic() - t0
        out[world] = json.loads(path.read_text())
    RUNS.update(stalled=stalled, worlds=out)
    return RUNS


@pytest.fixture(scope="session")
def group_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    """Results of every scenario at 4 ranks (saving a checkpoint) then at 2 ranks (restoring it)."""
    return run_groups(tmp_path_factory)["worlds"]


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    return tmp_path
