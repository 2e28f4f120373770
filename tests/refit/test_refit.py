"""rlopt refit on a tiny MODEL_DIR: exactness, the manifest it writes, every refusal, atomicity on failure."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlopt
from rlopt.errors import UsageError, VerificationError
from rlopt.manifest import read_manifest, sha256_file
from tests.conftest import assert_one_line_error, run_rlopt
from tests.refit.conftest import perturbed_state, reseal, save_state, tiny_model

FEEDS = {"input0": np.linspace(-2, 2, 3 * 4 * 32, dtype=np.float32).reshape(3, 4, 32)}
SINGLE = {"input0": np.linspace(-1, 1, 32, dtype=np.float32).reshape(1, 1, 32)}


def _recipe_folder(model_dir: Path) -> Path:
    return Path(read_manifest(model_dir).networks["policy"].facts.as_dict()["model_source"]["factory"]).parents[1]


def _eager(folder: Path, state: dict, feeds: dict) -> dict[str, np.ndarray]:
    import torch

    model = tiny_model(folder)
    model.load_state_dict(state)
    with torch.no_grad():
        x = torch.from_numpy(feeds["input0"])
        return {"logits": model.policy(x).numpy(), "value": model.value(x).numpy()}


def _listing(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def _no_partials(model_dir: Path) -> None:
    assert [p.name for p in model_dir.parent.iterdir() if ".partial-" in p.name or ".old-" in p.name] == []


def test_refit_matches_eager_pytorch_with_the_new_weights(base_dir: Path, tmp_path: Path) -> None:
    folder = _recipe_folder(base_dir)
    state = perturbed_state(folder)
    out = rlopt.refit(base_dir, save_state(state, tmp_path / "new.pt"), tmp_path / "refitted")
    for feeds in (FEEDS, SINGLE):  # batch > 1 and the single-observation branch of the If
        expected = _eager(folder, state, feeds)
        old = _eager(folder, tiny_model(folder).state_dict(), feeds)
        assert np.abs(expected["logits"] - old["logits"]).max() > 1e-2  # the weights did change
        for backend in ("torchscript", "onnxruntime"):
            for network, output in (("policy", "logits"), ("value", "value")):
                with rlopt.load(out, network, backend=backend) as sess:
                    got = sess.run(feeds)[output]
                np.testing.assert_allclose(got, expected[output], atol=2e-6, rtol=1e-5)
    manifest, old_manifest = read_manifest(out), read_manifest(base_dir)
    assert manifest.refit_of == old_manifest.content_sha256
    policy = manifest.networks["policy"]
    assert policy.drift is not None and policy.drift.kl_mean > 0 and 0 <= (policy.drift.argmax_agree or 0) <= 1
    assert policy.drift.compared == 4 * (1 * 1 + 2 * 3 + 4 * 6)  # 4 samples x rows at min, opt, max
    assert manifest.networks["value"].drift is None
    assert all(a.verified for n in manifest.networks.values() for a in n.artifacts.values())
    triton = [f for f in policy.files if f.endswith("model.onnx") and f.startswith("triton/")]
    assert triton and policy.files[triton[0]].sha256 == policy.files["model.onnx"].sha256
    assert rlopt_verify(out)


def rlopt_verify(model_dir: Path) -> bool:
    from rlopt.verify import verify_model_dir

    return verify_model_dir(model_dir).passed


def test_refitted_artifacts_equal_a_fresh_compile(base_dir: Path, tmp_path: Path) -> None:
    """The rewritten ONNX initializers and scripted weights are those a compile with the new weights writes."""
    import onnx
    import torch

    from rlopt.compile import compile_recipe
    from rlopt.stages.weight_map import tensor_locations

    folder = _recipe_folder(base_dir)
    checkpoint = save_state(perturbed_state(folder, seed=7), folder / "fresh.pt")
    out = rlopt.refit(base_dir, checkpoint, tmp_path / "refitted")
    recipe = folder / "fresh.yaml"
    recipe.write_text((folder / "tiny.yaml").read_text().replace("seed: 3", "seed: 3\n  checkpoint: fresh.pt"))
    fresh = compile_recipe(recipe, tmp_path / "fresh").model_dir
    for network in ("policy", "value"):
        mine = tensor_locations(onnx.load(str(out / network / "model.onnx")))
        theirs = tensor_locations(onnx.load(str(fresh / network / "model.onnx")))
        assert mine.keys() == theirs.keys()
        for location, proto in theirs.items():
            assert mine[location].SerializeToString() == proto.SerializeToString(), location
        ours = torch.jit.load(str(out / network / "model.ts")).state_dict()
        for key, value in torch.jit.load(str(fresh / network / "model.ts")).state_dict().items():
            assert torch.equal(ours[key], value), key
        assert np.array_equal(np.load(out / network / "reference.npz")[f"opt:out:{'logits' if network == 'policy' else 'value'}"],
                              np.load(fresh / network / "reference.npz")[f"opt:out:{'logits' if network == 'policy' else 'value'}"])


def _bad(folder: Path, kind: str) -> dict:
    state = perturbed_state(folder)
    if kind == "missing":
        del state["value.fc2.bias"]
    elif kind == "extra":
        state["policy.fc9.weight"] = state["policy.fc1.weight"]
    elif kind == "shape":
        state["policy.logits.weight"] = state["policy.logits.weight"][:4]
    else:  # another architecture: a wider model
        return tiny_model(folder, width=24).state_dict()
    return state


@pytest.mark.parametrize(("kind", "needle"), [("missing", "key 'value.fc2.bias': missing"),
                                              ("extra", "key 'policy.fc9.weight': unexpected"),
                                              ("shape", "key 'policy.logits.weight': shape [4, 16]"),
                                              ("architecture", "key 'policy.fc1.weight': shape [24, 32]")])
def test_bad_checkpoint_is_refused_naming_the_first_bad_key(model_copy: Path, tmp_path: Path, kind: str,
                                                            needle: str) -> None:
    checkpoint = save_state(_bad(_recipe_folder(model_copy), kind), tmp_path / "bad.pt")
    before = _listing(model_copy)
    with pytest.raises(UsageError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        rlopt.refit(model_copy, checkpoint)
    assert _listing(model_copy) == before
    _no_partials(model_copy)


def test_cli_refusal_is_one_line_exit_2(model_copy: Path, tmp_path: Path) -> None:
    checkpoint = save_state(_bad(_recipe_folder(model_copy), "missing"), tmp_path / "bad.pt")
    proc = run_rlopt("refit", str(model_copy), "--checkpoint", str(checkpoint), "-o", str(tmp_path / "out"))
    assert_one_line_error(proc, 2, "bad.pt: key 'value.fc2.bias'", "fix:")
    assert not (tmp_path / "out").exists()


def test_an_unreadable_checkpoint_is_one_short_line(model_copy: Path, tmp_path: Path) -> None:
    """torch's own message (a paragraph on its weights_only default) is not quoted: one line says what the file is."""
    import torch

    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(bytes(range(256)) * 2)
    whole = tmp_path / "whole.pt"
    torch.save(torch.nn.Linear(2, 2), whole)
    for checkpoint, needle in ((garbage, "not a file torch.save wrote, or a damaged one (UnpicklingError)"),
                               (whole, "it pickles torch.nn.modules.linear.Linear, not a state_dict of tensors")):
        proc = run_rlopt("refit", str(model_copy), "--checkpoint", str(checkpoint))
        line = assert_one_line_error(proc, 2, f"{checkpoint}: --checkpoint: cannot read '{checkpoint.name}': ", needle,
                                     "fix: save it with torch.save(model.state_dict(), path)")
        assert len(line) - len(str(checkpoint)) < 200 and "PyTorch 2.6" not in line, line


