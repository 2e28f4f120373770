"""Issue 14: every policy architecture RL users deploy compiles, or is refused in one line.

Default run: two representative architectures (masked policy, embedding) on torchscript + ONNX
Runtime, and a property test over random small networks (a GRU with state among them). The LSTM with
state and the whole matrix on every backend are marked slow (scripts/coverage.py writes
docs/coverage.md from the same models).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlopt.errors import RloptError
from rlopt.manifest import read_manifest
from rlopt.parity import run_parity
from rlopt.compile import compile_recipe
from rlopt.reference import Reference
from rlopt.verify import tolerance_of, verify_model_dir
from tests.conftest import assert_one_line_error, run_rlopt
from tests.data.models.coverage import ARCHITECTURES, LAYERS, recipe_for

MODELS = Path(__file__).resolve().parent / "data" / "models" / "coverage.py"
FAST = ["torchscript", "onnxruntime"]
ALL = ["torchscript", "onnxruntime", "tvm", "tensorrt"]


def write_recipe(folder: Path, document: dict) -> Path:
    (folder / "models").mkdir(parents=True, exist_ok=True)
    shutil.copy(MODELS, folder / "models" / "coverage.py")
    path = folder / f"{document['name']}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))  # input order is the forward's argument order
    return path


def compile_architecture(folder: Path, name: str, backends: list[str], **verify: int):
    return compile_recipe(write_recipe(folder, recipe_for(name, backends, **verify)), folder / f"out-{name}")


def multi_step_parity(model_dir: Path, backend: str):
    """run_parity on a compiled MODEL_DIR: the backend's own state fed back at every recorded step."""
    from rlopt.runtime import open_artifact

    network = read_manifest(model_dir).networks["net"]
    reference = Reference.load(model_dir / network.reference.path, list(network.inputs), network.outputs)
    runner = open_artifact(model_dir, backend, network.artifacts[backend], list(network.inputs))
    try:
        return reference, run_parity(runner.infer, reference, network.kind, network.distribution,
                                     tolerance_of(network))
    finally:
        runner.close()


def test_masked_policy_compiles_and_its_minus_inf_logits_verify(tmp_path: Path) -> None:
    result = compile_architecture(tmp_path, "maskable_ppo", FAST)
    assert result.passed, result.failures
    network = result.manifest.networks["net"]
    assert network.inputs["action_mask"].dtype == "bool"
    reference = Reference.load(result.model_dir / network.reference.path, list(network.inputs), network.outputs)
    logits = reference.arrays["opt:out:logits"]
    assert np.isneginf(logits).any() and np.isfinite(logits).any(axis=-1).all()
    for backend in FAST:
        parity = network.artifacts[backend].parity
        assert parity.passed and parity.argmax_agree == 1.0 and np.isfinite(parity.max_abs), backend
    assert verify_model_dir(result.model_dir).passed


@pytest.mark.slow  # recurrent state in the default run: the GRU tools test and the reference-steps test
def test_lstm_with_state_compiles_and_verifies_over_steps(tmp_path: Path) -> None:
    result = compile_architecture(tmp_path, "recurrent_ppo_lstm", FAST, samples=2, steps=2)
    assert result.passed, result.failures
    network = result.manifest.networks["net"]
    onnx_stage = next(s for s in network.stages if s["stage"] == "onnx")
    assert network.artifacts["onnxruntime"].parity.passed
    for backend in FAST:
        reference, parity = multi_step_parity(result.model_dir, backend)
        steps = reference.steps("opt")
        assert steps > 1 and reference.state == {"state_h": "next_state_h", "state_c": "next_state_c"}
        assert parity.passed and parity.compared == len(reference.points) * reference.samples("opt") * steps
    assert "LSTM" in onnx_stage["detail"] or onnx_stage["status"] == "ok"


