"""`rlopt cache ...` and `rlopt schema`."""

from __future__ import annotations

from typing import Annotated

import typer

from rlopt.cli.base import JsonFlag, app, print_json


cache_app = typer.Typer(no_args_is_help=True, help="The stage cache ($RLOPT_CACHE, default ~/.cache/rlopt).")
app.add_typer(cache_app, name="cache")


@cache_app.command("info")
def cache_info_command(json_out: JsonFlag = False) -> None:
    """Where the cache is, how many entries each stage has, and its size."""
    from rlopt.compile.cache import StageCache
    from rlopt.render import stdout

    info = StageCache().info()
    if json_out:
        print_json(info)
        return
    stdout.print(f"{info['root']}: {info['bytes'] / 1e6:.1f} MB", markup=False)
    for stage, count in info["entries"].items():
        stdout.print(f"  {stage}: {count} entries", markup=False)


@cache_app.command("prune")
def cache_prune_command(json_out: JsonFlag = False) -> None:
    """Remove entries made by other stage code or other tool versions (they can never hit again)."""
    from rlopt.compile.cache import StageCache
    from rlopt.compile.network import entry_is_current, stage_code_versions
    from rlopt.render import stdout

    versions = stage_code_versions()
    removed = StageCache().prune(lambda stage, components: entry_is_current(stage, components, versions))
    if json_out:
        print_json({"removed": removed})
        return
    stdout.print(f"removed {removed} entries made by other code or tool versions", markup=False)


@cache_app.command("clear")
def cache_clear_command() -> None:
    """Remove every cache entry."""
    from rlopt.compile.cache import StageCache
    from rlopt.render import stdout

    stdout.print(f"removed {StageCache().clear()} entries", markup=False)


@app.command("schema")
def schema_command(kind: Annotated[str, typer.Argument(help="recipe, profile or manifest.")]) -> None:
    """Print the JSON schema of a recipe, a warmup profile or a manifest (for editors and CI validation)."""
    from rlopt.schema import json_schema

    print_json(json_schema(kind))
