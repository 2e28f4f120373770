"""JSON schemas of the files rlopt reads and writes (for editors and CI validation): `rlopt schema KIND`."""

from __future__ import annotations

from importlib import import_module
from typing import Any

from rlopt.errors import UsageError

MODELS = {
    "recipe": "rlopt.recipe:Recipe",
    "profile": "rlopt.warmup_profile:WarmupProfile",
    "manifest": "rlopt.manifest:Manifest",
}


def json_schema(kind: str) -> dict[str, Any]:
    """The pydantic JSON schema of a recipe, a warmup profile or a manifest."""
    if kind not in MODELS:
        raise UsageError(f"rlopt schema {kind}: unknown kind; fix: use one of {', '.join(MODELS)}")
    module, name = MODELS[kind].split(":")
    schema: dict[str, Any] = getattr(import_module(module), name).model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