def test_embedding_ids_are_sampled_over_the_table_and_verify(tmp_path: Path) -> None:
    import rlopt

    result = compile_architecture(tmp_path, "embedding_ids", [*FAST, "tvm"])
    assert result.passed, result.failures
    network = result.manifest.networks["net"]
    reference = Reference.load(result.model_dir / network.reference.path, list(network.inputs), network.outputs)
    ids = reference.arrays["max:in:ids"]
    assert ids.dtype == np.int64 and 9 < ids.max() <= 49
    assert all(network.artifacts[b].parity.passed for b in FAST)
    assert network.inputs["ids"].index_range == [0, 49], "the embedding's rows, read from the ONNX graph"
    built = [b for b, a in network.artifacts.items() if a.built]
    for backend in built:  # TVM's take would read out of bounds (a segfault at 10**9); every backend refuses alike
        with rlopt.load(result.model_dir, "net", backend=backend) as session:
            assert session.run({"ids": np.array([[0, 49, 7]], np.int64)})["logits"].shape == (1, 4)
            for bad in (50, -1, 10**9):
                with pytest.raises(ValueError, match=rf"input 'ids': value {bad} is outside \[0, 49\]"):
                    session.run({"ids": np.array([[1, bad]], np.int64)})


# ---- property: random small networks verify, fail parity naming the backend, or are refused in one line

@st.composite
def random_networks(draw: st.DrawFn) -> dict:
    """A recipe for a random small network: MLP layers from LAYERS behind one of four fronts (plain or
    embedding ids, a bool action mask, a GRUCell with state, a conv on uint8 frames); sometimes a recipe
    whose input width disagrees with the module (a user mistake, refused in one line)."""
    layers = draw(st.lists(st.sampled_from(LAYERS), min_size=0, max_size=4))
    family = draw(st.sampled_from(["mlp", "masked", "gru", "conv"]))
    kind = draw(st.sampled_from(["policy", "value", "generic"]))
    width = draw(st.sampled_from([8, 8, 8, 5]))  # 5: the recipe disagrees with the module
    embedding = family in ("mlp", "masked") and draw(st.booleans())

    def batched(*dims: int, dtype: str = "float32") -> dict:
        return {"dtype": dtype, "min": [1, *dims], "opt": [2, *dims], "max": [4, *dims]}

    inputs = {"x": batched(3, dtype="int64") if embedding else batched(width)}
    outputs, state, kwargs = ["out"], {}, {"layers": layers, "obs": 8}
    cls = {"mlp": "RandomNet", "masked": "RandomMaskedNet", "gru": "RandomGruNet", "conv": "RandomConvNet"}[family]
    if family in ("mlp", "masked"):
        kwargs["embedding"] = embedding
    if family == "masked":
        inputs["action_mask"] = batched(4, dtype="bool")
    elif family == "gru":
        inputs["h"] = batched(16)
        outputs, state = ["out", "h_new"], {"h": "h_new"}
    elif family == "conv":
        inputs = {"x": batched(1, 9 if width == 8 else 5, 9, dtype="uint8")}
    network = {"module": "", "kind": kind, "inputs": inputs, "outputs": outputs, **({"state": state} if state else {})}
    return {
        "name": "random-net",
        "model": {"factory": f"models/coverage.py:{cls}", "kwargs": kwargs, "seed": draw(st.integers(0, 3))},
        "networks": {"net": network},
        "backends": FAST,
        "verify": {"samples": 2, "steps": 2},
    }


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_networks())
def test_random_networks_verify_fail_naming_a_backend_or_are_refused_in_one_line(document: dict) -> None:
    with tempfile.TemporaryDirectory(prefix="rlopt-random-") as folder:
        recipe = write_recipe(Path(folder), document)
        try:
            result = compile_recipe(recipe, Path(folder) / "out")
        except RloptError as exc:  # the CLI prints this one line and exits with its code
            assert exc.exit_code == 2, exc
            assert "\n" not in str(exc) and "fix:" in str(exc), str(exc)
            return
        # any other exception escapes: the CLI's exit 3, which this test forbids
        if result.passed:
            assert result.manifest.networks["net"].selected in FAST
            return
        assert any(f"net/{backend}" in failure for failure in result.failures for backend in FAST), result.failures
        assert all("\n" not in failure for failure in result.failures)


