"""Without the openvino module (simulated: None in sys.modules, as Python treats a module that cannot be imported):
the backend is skipped with the install line, and every other backend of the recipe goes on. Runs with or without
OpenVINO installed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rlopt.backends import unavailable_reason
from rlopt.backends.openvino import library
from rlopt.errors import BackendUnavailable
from tests.conftest import write_tiny_recipe

REASON = "python module 'openvino' is not installed; fix: pip install 'rlopt[openvino]'"


@pytest.fixture()
def no_openvino(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openvino", None)
    monkeypatch.setattr(library, "_core", None)


def test_the_reason_names_the_extra_to_install(no_openvino: None) -> None:
    assert unavailable_reason("openvino") == REASON
    with pytest.raises(BackendUnavailable, match=r"pip install 'rlopt\[openvino\]'"):
        library.import_openvino()
    with pytest.raises(BackendUnavailable, match=r"pip install 'rlopt\[openvino\]'"):
        library.shared_core()


def test_a_recipe_naming_openvino_compiles_the_others_and_records_why_it_skipped(no_openvino: None,
                                                                                  tmp_path: Path) -> None:
    from rlopt.compile import compile_recipe

    result = compile_recipe(write_tiny_recipe(tmp_path, backends="[onnxruntime, openvino]"), tmp_path / "out")
    assert result.passed, result.failures
    for name, network in result.manifest.networks.items():
        assert network.artifacts["openvino"].skipped == REASON, name
        assert network.artifacts["onnxruntime"].verified and network.selected == "onnxruntime"
        stage = next(s for s in network.stages if s["stage"] == "openvino")
        assert stage["status"] == "skipped" and "cache" not in stage, "a cached IR could not be verified here"
        assert not (result.model_dir / name / "model.xml").exists()
        assert not any("openvino" in path for path in network.files)
