"""Property: whatever a user hands rlopt (a recipe, a warmup profile, a MODEL_DIR's manifest, Session.run's feeds)
ends in a result or in one line of the right error type and exit code, never a crash or a traceback.

Each property runs a validation function, never a compile: thousands of cases in a few seconds.
"""

from __future__ import annotations

import copy
import json
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlopt.errors import ArtifactError, ProfileError, RecipeError, RloptError
from rlopt.recipe import Recipe, load_recipe
from tests.conftest import RECIPES

VALID = yaml.safe_load((RECIPES / "policy_value_heads.yaml").read_text())
# libyaml's emitter when PyYAML has it: the pure-Python one is most of the recipe properties' run time
DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
FIXTURES = [HealthCheck.function_scoped_fixture]
DTYPES = ["float32", "float16", "float64", "int64", "int32", "uint8", "bool"]  # contract section 7


def _dump(document: object) -> str:
    return yaml.dump(document, Dumper=DUMPER)


scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                    st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=12)
dims = st.lists(st.integers(-2, 40), max_size=4)


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


def _one_line(exc: RloptError, file: Path, code: int = 2) -> None:
    """The contract's shape of a user error: one line naming the file, a fix, and the exit code."""
    message = str(exc)
    assert "\n" not in message and "fix:" in message and str(file) in message, message
    assert exc.exit_code == code


# ---------------------------------------------------------------- recipes

def _parse(tmp_path: Path, text: str) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text(text)
    try:
        assert isinstance(load_recipe(path), Recipe)
    except RecipeError as exc:
        _one_line(exc, path)


@settings(max_examples=60, deadline=None, suppress_health_check=FIXTURES)
@given(document=values)
def test_random_documents_never_crash(tmp_path: Path, document: object) -> None:
    _parse(tmp_path, _dump(document))


@settings(max_examples=100, deadline=None, suppress_health_check=FIXTURES)
@given(path=st.sampled_from(PATHS), value=values)
def test_mutated_valid_recipe_never_crashes(tmp_path: Path, path: tuple, value: object) -> None:
    _parse(tmp_path, _dump(_replace(VALID, path, value)))


@settings(max_examples=100, deadline=None, suppress_health_check=FIXTURES)
@given(text=st.text(max_size=200))
def test_random_text_never_crashes(tmp_path: Path, text: str) -> None:
    _parse(tmp_path, text)


input_specs = st.fixed_dictionaries(
    {"dtype": st.one_of(st.sampled_from(DTYPES), st.sampled_from(["float8", "", "int"]), scalars)},
    optional={"min": dims, "opt": dims, "max": dims, "shape": dims, "range": st.lists(st.integers(-5, 600), max_size=3)})


@settings(max_examples=100, deadline=None, suppress_health_check=FIXTURES)
@given(inputs=st.dictionaries(st.sampled_from(["input0", "h", "ids", "bad name", ""]), input_specs, max_size=3),
       outputs=st.lists(st.sampled_from(["logits", "h_new", "value", ""]), max_size=3),
       state=st.dictionaries(st.sampled_from(["input0", "h", "x"]), st.sampled_from(["logits", "h_new", "y"]),
                             max_size=2))
def test_any_network_inputs_outputs_and_state_parse_or_are_one_line(tmp_path: Path, inputs: dict, outputs: list,
                                                                     state: dict) -> None:
    """Plausible input profiles (dims, dtypes, ranges, static shapes, state pairs): deeper than random documents."""
    document = copy.deepcopy(VALID)
    network = document["networks"]["policy"]
    network.update(inputs=inputs, outputs=outputs)
    if state:
        network["state"] = state
    _parse(tmp_path, _dump(document))


# ---------------------------------------------------------------- warmup profiles

@pytest.fixture(scope="module")
def manifest_of_tiny(tiny_compiled: Path) -> dict[str, Any]:
    return json.loads((tiny_compiled / "manifest.json").read_text())


request_specs = st.fixed_dictionaries(
    {"weight": st.one_of(st.floats(allow_nan=True), st.integers(-2, 5), st.text(max_size=3)),
     "shapes": st.dictionaries(st.one_of(st.just("input0"), st.text(max_size=6)), dims, max_size=2)},
    optional={"extra": values})
