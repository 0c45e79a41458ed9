"""The sharded buffer with learners on GPUs: NCCL across two GPUs, and gloo moving rows for CUDA learners.

Skipped without CUDA (``scripts/gpu-checks.sh`` runs them, with the other ``-m gpu`` tests, where there is).
NCCL cannot run two ranks on one GPU, so its test needs two; the gloo variant runs on one GPU (or more).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from conduit.distributed import launch
from tests.distributed import gpu_workers

pytestmark = pytest.mark.gpu


def _run(world: int, backend: str, out: Path) -> list[dict]:
    mp.spawn(gpu_workers.rows_on_gpus, args=(world, launch.free_port(), backend, str(out)), nprocs=world, join=True)
    return json.loads(out.read_text())


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs a GPU per rank: two GPUs")
def test_nccl_moves_rows_between_two_gpus(tmp_path: Path) -> None:
    reports = _run(2, "nccl", tmp_path / "nccl.json")
    for rank, rep in enumerate(reports):
        assert rep["devices"] == [f"cuda:{rank}"] and rep["rows"] == 20 * 32
        assert rep["owners"] == [0, 1]  # global sampling: rows from both shards reach each learner


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gloo_moves_rows_for_cuda_learners_on_one_gpu(tmp_path: Path) -> None:
    reports = _run(2, "gloo", tmp_path / "gloo.json")
    for rank, rep in enumerate(reports):
        assert rep["devices"] == [f"cuda:{rank % torch.cuda.device_count()}"]
        assert rep["rows"] == 20 * 32 and rep["owners"] == [0, 1]
