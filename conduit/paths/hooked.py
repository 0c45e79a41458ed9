"""A delivery hook over rows no path drew: the path's own operator and checks, outside an invocation.

The sharded runtime's on-policy parts come from its collectives, not from a path's
invocation; :func:`hooked` runs the registered delivery hook over such a batch exactly
as a delivery path runs it (:class:`~conduit.operators.HookOperator`: a failure is
:class:`~conduit.errors.HookFailed` naming the hook, ``exp_in.info`` holds the batch's
facts under the keys a path gives, and :func:`kept_rows` checks one output row per input row).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from conduit.batch import BatchInfo
from conduit.errors import ConduitError
from conduit.operators import HookOperator, Packet, concat

__all__ = ["hooked", "kept_rows"]


def kept_rows(whole: dict[str, torch.Tensor], sizes: Sequence[int]) -> None:
    """A delivery hook keeps one output row per input row (the batches' sizes and provenance depend on it)."""
    rows = next(iter(whole.values())).shape[0] if whole else 0
    if rows != sum(sizes):
        raise ConduitError(
            f"the delivery hook wrote {rows} rows but this invocation delivers {sum(sizes)} "
            f"(batches of {sizes}); a delivery hook must keep one output row per input row"
        )


class _BatchFacts:
    """A batch's :class:`BatchInfo` as what a delivery hook reads as ``exp_in.info``: the keys a path's own
    invocation gives (:meth:`Claim.facts` and its policy's), for rows a path did not draw itself."""

    def __init__(self, info: BatchInfo, rows: int) -> None:
        self.info, self.rows = info, rows

    def facts(self) -> dict[str, object]:
        i = self.info
        out: dict[str, object] = {
            "learner": i.learner, "mode": i.mode, "granularity": float(i.mode.granularity), "sizes": [self.rows],
            "rows": self.rows, "sampled_at_pull": i.sampled_at_pull, "buffer_version": i.buffer_version,
            "version": i.buffer_version,
        }
        if i.epoch is None:  # off-policy: the draw (ReplayClaim.facts)
            out.update(invocation=i.iteration, drawn=i.rows, weights=i.weights, indices=i.indices, ids=i.ids)
        else:  # on-policy: the mini-batch's rows (MinibatchClaim.facts)
            out.update(iteration=i.iteration, rows=[i.indices], ids=[i.ids])
        return out


def hooked(hook: HookOperator | None, data: dict[str, torch.Tensor], info: BatchInfo) -> dict[str, torch.Tensor]:
    """One batch through a delivery hook outside a path's invocation (the sharded runtime's rows come from its
    exchange): the path's own operator (a failure is :class:`~conduit.errors.HookFailed` naming the hook, and
    ``exp_in.info`` holds the batch's facts under the keys a path gives) and its check that the hook kept one
    output row per input row. Without a hook, ``data`` itself."""
    if hook is None:
        return data
    rows = next(iter(data.values())).shape[0] if data else 0
    parts = hook.run(Packet([data], _BatchFacts(info, rows))).parts
    whole = concat(parts)
    kept_rows(whole, [rows])
    return whole
