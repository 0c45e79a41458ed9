"""The ``conduit`` command line: ``conduit profile``, ``conduit plan``, ``conduit bench``.

typer + rich earn their place here (and only here): typed options from
function signatures, and tables/progress bars a person can read at a glance.
``import conduit`` never imports this package.
"""

from __future__ import annotations

import logging

import typer
from conduit.cli import harness as _harness
from conduit.cli import plan as _plan
from conduit.cli import profile as _profile

app = typer.Typer(
    name="conduit",
    help="Conduit: profile a machine and workload, plan placement and schedule, benchmark the experience path.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

app.command("profile")(_profile.profile)
app.command("plan")(_plan.plan)
app.add_typer(_harness.lazy_app(), name="bench")


@app.callback()
def _main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log what the runtime does.")) -> None:
    level = logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")


if __name__ == "__main__":  # pragma: no cover
    app()
