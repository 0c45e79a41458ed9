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
    rich_markup_mode=None,  # plain click help: flags shown as flags (no "<bool>"), choices listed
)

app.command("profile")(_profile.profile)
app.command("plan")(_plan.plan)
app.add_typer(_harness.lazy_app(), name="bench")


def _print_version(value: bool) -> None:
    if value:
        from conduit._version import __version__

        typer.echo(f"conduit {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log what the runtime does."),
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print Conduit's version and exit."
    ),
) -> None:
    level = logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")


if __name__ == "__main__":  # pragma: no cover
    app()
