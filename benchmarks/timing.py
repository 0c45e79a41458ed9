"""Interleaved timing: the only way to compare peers on a shared, noisy machine.

Every case runs as a *block* of ``n`` operations (a block may end with a flush,
so asynchronous peers are timed to completion) and reports seconds per
operation. One repeat times every case once, in a fresh random order (seeded)
each repeat, so a burst of load from a neighbour — or the after-effects of the
case timed just before — lands on different cases each time instead of on one;
the statistic is the median over repeats. The garbage collector is
paused inside a block (a collection is noise, not a property of the peer).
"""

from __future__ import annotations

import contextlib
import gc
import random
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch

__all__ = ["Stat", "block_seconds", "calls_for", "interleaved", "torch_threads"]

#: one timed block: run ``n`` operations (and whatever makes them complete)
Block = Callable[[int], None]


@dataclass(frozen=True)
class Stat:
    """Seconds per operation, one sample per repeat."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def low(self) -> float:
        return min(self.samples)

    @property
    def high(self) -> float:
        return max(self.samples)

    def to_json(self) -> dict[str, object]:
        return {"median_s": self.median, "min_s": self.low, "max_s": self.high, "samples_s": list(self.samples)}


def block_seconds(block: Block, n: int) -> float:
    """Seconds per operation of one block of ``n`` operations."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        block(n)
        return (time.perf_counter() - t0) / n
    finally:
        if enabled:
            gc.enable()


def calls_for(block: Block, target_s: float, lo: int = 20, hi: int = 2000) -> int:
    """How many operations make a block of about ``target_s`` seconds.

    Doubles a trial block until it lasts a quarter of the target, then takes the
    fastest of three such blocks: a one- or two-operation estimate is dominated
    by a cold cache and TLB (the first random gathers after another peer ran) or
    by a neighbour's burst, and would make every block too short to amortize them.
    """
    block(1)
    n = 1
    while block_seconds(block, n) * n < target_s / 4 and n < hi:
        n *= 2
    per = min(block_seconds(block, n) for _ in range(3))
    return max(lo, min(hi, round(target_s / max(per, 1e-7))))


def interleaved(
    cases: Mapping[str, Block],
    calls: int | Mapping[str, int],
    repeats: int,
    *,
    warmup: int = 1,
    on_repeat: Callable[[int], None] | None = None,
    seed: int = 0,
) -> dict[str, Stat]:
    """Time every case ``repeats`` times, interleaved, in a fresh random order each repeat.

    Not a rotation: rotating a list keeps every case behind the same neighbour in
    every repeat, and a case can leave the machine slower for the next one — on
    this VM a block of fresh 4 MB allocations freed again (numpy and cpprb
    samples) made the case timed right after it 2x slower, which a rotation
    charged to one case (Conduit's headline push and pull) in every repeat.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    names = list(cases)

    def n_of(name: str) -> int:
        return calls if isinstance(calls, int) else calls[name]

    for name in names:
        for _ in range(warmup):
            cases[name](max(1, n_of(name) // 4))
    samples: dict[str, list[float]] = {name: [] for name in names}
    rng = random.Random(seed)
    for r in range(repeats):
        order = names[:]
        rng.shuffle(order)
        for name in order:
            samples[name].append(block_seconds(cases[name], n_of(name)))
        if on_repeat is not None:
            on_repeat(r)
    return {name: Stat(tuple(v)) for name, v in samples.items()}


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` torch intra-op threads (``None``: leave them), restored afterwards."""
    previous = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
