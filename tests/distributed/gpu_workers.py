"""What each rank runs in the distributed GPU tests (spawned processes import this module)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import conduit.distributed as cd
from conduit.distributed import launch


def _unit(tids: np.ndarray) -> dict[str, torch.Tensor]:
    tid = torch.as_tensor(tids, dtype=torch.int64)
    return {"obs": tid.to(torch.float32).unsqueeze(1).repeat(1, 3), "tid": tid}


def rows_on_gpus(rank: int, world: int, port: int, backend: str, out: str) -> None:
    """Each rank fills its shard, pulls global batches onto its GPU; rank 0 writes what it saw."""
    device = f"cuda:{rank % torch.cuda.device_count()}"
    torch.cuda.set_device(torch.device(device))
    launch.init_process_group(rank, world, port, backend=backend)
    try:
        edp = cd.Conduit(policy="off_policy", train_batch_size=32, capacity=2000 * world, seed=1, timeout_s=60,
                         learner_device=device)
        report: dict[str, Any] = {}
        with edp:
            tids = np.arange(rank * 10_000, rank * 10_000 + 1000)
            for chunk in np.array_split(tids, 20):
                edp.push(_unit(chunk))
            seen: list[int] = []
            devices = set()
            for _ in range(20):
                b = edp.pull()
                devices.add(str(b["obs"].device))
                assert torch.equal(b["obs"][:, 0].to(torch.int64), b["tid"])  # each row whole
                seen += b["tid"].cpu().tolist()
            report = {"devices": sorted(devices), "owners": sorted({t // 10_000 for t in seen}), "rows": len(seen)}
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, report)
        if rank == 0:
            with open(out, "w") as f:
                json.dump(gathered, f)
    finally:
        dist.destroy_process_group()
