"""Helpers the reliability tests share: actors and learners as real threads, bounded in rows and time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from conduit import Conduit
from conduit.errors import ConduitTimeout


class Crew:
    """Threads that run ``fn`` and keep what each raised; ``join`` re-raises the first failure."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def start(self, fn: Callable[[], None], name: str) -> None:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # kept for join(), which fails the test with it
                self.errors.append(exc)

        t = threading.Thread(target=run, name=name, daemon=True)
        self.threads.append(t)
        t.start()

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self.threads if t.is_alive()]
        if self.errors:
            raise self.errors[0]
        assert not alive, f"threads still running after {timeout}s: {alive}"


def pull_until(edp: Conduit, learner: int, done: Callable[[], bool], got: list, deadline: float) -> None:
    """Pull for ``learner`` until ``done()`` (re-checked between short, bounded pulls) or the deadline."""
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"learner {learner}: not done by the deadline")
        try:
            got.append(edp.pull(learner, timeout=0.2))
        except ConduitTimeout:
            continue


def until(condition: Callable[[], object], seconds: float = 5.0) -> None:
    """Wait (polling, bounded) until ``condition()`` holds: a thread reached the state a test sets up."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.fixture
def crew() -> Crew:
    return Crew()
