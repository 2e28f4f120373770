"""TVM refit: a library built with weights A and refitted to weights B computes what a build with B computes.

The network is the default recipe's policy head (768 -> 256 -> 256 -> 16), so the shipped tuning database
schedules its static library at [1,1,768] with re-laid-out (pre-packed) weights: the case where the
pre-packing must run on the new weights, not on the ones the library was built with.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from rlopt.backends.base import RefitInputs
from rlopt.backends.tvm.facts import TvmFacts
from rlopt.backends.tvm.params import read_params, write_params
from rlopt.errors import ArtifactError

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "policy_value_heads.yaml"
STATIC = (1, 1, 768)


def _export(policy: Any, spec: Any, folder: Path) -> Path:
    from rlopt.stages.export_onnx import export_onnx
    from rlopt.stages.script import script_network

    folder.mkdir(parents=True)
    script_network(policy, folder / "model.ts", recipe_path=RECIPE, network="policy", module_path="policy")
    export_onnx(folder / "model.ts", spec, 17, folder / "model.onnx", recipe_path=RECIPE, network="policy")
    return folder / "model.onnx"


def _build(onnx_path: Path, recipe: Any, spec: Any, model_dir: Path) -> dict[str, Any]:
    from rlopt.backends.tvm.build import build_tvm

    network_dir = model_dir / "policy"
    network_dir.mkdir(parents=True)
    out = build_tvm(onnx_path, recipe.tvm, network_dir, recipe_path=RECIPE, network="policy", spec=spec)
    return out.facts.as_dict()


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Weights A and B of one architecture: their ONNX files and a TVM build of each (one tuned static shape)."""
    from rlopt.recipe import load_recipe
    from rlopt.user_model import build_model, submodule

    root = tmp_path_factory.mktemp("tvm-refit")
    recipe = load_recipe(RECIPE)
    spec = recipe.networks["policy"]
    model, _ = build_model(recipe.model, RECIPE)
    policy = submodule(model, "policy", RECIPE, "policy")
    static = [int(d) for d in STATIC]
    one_shape = spec.model_copy(update={"inputs": {"input0": spec.inputs["input0"].model_copy(
        update={"min": static, "opt": static, "max": static})}})
    onnx_a = _export(policy, spec, root / "onnx-a")
    with torch.no_grad():
        generator = torch.Generator().manual_seed(1)
        for parameter in policy.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    onnx_b = _export(policy, spec, root / "onnx-b")
    facts_a = _build(onnx_a, recipe, one_shape, root / "a")
    facts_b = _build(onnx_b, recipe, one_shape, root / "b")
    if not facts_a["shape_builds"][0]["tuned_kernels"]:
        pytest.skip(f"the shipped database does not apply on this CPU ({facts_a['database']['reason']})")
    return {"root": root, "onnx_a": onnx_a, "onnx_b": onnx_b, "a": facts_a, "b": facts_b}


def _refit(builds: dict[str, Any], onnx_path: Path, name: str) -> tuple[Path, dict[str, Any]]:
    from rlopt.backends.tvm.refit import refit_artifact

    model_dir = builds["root"] / name
    shutil.copytree(builds["root"] / "a", model_dir)
    facts = refit_artifact(RefitInputs(network_dir=model_dir / "policy", artifact="tvm-llvm.so",
                                       facts=TvmFacts.of(builds["a"]), onnx_path=onnx_path, padded_onnx_path=None,
                                       state={}))
    return model_dir, facts.as_dict()


def _runner(model_dir: Path, facts: dict[str, Any]) -> Any:
    from rlopt.backends.tvm.runner import TvmRunner

    return TvmRunner(model_dir / "policy" / "tvm-llvm.so", ["input0"], facts)


def test_params_file_round_trips_names_dtypes_and_bytes(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    weights = {"onnx::MatMul_34": rng.standard_normal((3, 4)).astype(np.float32),
               "fc1.weight__transposed": rng.standard_normal((4, 3)).astype(np.float32),
               "half": rng.standard_normal(5).astype(np.float16), "scalar": np.array(2.5, dtype=np.float64)}
    path = tmp_path / "w.params.npz"
    write_params(path, weights)
    first = path.read_bytes()
    back = read_params(path)
    assert list(back) == list(weights)
    for name, array in weights.items():
        assert back[name].dtype == array.dtype and back[name].shape == array.shape
        np.testing.assert_array_equal(back[name], array)
    write_params(path, weights)
    assert path.read_bytes() == first, "the same weights must give the same file (and sha256)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.params.npz"], "no temporary file is left behind"


def test_build_records_the_params_file_and_uses_the_database(builds: dict[str, Any]) -> None:
    from rlopt.manifest import sha256_file

    facts = TvmFacts.of(builds["a"])
    assert facts.params is not None and facts.params.onnx == "model.onnx"
    path = builds["root"] / "a" / facts.params.file.path
    assert sha256_file(path) == facts.params.file.sha256 and path.stat().st_size == facts.params.file.bytes
    stored = read_params(path)
    assert list(stored) == facts.params.names
    assert set(facts.param_names) <= set(stored) and set(facts.shape_builds[0].param_names) <= set(stored)
    initializers = {i.name for i in onnx.load(str(builds["onnx_a"])).graph.initializer}
    assert all(name in initializers or name.removesuffix("__transposed") in initializers for name in stored)
    assert facts.params.file in facts.companion_files()
    assert len(facts.shape_builds[0].tuned_kernels) == 3 and facts.shape_builds[0].untuned_kernels == []


