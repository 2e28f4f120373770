"""The `rlopt` command: typer commands that parse flags, call one library function, and render.

Each command module registers its commands on `rlopt.cli.base.app` when imported; adding a command is one
module and one name in the import below.
"""

from __future__ import annotations

import sys
from pathlib import Path

# each module registers its commands on `app`, in this order in `rlopt --help`
from rlopt.cli import build, artifacts, tools, diff, serve, cache  # noqa: F401, I001
from rlopt.cli.base import app
from rlopt.errors import RloptError


def _internal_error(exc: BaseException) -> str:
    """Write the traceback under the cache directory's logs/; returns the log's path."""
    import os
    import tempfile
    import traceback
    from datetime import datetime, timezone

    from rlopt.machine import cache_root

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    name = f"internal-error-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}-{os.getpid()}.log"
    for folder in (cache_root() / "logs", Path(tempfile.gettempdir())):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(f"rlopt {' '.join(sys.argv[1:])}\n{text}", encoding="utf-8")
            return str(folder / name)
        except OSError:
            continue
    return "(no writable log directory)"


RUN_ONLY_COMMANDS = frozenset({"diff", "refit", "serve", "verify", "warmup"})


def main(argv: list[str] | None = None) -> None:
    """Entry point: user errors become one line on stderr and the contract's exit code; usage errors exit 2.

    Anything else is a bug in rlopt: one line saying so, the traceback in a log file, exit 3.
    As the process's own entry (argv from sys.argv), a command that only runs artifacts loads each backend's
    runtime alone (rlopt.backends.runtime_only_process); a call with `argv` leaves its process as it is.
    """
    if argv is None and next((a for a in sys.argv[1:] if not a.startswith("-")), None) in RUN_ONLY_COMMANDS:
        from rlopt.backends import runtime_only_process

        runtime_only_process()
    try:
        app(args=argv)
    except RloptError as exc:
        sys.stderr.write(f"rlopt: error: {exc}\n")
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("rlopt: interrupted; nothing was published\n")
        sys.exit(130)
    except Exception as exc:  # not a user's mistake: every one of those is an RloptError
        message = " ".join(str(exc).split())
        sys.stderr.write(f"rlopt: internal error (a bug in rlopt): {type(exc).__name__}: {message}; "
                         f"the traceback is in {_internal_error(exc)}\n")
        sys.exit(3)


if __name__ == "__main__":
    main()
