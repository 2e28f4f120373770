"""The Triton model of an OpenVINO IR: what Triton's OpenVINO backend needs beyond the generic config.

The OpenVINO backend is named by `backend` (it has no `platform`) and finds `1/model.xml` with `1/model.bin`
beside it. With max_batch_size > 0 it fixes the model's batch at max_batch_size (ov::set_batch) and refuses, or
pads up to it, every other batch; so the config turns Triton's batching off and keeps the batch dim in the dims
(-1, as the IR's own bounded dim): each request runs at its own shape, as rlopt's runner runs it. One stream at the
LATENCY hint, as the runner compiles it. Its parameters have no f32 precision hint: on a CPU with bf16 (AMX,
AVX512-BF16) Triton runs OpenVINO's default there, bf16, where rlopt's runner asks for the precision it verified.
"""

from __future__ import annotations

from typing import Any

from rlopt.pbtxt import Enum

PARAMETERS = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1"}


def triton_config(config: dict[str, Any], profiles: Any) -> dict[str, Any]:
    """The generic ModelConfig (rlopt.compile.triton.model_config) made one for Triton's OpenVINO backend."""
    out = dict(config)
    if out["max_batch_size"] > 0:  # batching only where dim 0 is every tensor's dynamic batch: it is -1 again
        out["input"] = [{**tensor, "dims": [-1, *tensor["dims"]]} for tensor in out["input"]]
        out["output"] = [{**tensor, "dims": [-1, *tensor["dims"]]} for tensor in out["output"]]
        out["model_warmup"] = [
            {**warmup, "batch_size": 1,
             "inputs": [{**item, "value": {**item["value"], "dims": [warmup["batch_size"], *item["value"]["dims"]]}}
                        for item in warmup["inputs"]]}
            for warmup in out["model_warmup"]]
        out["max_batch_size"] = 0
        out.pop("dynamic_batching", None)
    out["instance_group"] = [{"kind": Enum("KIND_CPU"), "count": 1}]
    out["parameters"] = [{"key": key, "value": {"string_value": value}} for key, value in PARAMETERS.items()]
    return out


__all__ = ["PARAMETERS", "triton_config"]