def test_a_nan_in_pytorchs_output_fails_parity_naming_the_backend_and_the_output(tmp_path: Path) -> None:
    document = {
        "name": "log-net",
        "model": {"factory": "models/coverage.py:RandomNet", "kwargs": {"layers": ["log"], "obs": 8}},
        "networks": {"net": {"module": "", "kind": "value", "outputs": ["out"],
                             "inputs": {"x": {"dtype": "float32", "min": [1, 8], "opt": [2, 8], "max": [4, 8]}}}},
        "backends": FAST, "verify": {"samples": 2},
    }
    result = compile_recipe(write_recipe(tmp_path, document), tmp_path / "out")
    assert not result.passed and any("net/onnxruntime" in failure for failure in result.failures)
    parity = result.manifest.networks["net"].artifacts["onnxruntime"].parity
    assert not parity.passed and "PyTorch's output 'out' holds NaN" in parity.outputs[0].reason


# ---- the whole matrix on every backend (scripts/coverage.py writes docs/coverage.md from it)

@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_architecture_compiles_on_every_backend(tmp_path: Path, name: str) -> None:
    result = compile_architecture(tmp_path, name, ALL)
    network = result.manifest.networks["net"]
    assert result.failures == []
    for backend, record in network.artifacts.items():
        if record.skipped:
            assert record.skipped.strip() and "\n" not in record.skipped, backend
        elif record.parity is not None:
            assert record.parity.passed, (backend, record.parity)
    assert network.selected is not None
    assert network.artifacts["tvm"].skipped is None, "every architecture builds on TVM, recurrent ones included"


@pytest.mark.slow
def test_a_batch_branch_tracing_would_freeze_goes_to_the_dynamo_exporter(tmp_path: Path) -> None:
    """The TorchScript exporter refuses the scripted GRUCell and a trace would freeze the branch on the batch size,
    so the dynamo exporter runs; the shape probe ran its graph at batch 1 and > 1 against PyTorch."""
    import json

    document = recipe_for("gru_cell_state", FAST)
    document["model"]["factory"] = "models/coverage.py:GruCellWithBatchBranch"
    recipe = write_recipe(tmp_path, document)
    proc = run_rlopt("compile", str(recipe), "-o", str(tmp_path / "out"), "--json")
    assert proc.returncode == 0, proc.stderr
    onnx_facts = json.loads(proc.stdout)["manifest"]["networks"]["net"]["facts"]["onnx"]
    assert onnx_facts["export_path"] == "dynamo"
    assert "prim::ListConstruct" in onnx_facts["refused"]
    assert "would freeze the data-dependent if at coverage.py:" in onnx_facts["trace_refused"]
    checked = onnx_facts["shape_probe"]["checked"]
    assert "input 'obs' dim 0 = 1" in checked and any(label.startswith("input 'obs' dim 0 = ") and not
                                                      label.endswith("= 1") for label in checked), checked


# ---- issue 36: a dynamic window of tokens through nn.TransformerEncoder

@pytest.mark.slow
def test_dynamic_length_attention_matches_pytorch_on_every_backend_at_named_and_unnamed_lengths(
        tmp_path: Path) -> None:
    import rlopt
    from rlopt.recipe import load_recipe
    from rlopt.user_model import build_model

    result = compile_architecture(tmp_path, "attention_dynamic_length", ALL)
    assert result.passed, result.failures
    network = result.manifest.networks["net"]
    built = [b for b, a in network.artifacts.items() if a.built]
    assert set(built) >= {"torchscript", "onnxruntime", "tvm"}, network.artifacts
    recipe_path = tmp_path / "attention-dynamic-length.yaml"
    model, _ = build_model(load_recipe(recipe_path).model, recipe_path)
    rng = np.random.default_rng(5)
    for backend in built:
        with rlopt.load(result.model_dir, "net", backend=backend) as session:
            for batch, length in [(1, 1), (4, 20), (8, 64), (3, 37)]:  # min, opt, max, and a length no one named
                tokens = rng.standard_normal((batch, length, 128)).astype(np.float32)
                want = model(torch.from_numpy(tokens)).detach().numpy()
                got = session.run({"tokens": tokens})["logits"]
                np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-3, err_msg=f"{backend} at {length}")
    # the dynamo graph keeps a weight map: new weights go in without recompiling, every backend re-verified
    torch.manual_seed(7)
    retrained = type(model)().eval()
    torch.save(retrained.state_dict(), tmp_path / "retrained.pt")
    refitted = rlopt.refit(result.model_dir, tmp_path / "retrained.pt", out=tmp_path / "refitted")
    with rlopt.load(refitted, "net", backend="onnxruntime") as session:
        tokens = rng.standard_normal((2, 37, 128)).astype(np.float32)
        np.testing.assert_allclose(session.run({"tokens": tokens})["logits"],
                                   retrained(torch.from_numpy(tokens)).detach().numpy(), atol=1e-4, rtol=1e-3)


