"""The shape probe: which shapes it runs an exported graph at, and that it catches a frozen length."""

from __future__ import annotations

from pathlib import Path

import torch

from rlopt.recipe import NetworkSpec
from rlopt.stages.shape_probe import probe_export, probe_shapes, probe_tolerance, unnamed_value


def _spec(**inputs: list[list[int]]) -> NetworkSpec:
    dtypes = {"mask": "bool"}
    return NetworkSpec(inputs={name: {"dtype": dtypes.get(name, "float32"), "min": dims[0], "opt": dims[1],
                                      "max": dims[2]} for name, dims in inputs.items()}, outputs=["out"])


def test_the_unnamed_value_sits_in_the_widest_gap_between_named_values() -> None:
    assert unnamed_value((1, 20, 64), {1, 20, 64}) == 42
    assert unnamed_value((1, 4, 8), {1, 4, 8}) == 6
    assert unnamed_value((1, 3, 6), {1, 3, 6, 4}) == 5, "of two equal gaps, the upper one"
    assert unnamed_value((1, 1, 2), {1, 2}) is None, "no length left unnamed"
    assert unnamed_value((2, 3, 4), {2, 3, 4}) is None


def test_probes_vary_one_group_of_dims_at_a_time_batch_one_and_more_and_an_unnamed_length() -> None:
    spec = _spec(tokens=[[1, 1, 128], [4, 20, 128], [8, 64, 128]])
    probes = probe_shapes(spec)
    labels = [p.label for p in probes]
    assert labels == ["input 'tokens' dim 0 = 1", "input 'tokens' dim 0 = 8", "input 'tokens' dim 0 = 6 (unnamed)",
                      "input 'tokens' dim 1 = 1", "input 'tokens' dim 1 = 64", "input 'tokens' dim 1 = 42 (unnamed)",
                      "the min shape", "the max shape"]
    by_label = {p.label: p.shapes["tokens"] for p in probes}
    assert by_label["input 'tokens' dim 1 = 42 (unnamed)"] == [4, 42, 128], "the others stay at opt"
    assert by_label["input 'tokens' dim 0 = 1"] == [1, 20, 128]
    assert probes[3].dim == "input 'tokens' dim 1" and probes[-1].dim == ""


def test_dims_that_must_agree_vary_together_and_extra_shapes_are_named_lengths() -> None:
    spec = _spec(obs=[[1, 1, 8], [2, 3, 8], [4, 6, 8]], mask=[[1, 1], [2, 3], [4, 6]])
    spec.shapes.append({"obs": [2, 5, 8], "mask": [2, 5]})
    for probe in probe_shapes(spec):
        assert probe.shapes["obs"][:2] == probe.shapes["mask"], probe
    seq_values = {p.shapes["obs"][1] for p in probe_shapes(spec) if p.dim == "input 'obs' dim 1"}
    assert seq_values == {1, 5, 6, 4}, "named 1, 5 and 6 (opt 3 is the base), unnamed 4 (between 3 and 5)"


class _FixedWindow(torch.nn.Module):
    """Reshapes by the length it was traced at: right at that length only."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], -1).sum(dim=1, keepdim=True) * 2.0


def _trace(module: torch.nn.Module, example: torch.Tensor, path: Path, dynamic: dict) -> Path:
    torch.onnx.export(module, (example,), str(path), dynamo=False, input_names=["x"], output_names=["out"],
                      dynamic_axes=dynamic)
    return path


def test_a_graph_that_runs_only_at_its_example_length_is_caught_and_named(tmp_path: Path) -> None:
    from tests.data.models.coverage import DynamicLengthAttention

    torch.manual_seed(0)
    module = DynamicLengthAttention(d=16, heads=2, layers=1, n_actions=3).eval()
    spec = _spec(x=[[1, 1, 16], [2, 5, 16], [4, 9, 16]])
    # the trace keeps dims 0 and 1 symbolic in the graph's inputs but bakes the length 5 into a Reshape
    path = _trace(module, torch.ones(2, 5, 16), tmp_path / "traced.onnx", {"x": {0: "batch", 1: "x_d1"}})
    result = probe_export(path, module, spec, atol=1e-4, rtol=1e-3)
    assert result.failed is not None and result.failed.dim == "input 'x' dim 1", result
    assert result.failed.label == "input 'x' dim 1 = 1" and "the graph fails" in result.problem
    assert result.checked == ["input 'x' dim 0 = 1", "input 'x' dim 0 = 4", "input 'x' dim 0 = 3 (unnamed)"]


def test_a_graph_that_matches_everywhere_passes_and_a_mismatch_at_the_example_is_left_to_parity(
        tmp_path: Path) -> None:
    spec = _spec(x=[[1, 3], [2, 3], [5, 3]])
    module = _FixedWindow().eval()
    path = _trace(module, torch.ones(2, 3), tmp_path / "ok.onnx", {"x": {0: "batch"}})
    result = probe_export(path, module, spec, atol=1e-5, rtol=1e-5)
    assert result.failed is None and result.checked == ["input 'x' dim 0 = 1", "input 'x' dim 0 = 5",
                                                        "input 'x' dim 0 = 3 (unnamed)"]
    halved = _trace(_Halved().eval(), torch.ones(2, 3), tmp_path / "off.onnx", {"x": {0: "batch"}})
    off = probe_export(halved, module, spec, atol=1e-5, rtol=1e-5)
    assert off.failed is None and off.checked == [] and "differs by up to" in off.mismatch_at_example


class _Halved(_FixedWindow):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 0.5


def test_shapes_pytorch_itself_refuses_are_skipped_not_blamed_on_the_graph(tmp_path: Path) -> None:
    class OnlyEven(_FixedWindow):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            torch._assert(x.shape[0] % 2 == 0, "even batches only")
            return super().forward(x)

    spec = _spec(x=[[1, 3], [2, 3], [6, 3]])
    path = _trace(_FixedWindow().eval(), torch.ones(2, 3), tmp_path / "g.onnx", {"x": {0: "batch"}})
    result = probe_export(path, OnlyEven().eval(), spec, atol=1e-5, rtol=1e-5)
    assert result.failed is None
    assert result.skipped == ["input 'x' dim 0 = 1"] and "input 'x' dim 0 = 6" in result.checked


class _Nudged(_FixedWindow):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 1.000001


def test_rounding_is_left_to_the_parity_gate_even_at_zero_tolerance(tmp_path: Path) -> None:
    assert probe_tolerance(0.0, 0.0) == (1e-3, 1e-2) and probe_tolerance(1e-3, 1e-2) == (1e-2, 0.1)
    spec = _spec(x=[[1, 3], [2, 3], [5, 3]])
    nudged = _trace(_Nudged().eval(), torch.ones(2, 3), tmp_path / "nudged.onnx", {"x": {0: "batch"}})
    result = probe_export(nudged, _FixedWindow().eval(), spec, atol=0.0, rtol=0.0)
    assert result.failed is None and result.mismatch_at_example == "" and len(result.checked) == 3


def test_a_fully_static_network_is_probed_at_its_one_shape(tmp_path: Path) -> None:
    """min = opt = max: the recipe's points fold into one (named min); the probe still runs the graph there."""
    spec = _spec(x=[[2, 3], [2, 3], [2, 3]])
    path = _trace(_FixedWindow().eval(), torch.ones(2, 3), tmp_path / "static.onnx", {})
    result = probe_export(path, _FixedWindow().eval(), spec, atol=1e-5, rtol=1e-5)
    assert result.failed is None and result.mismatch_at_example == "" and result.checked == []
