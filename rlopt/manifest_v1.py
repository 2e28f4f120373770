"""Manifests written by rlopt 0.1 to 0.5 (schema_version 1), read and converted to the current layout.

Schema 1 kept `facts` as untyped dicts, `auto`'s route in `auto_*` network facts and TensorRT's plan in the network's
`tensorrt_plan`. The document is checked as it was written (its own `content_sha256`, computed as 0.5 did), then
converted: the route into `facts.route` (each backend moves its own keys: `Backend.upgrade_v1_facts`), keys the
typed models do not declare dropped. The conversion is in memory; manifest.json stays as written, and
`Manifest.converted` says what was done.
"""

from __future__ import annotations

import hashlib
import json
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rlopt.backends import BACKENDS
from rlopt.errors import ArtifactError, located
from rlopt.facts import NetworkFacts
from rlopt.files import FileRecord
from rlopt.parity import Parity

VERSION = 1


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputProfileV1(_Model):
    dtype: str
    min: list[int]
    opt: list[int]
    max: list[int]
    range: list[int] | None = None
    index_range: list[int] | None = None


class LatencyV1(_Model):
    shape: dict[str, list[int]]
    p50: float
    p99: float
    iterations: int


class DriftV1(_Model):
    kl_mean: float
    kl_max: float
    argmax_agree: float | None = None
    compared: int


class BackendRecordV1(_Model):
    path: str | None = None
    sha256: str | None = None
    bytes: int | None = None
    parity: Parity | None = None
    latency_us: dict[str, LatencyV1] = Field(default_factory=dict)
    facts: dict[str, Any] = Field(default_factory=dict)
    skipped: str | None = None


class NetworkRecordV1(_Model):
    kind: str
    distribution: str = "categorical"
    module: str
    inputs: dict[str, InputProfileV1]
    outputs: list[str]
    precision: str
    tolerance: dict[str, float]
    reference: FileRecord
    files: dict[str, FileRecord] = Field(default_factory=dict)
    artifacts: dict[str, BackendRecordV1]
    selected: str | None = None
    stages: list[dict[str, Any]] = Field(default_factory=list)
    facts: dict[str, Any] = Field(default_factory=dict)
    drift: DriftV1 | None = None


class ManifestV1(_Model):
    schema_version: int
    name: str
    rlopt_version: str
    created_at: str
    versions: dict[str, str | None]
    machine: dict[str, Any]
    recipe_sha256: str
    recipe: FileRecord
    networks: dict[str, NetworkRecordV1]
    refit_of: str | None = None
    content_sha256: str = ""

    def compute_content_sha256(self) -> str:
        """As rlopt 0.5 computed it: fields added after 0.1 count only when set."""
        body = self.model_dump(mode="json", exclude={"content_sha256"})
        if body["refit_of"] is None:
            del body["refit_of"]
        for network in body["networks"].values():
            if network["drift"] is None:
                del network["drift"]
            for profile in network["inputs"].values():
                if profile["index_range"] is None:
                    del profile["index_range"]
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def upgrade(document: dict[str, Any], path: Path, version: int) -> tuple[dict[str, Any], list[str]]:
    """A schema 1 manifest, checked as written, as a document of layout `version`; and one line per thing converted.
    Raises pydantic's ValidationError where it is no schema 1 manifest."""
    old = ManifestV1.model_validate(document)
    if old.content_sha256 != old.compute_content_sha256():
        raise ArtifactError(located(path, "content_sha256", "manifest.json was modified after it was written",
                                    "recompile MODEL_DIR"))
    body = old.model_dump(mode="json")
    body["schema_version"] = version
    notes = [f"schema_version {VERSION} (written by rlopt {old.rlopt_version}) read as {version}"]
    for name, network in body["networks"].items():
        network["facts"] = _network_facts(network["facts"], network["artifacts"], f"networks.{name}.facts", notes)
        for backend, artifact in network["artifacts"].items():
            model = BACKENDS[backend].facts if backend in BACKENDS else None
            if model is not None:
                artifact["facts"] = fit(model, artifact["facts"], f"networks.{name}.artifacts.{backend}.facts", notes)
    return body, notes


def _network_facts(facts: dict[str, Any], artifacts: dict[str, Any], where: str, notes: list[str]) -> dict[str, Any]:
    """Schema 1 network facts in the current layout: each backend's own keys moved by its hook, `auto_routes` and
    `auto_choice` into `route`."""
    facts = dict(facts)
    options: dict[str, dict[str, Any]] = {}
    for name, backend in BACKENDS.items():
        if backend.upgrade_v1_facts is not None:
            options[name] = backend.upgrade_v1_facts(facts)
    routes = facts.pop("auto_routes", None)
    choice = facts.pop("auto_choice", None)
    if routes:
        used = set(routes.values())
        facts["route"] = {"routes": routes, "choice": choice,
                          "options": {b: o for b, o in options.items() if o and b in used and b in artifacts}}
        notes.append(f"{where}: auto_routes, auto_choice and each backend's auto_* keys read as route")
    return fit(NetworkFacts, facts, where, notes)


def fit(model: type[BaseModel], value: Any, where: str, notes: list[str]) -> Any:
    """`value` (JSON) with only what `model` declares, nested models alike; each key dropped is one note."""
    if not isinstance(value, dict):
        return value
    kept: dict[str, Any] = {}
    for key, item in value.items():
        if key not in model.model_fields:
            notes.append(f"{where}.{key}: not a fact this rlopt declares; dropped")
            continue
        kept[key] = _fit_field(model.model_fields[key].annotation, item, f"{where}.{key}", notes)
    return kept


def _fit_field(annotation: Any, value: Any, where: str, notes: list[str]) -> Any:
    """A field's value fitted to the model its annotation names (directly, in a union, a list or a dict's values)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return fit(annotation, value, where, notes)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        model = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), None)
        return fit(model, value, where, notes) if model is not None else value
    if origin is list and args and isinstance(value, list):
        return [_fit_field(args[0], item, f"{where}[{i}]", notes) for i, item in enumerate(value)]
    if origin is dict and len(args) == 2 and isinstance(value, dict):
        return {key: _fit_field(args[1], item, f"{where}.{key}", notes) for key, item in value.items()}
    return value


__all__ = ["VERSION", "ManifestV1", "fit", "upgrade"]
