"""TVM refit: new weights into an artifact built with the weights as parameters; no LLVM build, no tuning.

The libraries take the weights as arguments (rlopt.backends.tvm.params), so a refit writes a new params file:
each library's initializers are rebuilt from the new ONNX graph exactly as the build derived them (the same
`prepare_onnx` rewrites: transposed Gemm weights, inlined static If branches), checked name by name against
the old file, and written over it. The pre-packing runs when the refitted artifact is opened.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from rlopt.backends.base import RefitInputs
from rlopt.backends.tvm.facts import TvmFacts
from rlopt.errors import ArtifactError, located
from rlopt.lazy import require

REBUILD = "rebuild it with 'rlopt compile RECIPE -o MODEL_DIR' (this rlopt builds TVM libraries that refit)"


def new_weights(onnx_model: Any, facts: TvmFacts) -> dict[str, np.ndarray]:
    """The initializers every library takes, from `onnx_model`, as the build derived them for each library.

    A name keeps the value of the first library that derives it (the dynamic one first), so a library whose
    names are all known already is not prepared: the same weights, without folding its shape's static Ifs (an
    ONNX reference evaluation per library)."""
    from rlopt.backends.tvm.importer import prepare_onnx, split_weights

    libraries = [(None, facts.param_names)] + [(build.shapes, build.param_names) for build in facts.shape_builds]
    if not any(node.op_type == "If" for node in onnx_model.graph.node):  # only a static If makes shapes matter
        libraries = [(None, [name for _, names in libraries for name in names])]
    weights: dict[str, np.ndarray] = {}
    for shapes, names in libraries:
        if all(name in weights for name in names):
            continue
        derived = split_weights(prepare_onnx(onnx_model, shapes)[0])
        for name in names:
            if name in derived:
                weights.setdefault(name, derived[name])
    return weights


def refit_artifact(inputs: RefitInputs) -> TvmFacts:
    """Write the new params file in `inputs.network_dir` and return the facts to record (its new sha256)."""
    from rlopt.backends.tvm.params import read_params, write_params
    from rlopt.files import file_record

    facts = TvmFacts.of(inputs.facts)
    artifact = inputs.network_dir / inputs.artifact
    if facts.params is None:
        raise ArtifactError(located(artifact, "facts.params", "TVM libraries have the weights baked in "
                                    "(built by an older rlopt, or for a CUDA target) and cannot be refitted", REBUILD))
    source = inputs.padded_onnx_path or inputs.onnx_path
    if facts.params.padded != (inputs.padded_onnx_path is not None):
        given = "a padded" if inputs.padded_onnx_path is not None else "an unpadded"
        raise ArtifactError(located(source, "", f"TVM was built from {facts.params.onnx}, refit was given {given} "
                                    "graph", REBUILD))
    params_path = inputs.network_dir / PurePosixPath(facts.params.file.path).name
    old = read_params(params_path)
    new = new_weights(require("onnx").load(str(source)), facts)
    _check_same_layout(old, new, source)
    write_params(params_path, {name: new[name] for name in facts.params.names})
    record = file_record(_model_dir(inputs.network_dir, facts.params.file.path), params_path)
    updated = facts.params.model_copy(update={"file": facts.params.file.model_copy(update=record.model_dump())})
    return facts.updated(params=updated)


def _check_same_layout(old: dict[str, np.ndarray], new: dict[str, np.ndarray], source: Path) -> None:
    """The new graph must give every old weight, same shape and dtype: else these libraries cannot take them."""
    for name, array in old.items():
        fresh = new.get(name)
        if fresh is None:
            raise ArtifactError(located(source, name, "the TVM libraries take this initializer; the new graph "
                                        "has none of that name", REBUILD))
        if fresh.shape != array.shape or fresh.dtype != array.dtype:
            raise ArtifactError(located(source, name, f"is {fresh.dtype}{list(fresh.shape)}, the TVM libraries "
                                        f"take {array.dtype}{list(array.shape)}", REBUILD))


def _model_dir(network_dir: Path, recorded: str) -> Path:
    """MODEL_DIR, from the network folder and a path recorded relative to it ('policy/tvm-llvm.params.npz')."""
    return network_dir.parents[len(PurePosixPath(recorded).parts) - 2]


__all__ = ["new_weights", "refit_artifact"]
