"""The two MODEL_DIRs `rlopt diff` compares: each read and every file it lists hash-checked, their networks'
interfaces compared, and NEW_DIR's thresholds (its resolved recipe's `ci:` section, flags overriding).

Every problem here is one ArtifactError or UsageError line (exit 2): a missing or corrupt MODEL_DIR, or a network
whose inputs or outputs differ between the two, is nothing to compare.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rlopt.backends import facts_of
from rlopt.ci_config import CiConfig
from rlopt.errors import ArtifactError, RecipeError, UsageError, located
from rlopt.manifest import MANIFEST_NAME, Manifest, NetworkRecord, checked_file, read_manifest
from rlopt.tools.diff.schema import Thresholds
from rlopt.yaml_file import load_yaml_mapping

FLAGS = {"max_latency_ratio": "--max-latency-ratio", "max_drift_kl": "--max-drift-kl",
         "allow_dropped_backends": "--allow-dropped-backends"}


def read_checked(model_dir: Path) -> Manifest:
    """The manifest, after the sha256 of every file it lists matches (a corrupt MODEL_DIR is exit 2 here, before
    anything is timed)."""
    manifest = read_manifest(model_dir)
    checked_file(model_dir, manifest.recipe)
    for network in manifest.networks.values():
        for record in [network.reference, *network.files.values()]:
            checked_file(model_dir, record)
        for backend, artifact in network.artifacts.items():
            if artifact.built:
                checked_file(model_dir, artifact)
                for extra in facts_of(backend, artifact.facts).companion_files():
                    checked_file(model_dir, extra)
    return manifest


def interface_problem(old: NetworkRecord, new: NetworkRecord) -> tuple[str, str] | None:
    """(field, what differs) when the two networks cannot be compared call for call; None when they can."""
    if old.kind != new.kind:
        return "kind", f"{old.kind} in OLD_DIR, {new.kind} in NEW_DIR"
    if list(old.inputs) != list(new.inputs):
        return "inputs", f"{list(old.inputs)} in OLD_DIR, {list(new.inputs)} in NEW_DIR"
    for name, before in old.inputs.items():
        after = new.inputs[name]
        if (before.dtype, before.min, before.opt, before.max) != (after.dtype, after.min, after.opt, after.max):
            return (f"inputs.{name}", f"{before.dtype} min {before.min} opt {before.opt} max {before.max} in OLD_DIR, "
                                      f"{after.dtype} min {after.min} opt {after.opt} max {after.max} in NEW_DIR")
    if old.outputs != new.outputs:
        return "outputs", f"{old.outputs} in OLD_DIR, {new.outputs} in NEW_DIR"
    return None


def compared_networks(old_dir: Path, new_dir: Path, old: Manifest, new: Manifest,
                      requested: Sequence[str] | None) -> list[str]:
    """The networks to compare, in NEW_DIR's order then OLD_DIR's; each one in both has the same interface.

    Without `requested`, a network in one MODEL_DIR only is listed too (added, or dropped: a regression); a
    requested network must be in both."""
    for name in requested or ():
        for folder, manifest in ((old_dir, old), (new_dir, new)):
            if name not in manifest.networks:
                both = sorted(set(old.networks) & set(new.networks))
                raise ArtifactError(located(folder / MANIFEST_NAME, "networks", f"no network '{name}' (--network)",
                                            f"name one that both MODEL_DIRs hold: {', '.join(both) or 'none'}"))
    names = list(dict.fromkeys(requested or [*new.networks, *old.networks]))
    for name in names:
        if name in old.networks and name in new.networks:
            problem = interface_problem(old.networks[name], new.networks[name])
            if problem is not None:
                field, what = problem
                raise ArtifactError(located(new_dir / MANIFEST_NAME, f"networks.{name}.{field}",
                                            f"differs from OLD_DIR {old_dir}: {what}",
                                            "diff MODEL_DIRs of the same network interface (same inputs, outputs, "
                                            "kind), or leave this network out with --network"))
    return names


def read_thresholds(new_dir: Path, manifest: Manifest, flags: Mapping[str, Any]) -> Thresholds:
    """NEW_DIR's `ci:` section (absent, e.g. compiled by an older rlopt: the defaults), each flag not None over it."""
    path = checked_file(new_dir, manifest.recipe)
    try:
        section = load_yaml_mapping(path, "recipe").get("ci") or {}
        recorded = CiConfig.model_validate(section)
    except RecipeError as exc:
        raise ArtifactError(f"{exc}") from None
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(["ci", *(str(part) for part in error["loc"])])
        raise ArtifactError(located(path, field, str(error["msg"]), "recompile NEW_DIR from a recipe whose ci: "
                                    "section is valid (rlopt schema recipe)")) from None
    given = {name: value for name, value in flags.items() if value is not None}
    try:
        merged = CiConfig.model_validate(recorded.model_dump() | given)
    except ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0])
        raise UsageError(f"{FLAGS.get(name, name)} {given.get(name)}: {error['msg']}; fix: e.g. "
                         f"{FLAGS.get(name, name)} {CiConfig.model_fields[name].default or 0.01}") from None
    source = {name: "flag" if name in given else "recipe" for name in CiConfig.model_fields}
    return Thresholds(**merged.model_dump(), source=source)


__all__ = ["compared_networks", "interface_problem", "read_checked", "read_thresholds"]
