"""Every name the TensorRT stand-in offers, and every `trt.<name>` rlopt's code uses, exists in the real bindings.

The lists are the Python-visible names of the tensorrt-cu12-bindings wheels of TensorRT 10.13 and 11.4
(tests/data/tensorrt_names_<major>.txt, made by scripts/tensorrt_names.py), so a stand-in method or a call that
TensorRT does not have fails here, on a CPU machine, not on the first GPU.
"""

from __future__ import annotations

import ast
import enum
import inspect
from pathlib import Path

import pytest

from tests.tensorrt_standin import make_tensorrt

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = {10: "10.13.3", 11: "11.4.0"}


def names(major: int) -> set[str]:
    lines = (ROOT / "tests" / "data" / f"tensorrt_names_{major}.txt").read_text().splitlines()
    return {line for line in lines if line and not line.startswith("#")}


def surface(trt: object) -> dict[str, str]:
    """Public name -> where the stand-in offers it: module attributes, class members and their parameters, enum
    members. Names starting with an underscore are the stand-in's own bookkeeping."""
    offered: dict[str, str] = {}
    for name, value in vars(trt).items():
        if name.startswith("_") and name != "__version__":
            continue
        offered[name] = "module"
        if isinstance(value, type) and issubclass(value, enum.Enum):
            offered.update({member: name for member in value.__members__})
        elif isinstance(value, type):
            for member, attribute in vars(value).items():
                if member.startswith("_") and member != "__init__":
                    continue
                offered[member] = name
                function = attribute.fget if isinstance(attribute, property) else attribute
                if callable(function):
                    for parameter in list(inspect.signature(function).parameters)[1:]:
                        offered[parameter] = f"{name}.{member}"
        elif callable(value):
            offered.update({p: name for p in inspect.signature(value).parameters})
    return offered


def trt_attributes_in_rlopt() -> dict[str, str]:
    """Every attribute chain rooted at a name `trt` in rlopt's code (trt.BuilderFlag.TF32 -> BuilderFlag, TF32)."""
    used: dict[str, str] = {}
    for path in sorted((ROOT / "rlopt").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            chain, current = [], node
            while isinstance(current, ast.Attribute):
                chain.append(current.attr)
                current = current.value
            if chain and isinstance(current, ast.Name) and current.id == "trt" and isinstance(node, ast.Attribute):
                for name in chain:
                    used[name] = f"{path.relative_to(ROOT)}:{node.lineno}"
    return used


@pytest.mark.parametrize("major", sorted(VERSIONS))
def test_the_standin_offers_only_names_the_real_bindings_define(major: int) -> None:
    offered = surface(make_tensorrt(VERSIONS[major]))
    assert {"Builder", "IExecutionContext", "OnnxParserRefitter", "TF32", "execute_async_v3"} <= set(offered)
    unknown = {name: where for name, where in offered.items() if name not in names(major)}
    assert unknown == {}


def test_every_trt_attribute_rlopt_uses_exists_in_tensorrt_10_or_11() -> None:
    used = trt_attributes_in_rlopt()
    assert {"BuilderFlag", "TF32", "OnnxParserRefitter", "Runtime", "nptype"} <= set(used)
    assert {name: where for name, where in used.items() if name not in names(10) | names(11)} == {}


def test_the_name_lists_know_what_changed_between_10_and_11() -> None:
    """The lists are the real ones: TensorRT 11 dropped the FP16 builder flag and kept TF32 and REFIT."""
    assert {"FP16", "TF32", "REFIT", "OnnxParserRefitter"} <= names(10)
    assert "FP16" not in names(11) and {"TF32", "REFIT", "OnnxParserRefitter"} <= names(11)
    assert "no_such_tensorrt_name" not in names(10) | names(11)
