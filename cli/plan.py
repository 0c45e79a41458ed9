"""``conduit plan``: placement for a topology file and workload (see issue 3)."""

from __future__ import annotations

import typer


def plan() -> None:
    """Compute and print the buffer placement for a topology and workload."""
    raise typer.Exit(code=2)
