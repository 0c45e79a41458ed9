"""The one way every ``conduit`` command reports a user's mistake: ``error: <what>`` on stderr, exit code 2.

A mistake is a :class:`~conduit.errors.ConduitError` (a bad file, config or
placement) or a ``ValueError`` raised while reading what the user gave; the
message is Conduit's own, which names the file, key and value. Anything else is
a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import typer
from rich.console import Console
from rich.markup import escape

from conduit.errors import ConduitError

__all__ = ["user_errors"]


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn a user's mistake raised inside the block into ``error: ...`` and exit code 2."""
    try:
        yield
    except typer.Exit:
        raise
    except (ConduitError, ValueError) as e:
        if isinstance(e, typer.BadParameter):
            raise
        Console(stderr=True).print(f"[red]error:[/red] {escape(str(e))}")
        raise typer.Exit(code=2) from None