def test_a_nan_weight_fails_the_gate_saying_nan_and_naming_the_output(model_copy: Path, tmp_path: Path) -> None:
    state = tiny_model(_recipe_folder(model_copy)).state_dict()
    state["policy.fc1.weight"][0, 0] = float("nan")
    before = _listing(model_copy)
    with pytest.raises(VerificationError) as caught:
        rlopt.refit(model_copy, save_state(state, tmp_path / "nan.pt"))
    message = str(caught.value)
    assert "policy/torchscript: parity failed: PyTorch's output 'logits' holds NaN at" in message, message
    assert _listing(model_copy) == before


def test_model_dir_from_an_older_rlopt_is_refused_naming_the_rebuild(model_copy: Path, tmp_path: Path) -> None:
    reseal(model_copy, lambda doc: doc["networks"]["value"]["facts"]["onnx"].pop("weight_map"))
    checkpoint = save_state(perturbed_state(_recipe_folder(model_copy)), tmp_path / "new.pt")
    with pytest.raises(UsageError) as caught:
        rlopt.refit(model_copy, checkpoint)
    message = str(caught.value)
    assert "networks.value" in message and "older rlopt" in message and "rlopt compile RECIPE -o" in message
    assert "\n" not in message


def test_unexplained_weight_is_refused(model_copy: Path, tmp_path: Path) -> None:
    def fold(doc: dict) -> None:
        doc["networks"]["policy"]["facts"]["onnx"]["weight_map"]["unexplained"] = ["init:42"]

    reseal(model_copy, fold)
    checkpoint = save_state(perturbed_state(_recipe_folder(model_copy)), tmp_path / "new.pt")
    with pytest.raises(UsageError, match="ONNX tensor '42' depends on the weights"):
        rlopt.refit(model_copy, checkpoint)


