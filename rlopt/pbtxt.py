"""Protobuf text format for a nested dict (Triton's config.pbtxt): dicts are messages, lists of dicts repeated
messages, `Enum` values are written without quotes. Below the backends, whose Triton rules build such dicts."""

from __future__ import annotations

from typing import Any


class Enum(str):
    """A protobuf enum value: written without quotes."""


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return str(value)
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def to_pbtxt(message: dict[str, Any], indent: int = 0) -> str:
    """Protobuf text format for a nested dict: dicts are messages, lists of dicts repeated messages."""
    pad = "  " * indent
    lines = []
    for key, value in message.items():
        if isinstance(value, dict):
            lines.append(f"{pad}{key} {{\n{to_pbtxt(value, indent + 1)}{pad}}}")
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            body = ",\n".join(f"{pad}  {{\n{to_pbtxt(v, indent + 2)}{pad}  }}" for v in value)
            lines.append(f"{pad}{key} [\n{body}\n{pad}]")
        elif isinstance(value, list):
            lines.append(f"{pad}{key}: [ {', '.join(_scalar(v) for v in value)} ]")
        else:
            lines.append(f"{pad}{key}: {_scalar(value)}")
    return "".join(line + "\n" for line in lines)


__all__ = ["Enum", "to_pbtxt"]
