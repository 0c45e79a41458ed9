"""The core's reuse queue: order, reuse, drops, tokens, two threads, snapshot and restore."""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit.ext import ReuseQueue


@dataclass
class Entry:
    reuses_left: int
    receive_time: float
    group: tuple[int, ...]
    reuses: int = 0


def make(max_size: int = 4, group_size: int = 2, reuses: int = 2) -> ReuseQueue[Entry]:
    clock = iter(range(10**6))
    return ReuseQueue(max_size, group_size, lambda g: (Entry(reuses, float(next(clock)), tuple(g)), None))


def test_groups_form_entries_handed_out_most_reuses_left_then_newest():
    q = make(max_size=8, group_size=2, reuses=2)
    assert q.put(0) is None and q.put(1).group == (0, 1)
    q.put(2)
    q.put(3)
    got = [q.get()[0].group for _ in range(4)]
    assert got == [(2, 3), (0, 1), (2, 3), (0, 1)]
    assert q.get() is None and (q.formed, q.handed, q.dropped) == (2, 4, 0)


def test_the_same_entry_comes_back_with_its_counts():
    q = make(group_size=1, reuses=3)
    q.put("x")
    first = q.get()[0]
    again = q.get()[0]
    assert first is again and (again.reuses_left, again.reuses) == (1, 2)


def test_over_max_size_the_fewest_reuses_left_and_oldest_is_dropped():
    q = make(max_size=2, group_size=1, reuses=2)
    q.put("a")
    q.put("b")
    q.get()  # b: one reuse left now
    q.put("c")  # three entries: b (1 left) is dropped
    assert q.dropped == 1 and sorted(e.group[0] for e in q.snapshot()[0]) == ["a", "c"]


def test_a_token_comes_back_with_its_entry_until_the_entry_leaves():
    q: ReuseQueue[Entry] = ReuseQueue(4, 1, lambda g: (Entry(2, 0.0, tuple(g)), f"event-{g[0]}"))
    q.put("a")
    assert q.get()[1] == "event-a"
    assert q.get()[1] == "event-a"  # last reuse: the token goes with it
    assert q._tokens == {}


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.one_of(st.just("get"), st.integers(0, 99)), max_size=80),
       max_size=st.integers(1, 5), reuses=st.integers(1, 3))
def test_matches_a_sorted_list_model(ops, max_size, reuses):
    q = make(max_size=max_size, group_size=1, reuses=reuses)
    model: list[list] = []  # [reuses_left, receive time, insertion seq, item], kept sorted
    clock = seq = 0

    def place(e):
        nonlocal seq
        e[2] = seq = seq + 1
        model.append(e)
        model.sort(key=lambda x: (x[0], x[1], x[2]))
        while len(model) > max_size:
            model.pop(0)

    for op in ops:
        if op == "get":
            got = q.get()
            if not model:
                assert got is None
                continue
            top = model.pop()
            top[0] -= 1
            assert got[0].group == (top[3],) and got[0].reuses_left == top[0]
            if top[0] > 0 and len(model) < max_size:
                place(top)
        else:
            q.put(op)
            place([reuses, float(clock), 0, op])
            clock += 1
    assert [e.group[0] for e in q.snapshot()[0]] == [e[3] for e in model]


def test_two_threads_each_formed_entry_handed_out_once():
    q = make(max_size=10_000, group_size=1, reuses=1)
    n, seen = 2_000, []

    def producer():
        for i in range(n):
            q.put(i)

    t = threading.Thread(target=producer)
    t.start()
    for _ in range(50 * n):  # bounded
        got = q.get()
        if got is not None:
            seen.append(got[0].group[0])
        elif not t.is_alive() and len(q) == 0:
            break
    t.join(30)
    assert sorted(seen) == list(range(n)) and q.handed == n


def test_snapshot_and_restore_keep_order_pending_and_counts():
    q = make(max_size=8, group_size=2, reuses=2)
    for i in range(5):
        q.put(i)
    q.get()
    entries, pending, counts = copy.deepcopy(q.snapshot())  # what a pickle round trip hands back
    r = make(max_size=8, group_size=2, reuses=2)
    r.restore(entries, pending, counts)
    assert pending == [4] and (r.formed, r.handed) == (2, 1)
    assert [q.get()[0].group for _ in range(3)] == [r.get()[0].group for _ in range(3)]


def test_a_group_being_formed_is_in_a_snapshot_and_a_failed_form_keeps_its_items():
    started, release = threading.Event(), threading.Event()

    def slow(group):
        started.set()
        assert release.wait(10)
        return Entry(1, 0.0, tuple(group)), None

    q: ReuseQueue[Entry] = ReuseQueue(4, 2, slow)
    q.put("a")
    t = threading.Thread(target=q.put, args=("b",))
    t.start()
    assert started.wait(10)
    q.put("c")
    assert q.snapshot()[1] == ["a", "b", "c"]  # the group in formation, then what waits
    release.set()
    t.join(10)
    assert q.snapshot()[1] == ["c"] and len(q) == 1

    def broken(group):
        raise ValueError("cannot stack")

    r: ReuseQueue[Entry] = ReuseQueue(4, 2, broken)
    r.put(1)
    with pytest.raises(ValueError, match="cannot stack"):
        r.put(2)
    assert r.snapshot()[1] == [1, 2] and len(r) == 0
