"""`rlopt refit`: new weights into a compiled MODEL_DIR without recompiling, verified, published atomically.

Old MODEL_DIR -> copied into a hidden staging dir -> per network: the new reference from eager PyTorch, the ONNX
graph rewritten through its weight map (and its pad_gemm copy re-padded), every artifact through its backend's
refit hook, every backend through the one parity gate -> manifest with `refit_of` and the drift -> publish.
"""

from __future__ import annotations

import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from rlopt.errors import UsageError, located
from rlopt.manifest import MANIFEST_NAME, BuildResult, Manifest, NetworkRecord, read_manifest, write_json
from rlopt.recipe import Recipe
from rlopt.reference import one_torch_thread


class RefitResult(BuildResult):
    """What a refit wrote and found: the same shape as a compile's result (`warnings` stays empty)."""


def refit(model_dir: Path | str, checkpoint: Path | str, out: Path | str | None = None, *,
          vecnormalize: Path | str | None = None) -> Path:
    """New weights into MODEL_DIR (or a new OUT); returns the published MODEL_DIR. Raises VerificationError
    (exit 1, nothing replaced) when a backend fails the gate or the drift exceeds verify.max_drift_kl."""
    from rlopt.errors import VerificationError

    result = refit_model_dir(model_dir, checkpoint, out, vecnormalize=vecnormalize)
    if not result.passed:
        raise VerificationError("; ".join(result.failures) + "; nothing was replaced")
    return result.model_dir


def read_recipe(model_dir: Path, manifest: Manifest | None = None) -> Recipe:
    """The resolved recipe a MODEL_DIR keeps (its `recipe.yaml`, already checked by the manifest's sha256)."""
    from rlopt.manifest import checked_file
    from rlopt.yaml_file import SAFE_LOADER

    record = (manifest or read_manifest(model_dir)).recipe
    return Recipe.model_validate(yaml.load(checked_file(model_dir, record).read_text(), Loader=SAFE_LOADER))


def rewritten_anew(manifest: Manifest) -> set[str]:
    """Paths (relative to MODEL_DIR) that refit writes from scratch before anything reads them, so the staging
    copy leaves them out: each network's reference.npz and the byte copies of its artifacts (Triton's)."""
    from rlopt.refit.network import copies_of

    return {path for network in manifest.networks.values()
            for path in [network.reference.path, *copies_of(network)]}


def stage_copy(model_dir: Path, staging: Path, manifest: Manifest) -> None:
    """MODEL_DIR copied into `staging`, less what refit writes anew (most of the bytes: the references)."""
    skip = rewritten_anew(manifest)

    def ignore(folder: str, names: list[str]) -> set[str]:
        relative = Path(folder).relative_to(model_dir)
        return {name for name in names if (relative / name).as_posix() in skip}

    shutil.copytree(model_dir, staging, dirs_exist_ok=True, ignore=ignore)


def refusal(manifest: Manifest) -> tuple[str, str] | None:
    """(field, reason) for the first artifact refit cannot rewrite, or None."""
    from rlopt.backends import BACKENDS
    from rlopt.stages.weight_map import map_problem

    for name, network in manifest.networks.items():
        if network.facts.model_source is None:
            return f"networks.{name}.facts", "it records no model source (built by an older rlopt)"
        problem = map_problem(network.facts.onnx.weight_map if network.facts.onnx is not None else None)
        if problem is not None:
            return f"networks.{name}", problem
        for backend, record in network.artifacts.items():
            if record.built and (backend not in BACKENDS or BACKENDS[backend].refit is None):
                return f"networks.{name}.artifacts.{backend}", f"backend '{backend}' has no refit hook"
    return None


