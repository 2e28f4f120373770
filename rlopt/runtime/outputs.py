"""What every runner and the reference recorder do with a model's return value."""

from __future__ import annotations

from typing import Any


def flatten_outputs(value: Any) -> list[Any]:
    """Tensors are leaves; tuples, lists and TVM Arrays of them are flattened in order."""
    if isinstance(value, (tuple, list)) or type(value).__name__ == "Array":
        return [leaf for item in value for leaf in flatten_outputs(item)]
    return [value]
