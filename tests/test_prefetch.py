"""The core's prefetch node: any iterator run ahead on the core's worker, items in order, failures surfaced."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from conduit.errors import ConduitTimeout, RuntimeFailed
from conduit.ext import Prefetcher, PrefetchStats


def shuffled(n: int, seed: int):
    """A source with its own random stream (what a framework's mini-batch iterator is)."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        yield torch.from_numpy(rng.permutation(8))


@pytest.mark.parametrize("depth", [1, 4])
def test_items_arrive_in_the_order_the_source_makes_them_and_only_the_worker_advances_it(depth):
    want = [t.tolist() for t in shuffled(20, seed=3)]
    threads: set[str] = set()

    def source():
        for t in shuffled(20, seed=3):
            threads.add(threading.current_thread().name)
            yield t

    stats = PrefetchStats()
    got = [t.tolist() for t in Prefetcher(source(), depth=depth, stats=stats, name="test-prefetch")]
    assert got == want
    assert threads == {"conduit-test-prefetch"}
    assert stats.updates == 1 and stats.minibatches == 20


def test_it_runs_at_most_depth_items_ahead():
    made = []

    def source():
        for i in range(10):
            made.append(i)
            yield i

    it = iter(Prefetcher(source(), depth=2))
    assert next(it) == 0
    time.sleep(0.2)  # the worker fills what the depth allows, and no more
    assert len(made) <= 1 + 2 + 1  # handed, staged, and the one being made
    assert list(it) == list(range(1, 10))


def test_a_failing_source_fails_the_consumer_with_its_traceback():
    def broken():
        yield 1
        raise ValueError("boom in the source")

    it = iter(Prefetcher(broken(), timeout_s=5))
    assert next(it) == 1
    with pytest.raises(RuntimeFailed, match="boom in the source"):
        next(it)


def test_a_source_that_hangs_is_a_timeout_naming_the_worker():
    release = threading.Event()

    def slow():
        release.wait(10)
        yield 1

    it = iter(Prefetcher(slow(), timeout_s=0.3, name="slow-source"))
    try:
        with pytest.raises(ConduitTimeout, match="slow-source"):
            next(it)
    finally:
        release.set()
        it.close()


def test_depth_must_be_positive():
    with pytest.raises(ValueError, match="depth"):
        Prefetcher(iter([]), depth=0)
