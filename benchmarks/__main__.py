"""``python -m benchmarks ...``: the typer app behind ``conduit bench ...``, from a source checkout."""

from __future__ import annotations

from benchmarks.cli import app

if __name__ == "__main__":  # pragma: no cover
    app(prog_name="python -m benchmarks")
