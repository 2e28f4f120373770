"""The Triton model of a TorchScript artifact: Triton's PyTorch backend finds tensors by position, `<name>__<index>`."""

from __future__ import annotations

from typing import Any


def positional_names(config: dict[str, Any], profiles: Any) -> dict[str, Any]:
    """The generic ModelConfig with every input, output and warmup input named `<name>__<index>`."""
    inputs = {t["name"]: f"{t['name']}__{i}" for i, t in enumerate(config["input"])}
    outputs = {t["name"]: f"{t['name']}__{i}" for i, t in enumerate(config["output"])}
    return {**config,
            "input": [{**t, "name": inputs[t["name"]]} for t in config["input"]],
            "output": [{**t, "name": outputs[t["name"]]} for t in config["output"]],
            "model_warmup": [{**w, "inputs": [{**item, "key": inputs[item["key"]]} for item in w["inputs"]]}
                             for w in config["model_warmup"]]}


__all__ = ["positional_names"]
