"""Reading a YAML (or JSON) file that must hold a mapping, with every failure one located line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rlopt.errors import RecipeError, located

SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml where present: the same documents, faster


def load_yaml_mapping(path: Path, what: str) -> dict[str, Any]:
    """Read a YAML (or JSON) file that must hold a mapping; every failure is one RecipeError line."""
    if not path.is_file():
        raise RecipeError(located(path, "", f"{what} not found", "check the path"))
    try:
        document = yaml.load(path.read_text(encoding="utf-8"), Loader=SAFE_LOADER)
    except UnicodeDecodeError:
        raise RecipeError(located(path, "", "not UTF-8 text", f"give a YAML {what}")) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(parse)"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise RecipeError(located(path, where, f"invalid YAML: {problem}", "fix the syntax there")) from None
    if not isinstance(document, dict):
        raise RecipeError(
            located(path, "(top level)", f"expected a mapping, got {type(document).__name__}",
                    f"write the {what} as 'key: value' fields")
        )
    return document
