"""What a sharded buffer refuses before the group forms, with the reason (no process group needed)."""

from __future__ import annotations

import pytest

import conduit.distributed as cd
from conduit import ConfigError


@pytest.mark.parametrize("policy", [dict(policy="off_policy", capacity=64), dict(policy="on_policy")], ids=str)
def test_growable_fields_are_refused_across_ranks(policy):
    """Each shard would grow its own layout and the ranks would stop agreeing on one: refused at construction,
    not accepted and then every pull failing."""
    with pytest.raises(ConfigError, match="growable=\\['obs'\\]: not supported across ranks"):
        cd.Conduit(**policy, train_batch_size=4, growable=("obs",))


def test_a_rate_band_given_by_its_edges_is_refused_across_ranks():
    """The group shares its room as ± tolerance; Reverb's [min_diff, max_diff] (``RateLimit.queue``) is one
    process's: refused with the reason, not accepted and then miscounted."""
    from conduit import RateLimit

    with pytest.raises(ConfigError, match="min_diff/max_diff"):
        cd.Conduit(policy="off_policy", capacity=64, train_batch_size=4, rate_limit=RateLimit.queue(64))
