"""`rlopt verify` and `rlopt inspect`: the commands that read a MODEL_DIR."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rlopt.cli.base import JsonFlag, app, exit_failed, print_json


@app.command("verify")
def verify_command(model_dir: Annotated[Path, typer.Argument(help="A compiled MODEL_DIR.")],
                   strict: Annotated[bool, typer.Option("--strict", help="Fail (exit 1) when an artifact cannot be "
                                                        "verified on this machine, e.g. a GPU one.")] = False,
                   json_out: JsonFlag = False) -> None:
    """Re-check the sha256 of every artifact and re-run parity against the recorded reference; an artifact this
    machine cannot run shows "unverified here: <reason>" and fails only with --strict."""
    from rlopt.render import stdout, verify_table
    from rlopt.verify import verify_model_dir

    report = verify_model_dir(model_dir)
    if json_out:
        print_json({**report.as_json(), "strict": strict})
    else:
        stdout.print(verify_table(report))
    failures = [f.detail if f.parity is None else f"{f.network}/{f.subject}: {f.detail}"
                for f in report.findings if not f.ok]
    if strict:
        failures += [f"{f.network}/{f.subject}: {f.detail} (--strict)" for f in report.unverified]
    if failures:
        exit_failed(failures)


@app.command("inspect")
def inspect_command(model_dir: Annotated[Path, typer.Argument(help="A compiled MODEL_DIR.")],
                    json_out: JsonFlag = False) -> None:
    """Human summary of a MODEL_DIR's manifest."""
    from rlopt.manifest import read_manifest
    from rlopt.render import stdout, summary_table

    manifest = read_manifest(model_dir)
    if json_out:
        print_json(manifest.model_dump(mode="json"))
        return
    stdout.print(f"[bold]{manifest.name}[/]  rlopt {manifest.rlopt_version}  created {manifest.created_at}")
    stdout.print("versions: " + ", ".join(f"{k} {v}" for k, v in manifest.versions.items() if v))
    stdout.print(f"machine: {manifest.machine.get('cpu')} ({manifest.machine.get('cores')} cores)")
    for line in manifest.converted:
        stdout.print(f"read from an older layout: {line}", markup=False)
    for name, network in manifest.networks.items():
        shapes = ", ".join(f"{n} {p.dtype} min {p.min} opt {p.opt} max {p.max}" for n, p in network.inputs.items())
        stdout.print(f"[bold]{name}[/] ({network.kind}, {network.precision}): {shapes} -> {network.outputs}; "
                     f"selected: {network.selected}")
        route = network.facts.route
        if route is not None:
            stdout.print("  auto: " + ", ".join(f"{shape} -> {backend}" for shape, backend in route.routes.items()),
                         markup=False)
            for backend, options in route.options.items():
                stdout.print(f"  auto opens {backend} with {options}", markup=False)
            if route.choice is not None and route.choice.reason:
                stdout.print(f"  auto chosen: {route.choice.reason}", markup=False)
        for backend, record in network.artifacts.items():
            for line in record.facts.summary():
                stdout.print(f"  {backend}: {line}", markup=False)
            if record.facts.notice:
                stdout.print(f"  {backend}: [yellow]{record.facts.notice}[/]")
    stdout.print(summary_table(manifest))