profiles = st.fixed_dictionaries(
    {"network": st.one_of(st.sampled_from(["policy", "value", "critic"]), scalars),
     "requests": st.one_of(st.lists(request_specs, max_size=3), values)},
    optional={"duration_s": st.one_of(st.floats(allow_nan=True), scalars),
              "concurrency": st.one_of(st.integers(-2, 2000), scalars),
              "slo": st.one_of(st.fixed_dictionaries({"p99_ms": st.floats(allow_nan=True)}), values)})


@pytest.fixture(scope="module")
def tiny_manifest(tiny_compiled: Path) -> Any:
    from rlopt.manifest import read_manifest

    return read_manifest(tiny_compiled)


@settings(max_examples=150, deadline=None, suppress_health_check=FIXTURES)
@given(document=st.one_of(profiles, values))
def test_any_warmup_profile_loads_or_is_one_line(tmp_path: Path, tiny_compiled: Path, tiny_manifest: Any,
                                                 document: object) -> None:
    from rlopt.warmup_profile import WarmupProfile, load_profile

    path = tmp_path / "profile.json"
    path.write_text(json.dumps(document))
    try:
        profile = load_profile(path, tiny_manifest, tiny_compiled)
    except ProfileError as exc:
        _one_line(exc, path)
        return
    assert isinstance(profile, WarmupProfile) and profile.network in ("policy", "value")
    assert all(math.isfinite(r.weight) and r.weight > 0 for r in profile.requests)


# ---------------------------------------------------------------- manifests

def _write_manifest(folder: Path, document: object, reseal: bool) -> Path:
    """`document` as MODEL_DIR/manifest.json; resealed (content_sha256 of the mutated content) where it still
    validates, so that the checks after the hash are reached too."""
    from pydantic import ValidationError

    from rlopt.manifest import Manifest

    if reseal and isinstance(document, dict):
        try:
            document["content_sha256"] = Manifest.model_validate(document).compute_content_sha256()
        except (ValidationError, TypeError, ValueError):
            pass
    folder.mkdir(exist_ok=True)
    (folder / "manifest.json").write_text(json.dumps(document))
    return folder


@settings(max_examples=80, deadline=None, suppress_health_check=FIXTURES)
@given(data=st.data(), reseal=st.booleans())
def test_any_manifest_reads_or_is_one_line(tmp_path: Path, manifest_of_tiny: dict[str, Any], data: st.DataObject,
                                           reseal: bool) -> None:
    from rlopt.manifest import Manifest, read_manifest

    path = data.draw(st.sampled_from([p for p in _paths(manifest_of_tiny) if p]), label="path")
    document = _replace(manifest_of_tiny, path, data.draw(values, label="value"))
    model_dir = _write_manifest(tmp_path / "model_dir", document, reseal)
    try:
        assert isinstance(read_manifest(model_dir), Manifest)
    except ArtifactError as exc:
        _one_line(exc, model_dir)