def refit_model_dir(model_dir: Path | str, checkpoint: Path | str, out: Path | str | None = None, *,
                    vecnormalize: Path | str | None = None) -> RefitResult:
    """Everything `rlopt refit` does; failures (gate, drift) are returned and then nothing is published."""
    from rlopt.backends import import_before_torch
    from rlopt.compile.publish import is_model_dir_or_empty, publish, remove_stale_partials, staging_dir
    from rlopt.locking import exclusive_lock
    from rlopt.refit.checkpoint import rebuild_command

    started = time.perf_counter()
    model_dir, checkpoint = Path(model_dir), Path(checkpoint)
    out_dir = Path(out) if out is not None else model_dir
    manifest = read_manifest(model_dir)
    recipe = read_recipe(model_dir, manifest)
    refused = refusal(manifest)
    if refused is not None:
        raise UsageError(located(model_dir / MANIFEST_NAME, refused[0], f"cannot be refitted: {refused[1]}",
                                 f"rebuild it: {rebuild_command(recipe, checkpoint, out_dir)}"))
    if out_dir.resolve() != model_dir.resolve() and not is_model_dir_or_empty(out_dir):
        raise UsageError(located(out_dir, "-o", "exists and is not an rlopt MODEL_DIR",
                                 "choose another output directory or remove it"))
    import_before_torch(manifest.built_backends())
    model, recipe = _new_model(manifest, recipe, model_dir, checkpoint, vecnormalize)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(out_dir.parent / f".{out_dir.name}.lock", out_dir, "rlopt refit"):
        remove_stale_partials(out_dir)
        staging = staging_dir(out_dir)
        try:
            stage_copy(model_dir, staging, manifest)
            networks, failures = _refit_networks(staging, recipe, manifest, model, checkpoint, model_dir)
            refitted = manifest.model_copy(update={
                "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "networks": networks,
                "refit_of": manifest.content_sha256}).seal()
            write_json(staging / MANIFEST_NAME, refitted.model_dump(mode="json"))
            if failures:
                shutil.rmtree(staging, ignore_errors=True)
            else:
                publish(staging, out_dir)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return RefitResult(out_dir, refitted, failures, time.perf_counter() - started)


def _refit_networks(staging: Path, recipe: Recipe, manifest: Manifest, model: Any, checkpoint: Path,
                    model_dir: Path) -> tuple[dict[str, NetworkRecord], list[str]]:
    """Every network refitted; records and failures in the manifest's order, the first error raised wins.

    All of it on one thread per job, one worker per core: each network's start (reference re-recorded on PyTorch's
    one thread, graph rewritten), then, queued as it ends, the hook and gate of each artifact whose backend computes
    on its calling thread alone, the costliest first. What cannot (TensorRT) runs after, one network at a time.
    Default recipe, 2 cores: 0.42 s against 0.49 s with each ONNX Runtime and TVM gate on a pool of two threads
    (docs/refit.md)."""
    from rlopt.machine import usable_cores
    from rlopt.refit.network import NetworkRefit

    refits = [NetworkRefit(staging, recipe, name, record, model, checkpoint, model_dir)
              for name, record in manifest.networks.items()]
    alone: dict[str, list[str]] = {}
    try:
        with one_torch_thread():
            with ThreadPoolExecutor(max(1, usable_cores()), thread_name_prefix="rlopt-refit") as pool:
                gates: list[Future[None]] = []

                def start(refit: NetworkRefit) -> None:
                    refit.start()
                    alone[refit.name] = refit.side_by_side()
                    gates.extend(pool.submit(refit.refit_backend, backend, one_thread=True)
                                 for backend in alone[refit.name])

                for job in [pool.submit(start, refit) for refit in refits]:
                    job.result()
                for job in gates:  # complete: each start queued its gates before it returned
                    job.result()
            for refit in refits:
                refit.refit_rest(alone[refit.name])
            networks = {refit.name: refit.finish() for refit in refits}
    finally:
        for refit in refits:
            refit.close()
    return networks, [failure for refit in refits for failure in refit.failures]


def _new_model(manifest: Manifest, recipe: Recipe, model_dir: Path, checkpoint: Path,
               vecnormalize: Path | str | None) -> tuple[Any, Recipe]:
    from rlopt.refit.checkpoint import agent_model, factory_model

    source = next(iter(manifest.networks.values())).facts.model_source
    if recipe.model.sb3 is not None:
        return agent_model(recipe, checkpoint, Path(vecnormalize) if vecnormalize else None)
    if vecnormalize is not None:
        raise UsageError(located(model_dir, "--vecnormalize", "goes only with a MODEL_DIR compiled from an SB3 zip",
                                 "leave it out"))
    assert source is not None  # refusal() checked every network records one
    return factory_model(source, checkpoint, model_dir), recipe


__all__ = ["RefitResult", "read_recipe", "refit", "refit_model_dir", "refusal", "rewritten_anew", "stage_copy"]
