"""`rlopt.load(backend="auto")` when a verified backend's runner cannot start after all (its library present, yet CUDA
fails to initialise, say): `auto` routes over the others; named explicitly, the reason is the error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import rlopt
from rlopt.backends import BACKENDS
from rlopt.errors import ArtifactError, BackendUnavailable
from rlopt.manifest import read_manifest


def _cannot_start(monkeypatch: pytest.MonkeyPatch, broken: set[str]) -> None:
    from rlopt.runtime import loader

    real = loader.open_artifact

    def open_artifact(model_dir, backend, *args, **kwargs):
        if backend in broken:
            raise BackendUnavailable(f"{backend} could not start (test)")
        return real(model_dir, backend, *args, **kwargs)

    monkeypatch.setattr(loader, "open_artifact", open_artifact)


def test_auto_leaves_out_a_backend_that_cannot_start(tiny_compiled: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    route = read_manifest(tiny_compiled).networks["policy"].facts.route
    routed = route.backends if route is not None else set()
    assert routed - {"torchscript"}, "the recorded route uses a backend the test can break"
    _cannot_start(monkeypatch, set(BACKENDS) - {"torchscript"})
    x = np.random.default_rng(0).standard_normal((2, 3, 32)).astype(np.float32)
    with rlopt.load(tiny_compiled, "policy") as session:
        assert session.backend == "torchscript"
        with rlopt.load(tiny_compiled, "policy", backend="torchscript") as reference:
            np.testing.assert_array_equal(session.run({"input0": x})["logits"], reference.run({"input0": x})["logits"])


def test_auto_with_nothing_that_starts_names_every_reason(tiny_compiled: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _cannot_start(monkeypatch, set(BACKENDS))
    with pytest.raises(ArtifactError, match="no verified backend can start on this machine .*could not start"):
        rlopt.load(tiny_compiled, "policy")


def test_a_backend_named_explicitly_raises_its_reason(tiny_compiled: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _cannot_start(monkeypatch, {"onnxruntime"})
    with pytest.raises(BackendUnavailable, match="onnxruntime could not start"):
        rlopt.load(tiny_compiled, "policy", backend="onnxruntime")
