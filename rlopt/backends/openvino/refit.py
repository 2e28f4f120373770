"""OpenVINO's refit hook: the IR converted again from the refitted ONNX graph, with the bounds the build recorded.

The refit driver has already rewritten model.onnx (and re-padded model.padded.onnx) through the weight map; the
conversion is the build's own (`convert_ir`), so the new model.xml and model.bin are what a compile of the new
weights would write, and the refit's gate then checks them like every artifact.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from rlopt.backends.base import RefitInputs
from rlopt.backends.openvino.facts import OpenVinoFacts
from rlopt.errors import ArtifactError, located

REBUILD = "recompile the MODEL_DIR with 'rlopt compile RECIPE -o MODEL_DIR'"


def refit_artifact(inputs: RefitInputs) -> OpenVinoFacts:
    """Write the new model.xml and model.bin in `inputs.network_dir`; returns the facts with the new weights file."""
    from rlopt.backends.openvino.convert import convert_ir
    from rlopt.files import file_record

    facts = OpenVinoFacts.of(inputs.facts)
    xml_path = inputs.network_dir / inputs.artifact
    if facts.weights is None or not facts.input_bounds:
        raise ArtifactError(located(xml_path, "facts", "the OpenVINO facts name no weights file or input bounds",
                                    REBUILD))
    padded = facts.onnx == "model.padded.onnx"
    if padded and inputs.padded_onnx_path is None:
        raise ArtifactError(located(xml_path, "facts.onnx", "the IR was converted from the padded graph, refit was "
                                    "given none", REBUILD))
    source = inputs.padded_onnx_path if padded and inputs.padded_onnx_path is not None else inputs.onnx_path
    convert_ir(source, xml_path, facts.input_bounds)
    weights = xml_path.with_suffix(".bin")
    record = file_record(_model_dir(inputs.network_dir, facts.weights.path), weights)
    updated = facts.weights.model_copy(update=record.model_dump())
    return facts.updated(weights=updated)


def _model_dir(network_dir: Path, recorded: str) -> Path:
    """MODEL_DIR, from the network folder and a path recorded relative to it ('policy/model.bin')."""
    return network_dir.parents[len(PurePosixPath(recorded).parts) - 2]


__all__ = ["refit_artifact"]
