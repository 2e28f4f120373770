"""What makes a refit cheaper without changing what it writes: the staging copy, hashing each file once, and
TVM's weight derivation skipping libraries whose weights are already known."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from rlopt.manifest import read_manifest, sha256_file


def test_the_staging_copy_leaves_out_only_what_refit_writes_anew(base_dir: Path, tmp_path: Path) -> None:
    from rlopt.refit.driver import rewritten_anew, stage_copy

    manifest = read_manifest(base_dir)
    skipped = rewritten_anew(manifest)
    assert {"policy/reference.npz", "value/reference.npz"} <= skipped
    triton = {p for p in skipped if p.startswith("triton/")}
    assert triton and all(p.endswith(("model.onnx", "model.pt")) for p in triton)
    stage_copy(base_dir, tmp_path / "staging", manifest)
    source = {p.relative_to(base_dir).as_posix() for p in base_dir.rglob("*") if p.is_file()}
    copied = {p.relative_to(tmp_path / "staging").as_posix() for p in (tmp_path / "staging").rglob("*") if p.is_file()}
    assert copied == source - skipped
    assert all(sha256_file(tmp_path / "staging" / p) == sha256_file(base_dir / p) for p in copied)


def test_a_file_is_hashed_again_once_it_changed(tmp_path: Path) -> None:
    from rlopt.refit.network import Hashes

    path = tmp_path / "net" / "model.onnx"
    path.parent.mkdir()
    path.write_bytes(b"first")
    hashes = Hashes(tmp_path)
    first = hashes.record(path)
    assert first.path == "net/model.onnx" and first.sha256 == sha256_file(path)
    assert hashes.record(path) is first
    path.write_bytes(b"second, longer")
    again = hashes.record(path)
    assert again.sha256 == sha256_file(path) != first.sha256 and again.bytes == len(b"second, longer")


def test_tvm_refit_prepares_only_libraries_with_weights_not_yet_derived(monkeypatch: pytest.MonkeyPatch) -> None:
    import rlopt.backends.tvm.importer as importer
    from rlopt.backends.tvm.refit import new_weights

    derived = {None: {"w": 1.0, "b": 2.0}, "single": {"w": 9.0, "w_single": 3.0}, "batch": {"w": 9.0, "b": 9.0}}
    prepared: list[str | None] = []

    def prepare(model: object, shapes: dict | None) -> tuple[object, dict]:
        key = None if shapes is None else shapes["which"]
        prepared.append(key)
        return key, {}

    monkeypatch.setattr(importer, "prepare_onnx", prepare)
    monkeypatch.setattr(importer, "split_weights", lambda key: {k: np.float32(v) for k, v in derived[key].items()})
    facts = SimpleNamespace(param_names=["w", "b"], shape_builds=[
        SimpleNamespace(shapes={"which": "single"}, param_names=["w_single", "w"]),
        SimpleNamespace(shapes={"which": "batch"}, param_names=["w", "b"])])
    model = SimpleNamespace(graph=SimpleNamespace(node=[SimpleNamespace(op_type="If")]))
    weights = new_weights(model, facts)  # type: ignore[arg-type]
    assert prepared == [None, "single"]  # the batch library takes only weights the dynamic one gave
    assert {k: float(v) for k, v in weights.items()} == {"w": 1.0, "b": 2.0, "w_single": 3.0}