@pytest.mark.slow
def test_cli_refuses_a_dim_no_exporter_keeps_dynamic_in_one_line(tmp_path: Path) -> None:
    document = recipe_for("attention_dynamic_length", FAST)
    document["model"]["factory"] = "models/coverage.py:LengthBoundAttention"
    recipe = write_recipe(tmp_path, document)
    proc = run_rlopt("compile", str(recipe), "-o", str(tmp_path / "out"), "--json")
    line = assert_one_line_error(proc, 2, "networks.net", "no ONNX exporter keeps input 'tokens' dim 1 (1..64) "
                                 "dynamic", "fix: make input 'tokens' dim 1 static")
    assert "Reshape" not in line and proc.stdout == "" and not (tmp_path / "out").exists()


# ---- issue 36: TVM for recurrent policies (LSTM / GRU unrolled into MatMul + gates per step)

def _small_recurrent(name: str, kwargs: dict, inputs: dict) -> dict:
    document = recipe_for(name, ["tvm"], samples=2)
    document["model"]["kwargs"] = kwargs
    document["networks"]["net"]["inputs"].update(inputs)
    return document


def _tvm_verified_over_steps(result, steps: int) -> None:
    assert result.passed, result.failures
    network = result.manifest.networks["net"]
    tvm = network.artifacts["tvm"]
    assert tvm.skipped is None and tvm.parity.passed, tvm
    assert any(kernel.startswith("fused_matmul") for kernel in tvm.facts.fused_kernels)
    reference, parity = multi_step_parity(result.model_dir, "tvm")
    assert reference.steps("opt") == steps
    assert parity.passed and parity.compared == sum(reference.samples(p) * reference.steps(p) for p in reference.points)


@pytest.mark.slow  # compiles a whole recipe; the converters and the tools' recurrent paths are tested fast
def test_an_lstm_actor_builds_on_tvm_and_matches_over_six_steps_with_its_state_fed_back(tmp_path: Path) -> None:
    def batched(*dims: int) -> dict:
        return {"dtype": "float32", "min": [1, *dims], "opt": [4, *dims], "max": [8, *dims]}

    document = _small_recurrent("recurrent_ppo_lstm", {"obs": 8, "hidden": 8, "n_actions": 4},
                                {"state_h": batched(1, 8), "state_c": batched(1, 8)})
    assert document["verify"]["steps"] == 6
    _tvm_verified_over_steps(compile_recipe(write_recipe(tmp_path, document), tmp_path / "out"), 6)


@pytest.mark.slow  # compiles a whole recipe; the converters and the tools' recurrent paths are tested fast
def test_a_gru_sequence_encoder_builds_on_tvm_and_matches(tmp_path: Path) -> None:
    window = {"dtype": "float32", "min": [1, 6, 8], "opt": [4, 6, 8], "max": [8, 6, 8]}  # the matrix's is 16 long
    document = _small_recurrent("gru_sequence_encoder", {"obs": 8, "hidden": 8, "n_actions": 4}, {"window": window})
    result = compile_recipe(write_recipe(tmp_path, document), tmp_path / "out")
    _tvm_verified_over_steps(result, 1)
    builds = result.manifest.networks["net"].artifacts["tvm"].facts.shape_builds
    assert [b.shapes["window"] for b in builds] == [[1, 6, 8], [4, 6, 8], [8, 6, 8]]
    guard = next(s for s in result.manifest.networks["net"].stages if s["stage"] == "specialization guard")
    # batch 1, 8 and the unnamed 6 (the min and max shapes are those): the window length is fixed
    assert guard["detail"] == "1 input(s) match the recipe; the graph matches PyTorch at 3 more shape(s)", guard
