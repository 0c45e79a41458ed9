"""Promise: a fault at any point fails the runtime cleanly — every thread hears of it, nothing hangs.

A hook raises at a random invocation (seeded), on either path, under every
off-policy schedule, while actor and learner threads run; then every thread
must end with the runtime's failure (``HookFailed``) or ``RuntimeClosed``, and
``close`` must return within its timeout and leave no worker behind.
"""

from __future__ import annotations

import itertools
import random
import threading
import time

import pytest

from conduit import Conduit, HookFailed, Mode, RuntimeClosed, RuntimeFailed, Schedule
from tests.helpers import transitions

SCHEDULES = [
    Schedule(Mode(i_ovl, gi), Mode(d_ovl, gd))
    for i_ovl, gi, d_ovl, gd in itertools.product((False, True), (1, 2), (False, True), (1, 2))
]
CASES = [(s, path, seed) for s in SCHEDULES for path in ("ingestion", "delivery") for seed in (0, 1)]


@pytest.mark.parametrize("schedule, path, seed", CASES, ids=[f"{s}-{p}-{k}" for s, p, k in CASES])
def test_a_hook_failing_at_a_random_invocation_reaches_every_thread(schedule, path, seed):
    fail_at = random.Random(seed * 7919 + {"ingestion": 1, "delivery": 2}[path]).randint(1, 40)
    edp = Conduit(policy="off_policy", train_batch_size=8, capacity=4096, timeout_s=5.0, pinned=schedule)
    calls = [0]
    register = edp.register_ingestion if path == "ingestion" else edp.register_delivery

    @register()
    def flaky(src, dst):
        calls[0] += 1
        if calls[0] == fail_at:
            raise RuntimeError(f"injected fault at invocation {fail_at}")
        dst.write(src.read())

    outcomes: dict[str, BaseException | None] = {}

    def run(name: str, body) -> None:
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                body()
            outcomes[name] = None
        except BaseException as exc:  # what each thread ends with
            outcomes[name] = exc

    edp.start()
    counter = iter(range(10**9))
    threads = [
        threading.Thread(target=run, args=(f"actor-{a}", lambda: edp.push(transitions(8, start=8 * next(counter)))))
        for a in range(2)
    ] + [threading.Thread(target=run, args=("learner", lambda: edp.pull(timeout=5.0)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a thread hung after the fault"
    assert set(outcomes) == {"actor-0", "actor-1", "learner"}
    for name, exc in outcomes.items():
        assert isinstance(exc, (RuntimeFailed, RuntimeClosed)), f"{name} ended with {exc!r}"
    assert isinstance(edp.failure.error, HookFailed) and f"invocation {fail_at}" in str(edp.failure.error)
    t0 = time.monotonic()
    edp.close(timeout=2.0)
    assert time.monotonic() - t0 < 2.2
    assert not any(t.name.startswith("conduit-") and t.is_alive() for t in threading.enumerate())
