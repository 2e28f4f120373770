"""MODEL_DIR/triton: a Triton Inference Server model repository for every built backend Triton serves.

`triton/<name>_<network>_<backend>/config.pbtxt` + `1/<its file>` (each backend's `Backend.triton`: platform or
Triton backend, file name, and rules for what its Triton backend needs beyond this generic config). Every shape in a
config comes from the network's profile objects (rlopt.stages.profiles), the same ones a TensorRT
engine is built with: `max_batch_size` is profile 0's batch max (only when dim 0 of every input
is one shared dynamic batch dim starting at 1, so Triton never sends a batch outside the
profile), dims are -1 exactly where the profile is dynamic, dynamic batching prefers the
profile's opt and max batch, and one warmup request is generated per profile point. Output dims
come from the outputs PyTorch produced at those same points. The text is protobuf text format
for Triton's ModelConfig (model_config.proto); the tests parse every file with the real message.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlopt.backends import BACKENDS
from rlopt.backends.capability import TritonModel
from rlopt.pbtxt import Enum, to_pbtxt
from rlopt.stages.profiles import Batching, ShapeProfiles

# backend -> how Triton serves it
SERVED: dict[str, TritonModel] = {name: b.triton for name, b in BACKENDS.items() if b.triton is not None}
TRITON_DTYPES: dict[str, str] = {
    "float32": "TYPE_FP32", "float16": "TYPE_FP16", "int64": "TYPE_INT64", "int32": "TYPE_INT32",
    "uint8": "TYPE_UINT8", "bool": "TYPE_BOOL", "float64": "TYPE_FP64", "int8": "TYPE_INT8",
}
POINTS = ("min", "opt", "max")


@dataclass(frozen=True)
class OutputShapes:
    """One output's dtype and its shape at each profile point, as PyTorch produced it."""

    name: str
    dtype: str
    shapes: dict[str, tuple[int, ...]]

    def dims(self) -> list[int]:
        shapes = list(self.shapes.values())
        return [shapes[0][axis] if len({s[axis] for s in shapes}) == 1 else -1 for axis in range(len(shapes[0]))]


def output_shapes(arrays: dict[str, np.ndarray], output_names: list[str]) -> list[OutputShapes]:
    """From reference.npz arrays (`<point>:out:<name>`, stacked over samples)."""
    found = []
    for name in output_names:
        shapes = {p: tuple(arrays[f"{p}:out:{name}"].shape[1:]) for p in POINTS if f"{p}:out:{name}" in arrays}
        dtype = next(arrays[f"{p}:out:{name}"].dtype.name for p in POINTS if f"{p}:out:{name}" in arrays)
        found.append(OutputShapes(name, dtype, shapes))
    return found


def batching_for(plan: ShapeProfiles, outputs: list[OutputShapes]) -> Batching:
    """The plan's batching, kept only if every output's dim 0 is the batch at every profile point."""
    batching = plan.batching()
    if not batching.enabled:
        return batching
    envelope = plan.envelope
    first = envelope.names[0]
    for out in outputs:
        for point, shape in out.shapes.items():
            if not shape or shape[0] != envelope[first].point(point)[0]:
                return Batching(0, ())
    return batching


def model_config(model_name: str, backend: str, plan: ShapeProfiles, outputs: list[OutputShapes],
                 input_dtypes: dict[str, str]) -> dict[str, Any]:
    """The ModelConfig as a nested dict (field -> value), derived only from the profiles and the output shapes,
    then given to the backend's Triton rules (`TritonModel.rules`)."""
    served = SERVED[backend]
    batching = batching_for(plan, outputs)
    envelope = plan.envelope
    skip = 1 if batching.enabled else 0
    in_names, out_names = list(envelope.names), [o.name for o in outputs]
    kind = {"backend": served.backend} if served.backend else {"platform": served.platform}
    config: dict[str, Any] = {
        "name": model_name,
        **kind,
        "max_batch_size": batching.max_batch_size,
        "default_model_filename": served.filename,
        "input": [{"name": triton_name, "data_type": Enum(TRITON_DTYPES[input_dtypes[name]]),
                   "dims": [-1 if envelope[name].dynamic(a) else envelope[name].min[a]
                            for a in range(skip, len(envelope[name].min))]}
                  for triton_name, name in zip(in_names, envelope.names)],
        "output": [{"name": triton_name, "data_type": Enum(TRITON_DTYPES[out.dtype]), "dims": out.dims()[skip:]}
                   for triton_name, out in zip(out_names, outputs)],
    }
    if batching.enabled:
        config["dynamic_batching"] = {"preferred_batch_size": list(batching.preferred),
                                      "max_queue_delay_microseconds": 100}
    warmups = []
    for point in POINTS:
        shapes = {name: envelope[name].point(point) for name in envelope.names}
        if _same_as_earlier(shapes, envelope, point):
            continue
        warmups.append({
            "name": f"profile_{point}",
            "batch_size": shapes[envelope.names[0]][0] if batching.enabled else 1,
            "inputs": [{"key": triton_name, "value": {"data_type": Enum(TRITON_DTYPES[input_dtypes[name]]),
                                                      "dims": list(shapes[name][skip:]), "random_data": True}}
                       for triton_name, name in zip(in_names, envelope.names)],
        })
    config["model_warmup"] = warmups
    rules = served.rules_function()
    return rules(config, plan) if rules is not None else config


def _same_as_earlier(shapes: dict[str, tuple[int, ...]], envelope: Any, point: str) -> bool:
    earlier = POINTS[:POINTS.index(point)]
    return any(all(envelope[n].point(p) == shapes[n] for n in shapes) for p in earlier)


def model_name(recipe_name: str, network: str, backend: str) -> str:
    return f"{recipe_name}_{network}_{backend}"


def _place(source: Path, target: Path) -> None:
    """Hard link when the file system allows (a plan can be large), else copy."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def write_models(root: Path, recipe_name: str, network: str, artifacts: dict[str, Path], plan: ShapeProfiles,
                 outputs: list[OutputShapes], input_dtypes: dict[str, str],
                 companions: dict[str, list[Path]] | None = None) -> list[Path]:
    """Write one Triton model per servable backend in `artifacts` under `root` (MODEL_DIR/triton); returns the files.

    `companions`: per backend, the files that travel with its artifact (e.g. a weights file), placed beside it under
    their own names."""
    written: list[Path] = []
    for backend, artifact in artifacts.items():
        if backend not in SERVED:
            continue
        served, name = SERVED[backend], model_name(recipe_name, network, backend)
        folder = root / name
        config = model_config(name, backend, plan, outputs, input_dtypes)
        header = f"# Generated by rlopt from the {network} network's optimization profiles; do not edit.\n"
        header += f"# {served.note}\n" if served.note else ""
        (folder / "1").mkdir(parents=True, exist_ok=True)
        (folder / "config.pbtxt").write_text(header + to_pbtxt(config), encoding="utf-8")
        placed = [(artifact, folder / "1" / served.filename)]
        placed += [(companion, folder / "1" / companion.name) for companion in (companions or {}).get(backend, [])]
        for source, target in placed:
            _place(source, target)
        written += [folder / "config.pbtxt", *(target for _, target in placed)]
    return written


__all__ = ["POINTS", "SERVED", "TRITON_DTYPES", "Enum", "OutputShapes", "batching_for", "model_config", "model_name",
           "output_shapes", "to_pbtxt", "write_models"]