def test_refit_to_weights_b_computes_what_a_build_with_b_computes(builds: dict[str, Any]) -> None:
    refitted_dir, refitted_facts = _refit(builds, builds["onnx_b"], "refit-b")
    assert refitted_facts["params"]["file"]["sha256"] != builds["a"]["params"]["file"]["sha256"]
    assert refitted_facts["shape_builds"] == builds["a"]["shape_builds"], "the libraries are reused as they are"
    refitted = _runner(refitted_dir, refitted_facts)
    rebuilt = _runner(builds["root"] / "b", builds["b"])
    original = _runner(builds["root"] / "a", builds["a"])
    rng = np.random.default_rng(3)
    for shape in [STATIC, (2, 3, 768)]:  # the tuned static library (a KernelChain), then the dynamic one
        x = rng.standard_normal(shape).astype(np.float32)
        for _ in range(2):
            got = refitted.infer({"input0": x})[0]
            np.testing.assert_array_equal(got, rebuilt.infer({"input0": x})[0])
            assert np.abs(got - original.infer({"input0": x})[0]).max() > 1e-3, "the weights did change"
        np.testing.assert_array_equal(refitted.infer_dynamic({"input0": x})[0],
                                      rebuilt.infer_dynamic({"input0": x})[0])
    from rlopt.backends.tvm.chain import KernelChain

    assert any(isinstance(plan, KernelChain) for plan in refitted._local.plans.values())


def test_a_graph_with_other_weight_shapes_is_refused_and_nothing_is_written(builds: dict[str, Any]) -> None:
    model = onnx.load(str(builds["onnx_b"]))
    victim = next(i for i in model.graph.initializer if i.name.endswith("bias"))
    victim.CopyFrom(numpy_helper.from_array(np.zeros(3, dtype=np.float32), victim.name))
    bad = builds["root"] / "bad" / "model.onnx"
    bad.parent.mkdir()
    onnx.save(model, str(bad))
    with pytest.raises(ArtifactError, match=f"{victim.name}.*rlopt compile"):
        _refit(builds, bad, "refit-bad")
    params = builds["root"] / "refit-bad" / builds["a"]["params"]["file"]["path"]
    assert params.read_bytes() == (builds["root"] / "a" / builds["a"]["params"]["file"]["path"]).read_bytes()


def test_baked_weights_are_refused_with_the_rebuild_command(tmp_path: Path) -> None:
    from rlopt.backends.tvm.refit import refit_artifact

    old = TvmFacts.of({"target": {"kind": "llvm"}, "shape_builds": []})
    with pytest.raises(ArtifactError) as caught:
        refit_artifact(RefitInputs(network_dir=tmp_path, artifact="tvm-llvm.so", facts=old,
                                   onnx_path=tmp_path / "model.onnx", padded_onnx_path=None, state={}))
    message = str(caught.value)
    assert "\n" not in message and "baked" in message and "rlopt compile" in message


RUNTIME_ONLY_SCRIPT = """
import json, shutil, sys
from pathlib import Path
import numpy as np
from rlopt.backends import runtime_only_process
applied = runtime_only_process()
from rlopt.backends.base import RefitInputs
from rlopt.backends.tvm.facts import TvmFacts
from rlopt.backends.tvm.refit import refit_artifact
from rlopt.backends.tvm.runner import TvmRunner
root, onnx_b, out, shapes = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), json.loads(sys.argv[4])
model_dir = root / "runtime-only"
shutil.copytree(root / "a", model_dir)
facts = json.loads((root / "facts-a.json").read_text())
facts = refit_artifact(RefitInputs(network_dir=model_dir / "policy", artifact="tvm-llvm.so", facts=TvmFacts.of(facts),
                                   onnx_path=onnx_b, padded_onnx_path=None, state={}))
runner = TvmRunner(model_dir / "policy" / "tvm-llvm.so", ["input0"], facts)
rng = np.random.default_rng(3)
feeds = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]
np.savez(out, *[runner.infer({"input0": x})[0] for x in feeds], *feeds)
import tvm.base
print(json.dumps({"applied": applied, "libraries": sorted(tvm.base._LOADED_LIBS), "torch": "torch" in sys.modules}))
"""


def test_a_process_that_only_runs_artifacts_refits_tvm_without_the_compiler(builds: dict[str, Any]) -> None:
    """`rlopt refit` / `verify` / `warmup` load libtvm_runtime alone (TVM_USE_RUNTIME_LIB=1, ~0.5 s less per
    process): the TVM hook and runner need nothing of the compiler, and compute what a build with B computes."""
    import json
    import os
    import subprocess
    import sys

    (builds["root"] / "facts-a.json").write_text(json.dumps(builds["a"]))
    out = builds["root"] / "runtime-only.npz"
    shapes = [list(STATIC), [2, 3, 768]]
    env = {k: v for k, v in os.environ.items() if k != "TVM_USE_RUNTIME_LIB"}
    done = subprocess.run([sys.executable, "-c", RUNTIME_ONLY_SCRIPT, str(builds["root"]), str(builds["onnx_b"]),
                           str(out), json.dumps(shapes)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"applied": ["TVM_USE_RUNTIME_LIB=1"], "libraries": ["tvm_runtime"], "torch": False}
    rebuilt = _runner(builds["root"] / "b", builds["b"])
    with np.load(out) as arrays:
        for index in range(len(shapes)):
            x = arrays[f"arr_{index + len(shapes)}"]
            np.testing.assert_array_equal(arrays[f"arr_{index}"], rebuilt.infer({"input0": x})[0])
