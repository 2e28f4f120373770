"""The typer app every command module registers on, and the helpers the commands share."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Compile RL policy/value networks into fast, verified, deployable artifacts.")

JsonFlag = Annotated[bool, typer.Option("--json", help="Print exactly one JSON document on stdout.")]
JunitOption = Annotated[Optional[Path], typer.Option("--junit", help="Write the diff's JUnit XML here: a testsuite "
                                                     "per network, a testcase per check.")]


def print_json(document: object) -> None:
    sys.stdout.write(json.dumps(document, indent=2) + "\n")


def exit_failed(failures: list[str], note: str | None = None) -> None:
    """Each failure as one FAIL line on stderr, then `note`; exit 1 (the contract's parity-failure code)."""
    from rlopt.render import stderr

    for failure in failures:
        stderr.print(f"[red]FAIL[/] {failure}")
    if note:
        stderr.print(note)
    raise typer.Exit(1)
