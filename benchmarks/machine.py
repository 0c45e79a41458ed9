"""What machine a benchmark ran on: the facts a reader needs to judge the numbers.

Stdlib, torch and numpy only; peer versions are read from package metadata
without importing the peers.
"""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import subprocess
import time
from importlib import metadata
from typing import Any

import numpy as np
import torch

from conduit.samplers import sumtree
from conduit.storage import streaming

__all__ = ["PEER_PACKAGES", "cpu_model", "machine_info", "memcpy_bandwidth", "package_version"]

#: the packages of the optional ``bench`` extra
PEER_PACKAGES = ("torchrl", "tensordict", "cpprb", "matplotlib")


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    """The ``lscpu`` "Model name" line (``/proc/cpuinfo`` as a fallback)."""
    if shutil.which("lscpu"):
        try:
            out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
            for line in out.splitlines():
                if line.strip().startswith("Model name"):
                    return line.split(":", 1)[1].strip()
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memcpy_bandwidth(nbytes: int = 128 << 20, repeats: int = 5) -> float:
    """Bytes/s of one large contiguous host copy (median of ``repeats``; torch's current threads)."""
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch every page first
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times)


def machine_info() -> dict[str, Any]:
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "numpy": np.__version__,
        "cuda": torch.cuda.is_available(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else [],
        "peers": {name: package_version(name) for name in PEER_PACKAGES},
        "load_avg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "streaming_writes": streaming.AVAILABLE,  # replay-ring writes with non-temporal stores (conduit._native)
        "native_sumtree": sumtree.NATIVE,  # the prioritized sampler's sum-tree in C (conduit._native)
    }
