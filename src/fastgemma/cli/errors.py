"""The command line's one convention for a user's mistake: one `error: ...` line on stderr, exit code 2.

Shared by every command module (`main`, `verify`, `tune`, `submission`), which import it from
here, so none of them imports another.
"""

from __future__ import annotations

from typing import NoReturn

import typer


def fail(message: str) -> NoReturn:
    """Print `message` as one `error:` line and exit with code 2."""
    one_line = " ".join(part.strip() for part in message.splitlines() if part.strip())
    typer.echo(f"error: {one_line}", err=True)
    raise typer.Exit(code=2)


def left_default(ctx: typer.Context, name: str) -> bool:
    """The parameter `name` was not given on the command line (typer vendors click, so the
    source is compared by name)."""
    source = ctx.get_parameter_source(name)
    return source is None or source.name in ("DEFAULT", "DEFAULT_MAP")
