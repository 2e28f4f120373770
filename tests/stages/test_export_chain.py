"""The export chain with the shape probe: a dim the trace froze goes to the dynamo exporter; a dim no exporter
keeps dynamic is refused in one line naming it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from rlopt.errors import StageError
from rlopt.recipe import NetworkSpec
from rlopt.stages.export_onnx import export_onnx
from rlopt.stages.script import script_network

TOKENS = {"tokens": {"dtype": "float32", "min": [1, 1, 32], "opt": [2, 20, 32], "max": [4, 64, 32]}}


def _export(module: torch.nn.Module, folder: Path, name: str = "model.onnx") -> object:
    script_network(module, folder / "model.ts", recipe_path=folder / "r.yaml", network="net", module_path="")
    spec = NetworkSpec(inputs=TOKENS, outputs=["logits"], kind="policy")
    return export_onnx(folder / "model.ts", spec, 17, folder / name, recipe_path=folder / "r.yaml", network="net",
                       eager_module=module)


@pytest.fixture(scope="module")
def dynamic_length(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, torch.nn.Module, Path]:
    from tests.data.models.coverage import DynamicLengthAttention

    torch.manual_seed(0)
    module = DynamicLengthAttention(d=32, heads=2, layers=1, n_actions=5).eval()
    folder = tmp_path_factory.mktemp("dynamic-length")
    return _export(module, folder), module, folder / "model.onnx"


@pytest.mark.slow  # torch.export of an attention network takes ~10 s: `make test-all`
def test_the_frozen_trace_gives_way_to_the_dynamo_export_which_runs_at_every_length(
        dynamic_length: tuple[object, torch.nn.Module, Path]) -> None:
    import onnxruntime as ort

    out, module, path = dynamic_length
    facts = out.facts
    assert facts["export_path"] == "dynamo" and facts["refused"].startswith("aten::is_autocast_enabled")
    assert facts["trace_refused"].startswith("the graph does not match PyTorch at input 'tokens' dim 1 = 1")
    assert "input 'tokens' dim 1 = 42 (unnamed)" in facts["shape_probe"]["checked"]
    graph = onnx.load(str(path)).graph
    assert [d.dim_param or d.dim_value for d in graph.input[0].type.tensor_type.shape.dim] == \
        ["batch", "tokens_d1", 32], "the dynamo symbols renamed as the other paths name them"
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for batch, length in [(1, 1), (2, 20), (4, 64), (3, 37)]:
        tokens = rng.standard_normal((batch, length, 32)).astype(np.float32)
        want = module(torch.from_numpy(tokens)).detach().numpy()
        np.testing.assert_allclose(session.run(None, {"tokens": tokens})[0], want, atol=1e-5, rtol=1e-4)


@pytest.mark.slow  # torch.export of an attention network takes ~10 s: `make test-all`
def test_the_dynamo_graph_keeps_a_weight_map_refit_can_use(
        dynamic_length: tuple[object, torch.nn.Module, Path]) -> None:
    out, module, _ = dynamic_length
    weight_map = out.facts["weight_map"]
    assert "refused" not in weight_map and weight_map["unexplained"] == []
    assert {entry["key"] for entry in weight_map["entries"].values()} == set(module.state_dict())


@pytest.mark.slow  # both exporters, torch.export's first import included: ~5-8 s
def test_a_dim_no_exporter_keeps_dynamic_is_refused_in_one_line_naming_it(tmp_path: Path) -> None:
    from tests.data.models.coverage import LengthBoundAttention

    torch.manual_seed(0)
    module = LengthBoundAttention(d=32, heads=2, layers=1, n_actions=5).eval()
    with pytest.raises(StageError) as info:
        _export(module, tmp_path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{tmp_path / 'r.yaml'}: networks.net: ")
    assert "no ONNX exporter keeps input 'tokens' dim 1 (1..64) dynamic" in message
    assert "traced: tracing would freeze the data-dependent if at coverage.py:" in message
    assert "dynamo: froze it (does not match PyTorch at input 'tokens' dim 1 = 1)" in message
    assert "fix: make input 'tokens' dim 1 static in the recipe (min = opt = max)" in message
    assert "Reshape" not in message and not (tmp_path / "model.onnx").exists()
    assert info.value.exit_code == 2


@pytest.mark.slow  # torch.export of an attention network takes ~10 s: `make test-all`
def test_the_dynamo_graph_builds_in_tvm_and_runs_at_an_unnamed_length(
        dynamic_length: tuple[object, torch.nn.Module, Path], tmp_path: Path) -> None:
    import tvm
    from tvm import relax

    from rlopt.backends.tvm.build import build_tvm
    from rlopt.backends.tvm.params import bind_params, read_params
    from rlopt.backends.tvm.config import TvmConfig

    _, module, path = dynamic_length
    out = build_tvm(path, TvmConfig(), tmp_path, recipe_path=tmp_path / "r.yaml", network="net")
    assert any(name.startswith("fused_matmul") for name in out.facts.fused_kernels)
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(out.artifact)), tvm.cpu())
    params = bind_params(tvm, vm, out.facts.param_names, read_params(tmp_path / "tvm-llvm.params.npz"), tvm.cpu())
    rng = np.random.default_rng(2)
    for batch, length in [(1, 1), (3, 37), (4, 64)]:
        tokens = rng.standard_normal((batch, length, 32)).astype(np.float32)
        want = module(torch.from_numpy(tokens)).detach().numpy()
        got = vm["main"](tvm.runtime.tensor(tokens), *params).numpy()
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)
