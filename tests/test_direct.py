"""The one inline pull route: its operators called directly (no hook, nobody tracing) against the graph."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conduit import Conduit, Mode, Schedule
from conduit.trace import Tracer
from tests.helpers import transitions

KINDS = {
    "uniform": {},
    "prioritized": {"sampler": "prioritized"},
    "max_times_sampled": {"max_times_sampled": 2},  # evicts: holes, ids read at the draw
    "rate_limited": {"rate_limit": {"samples_per_insert": 0.5, "tolerance": 64.0}},
    "batch_pool": {"tuning": {"batch_pool": 2}},  # every batch gathered into the learner's ring of batch memory
}


def run(path: str, kw: dict) -> tuple[list, list, tuple]:
    """Twelve inline pulls of 8 with a unit pushed every third, by ``path``: direct, graph (traced) or hook."""
    edp = Conduit(
        policy="off_policy", train_batch_size=8, capacity=48, seed=0, timeout_s=5.0,
        pinned=Schedule(Mode(False, 1), Mode(False, 1)), tracer=Tracer(enabled=path == "graph"), **kw,
    )
    if path == "hook":  # a registered hook runs the graph, untraced

        @edp.register_delivery(input="ExperienceBuffer", output="Learner")
        def identity(exp_in, learn_out):
            learn_out.write(exp_in.read())

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
        if kw.get("tuning", {}).get("batch_pool"):  # the ring's two blocks, taken in turn, on every path
            assert len(set(ptrs)) == 2 and ptrs[2:] == ptrs[:-2]
        gathers = sum(s.name == "select_gather" for s in edp.tracer.spans)
        assert gathers == (12 if path == "graph" else 0)  # every traced pull ran the graph
        d, buf = edp.delivery, edp.buffer
        limiter = buf.limiter
        accounts = (
            d.stats.pulls, d.stats.invocations, d.stats.delivered_rows, d.graph.invocations,
            len(d.graph.timings), limiter.samples, limiter.reserved, buf.evicted_by_sampling,
            int(np.asarray(buf.table.times_sampled).sum()),
        )
    return tids, infos, accounts


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_direct_route_delivers_what_the_graph_does(kind):
    direct = run("direct", KINDS[kind])
    assert direct == run("graph", KINDS[kind])
    assert direct == run("hook", KINDS[kind])
    assert direct[2][:5] == (12, 12, 96, 12, 12)


def test_the_inline_route_follows_a_new_schedule_tracing_and_a_new_storage():
    tracer = Tracer(enabled=False)
    with Conduit(
        policy="off_policy", train_batch_size=8, capacity=256, seed=0, timeout_s=5.0, tracer=tracer,
        pinned=Schedule(Mode(False, 1), Mode(False, 1)), growable={"obs"},
    ) as edp:
        edp.push(transitions(64))
        first = edp.pull()

        edp.delivery.set_mode(Mode(False, 2))  # g = 2: one invocation, its second batch staged
        b = [edp.pull() for _ in range(2)]
        assert [x.info.iteration for x in b] == [1, 1] and [x.info.pull_index for x in b] == [1, 2]
        assert [x.info.sampled_at_pull for x in b] == [1, 1] and b[1].info.staleness == 1

        edp.delivery.set_mode(Mode(False, 1))
        assert edp.pull().info.iteration == 2

        tracer.enabled = True  # a traced pull runs the graph, its spans recorded
        assert edp.pull().info.pull_index == 4
        assert [s.name for s in tracer.spans if s.name == "select_gather"] == ["select_gather"]
        tracer.enabled = False

        storage = edp.buffer.storage
        edp.push(transitions(8, dim=6, start=64))  # obs grows from 4 to 6: the rows move to a new storage
        edp.flush()
        assert edp.buffer.storage is not storage
        b = edp.pull()
        assert b["obs"].shape == (8, 6) and torch.equal(b["tid"], torch.from_numpy(b.info.ids))
        assert first.info.pull_index == 0 and b.info.pull_index == 5
        assert len([s for s in tracer.spans if s.name == "select_gather"]) == 1  # untraced again: direct