def test_backend_without_a_hook_is_refused(model_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlopt.backends import BACKENDS

    monkeypatch.setitem(BACKENDS, "onnxruntime", dataclasses.replace(BACKENDS["onnxruntime"], refit=None))
    checkpoint = save_state(perturbed_state(_recipe_folder(model_copy)), tmp_path / "new.pt")
    with pytest.raises(UsageError, match="backend 'onnxruntime' has no refit hook.*rlopt compile"):
        rlopt.refit(model_copy, checkpoint)


def test_max_drift_kl_exits_1_and_replaces_nothing(model_copy: Path, tmp_path: Path) -> None:
    import hashlib

    recipe = model_copy / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace("verify:\n", "verify:\n  max_drift_kl: 1.0e-06\n", 1))
    digest = hashlib.sha256(recipe.read_bytes()).hexdigest()

    def point(doc: dict) -> None:
        doc["recipe"].update(sha256=digest, bytes=recipe.stat().st_size)

    reseal(model_copy, point)
    before = _listing(model_copy)
    checkpoint = save_state(perturbed_state(_recipe_folder(model_copy)), tmp_path / "new.pt")
    proc = run_rlopt("refit", str(model_copy), "--checkpoint", str(checkpoint), "--json")
    assert proc.returncode == 1, proc.stderr
    document = json.loads(proc.stdout)
    assert document["passed"] is False and document["drift"]["policy"]["kl_mean"] > 1.0e-6
    assert document["refit_of"] == read_manifest(model_copy).content_sha256
    assert "policy: policy drift KL(old || new)" in proc.stderr and "max_drift_kl" in proc.stderr
    assert _listing(model_copy) == before
    _no_partials(model_copy)
    small = save_state(tiny_model(_recipe_folder(model_copy)).state_dict(), tmp_path / "same.pt")
    assert rlopt.refit(model_copy, small) == model_copy  # the same weights: no drift, passes
    assert read_manifest(model_copy).networks["policy"].drift.kl_max == pytest.approx(0.0, abs=1e-12)


def _with_hook(monkeypatch: pytest.MonkeyPatch, backend: str, hook: str, model_copy: Path, tmp_path: Path) -> Path:
    """`backend`'s refit hook replaced by `hook` of this module; a checkpoint with new weights."""
    from rlopt.backends import BACKENDS

    monkeypatch.setitem(BACKENDS, backend, dataclasses.replace(BACKENDS[backend], refit=f"tests.refit.test_refit:{hook}"))
    return save_state(perturbed_state(_recipe_folder(model_copy)), tmp_path / "new.pt")


