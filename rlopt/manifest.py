"""manifest.json (contract section 3): the only thing the runtime reads to find and trust artifacts.

Every `facts` object is a typed model: a network's `NetworkFacts`, an artifact's its backend's `Backend.facts`.
A MODEL_DIR written by rlopt 0.5 (schema 1) is read through `rlopt.manifest_v1`, converted, and says so.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_serializer, model_validator

from rlopt import manifest_v1
from rlopt.arrays import shape_label
from rlopt.backends import BACKENDS, facts_of
from rlopt.errors import ArtifactError, located
from rlopt.facts import ArtifactFacts, NetworkFacts
from rlopt.files import (MANIFEST_NAME, FileRecord, atomic_write_text, checked_file, checked_private_copy, confined,
                         file_record, sha256_file, write_json)
from rlopt.parity import OutputParity, Parity

# The manifest's layout version (contract section 7). Adding an optional field or fact keeps it; renaming, moving or
# retyping one, or changing what a MODEL_DIR holds, bumps it, and `read_manifest` then refuses an older MODEL_DIR in
# one line naming the command that rebuilds it, unless it can convert it (UPGRADES).
# 1: rlopt 0.1 to 0.5 (facts as untyped dicts; `auto`'s route in auto_* network facts; a network's `tensorrt_plan`).
# 2: typed facts (unknown keys refused), `facts.route` (RoutePlan), `facts.profiles`.
SCHEMA_VERSION = 2


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputProfile(_Model):
    dtype: str
    min: list[int]
    opt: list[int]
    max: list[int]
    range: list[int] | None = None  # integer inputs: the values verification samples (inclusive)
    # integer inputs that index a table (an ONNX Gather): the values every backend accepts; Session.run refuses others
    index_range: list[int] | None = None


class Latency(_Model):
    shape: dict[str, list[int]]
    p50: float
    p99: float
    iterations: int


class BackendRecord(_Model):
    """A built artifact with its parity and latency, or `skipped` with the reason."""

    path: str | None = None
    sha256: str | None = None
    bytes: int | None = None
    parity: Parity | None = None
    latency_us: dict[str, Latency] = Field(default_factory=dict)
    facts: ArtifactFacts = Field(default_factory=ArtifactFacts)  # the backend's own model (NetworkRecord types it)
    skipped: str | None = None

    @field_serializer("facts")
    def _facts(self, facts: ArtifactFacts) -> dict[str, Any]:
        return facts.as_dict()

    @classmethod
    def of(cls, backend: str, data: dict[str, Any]) -> BackendRecord:
        """A record of `backend` from its JSON, its facts as the backend's model."""
        return cls.model_validate({**data, "facts": facts_of(backend, data.get("facts"))})

    @property
    def built(self) -> bool:
        return self.skipped is None and self.path is not None

    @property
    def verified(self) -> bool:
        return self.built and self.parity is not None and self.parity.passed


class Drift(_Model):
    """How far a refit moved a policy on the reference inputs: KL(old || new) per row and argmax agreement."""

    kl_mean: float
    kl_max: float
    argmax_agree: float | None = None  # categorical policies only
    compared: int


class NetworkRecord(_Model):
    kind: str
    distribution: str = "categorical"
    module: str
    inputs: dict[str, InputProfile]
    outputs: list[str]
    precision: str
    tolerance: dict[str, float]
    reference: FileRecord
    files: dict[str, FileRecord] = Field(default_factory=dict)
    artifacts: dict[str, BackendRecord]
    selected: str | None = None
    stages: list[dict[str, Any]] = Field(default_factory=list)
    # Per-network results that belong to no single backend: the export, GEMM padding, the shape profiles, what
    # each backend did with `precision`, Triton models, `auto`'s route.
    facts: NetworkFacts = Field(default_factory=NetworkFacts)
    drift: Drift | None = None  # set by `rlopt refit` on policy networks

    @model_validator(mode="before")
    @classmethod
    def _typed_facts(cls, data: Any) -> Any:
        """Each artifact's facts as its backend's model (`read_manifest` has typed them already, with locations)."""
        if not isinstance(data, dict) or not isinstance(data.get("artifacts"), dict):
            return data
        artifacts = {}
        for backend, artifact in data["artifacts"].items():
            if isinstance(artifact, dict) and not isinstance(artifact.get("facts"), ArtifactFacts):
                try:
                    artifact = {**artifact, "facts": facts_of(backend, artifact.get("facts"))}
                except ValidationError as exc:
                    err = exc.errors()[0]
                    raise ValueError(f"artifacts.{backend}.facts.{'.'.join(map(str, err['loc']))}: {err['msg']}") \
                        from None
            artifacts[backend] = artifact
        return {**data, "artifacts": artifacts}

    @field_serializer("facts")
    def _facts(self, facts: NetworkFacts) -> dict[str, Any]:
        return facts.as_dict()