@settings(max_examples=15, deadline=None, suppress_health_check=FIXTURES)
@given(data=st.data())
def test_rlopt_inspect_on_any_manifest_exits_0_or_2_with_one_line(tmp_path: Path, manifest_of_tiny: dict[str, Any],
                                                                  data: st.DataObject,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Through the CLI's own error handling: no exit 3, no traceback."""
    from rlopt.cli import main

    path = data.draw(st.sampled_from([p for p in _paths(manifest_of_tiny) if p]), label="path")
    document = _replace(manifest_of_tiny, path, data.draw(values, label="value"))
    model_dir = _write_manifest(tmp_path / "model_dir", document, reseal=True)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(["inspect", str(model_dir), "--json"])
    err = capsys.readouterr().err
    assert exited.value.code in (0, None, 2), err
    if exited.value.code == 2:
        assert err.count("\n") == 1 and err.startswith("rlopt: error: ") and "Traceback" not in err, err


# ---------------------------------------------------------------- Session.run feeds

FEED_NAMES = ["obs", "h", "mask", "ids"]
ODD_VALUES = [None, 1.5, "x", [1.0, 2.0], np.float32(1.0)]
CASES_PER_SEED = 100  # a hypothesis draw costs milliseconds here, a case of check_feeds microseconds


def _random_profiles(rng: random.Random) -> dict[str, Any]:
    from rlopt.manifest import InputProfile

    profiles = {}
    for name in rng.sample(FEED_NAMES, rng.randint(1, 3)):
        low = [rng.randint(1, 4) for _ in range(rng.randint(1, 3))]
        high = [d + rng.randint(0, 3) for d in low]
        profiles[name] = InputProfile(dtype=rng.choice(DTYPES), min=low, opt=low, max=high)
    return profiles


def _random_feeds(rng: random.Random, profiles: dict[str, Any]) -> Any:
    """Mostly near misses of `profiles` (a dim one over, another dtype or rank, a name missing or extra, a
    non-contiguous view), now and then something that is no feed at all."""
    if rng.random() < 0.03:
        return rng.choice([None, [], "obs", 3])
    feeds: dict[str, Any] = {}
    for name, profile in profiles.items():
        if rng.random() < 0.05:
            continue
        if rng.random() < 0.05:
            feeds[name] = rng.choice(ODD_VALUES)
            continue
        shape = [rng.randint(lo - 1, hi + 1) for lo, hi in zip(profile.min, profile.max)]
        if rng.random() < 0.1:
            shape = shape[:-1] if rng.random() < 0.5 else [*shape, 1]
        dtype = profile.dtype if rng.random() < 0.7 else rng.choice([*DTYPES, ">f4", "int8", "complex64", "U3"])
        array = np.zeros([max(d, 0) for d in shape], dtype=dtype)
        feeds[name] = array.T if rng.random() < 0.2 else array
    if rng.random() < 0.05:
        feeds[rng.choice([*FEED_NAMES, "x"])] = np.zeros(1, np.float32)
    return feeds


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_any_feeds_pass_the_checks_or_are_one_value_error_naming_the_input(seed: int) -> None:
    """check_feeds (what Session.run checks once per signature) on CASES_PER_SEED cases from each drawn seed."""
    from rlopt.runtime.session import check_feeds

    rng = random.Random(seed)
    for case in range(CASES_PER_SEED):
        profiles = _random_profiles(rng)
        feeds = _random_feeds(rng, profiles)
        try:
            checked = check_feeds(feeds, profiles)
        except ValueError as exc:
            message = str(exc)
            assert message and "\n" not in message, (seed, case, message)
            assert message.startswith(("input '", "inputs ", "Session.run takes")), (seed, case, message)
            continue
        assert isinstance(feeds, dict) and set(checked) == set(profiles), (seed, case)
        for name, array in checked.items():
            profile = profiles[name]
            assert array.flags.c_contiguous and np.array_equal(array, feeds[name]), (seed, case, name)
            assert array.dtype == np.dtype(profile.dtype) and array.ndim == len(profile.min), (seed, case, name)
            assert all(lo <= d <= hi for d, lo, hi in zip(array.shape, profile.min, profile.max)), (seed, case)


feed_values = st.one_of(
    st.tuples(st.sampled_from([*DTYPES, ">f4", "int8", "complex64", "U3"]),
              st.lists(st.integers(0, 8), max_size=4), st.booleans()),
    st.sampled_from(ODD_VALUES))


def _feed(value: Any) -> Any:
    if not isinstance(value, tuple):
        return value
    dtype, shape, transposed = value
    array = np.zeros(shape, dtype=dtype)
    return array.T if transposed else array


@pytest.fixture(scope="module")
def tiny_session(tiny_compiled: Path) -> Any:
    import rlopt

    with rlopt.load(tiny_compiled, "policy", backend="auto") as session:
        yield session


@settings(max_examples=80, deadline=None, suppress_health_check=FIXTURES)
@given(value=feed_values, name=st.sampled_from(["input0", "input0", "obs"]))
def test_a_real_session_runs_or_refuses_any_feed_in_one_value_error(tiny_session: Any, value: Any, name: str) -> None:
    feed = _feed(value)
    try:
        out = tiny_session.run({name: feed})
    except ValueError as exc:
        assert "\n" not in str(exc) and str(exc)
        return
    assert isinstance(feed, np.ndarray) and out["logits"].shape == (*feed.shape[:2], 5)