def test_failure_midway_replaces_nothing(model_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = _listing(model_copy)
    checkpoint = _with_hook(monkeypatch, "onnxruntime", "_raising_hook", model_copy, tmp_path)
    with pytest.raises(RuntimeError, match="disk full"):
        rlopt.refit(model_copy, checkpoint)
    assert _listing(model_copy) == before
    _no_partials(model_copy)


def test_a_hook_that_breaks_the_artifact_fails_the_gate(model_copy: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    before = _listing(model_copy)
    checkpoint = _with_hook(monkeypatch, "torchscript", "_stale_hook", model_copy, tmp_path)
    with pytest.raises(VerificationError, match="torchscript: parity failed.*nothing was replaced"):
        rlopt.refit(model_copy, checkpoint)
    assert _listing(model_copy) == before


def _raising_hook(inputs: object) -> dict:
    raise RuntimeError("disk full")


def _stale_hook(inputs: object) -> dict:
    """Leaves the old weights in place: the gate must catch it."""
    return inputs.facts.as_dict()  # type: ignore[attr-defined]


def test_session_reload_onto_a_refitted_dir(base_dir: Path, tmp_path: Path) -> None:
    folder = _recipe_folder(base_dir)
    state = perturbed_state(folder, seed=5)
    sess = rlopt.load(base_dir, "policy", backend="onnxruntime")
    out = rlopt.refit(base_dir, save_state(state, tmp_path / "new.pt"), tmp_path / "refitted")
    sess.reload(out)
    np.testing.assert_allclose(sess.run(FEEDS)["logits"], _eager(folder, state, FEEDS)["logits"], atol=2e-6)
    sess.close()


def test_gates_run_side_by_side_on_one_thread_each_costliest_first(base_dir: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Each side-by-side gate opens its runner on a refit worker with one-thread facts; ONNX Runtime's session gets
    one intra-op thread, and the stored facts keep what compile chose."""
    import threading

    import rlopt.backends as backends

    opened: list[tuple[str, str, Any]] = []
    real = backends.open_runner

    def recording(backend: str, path: Path, names: list[str], facts: Any) -> Any:
        opened.append((backend, threading.current_thread().name, dict(facts).get("intra_op_threads")))
        return real(backend, path, names, facts)

    monkeypatch.setattr(backends, "open_runner", recording)
    checkpoint = save_state(perturbed_state(_recipe_folder(base_dir)), tmp_path / "new.pt")
    out = rlopt.refit(base_dir, checkpoint, tmp_path / "out")
    assert sorted(b for b, _, _ in opened) == sorted(["onnxruntime", "torchscript"] * 2)
    assert all(thread.startswith("rlopt-refit") for _, thread, _ in opened)
    assert [threads for b, _, threads in opened if b == "onnxruntime"] == [1, 1]
    compiled = read_manifest(base_dir).networks["policy"].artifacts["onnxruntime"].facts.as_dict().get("intra_op_threads")
    assert compiled != 1  # else the check above could not tell the gate's setting from compile's
    assert read_manifest(out).networks["policy"].artifacts["onnxruntime"].facts.as_dict().get("intra_op_threads") == compiled


def test_gate_cost_weighs_compile_latency_by_samples() -> None:
    from rlopt.manifest import BackendRecord, Latency
    from rlopt.reference import Reference
    from rlopt.refit.network import gate_cost

    arrays = {"min:in:x": np.zeros((4, 1)), "min:out:y": np.zeros((4, 1)),
              "max:in:x": np.zeros((2, 8)), "max:out:y": np.zeros((2, 8))}
    reference = Reference(arrays, ["x"], ["y"])
    timed = BackendRecord(path="a", latency_us={
        "min": Latency(shape={"x": [1]}, p50=10.0, p99=11.0, iterations=5),
        "max": Latency(shape={"x": [8]}, p50=100.0, p99=120.0, iterations=5)})
    assert gate_cost(timed, reference) == 4 * 10.0 + 2 * 100.0
    assert gate_cost(BackendRecord(path="b"), reference) == 0.0
