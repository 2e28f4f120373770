"""compile_agent's errors name the agent zip the user gave, not the generated recipe that is deleted on return."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from rlopt.compile import driver
from rlopt.errors import StageError, located


@pytest.fixture()
def agent_zip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "agent.zip"
    path.write_bytes(b"PK")
    monkeypatch.setattr("rlopt.sb3.load_agent", lambda *args, **kwargs: object())
    monkeypatch.setattr("rlopt.sb3.agent_recipe", lambda *args, **kwargs: {"name": "agent"})
    return path


def test_an_error_names_the_zip(agent_zip: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(recipe_path: Path, out_dir: Path, **options: object) -> None:
        raise StageError(located(recipe_path, "networks.actor", "TVM cannot import the ONNX model", "drop tvm"))

    monkeypatch.setattr(driver, "compile_recipe", failing)
    with pytest.raises(StageError) as caught:
        driver.compile_agent(agent_zip, tmp_path / "out")
    assert str(caught.value) == (f"{agent_zip.resolve()} (its generated recipe): networks.actor: TVM cannot import "
                                 "the ONNX model; fix: drop tvm")


def test_a_failure_names_the_zip(agent_zip: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(recipe_path: Path, out_dir: Path, **options: object) -> SimpleNamespace:
        return SimpleNamespace(failures=[f"actor/tvm: build failed: {recipe_path}: networks.actor: AssertionError"])

    monkeypatch.setattr(driver, "compile_recipe", failing)
    result = driver.compile_agent(agent_zip, tmp_path / "out")
    assert result.failures == [f"actor/tvm: build failed: {agent_zip.resolve()} (its generated recipe): "
                               "networks.actor: AssertionError"]
