"""Stages in isolation: scripting keeps the branch, ONNX keeps the If, TVM fuses and stays exact."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from rlopt.errors import RecipeError, StageError
from rlopt.recipe import load_recipe
from rlopt.stages.export_onnx import dynamic_dim_names, export_onnx
from rlopt.user_model import build_model, submodule
from rlopt.stages.script import script_network
from rlopt.backends.tvm.build import build_tvm, target_slug, tensorize_shape_comparisons
from tests.conftest import write_tiny_recipe


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object, object]:
    folder = tmp_path_factory.mktemp("stages")
    recipe_path = write_tiny_recipe(folder)
    recipe = load_recipe(recipe_path)
    model, _ = build_model(recipe.model, recipe_path)
    policy = submodule(model, "policy", recipe_path, "policy")
    spec = recipe.networks["policy"]
    out = script_network(policy, folder / "model.ts", recipe_path=recipe_path, network="policy", module_path="policy")
    assert out.facts["branches"] >= 1
    export_onnx(folder / "model.ts", spec, 17, folder / "model.onnx", recipe_path=recipe_path,
                network="policy")
    return folder / "model.onnx", policy, recipe


def test_onnx_keeps_the_branch_and_names_dynamic_dims(exported: tuple[Path, object, object]) -> None:
    path, _, _ = exported
    model = onnx.load(str(path))
    assert "If" in {n.op_type for n in model.graph.node}
    dims = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", "input0_d1", 32]


def test_tensorize_rewrites_the_shape_comparison_only(exported: tuple[Path, object, object]) -> None:
    path, _, _ = exported
    model = onnx.load(str(path))
    before = len(model.graph.node)
    assert tensorize_shape_comparisons(model) == 1
    assert len(model.graph.node) == before + 2
    onnx.checker.check_model(model)
    assert tensorize_shape_comparisons(model) == 0, "the rewritten Gather has a 1-D index: nothing left to do"


def test_tvm_build_fuses_and_is_exact_on_both_branches(exported: tuple[Path, object, object], tmp_path: Path) -> None:
    import tvm
    from tvm import relax

    from rlopt.backends.tvm.params import bind_params, read_params

    path, policy, recipe = exported
    out = build_tvm(path, recipe.tvm, tmp_path, recipe_path=tmp_path / "r.yaml", network="policy")
    assert out.artifact is not None and out.artifact.name == "tvm-llvm.so"
    assert any(name.startswith("fused_matmul") and "relu" in name for name in out.facts.fused_kernels)
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(out.artifact)), tvm.cpu())
    weights = read_params(tmp_path / "tvm-llvm.params.npz")
    params = bind_params(tvm, vm, out.facts.param_names, weights, tvm.cpu())
    for shape in [(1, 1, 32), (1, 5, 32), (3, 2, 32), (4, 6, 32)]:
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        expected = policy(torch.from_numpy(x)).detach().numpy()
        got = vm["main"](tvm.runtime.tensor(x), *params).numpy()
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-4)


def test_dynamic_dim_names_share_batch_only_when_ranges_agree() -> None:
    from rlopt.recipe import InputSpec

    same = {"a": InputSpec(min=[1, 4], opt=[2, 4], max=[8, 4]), "b": InputSpec(min=[1, 2], opt=[2, 3], max=[8, 9])}
    assert dynamic_dim_names(same) == {"a": {0: "batch"}, "b": {0: "batch", 1: "b_d1"}}
    different = {"a": InputSpec(min=[1], opt=[1], max=[8]), "b": InputSpec(min=[1], opt=[1], max=[4])}
    assert dynamic_dim_names(different) == {"a": {0: "a_d0"}, "b": {0: "b_d0"}}


def test_target_slug() -> None:
    assert target_slug({"kind": "llvm"}) == "llvm"
    assert target_slug({"kind": "llvm", "mcpu": "znver4", "num-cores": 2}) == "llvm-znver4"
    assert target_slug({"kind": "cuda", "arch": "sm_86"}) == "cuda-sm_86"


class _Unscriptable(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * len({1: object()})


def test_unscriptable_module_names_module_and_construct(tmp_path: Path) -> None:
    with pytest.raises(StageError) as info:
        script_network(_Unscriptable(), tmp_path / "m.ts", recipe_path=tmp_path / "r.yaml", network="policy",
                       module_path="policy.head")
    message = str(info.value)
    assert "networks.policy.module" in message and "'policy.head' cannot be scripted" in message
    assert "test_stages.py" in message and "\n" not in message


def test_factory_and_checkpoint_errors(tmp_path: Path) -> None:
    recipe_path = write_tiny_recipe(tmp_path)
    recipe = load_recipe(recipe_path)
    bad_attr = recipe.model.model_copy(update={"factory": "models/policy_heads.py:Nope"})
    with pytest.raises(RecipeError, match="'Nope' is not a callable"):
        build_model(bad_attr, recipe_path)
    raising = recipe.model.model_copy(update={"kwargs": {"hidden": -1}})
    with pytest.raises(RecipeError, match=r"model.kwargs.*raised RuntimeError"):
        build_model(raising, recipe_path)
    torch.save({"fc1.weight": torch.zeros(1)}, tmp_path / "wrong.pt")
    wrong_keys = recipe.model.model_copy(update={"checkpoint": "wrong.pt"})
    with pytest.raises(RecipeError, match="keys do not match"):
        build_model(wrong_keys, recipe_path)
    torch.save([1, 2, 3], tmp_path / "list.pt")
    with pytest.raises(RecipeError, match="not a state_dict"):
        build_model(recipe.model.model_copy(update={"checkpoint": "list.pt"}), recipe_path)
    with pytest.raises(RecipeError, match="not found"):
        build_model(recipe.model.model_copy(update={"checkpoint": "absent.pt"}), recipe_path)
    model, _ = build_model(recipe.model, recipe_path)
    with pytest.raises(RecipeError, match="networks.policy.module"):
        submodule(model, "policy.missing", recipe_path, "policy")


def test_checkpoint_round_trip_pt_and_safetensors(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    recipe_path = write_tiny_recipe(tmp_path)
    recipe = load_recipe(recipe_path)
    model, _ = build_model(recipe.model, recipe_path)
    state = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    torch.save(state, tmp_path / "w.pt")
    save_file(state, str(tmp_path / "w.safetensors"))
    for name in ("w.pt", "w.safetensors"):
        loaded, facts = build_model(recipe.model.model_copy(update={"checkpoint": name}), recipe_path)
        assert torch.equal(loaded.state_dict()["policy.fc1.weight"], state["policy.fc1.weight"])
        assert len(facts["checkpoint_sha256"]) == 64


# issue 14: every scripted module fingerprints; the export chain with its guards; TVM names what it cannot import


def _spec(inputs: dict[str, list[list[int]]], outputs: list[str], dtype: str = "float32") -> object:
    from rlopt.recipe import NetworkSpec

    return NetworkSpec(inputs={name: {"dtype": dtype, "min": dims[0], "opt": dims[1], "max": dims[2]}
                               for name, dims in inputs.items()}, outputs=outputs)


def _script(module: torch.nn.Module, folder: Path) -> tuple[Path, dict]:
    out = script_network(module.eval(), folder / "model.ts", recipe_path=folder / "r.yaml", network="net",
                         module_path="")
    return folder / "model.ts", out.facts


@pytest.mark.slow  # scripts several RNN containers: ~2 s
def test_fingerprint_works_for_rnns_containers_and_splits_graph_from_weights(tmp_path: Path) -> None:
    from tests.data.models.coverage import AttentionPolicy, GruCellActor, LstmSequence

    for cls in (LstmSequence, GruCellActor, AttentionPolicy):
        torch.manual_seed(0)
        _, first = _script(cls(), tmp_path)
        torch.manual_seed(1)
        _, reseeded = _script(cls(), tmp_path)
        torch.manual_seed(0)
        _, same = _script(cls(), tmp_path)
        assert first["graph_sha256"] == reseeded["graph_sha256"], cls
        assert first["weights_sha256"] != reseeded["weights_sha256"], cls
        assert first["fingerprint"] == same["fingerprint"] != reseeded["fingerprint"], cls
    _, other = _script(LstmSequence(hidden=16), tmp_path)
    assert other["graph_sha256"] != first["graph_sha256"]


class _GruWithBranch(torch.nn.Module):
    """A scripted GRUCell (the TorchScript exporter refuses it) AND a branch on the batch size."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.nn.GRUCell(8, 16)

    def forward(self, obs: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        if obs.size(0) > 1:
            return self.cell(obs, h) * 2.0
        return self.cell(obs, h)


GRU_INPUTS = {"obs": [[1, 8], [2, 8], [4, 8]], "h": [[1, 16], [2, 16], [4, 16]]}


def test_export_falls_back_to_the_trace_where_the_scripted_graph_is_refused(tmp_path: Path) -> None:
    from rlopt.stages.export_onnx import control_flow_blockers
    from tests.data.models.coverage import AttentionPolicy, GruCellActor

    cases = [(GruCellActor(obs=8, hidden=16), GRU_INPUTS, ["logits", "h_new"], "prim::ListConstruct"),
             (AttentionPolicy(), {"obs": [[1, 8, 8], [2, 8, 8], [4, 8, 8]]}, ["logits"],
              "aten::is_autocast_enabled")]
    for module, inputs, outputs, op in cases:
        ts_path, _ = _script(module, tmp_path)
        assert control_flow_blockers(torch.jit.load(str(ts_path))) == []
        spec = _spec(inputs, outputs)
        out = export_onnx(ts_path, spec, 17, tmp_path / "model.onnx", recipe_path=tmp_path / "r.yaml",
                          network="net", eager_module=module)
        assert out.facts["export_path"] == "trace" and out.facts["refused"].startswith(op + ": ")
        assert "\n" not in out.facts["refused"]
        with pytest.raises(StageError, match=r"networks\.net: ONNX export failed: " + op):
            export_onnx(ts_path, spec, 17, tmp_path / "refused.onnx", recipe_path=tmp_path / "r.yaml", network="net")
        assert not (tmp_path / "refused.onnx").exists(), "nothing half-written"
        import onnxruntime as ort

        session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
        for point in (0, 2):  # batch 1 and batch > 1: the trace kept the batch dynamic
            feeds = {n: np.random.default_rng(point).standard_normal(d[point]).astype(np.float32)
                     for n, d in inputs.items()}
            expected = module(*[torch.from_numpy(v) for v in feeds.values()])
            expected = expected if isinstance(expected, tuple) else (expected,)
            for got, want in zip(session.run(None, feeds), expected):
                np.testing.assert_allclose(got, want.detach().numpy(), atol=1e-5)


def test_lstm_exports_from_the_script_and_plain_branches_stay_on_it(tmp_path: Path) -> None:
    from tests.data.models.coverage import LstmSequence

    ts_path, _ = _script(LstmSequence(), tmp_path)
    spec = _spec({"obs": [[1, 1, 8], [2, 3, 8], [4, 6, 8]], "h": [[1, 1, 32], [2, 1, 32], [4, 1, 32]],
                  "c": [[1, 1, 32], [2, 1, 32], [4, 1, 32]]}, ["out", "h_new", "c_new"])
    out = export_onnx(ts_path, spec, 17, tmp_path / "model.onnx", recipe_path=tmp_path / "r.yaml", network="net",
                      eager_module=LstmSequence())
    assert out.facts["export_path"] == "script" and "refused" not in out.facts and "LSTM" in out.facts["op_types"]


def test_trace_fallback_is_refused_when_the_network_branches_on_its_inputs(tmp_path: Path) -> None:
    from rlopt.stages.export_onnx import control_flow_blockers

    module = _GruWithBranch()
    ts_path, _ = _script(module, tmp_path)
    assert control_flow_blockers(torch.jit.load(str(ts_path))) == [f"if at test_stages.py:{_line_of('obs.size(0) > 1')}"]
    with pytest.raises(StageError) as info:
        export_onnx(ts_path, _spec(GRU_INPUTS, ["h_new"]), 17, tmp_path / "model.onnx",
                    recipe_path=tmp_path / "r.yaml", network="net", eager_module=module)
    message = str(info.value)
    assert "\n" not in message and "prim::ListConstruct" in message and "would freeze" in message
    assert "test_stages.py" in message and "fix:" in message


def _line_of(text: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line and "if " in line)


def test_refused_op_names_the_operator() -> None:
    from rlopt.stages.export_onnx import refused_op

    message = "Exporting the operator 'aten::is_autocast_enabled' to ONNX opset version 17 is not supported"
    assert refused_op(RuntimeError(message)) == f"aten::is_autocast_enabled: {message}"
    assert refused_op(RuntimeError("ONNX symbolic expected node type prim::ListConstruct, got x\nmore")).startswith(
        "prim::ListConstruct: ONNX symbolic expected")
    assert refused_op(ValueError("")) == "ValueError: ValueError"


def test_dynamo_is_gated_on_onnxscript() -> None:
    from rlopt.stages.export_onnx import _dynamo_unavailable

    try:
        import onnxscript  # noqa: F401
    except ImportError:
        assert "onnxscript" in (_dynamo_unavailable() or "")
    else:
        assert _dynamo_unavailable() is None


def test_tvm_names_the_onnx_ops_its_frontend_cannot_convert(tmp_path: Path) -> None:
    from rlopt.errors import BackendUnavailable
    from rlopt.backends.tvm.normalize import check_supported, unsupported_ops
    from tests.data.models.coverage import LstmSequence

    ts_path, _ = _script(LstmSequence(), tmp_path)
    spec = _spec({"obs": [[1, 1, 8], [2, 3, 8], [4, 6, 8]], "h": [[1, 1, 32], [2, 1, 32], [4, 1, 32]],
                  "c": [[1, 1, 32], [2, 1, 32], [4, 1, 32]]}, ["out", "h_new", "c_new"])
    export_onnx(ts_path, spec, 17, tmp_path / "model.onnx", recipe_path=tmp_path / "r.yaml", network="net")
    model = onnx.load(str(tmp_path / "model.onnx"))
    assert [entry.split(" ")[0] for entry in unsupported_ops(model)] == ["LSTM"]
    with pytest.raises(BackendUnavailable, match=r"tvm: Relax ONNX frontend has no converter for LSTM \(node "):
        check_supported(model)
    # inside a subgraph too
    from onnx import helper

    loop_body = helper.make_graph([helper.make_node("Scan", [], [], name="inner")], "body", [], [])
    outer = helper.make_model(helper.make_graph([helper.make_node("If", ["c"], ["y"], name="outer",
                                                                  then_branch=loop_body, else_branch=loop_body)],
                                                "g", [], []))
    assert unsupported_ops(outer) == ["Scan (node inner)"]


def test_reference_sampling_by_dtype_range_embedding_and_mask(tmp_path: Path) -> None:
    from rlopt.recipe import NetworkSpec
    from rlopt.reference import Reference, random_input, record_reference
    from tests.data.models.coverage import EmbeddingPolicy, MaskedPolicy

    rng = np.random.default_rng(0)
    spec = NetworkSpec(inputs={"ids": {"dtype": "int64", "range": [3, 5], "shape": [64, 4]}}, outputs=["logits"])
    ids = random_input(rng, spec.inputs["ids"], [64, 4])
    assert ids.dtype == np.int64 and ids.min() == 3 and ids.max() == 5
    # without a range: the embedding the input feeds
    unranged = NetworkSpec(inputs={"ids": {"dtype": "int64", "shape": [64, 8]}}, outputs=["logits"])
    reference = record_reference(EmbeddingPolicy(vocab=50), unranged, 4, 0, recipe_path=tmp_path / "r.yaml",
                                 network="net")
    recorded = reference.arrays["min:in:ids"]
    assert recorded.max() > 9 and recorded.max() <= 49 and recorded.min() >= 0
    assert random_input(rng, unranged.inputs["ids"], [1000]).max() <= 9, "no embedding known: 0-9"
    frames = random_input(rng, NetworkSpec(inputs={"f": {"dtype": "uint8", "shape": [4096]}},
                                           outputs=["o"]).inputs["f"], [4096])
    assert frames.dtype == np.uint8 and frames.max() > 200
    masked = NetworkSpec(inputs={"obs": {"shape": [64, 8]}, "action_mask": {"dtype": "bool", "shape": [64, 6]}},
                         outputs=["logits"], kind="policy")
    reference = record_reference(MaskedPolicy(), masked, 8, 0, recipe_path=tmp_path / "r.yaml", network="net")
    assert reference.arrays["min:in:action_mask"].any(axis=-1).all(), "at least one legal action per row"
    flag = NetworkSpec(inputs={"done": {"dtype": "bool", "shape": [4096]}}, outputs=["o"]).inputs["done"]
    assert not random_input(rng, flag, [4096]).all(), "a [batch] flag is sampled freely"
    legal = random_input(rng, flag, [512, 3], name="legal")
    assert legal.any(axis=-1).all() and not legal.all(), "shaped like a mask: one True per row at least"
    assert np.isinf(reference.arrays["min:out:logits"]).any()
    reference.save(tmp_path / "reference.npz")
    loaded = Reference.load(tmp_path / "reference.npz", ["obs", "action_mask"], ["logits"])
    assert loaded.points == ["min"] and loaded.state == {} and loaded.steps("min") == 1


def test_reference_records_steps_with_pytorchs_own_state(tmp_path: Path) -> None:
    from rlopt.recipe import NetworkSpec
    from rlopt.reference import Reference, record_reference
    from tests.data.models.coverage import GruCellActor

    module = GruCellActor().eval()
    spec = NetworkSpec(inputs={"obs": {"min": [1, 8], "opt": [2, 8], "max": [3, 8]},
                               "h": {"min": [1, 32], "opt": [2, 32], "max": [3, 32]}},
                       outputs=["logits", "h_new"], state={"h": "h_new"})
    reference = record_reference(module, spec, 2, 0, recipe_path=tmp_path / "r.yaml", network="net", steps=3)
    assert reference.steps("opt") == 3 and reference.state == {"h": "h_new"}
    np.testing.assert_array_equal(reference.arrays["opt:step1:in:h"], reference.arrays["opt:out:h_new"])
    np.testing.assert_array_equal(reference.arrays["opt:step2:in:h"], reference.arrays["opt:step1:out:h_new"])
    reference.save(tmp_path / "reference.npz")
    loaded = Reference.load(tmp_path / "reference.npz", ["obs", "h"], ["logits", "h_new"])
    assert loaded.state == {"h": "h_new"} and loaded.points == ["min", "opt", "max"] and loaded.steps("max") == 3
    assert loaded.head(1).samples("opt") == 1 and loaded.head(1).state == {"h": "h_new"}
    # a state output whose shape does not match its input: one located line
    wrong = NetworkSpec(inputs=spec.inputs, outputs=["logits", "h_new"], state={"h": "logits"})
    with pytest.raises(RecipeError, match=r"networks\.net\.state: 'logits' has shape \[1, 4\]"):
        record_reference(module, wrong, 1, 0, recipe_path=tmp_path / "r.yaml", network="net")


def test_reference_is_recorded_on_one_torch_thread(tmp_path: Path) -> None:
    """A BLAS splits sums by thread: a reference recorded on the caller's thread count would differ in its last bits
    between a compile and a refit of the same weights. Recording runs on one thread and restores the caller's."""
    import torch

    from rlopt.recipe import NetworkSpec
    from rlopt.reference import record_reference

    seen: list[int] = []

    class Probe(torch.nn.Module):
        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            seen.append(torch.get_num_threads())
            return obs * 2

    spec = NetworkSpec(inputs={"obs": {"shape": [2, 3]}}, outputs=["o"])
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        reference = record_reference(Probe(), spec, 2, 0, recipe_path=tmp_path / "r.yaml", network="net")
        assert torch.get_num_threads() == 2, "the caller's thread count is restored"
    finally:
        torch.set_num_threads(before)
    assert seen and set(seen) == {1}
    np.testing.assert_array_equal(reference.arrays["min:out:o"], reference.arrays["min:in:obs"] * 2)


def test_graph_digest_is_the_same_in_every_process(tmp_path: Path) -> None:
    """load_model names a recipe's model module after a per-process hash of its path; the digest ignores it."""
    import importlib.util

    from rlopt.stages.script import graph_sha256

    source = Path(__file__).resolve().parent / "data" / "models" / "coverage.py"
    digests = set()
    for suffix in ("12345678", "87654321"):
        spec = importlib.util.spec_from_file_location(f"rlopt_user_coverage_{suffix}", source)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        torch.manual_seed(0)
        scripted = torch.jit.script(module.MaskedPolicy().eval())
        assert f"rlopt_user_coverage_{suffix}" in str(scripted.inlined_graph)
        digests.add(graph_sha256(scripted))
    assert len(digests) == 1
