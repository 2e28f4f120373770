"""The Triton model of a TensorRT engine: one GPU instance that may use every optimization profile it was built with."""

from __future__ import annotations

from typing import Any

from rlopt.pbtxt import Enum


def every_profile_on_the_gpu(config: dict[str, Any], profiles: Any) -> dict[str, Any]:
    """The generic ModelConfig with an instance group on the GPU offering each profile (the engine's, in order)."""
    group = [{"kind": Enum("KIND_GPU"), "count": 1, "profile": [str(i) for i in range(len(profiles.profiles))]}]
    head = {key: value for key, value in config.items() if key != "model_warmup"}
    return {**head, "instance_group": group, "model_warmup": config["model_warmup"]}


__all__ = ["every_profile_on_the_gpu"]
