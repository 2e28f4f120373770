"""The one error policy (rlopt/errors.py): whose fault it is decides the exit code, and every site that catches a
library's `Exception` says where it sends it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rlopt.errors import ArtifactError, StageError
from rlopt.onnx_session import make_session
from tests.conftest import assert_one_line_error, run_rlopt, write_tiny_recipe

PACKAGE = Path(__file__).resolve().parents[1] / "rlopt"
BROAD = {"Exception", "BaseException"}


def _catches_everything(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any((isinstance(k, ast.Name) and k.id in BROAD) or (isinstance(k, ast.Attribute) and k.attr in BROAD)
               for k in kinds)


def _reraises_as_is(handler: ast.ExceptHandler) -> bool:
    """Cleanup, then the same exception raised on: nothing is decided here."""
    return bool(handler.body) and isinstance(handler.body[-1], ast.Raise) and handler.body[-1].exc is None


def _says_why(line: str) -> bool:
    comment = line.partition("#")[2]
    reason = comment.replace("noqa: BLE001", "").strip(" -:")
    return len(reason) >= 10


def broad_handlers_without_a_reason(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ExceptHandler) and _catches_everything(node) and not _reraises_as_is(node) \
                    and not _says_why(lines[node.lineno - 1]):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return found


def test_every_broad_except_reraises_or_says_why() -> None:
    assert broad_handlers_without_a_reason(PACKAGE) == []


def test_the_audit_finds_a_silent_broad_except(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(
        "try:\n    pass\nexcept Exception:  # noqa: BLE001\n    pass\n"
        "try:\n    pass\nexcept (ValueError, BaseException):\n    x = 1\n"
        "try:\n    pass\nexcept BaseException:\n    x = 2\n    raise\n"
        "try:\n    pass\nexcept Exception as exc:  # the parser raises many types: a user error\n    pass\n")
    assert [line.split(": ", 1)[0] for line in broad_handlers_without_a_reason(tmp_path / "pkg")] == \
        ["pkg/m.py:3", "pkg/m.py:7"]


def test_onnx_runtime_that_cannot_load_a_graph_raises_whose_fault_the_caller_says(tmp_path: Path) -> None:
    garbage = tmp_path / "model.onnx"
    garbage.write_bytes(b"not an onnx model")
    with pytest.raises(ArtifactError, match="ONNX Runtime cannot load it.*fix: recompile MODEL_DIR"):
        make_session(garbage)
    with pytest.raises(StageError, match="fix: leave onnxruntime out"):
        make_session(garbage, cannot_load=(StageError, "leave onnxruntime out of this recipe's backends"))


def test_a_target_tvm_rejects_is_the_recipes_error(tmp_path: Path) -> None:
    recipe = write_tiny_recipe(tmp_path, backends="[tvm]", extra="tvm: {target: {kind: llvm, colour: blue}}\n")
    proc = run_rlopt("compile", str(recipe), "-o", str(tmp_path / "out"), "--no-cache")
    assert_one_line_error(proc, 2, "tvm.target", "TVM rejects", "colour", "fix:")
    assert not (tmp_path / "out").exists(), "nothing half-written"