class Manifest(_Model):
    schema_version: int
    name: str
    rlopt_version: str
    created_at: str
    versions: dict[str, str | None]
    machine: dict[str, Any]
    recipe_sha256: str
    recipe: FileRecord
    networks: dict[str, NetworkRecord]
    refit_of: str | None = None  # `rlopt refit`: the content_sha256 of the MODEL_DIR whose weights were replaced
    content_sha256: str = ""
    # read from an older layout: what was converted (`rlopt inspect` says so); the manifest.json itself is unchanged
    _converted: list[str] = PrivateAttr(default_factory=list)

    @property
    def converted(self) -> list[str]:
        return self._converted

    def seal(self) -> Manifest:
        """Fill `content_sha256` so that a flipped byte in manifest.json itself is caught."""
        self.content_sha256 = self.compute_content_sha256()
        return self

    def compute_content_sha256(self) -> str:
        body = self.model_dump(mode="json", exclude={"content_sha256"})
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()

    def built_backends(self) -> set[str]:
        """Every backend with a built artifact in some network."""
        return {b for network in self.networks.values() for b, a in network.artifacts.items() if a.built}

    def network(self, name: str, model_dir: Path) -> NetworkRecord:
        if name not in self.networks:
            known = ", ".join(sorted(self.networks))
            raise ArtifactError(
                located(model_dir / MANIFEST_NAME, "networks", f"no network '{name}'", f"use one of: {known}")
            )
        return self.networks[name]


@dataclass
class BuildResult:
    """What a compile or a refit wrote: the MODEL_DIR, its manifest, the failures (none when it passed)."""

    model_dir: Path
    manifest: Manifest
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


def read_manifest(model_dir: Path | str) -> Manifest:
    """Read and check manifest.json; every problem is one ArtifactError line."""
    model_dir = Path(model_dir)
    path = model_dir / MANIFEST_NAME
    if not model_dir.is_dir():
        raise ArtifactError(located(model_dir, "", "MODEL_DIR not found", "run 'rlopt compile RECIPE -o DIR' first"))
    if not path.is_file():
        raise ArtifactError(
            located(path, "", "missing: not a complete rlopt MODEL_DIR", "run 'rlopt compile RECIPE -o DIR'")
        )
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(located(path, "", f"not valid JSON ({exc})", "recompile MODEL_DIR")) from None
    if not isinstance(document, dict):
        raise ArtifactError(located(path, "", "not a JSON object", "recompile MODEL_DIR"))
    version = check_schema_version(document, model_dir)
    converted: list[str] = []
    try:
        if version != SCHEMA_VERSION:
            document, converted = UPGRADES[version](document, path, SCHEMA_VERSION)
        type_facts(document, path)
        manifest = Manifest.model_validate(document)
    except ValidationError as exc:
        raise _invalid(path, exc) from None
    if not converted and manifest.content_sha256 != manifest.compute_content_sha256():
        raise ArtifactError(
            located(path, "content_sha256", "manifest.json was modified after it was written", "recompile MODEL_DIR")
        )
    manifest._converted = converted
    return manifest


# older layouts read_manifest converts: version -> (document, path, current version) -> (document, notes)
UPGRADES: dict[int, Callable[[dict[str, Any], Path, int], tuple[dict[str, Any], list[str]]]] = {
    manifest_v1.VERSION: manifest_v1.upgrade}


