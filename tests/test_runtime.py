"""Session.run checks inputs before any backend sees them: a ValueError naming the input and the range."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import rlopt
from rlopt.manifest import InputProfile
from rlopt.runtime import check_feeds
from rlopt.runtime.session import feed_probe

PROFILES = {"input0": InputProfile(dtype="float32", min=[1, 1, 32], opt=[2, 3, 32], max=[4, 6, 32])}


@pytest.mark.parametrize(
    ("feeds", "needles"),
    [
        ({"obs": np.zeros((1, 1, 32), np.float32)}, ["unknown: ['obs']", "missing: ['input0']"]),
        ({"input0": np.zeros((1, 1, 32), np.float64)}, ["input0", "float32", "astype"]),
        ({"input0": np.zeros((1, 32), np.float32)}, ["input0", "rank 2", "rank 3"]),
        ({"input0": np.zeros((5, 1, 32), np.float32)}, ["input0", "dim 0 is 5", "[1, 4]"]),
        ({"input0": np.zeros((1, 1, 31), np.float32)}, ["dim 2 is 31", "[32, 32]"]),
        ({"input0": np.zeros((1, 1, 32), ">f4")}, ["big-endian"]),
        ({"input0": [[0.0] * 32]}, ["numpy array"]),
    ],
)
def test_bad_feeds_raise_value_error_naming_the_input(feeds: dict, needles: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        check_feeds(feeds, PROFILES)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))


def test_non_contiguous_input_is_accepted_as_a_copy() -> None:
    x = np.zeros((2, 32, 3), np.float32).transpose(0, 2, 1)
    checked = check_feeds({"input0": x}, PROFILES)
    assert checked["input0"].flags.c_contiguous and checked["input0"].shape == (2, 3, 32)


def test_session_rejects_out_of_profile_shape_before_the_backend(tiny_compiled: Path) -> None:
    for backend in ("torchscript", "onnxruntime", "tvm"):
        session = rlopt.load(tiny_compiled, "policy", backend=backend)
        with pytest.raises(ValueError, match=r"dim 1 is 7, allowed \[1, 6\]"):
            session.run({"input0": np.zeros((1, 7, 32), np.float32)})
        assert session.run({"input0": np.zeros((4, 6, 32), np.float32)})["logits"].shape == (4, 6, 5)


def test_auto_session_follows_the_manifest_routes_and_matches_the_reference(tiny_compiled: Path) -> None:
    import json

    manifest = json.loads((tiny_compiled / "manifest.json").read_text())
    expected_routes = manifest["networks"]["policy"]["facts"]["route"]["routes"]
    session = rlopt.load(tiny_compiled, "policy")
    assert session.routes == expected_routes
    assert session.backend == expected_routes["2x3x32"]
    reference = rlopt.load(tiny_compiled, "policy", backend="torchscript")
    rng = np.random.default_rng(3)
    for shape in [(1, 1, 32), (2, 3, 32), (4, 6, 32), (3, 2, 32)]:
        x = rng.standard_normal(shape).astype(np.float32)
        for _ in range(2):  # the second call takes the remembered path
            np.testing.assert_allclose(session.run({"input0": x})["logits"], reference.run({"input0": x})["logits"],
                                       atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("backend", ["tvm", "onnxruntime", "torchscript"])
def test_remembered_shapes_still_reject_bad_inputs(tiny_compiled: Path, backend: str) -> None:
    session = rlopt.load(tiny_compiled, "policy", backend=backend)
    x = np.random.default_rng(3).standard_normal((2, 3, 32)).astype(np.float32)
    expected = session.run({"input0": x})["logits"]
    for _ in range(3):  # the second call binds the signature, the third takes the bound call
        np.testing.assert_array_equal(session.run({"input0": x})["logits"], expected)
    with pytest.raises(ValueError, match="float32"):
        session.run({"input0": x.astype(np.float64)})
    with pytest.raises(ValueError, match="big-endian"):  # same shape, same dtype kind: still not the signature
        session.run({"input0": x.astype(">f4")})
    with pytest.raises(ValueError, match="unknown"):
        session.run({"input0": x, "extra": x})
    with pytest.raises(ValueError, match="numpy array"):
        session.run({"input0": x.tolist()})
    strided = np.ascontiguousarray(x.transpose(0, 2, 1)).transpose(0, 2, 1)  # same values, not C-contiguous
    assert not strided.flags.c_contiguous
    np.testing.assert_array_equal(session.run({"input0": strided})["logits"], expected)


def test_the_fast_path_key_is_each_inputs_shape_dtype_and_contiguity_in_input_order() -> None:
    probe = feed_probe(["obs", "state"])
    obs, state = np.zeros((2, 3), np.float32), np.zeros((2, 4), np.int64)
    arrays, key = probe({"state": state, "obs": obs})
    assert arrays[0] is obs and arrays[1] is state
    assert key == ((2, 3), np.dtype(np.float32), True, (2, 4), np.dtype(np.int64), True)
    others = [probe({"obs": obs.astype(">f4"), "state": state})[1],
              probe({"obs": np.zeros((3, 2), np.float32).T, "state": state})[1],
              probe({"obs": obs, "state": np.zeros((2, 4), np.int32)})[1]]
    assert len({key, *others}) == 4
    with pytest.raises(KeyError):
        probe({"obs": obs})
    with pytest.raises(AttributeError):
        probe({"obs": obs, "state": [[0] * 4] * 2})


@pytest.mark.parametrize("backend", ["tvm", "onnxruntime", "auto"])
def test_results_belong_to_the_caller(tiny_compiled: Path, backend: str) -> None:
    """A result is the caller's to keep and to write: no later call, and no other thread's, reads or changes it."""
    session = rlopt.load(tiny_compiled, "policy", backend=backend)
    x = np.random.default_rng(19).standard_normal((1, 1, 32)).astype(np.float32)
    results = [session.run({"input0": x})["logits"] for _ in range(4)]  # first call, binding, bound calls
    expected = results[0].copy()
    for result in results:
        np.testing.assert_array_equal(result, expected)
        assert result.flags.writeable
    for i, result in enumerate(results):
        assert not any(np.shares_memory(result, other) for other in results[i + 1:])
        result[...] = np.nan  # the caller writes into its result
    np.testing.assert_array_equal(session.run({"input0": x})["logits"], expected)
