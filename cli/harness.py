"""``conduit bench``: the benchmark harness's commands, where this install can reach the harness.

The harness (the top-level package ``benchmarks/``) ships with the source, not
the wheel. This module finds it, in order:

1. ``import benchmarks.cli`` (a checkout on ``sys.path``, or ``python -m`` from one);
2. a source checkout beside the installed package
   (``Path(conduit.__file__).resolve().parent.parent``: an editable install
   from a clone has ``benchmarks/`` there), added to ``sys.path``;

and exposes its typer app as :data:`app`. Where neither finds it, :data:`app`
is a stand-in whose every invocation says where the harness is and exits 1
(and where the harness is there but fails to import, one that says so: the
other commands of ``conduit`` keep working either way).
Only the CLI imports this module (``import conduit`` never does).

The harness imports torch and its peers, which takes seconds: ``conduit`` mounts
:func:`lazy_app`, a ``bench`` group that finds and imports the harness only when
``conduit bench ...`` runs, so ``conduit --help`` and ``conduit profile --help``
answer at once; :data:`app` itself is built on first access (PEP 562).
"""

from __future__ import annotations

import functools
import importlib
import sys
import traceback
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperGroup

import conduit

__all__ = ["CHECKOUT", "HELP", "MISSING", "app", "lazy_app", "load_harness"]

HELP = "Benchmarks of the experience path: micro, synthetic loop, validation sweep, summary (a source checkout's)."

#: the source checkout an editable install runs from: the harness is ``CHECKOUT / "benchmarks"`` there
CHECKOUT = Path(conduit.__file__).resolve().parent.parent

MISSING = (
    "conduit bench: the benchmark harness (benchmarks/) ships with the source, not the wheel, "
    "and this installation has no source checkout beside it.\n"
    "To run it, clone the repository and install it there: pip install -e \".[bench]\" "
    "(or run `python -m benchmarks` from the clone)."
)


def _absent(exc: ModuleNotFoundError) -> bool:
    """Whether the import failed because the harness itself is not there (not because something it needs is not)."""
    return exc.name in ("benchmarks", "benchmarks.cli")


def _import_harness() -> typer.Typer | None:
    try:
        module = importlib.import_module("benchmarks.cli")
    except ModuleNotFoundError as exc:
        if not _absent(exc):
            raise  # the harness is there but something it imports is not: not the same message
        return None
    found = getattr(module, "app", None)
    return found if isinstance(found, typer.Typer) else None  # some other project's benchmarks.cli


def _forget_other_benchmarks(root: Path) -> None:
    """Drop a ``benchmarks`` imported from elsewhere (TorchRL installs a namespace package of that name)."""
    if "benchmarks" not in sys.modules or sys.modules["benchmarks"] is None:  # None: blocked on purpose, stays so
        return
    mod = sys.modules["benchmarks"]
    file = getattr(mod, "__file__", None)
    if file is not None and Path(file).resolve() == (root / "benchmarks" / "__init__.py").resolve():
        return
    for name in [n for n in sys.modules if n == "benchmarks" or n.startswith("benchmarks.")]:
        del sys.modules[name]


def load_harness(checkout: Path | None = None) -> typer.Typer | None:
    """The harness's typer app: importable as is, or from the source checkout (default :data:`CHECKOUT`)."""
    found = _import_harness()
    if found is not None:
        return found
    root = (CHECKOUT if checkout is None else checkout).resolve()
    if not (root / "benchmarks" / "__init__.py").is_file():
        return None
    _forget_other_benchmarks(root)
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))  # first: another project's package of that name must not win
    return _import_harness()


def _stand_in(message: str, help: str) -> typer.Typer:
    """A ``conduit bench`` whose every invocation (any command, options, ``--help``) prints ``message``, exits 1."""

    class _Unavailable(TyperGroup):
        def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:  # type: ignore[override]
            if ctx.resilient_parsing:  # shell completion: nothing to complete, nothing to say
                return []
            typer.echo(message, err=True)
            ctx.exit(1)
            return []  # pragma: no cover (ctx.exit raises)

    stand_in = typer.Typer(cls=_Unavailable, help=help, add_completion=False)

    @stand_in.callback(invoke_without_command=True)
    def _bench() -> None:  # pragma: no cover (parse_args exits first)
        typer.echo(message, err=True)
        raise typer.Exit(1)

    return stand_in


def _make_app() -> typer.Typer:
    try:
        harness = load_harness()
    except Exception as exc:  # a broken harness must not take `conduit profile` and `conduit plan` down with it
        reason = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return _stand_in(
            f"conduit bench: the benchmark harness (benchmarks/) failed to import: {reason}\n"
            "Run `python -m benchmarks` in the checkout for the traceback.",
            "Benchmarks of the experience path (the harness failed to import: run it for the reason).",
        )
    if harness is None:
        return _stand_in(
            MISSING, "Benchmarks of the experience path (the harness ships with the source checkout, not the wheel)."
        )
    return harness


app: typer.Typer  # built on first access by __getattr__ below (the annotation alone binds nothing)


@functools.cache
def _app() -> typer.Typer:
    return _make_app()


def __getattr__(name: str) -> Any:
    """``app``: the harness's typer app (or its stand-in), built on first access."""
    if name == "app":
        return _app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _LazyBench(TyperGroup):
    """``conduit bench``: the harness's own group, imported when ``bench`` is invoked (any arguments)."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any
    ) -> Any:  # click's Context (typer does not re-export its type, and click is not ours to import)
        real = typer.main.get_command(_app())
        return real.make_context(info_name, args, parent=parent, **extra)


def lazy_app() -> typer.Typer:
    """The ``bench`` group ``conduit`` mounts: its help line is static, the harness is imported when it runs."""
    lazy = typer.Typer(cls=_LazyBench, help=HELP, add_completion=False)

    @lazy.callback(invoke_without_command=True)
    def _bench() -> None:  # pragma: no cover (make_context hands the invocation to the harness's own group)
        pass

    return lazy
