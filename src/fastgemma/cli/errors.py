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

