"""The `rlopt` command: typer commands that parse flags, call one library function, and render."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from rlopt.errors import RloptError

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Compile RL policy/value networks into fast, verified, deployable artifacts.")

JsonFlag = Annotated[bool, typer.Option("--json", help="Print exactly one JSON document on stdout.")]


def _print_json(document: object) -> None:
    sys.stdout.write(json.dumps(document, indent=2) + "\n")


@app.command("compile")
def compile_command(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML (contract section 1).")],
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="MODEL_DIR (default artifacts/<name>).")] = None,
    backend: Annotated[Optional[list[str]], typer.Option("--backend", help="Only these backends (repeatable).")] = None,
    tune_trials: Annotated[Optional[int], typer.Option("--tune-trials", help="MetaSchedule trials (0 = untuned).")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Do not use the stage cache.")] = False,
    json_out: JsonFlag = False,
) -> None:
    """Script -> ONNX -> TVM / ONNX Runtime / TensorRT -> verify -> benchmark -> write MODEL_DIR."""
    from rlopt.pipeline import compile_recipe
    from rlopt.render import ProgressReporter, parity_failure_table, stage_table, stderr, stdout, summary_table

    with ProgressReporter() as reporter:
        result = compile_recipe(recipe, output, backends=backend, tune_trials=tune_trials, reporter=reporter)
    if json_out:
        _print_json({"model_dir": str(result.model_dir), "passed": result.passed, "failures": result.failures,
                     "seconds": round(result.seconds, 2), "stages": [list(r) for r in reporter.rows],
                     "manifest": result.manifest.model_dump(mode="json")})
    else:
        stdout.print(stage_table(reporter.rows))
        stdout.print(summary_table(result.manifest))
        stdout.print(f"wrote {result.model_dir} in {result.seconds:.1f} s")
    if not result.passed:
        stderr.print(parity_failure_table(result.manifest))
        for failure in result.failures:
            stderr.print(f"[red]FAIL[/] {failure}")
        raise typer.Exit(1)


@app.command("verify")
def verify_command(model_dir: Annotated[Path, typer.Argument(help="A compiled MODEL_DIR.")],
                   json_out: JsonFlag = False) -> None:
    """Re-check the sha256 of every artifact and re-run parity against the recorded reference."""
    from rich.table import Table

    from rlopt.render import parity_text, stderr, stdout
    from rlopt.verify import verify_model_dir

    report = verify_model_dir(model_dir)
    if json_out:
        _print_json({"model_dir": str(model_dir), "passed": report.passed,
                     "findings": [{"network": f.network, "subject": f.subject, "ok": f.ok, "detail": f.detail,
                                   "parity": f.parity.model_dump(mode="json") if f.parity else None}
                                  for f in report.findings]})
    else:
        table = Table(title=f"verify {model_dir}")
        for column in ("network", "file / backend", "result", "detail"):
            table.add_column(column, overflow="fold")
        for f in report.findings:
            detail = f.detail + (f" ({parity_text(f.parity)})" if f.parity else "")
            table.add_row(f.network, f.subject, "[green]ok[/]" if f.ok else "[red]FAIL[/]", detail)
        stdout.print(table)
    if not report.passed:
        for f in report.findings:
            if not f.ok:
                stderr.print(f"[red]FAIL[/] {f.detail if f.parity is None else f'{f.network}/{f.subject}: {f.detail}'}")
        raise typer.Exit(1)


@app.command("inspect")
def inspect_command(model_dir: Annotated[Path, typer.Argument(help="A compiled MODEL_DIR.")],
                    json_out: JsonFlag = False) -> None:
    """Human summary of a MODEL_DIR's manifest."""
    from rlopt.manifest import read_manifest
    from rlopt.render import stdout, summary_table

    manifest = read_manifest(model_dir)
    if json_out:
        _print_json(manifest.model_dump(mode="json"))
        return
    stdout.print(f"[bold]{manifest.name}[/]  rlopt {manifest.rlopt_version}  created {manifest.created_at}")
    stdout.print("versions: " + ", ".join(f"{k} {v}" for k, v in manifest.versions.items() if v))
    stdout.print(f"machine: {manifest.machine.get('cpu')} ({manifest.machine.get('cores')} cores)")
    for name, network in manifest.networks.items():
        shapes = ", ".join(f"{n} {p.dtype} min {p.min} opt {p.opt} max {p.max}" for n, p in network.inputs.items())
        stdout.print(f"[bold]{name}[/] ({network.kind}, {network.precision}): {shapes} -> {network.outputs}; "
                     f"selected: {network.selected}")
        for backend, record in network.artifacts.items():
            notes = record.facts.get("fused_kernels")
            if notes:
                stdout.print(f"  {backend}: fused kernels {', '.join(notes)}")
            if record.facts.get("notice"):
                stdout.print(f"  {backend}: [yellow]{record.facts['notice']}[/]")
    stdout.print(summary_table(manifest))


def main(argv: list[str] | None = None) -> None:
    """Entry point: user errors become one line on stderr and the contract's exit code; usage errors exit 2."""
    try:
        app(args=argv)
    except RloptError as exc:
        sys.stderr.write(f"rlopt: error: {exc}\n")
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("rlopt: interrupted; nothing was published\n")
        sys.exit(130)


if __name__ == "__main__":
    main()
