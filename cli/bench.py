"""``conduit bench``: micro and synthetic benchmarks against the peers (see issue 6)."""

from __future__ import annotations

import typer

app = typer.Typer(help="Benchmarks of the experience path against the peers.", no_args_is_help=True)
