"""A tiny MODEL_DIR (torchscript + onnxruntime, as tvm's refit hook is not merged yet) and new checkpoints."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.conftest import write_tiny_recipe

BACKENDS = "[torchscript, onnxruntime]"


def tiny_model(folder: Path, **kwargs: Any) -> Any:
    """The tiny recipe's model (seed 3), built from the copy of its code beside the recipe."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("refit_test_policy_heads", folder / "models" / "policy_heads.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    torch.manual_seed(3)
    return module.PolicyValueHeads(**{"hidden": 32, "width": 16, "n_actions": 5, **kwargs}).eval()


def perturbed_state(folder: Path, scale: float = 0.05, seed: int = 1) -> dict[str, Any]:
    import torch

    generator = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=generator)
            for k, v in tiny_model(folder).state_dict().items()}


def save_state(state: dict[str, Any], path: Path) -> Path:
    import torch

    torch.save(state, path)
    return path


@pytest.fixture(scope="session")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Compiled once per session; tests copy it before refitting in place."""
    from rlopt.compile import compile_recipe

    folder = tmp_path_factory.mktemp("refit-base")
    recipe = write_tiny_recipe(folder, backends=BACKENDS)
    result = compile_recipe(recipe, folder / "model")
    assert result.passed, result.failures
    return result.model_dir


@pytest.fixture()
def model_copy(base_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(base_dir, target)
    return target


def reseal(model_dir: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Edit a MODEL_DIR's manifest as JSON and seal it again (a MODEL_DIR as another rlopt would have written)."""
    from rlopt.manifest import Manifest, write_json

    path = model_dir / "manifest.json"
    document = json.loads(path.read_text())
    edit(document)
    write_json(path, Manifest.model_validate(document).seal().model_dump(mode="json"))
