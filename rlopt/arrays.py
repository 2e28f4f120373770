"""Shape labels and output flattening: the conventions every layer shares when it names a shape or reads outputs."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

ShapeKey = tuple[tuple[int, ...], ...]


def shape_label(dims_per_input: Iterable[Sequence[int]]) -> str:
    """`2x8x768` (inputs joined by '-'): how reference points, auto routes and timing tables name a shape."""
    return "-".join("x".join(str(d) for d in dims) for dims in dims_per_input)


def parse_label(label: str) -> ShapeKey:
    """`shape_label`'s inverse: '2x3x32' (inputs joined by '-') -> ((2, 3, 32),)."""
    return tuple(tuple(int(d) for d in part.split("x")) if part else () for part in label.split("-"))


def flatten_outputs(value: Any) -> list[Any]:
    """Tensors are leaves; tuples, lists and TVM Arrays of them are flattened in order."""
    if isinstance(value, (tuple, list)) or type(value).__name__ == "Array":
        return [leaf for item in value for leaf in flatten_outputs(item)]
    return [value]


__all__ = ["ShapeKey", "flatten_outputs", "parse_label", "shape_label"]
