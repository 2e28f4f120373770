"""`rlopt verify` and `rlopt inspect`: the commands that read a MODEL_DIR."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

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
    from rlopt.runtime import unbucketed_variant

    manifest = read_manifest(model_dir)
    if json_out:
        print_json(manifest.model_dump(mode="json"))
        return
    stdout.print(f"[bold]{manifest.name}[/]  rlopt {manifest.rlopt_version}  created {manifest.created_at}")
    stdout.print("versions: " + ", ".join(f"{k} {v}" for k, v in manifest.versions.items() if v))
    stdout.print(f"machine: {manifest.machine.get('cpu')} ({manifest.machine.get('cores')} cores)")
    for name, network in manifest.networks.items():
        shapes = ", ".join(f"{n} {p.dtype} min {p.min} opt {p.opt} max {p.max}" for n, p in network.inputs.items())
        stdout.print(f"[bold]{name}[/] ({network.kind}, {network.precision}): {shapes} -> {network.outputs}; "
                     f"selected: {network.selected}")
        routes = network.facts.get("auto_routes")
        if routes:
            stdout.print("  auto: " + ", ".join(f"{shape} -> {backend}" for shape, backend in routes.items()),
                         markup=False)
            why = network.facts.get("auto_choice", {}).get("reason")
            if why:
                stdout.print(f"  auto chosen: {why}", markup=False)
        for backend, record in network.artifacts.items():
            notes = record.facts.get("fused_kernels")
            if notes:
                stdout.print(f"  {backend}: fused kernels {', '.join(notes)}")
            if record.facts.get("tuning_summary"):
                stdout.print(f"  {backend}: {record.facts['tuning_summary']}, {record.facts.get('num_threads')} "
                             f"thread(s), target {record.facts.get('target')}", markup=False)
            serving = unbucketed_variant(record.facts)
            if serving is not None:
                stdout.print(f"  {backend}: shapes without their own library: {OTHER_SHAPES[serving]}"
                             + _padding_note(record.facts, serving), markup=False)
            if record.facts.get("gpu"):
                stdout.print(f"  {backend}: {gpu_line(record.facts['gpu'])}", markup=False)
            if record.facts.get("notice"):
                stdout.print(f"  {backend}: [yellow]{record.facts['notice']}[/]")
    stdout.print(summary_table(manifest))


def gpu_line(gpu: dict[str, Any]) -> str:
    """'GPU NVIDIA A10G (compute 8.6), driver 550.54.15, CUDA 12.8, TensorRT 10.13.3.9': where it was built."""
    parts = [f"driver {gpu['driver']}" if gpu.get("driver") else "",
             f"CUDA {gpu['cuda_runtime']}" if gpu.get("cuda_runtime") else "",
             f"TensorRT {gpu['tensorrt']}" if gpu.get("tensorrt") else ""]
    compute = f" (compute {gpu['compute_capability']})" if gpu.get("compute_capability") else ""
    return f"GPU {gpu.get('name') or '(name unknown)'}{compute}" + \
        "".join(f", {part}" for part in parts if part)


OTHER_SHAPES = {"padded": "zero-padded into the smallest bigger tuned library", "dynamic": "the dynamic library"}


def _padding_note(facts: dict[str, Any], serving: str) -> str:
    """Why a TVM artifact does not pad, when it does not."""
    gate = facts.get("variant_parity", {}).get("padded")
    if serving == "padded" or gate is None:
        return ""
    if not gate.get("passed"):
        detail = gate.get("error") or f"max_abs {gate.get('max_abs')}"
        return f" (padding failed the parity gate: {detail})"
    return " (padding does not reach every shape: a varying dim that no output follows)"
