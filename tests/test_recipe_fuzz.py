"""Property: any document thrown at the recipe parser ends in a Recipe or one RecipeError line, never a crash."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlopt.errors import RecipeError
from rlopt.recipe import Recipe, load_recipe
from tests.conftest import RECIPES

VALID = yaml.safe_load((RECIPES / "policy_value_heads.yaml").read_text())
# libyaml's emitter when PyYAML has it: the pure-Python one is most of this file's run time
DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def _dump(document: object) -> str:
    return yaml.dump(document, Dumper=DUMPER)

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                    st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=12)


def _paths(document: object, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(document, dict):
        for key, value in document.items():
            found += _paths(value, prefix + (key,))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            found += _paths(value, prefix + (index,))
    return found


PATHS = [p for p in _paths(VALID) if p]


def _replace(document: dict, path: tuple, value: object) -> dict:
    mutated = copy.deepcopy(document)
    target = mutated
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return mutated


def _parse(tmp_path: Path, text: str) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text(text)
    try:
        assert isinstance(load_recipe(path), Recipe)
    except RecipeError as exc:
        message = str(exc)
        assert "\n" not in message and "fix:" in message and str(path) in message


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(document=values)
def test_random_documents_never_crash(tmp_path: Path, document: object) -> None:
    _parse(tmp_path, _dump(document))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(PATHS), value=values)
def test_mutated_valid_recipe_never_crashes(tmp_path: Path, path: tuple, value: object) -> None:
    _parse(tmp_path, _dump(_replace(VALID, path, value)))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=200))
def test_random_text_never_crashes(tmp_path: Path, text: str) -> None:
    _parse(tmp_path, text)