def check_schema_version(document: dict[str, Any], model_dir: Path) -> int:
    """The manifest's layout version, refused in one line where this rlopt neither writes nor converts it: an older
    one names the command that rebuilds the MODEL_DIR, a newer one says to upgrade rlopt."""
    path = model_dir / MANIFEST_NAME
    version = document.get("schema_version")
    rebuild = f"rlopt compile RECIPE -o {model_dir}"
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ArtifactError(located(path, "schema_version", f"{version!r} is not a schema version (this rlopt reads "
                                    f"{SCHEMA_VERSION})", f"rebuild it: {rebuild}"))
    if version == SCHEMA_VERSION or version in UPGRADES:
        return int(version)
    writer = document.get("rlopt_version")
    by = f"rlopt {writer}" if isinstance(writer, str) and writer else "another rlopt"
    if version < SCHEMA_VERSION:
        raise ArtifactError(located(path, "schema_version", f"{version} was written by {by} and this rlopt reads "
                                    f"{SCHEMA_VERSION}", rebuild))
    raise ArtifactError(located(path, "schema_version", f"{version} was written by {by}, newer than this rlopt, "
                                f"which reads {SCHEMA_VERSION}", f"upgrade rlopt, or rebuild it with this one: {rebuild}"))


def type_facts(document: dict[str, Any], path: Path) -> None:
    """Every `facts` object of a manifest document as its typed model, in place (rlopt/facts.py, each backend's
    `Backend.facts`), and each backend's route options against its model: an undeclared or wrong-typed fact is one
    ArtifactError line naming it, so the runtime's typed reads never fail later."""
    networks = document.get("networks")
    for name, network in (networks.items() if isinstance(networks, dict) else []):
        if not isinstance(network, dict):
            continue
        where = f"networks.{name}.facts"
        try:
            network["facts"] = NetworkFacts.model_validate(network.get("facts") or {})
            artifacts = network.get("artifacts") if isinstance(network.get("artifacts"), dict) else {}
            for backend, artifact in artifacts.items():
                if isinstance(artifact, dict):
                    where = f"networks.{name}.artifacts.{backend}.facts"
                    artifact["facts"] = facts_of(backend, artifact.get("facts"))
            route = network["facts"].route
            for backend, options in (route.options.items() if route is not None else []):
                where = f"networks.{name}.facts.route.options.{backend}"
                if backend not in artifacts or not isinstance(artifacts[backend], dict):
                    raise ArtifactError(located(path, where, "options for a backend the network did not build",
                                                "recompile MODEL_DIR"))
                facts_of(backend, {**artifacts[backend]["facts"].as_dict(), **options})
        except ValidationError as exc:
            raise _invalid(path, exc, where) from None


def _invalid(path: Path, exc: ValidationError, prefix: str = "") -> ArtifactError:
    err = exc.errors()[0]
    field = ".".join([prefix] * bool(prefix) + [str(p) for p in err["loc"]])
    return ArtifactError(located(path, field, str(err["msg"]), "recompile MODEL_DIR"))


def manifest_json_schema() -> dict[str, Any]:
    """The JSON schema of manifest.json (`rlopt schema manifest`): Manifest's, with each `facts` object described
    by its typed models (network facts; per backend, one of the backends' facts models)."""
    from pydantic.json_schema import models_json_schema

    backend_models = list(dict.fromkeys(backend.facts for backend in BACKENDS.values()))
    keys, combined = models_json_schema([(Manifest, "validation"), (NetworkFacts, "validation"),
                                         *[(model, "validation") for model in backend_models]])
    definitions = combined["$defs"]
    schema = dict(definitions.pop(keys[(Manifest, "validation")]["$ref"].rsplit("/", 1)[-1]))
    network_ref = keys[(NetworkFacts, "validation")]
    backend_refs = [keys[(model, "validation")] for model in backend_models]
    definitions["NetworkRecord"]["properties"]["facts"] = {
        **network_ref, "description": "results that belong to no single backend"}
    definitions["BackendRecord"]["properties"]["facts"] = {
        "anyOf": backend_refs, "description": "what the build recorded; the model is the backend's (the artifacts "
        "key): " + ", ".join(f"{name}: {backend.facts.__name__}" for name, backend in BACKENDS.items())}
    schema["$defs"] = definitions
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


__all__ = ["MANIFEST_NAME", "SCHEMA_VERSION", "BackendRecord", "BuildResult", "Drift", "FileRecord", "InputProfile",
           "Latency", "Manifest", "NetworkRecord", "OutputParity", "Parity", "atomic_write_text", "check_schema_version", "checked_file", "checked_private_copy", "confined", "file_record",
           "manifest_json_schema", "read_manifest", "sha256_file", "shape_label", "type_facts", "write_json"]
