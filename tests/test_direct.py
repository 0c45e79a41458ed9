"""The fast inline pull (conduit.delivery.direct) against the layered direct path and the operator graph."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conduit import Conduit, Mode, Schedule
from conduit.delivery import replay
from conduit.trace import Tracer
from tests.helpers import transitions

KINDS = {
    "uniform": {},
    "prioritized": {"sampler": "prioritized"},
    "max_times_sampled": {"max_times_sampled": 2},  # evicts: holes, ids read at the draw
    "rate_limited": {"rate_limit": {"samples_per_insert": 0.5, "tolerance": 64.0}},
    "batch_pool": {"batch_pool": 2},  # every batch gathered into the learner's ring of batch memory
}


def run(path: str, kw: dict, monkeypatch: pytest.MonkeyPatch) -> tuple[list, list, tuple]:
    """Twelve inline pulls of 8 with a unit pushed every third, through ``path``: fast, layered or graph."""
    with monkeypatch.context() as m:
        if path == "layered":  # the layered direct path alone
            m.setattr(replay, "direct_pull", lambda delivery, learner: None)
        edp = Conduit(
            policy="off_policy", train_batch_size=8, capacity=48, seed=0, timeout_s=5.0,
            schedule=Schedule(Mode(False, 1), Mode(False, 1)), tracer=Tracer(enabled=path == "graph"), **kw,
        )
        with edp:
            for u in range(3):
                edp.push(transitions(16, start=16 * u))
            tids, infos, ptrs = [], [], []
            for k in range(12):
                b = edp.pull()
                assert torch.equal(b["tid"], torch.from_numpy(b.info.ids))  # the rows are the ones it names
                ptrs.append(b["obs"].data_ptr())
                tids.append(b["tid"].tolist())
                i = b.info
                weights = None if i.weights is None else i.weights.tolist()
                infos.append(
                    (i.learner, i.pull_index, i.sampled_at_pull, i.iteration, i.buffer_version,
                     i.version_at_delivery, i.mode, i.indices.tolist(), i.ids.tolist(), weights)
                )
                if k % 3 == 2:
                    edp.push(transitions(16, start=48 + 16 * (k // 3)))
            if kw.get("batch_pool"):  # the ring's two blocks, taken in turn, on every path
                assert set(ptrs) == {block["obs"].data_ptr() for block in edp.delivery._pools[0]}
                assert len(set(ptrs)) == 2 and ptrs[2:] == ptrs[:-2]
            assert (edp.delivery._fast[0] is not None) == (path != "layered")  # built, and under tracing unused:
            gathers = sum(s.name == "select_gather" for s in edp.tracer.spans)
            assert gathers == (12 if path == "graph" else 0)  # every traced pull ran the graph
            d, limiter, buf = edp.delivery, edp.delivery.limiter, edp.buffer
            accounts = (
                d.stats.pulls, d.stats.invocations, d.stats.delivered_rows, d.graph.invocations,
                len(d.graph.timings), limiter.samples, limiter.reserved, buf.evicted_by_sampling,
                int(np.asarray(buf.table.times_sampled).sum()),
            )
    return tids, infos, accounts


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_fast_pull_delivers_what_the_layered_path_and_the_graph_do(kind, monkeypatch):
    fast = run("fast", KINDS[kind], monkeypatch)
    assert fast == run("layered", KINDS[kind], monkeypatch)
    assert fast == run("graph", KINDS[kind], monkeypatch)
    assert fast[2][:4] == (12, 12, 96, 12)


def test_the_fast_pull_steps_aside_for_a_new_schedule_tracing_and_a_new_storage():
    tracer = Tracer(enabled=False)
    with Conduit(
        policy="off_policy", train_batch_size=8, capacity=256, seed=0, timeout_s=5.0, tracer=tracer,
        schedule=Schedule(Mode(False, 1), Mode(False, 1)), growable={"obs"},
    ) as edp:
        edp.push(transitions(64))
        first = edp.pull()
        fast = edp.delivery._fast[0]
        assert fast is not None

        edp.delivery.set_mode(Mode(False, 2))  # g = 2: the layered path, which stages the second batch
        assert fast() is None
        b = [edp.pull() for _ in range(2)]
        assert edp.delivery._fast[0] is None
        assert [x.info.iteration for x in b] == [1, 1] and [x.info.pull_index for x in b] == [1, 2]

        edp.delivery.set_mode(Mode(False, 1))
        edp.pull()
        fast = edp.delivery._fast[0]
        assert fast is not None

        tracer.enabled = True  # a traced pull runs the graph, its spans recorded
        assert edp.pull().info.pull_index == 4
        assert [s.name for s in tracer.spans if s.name == "select_gather"] == ["select_gather"]
        tracer.enabled = False

        storage = edp.buffer.storage
        edp.push(transitions(8, dim=6, start=64))  # obs grows from 4 to 6: the rows move to a new storage
        edp.flush()
        assert edp.buffer.storage is not storage
        assert fast() is None
        b = edp.pull()
        assert b["obs"].shape == (8, 6) and torch.equal(b["tid"], torch.from_numpy(b.info.ids))
        assert edp.delivery._fast[0] is not fast and edp.delivery._fast_for[0][0] is edp.buffer.storage
        assert first.info.pull_index == 0 and b.info.pull_index == 5
