"""Stage work: the exported ONNX graph converted to an OpenVINO IR (`model.xml` + `model.bin`), proven to compile.

OpenVINO's ONNX frontend reads the graph (`Core.read_model`) and every dim the recipe leaves dynamic is reshaped to a
bounded dimension (min..max), so the CPU plugin sees the profile's range; the IR is saved uncompressed (fp32
weights: the precision is a runtime hint, `INFERENCE_PRECISION_HINT`, applied where the CPU has it). The refit hook
calls `convert_ir` again on the refitted graph with the bounds recorded here, so its speed is refit's: `ovc`'s
`convert_model` adds its own graph passes, which took 150-250 ms of each conversion and changed neither an output
bit nor the compiled model's speed (the CPU plugin runs its own passes when it compiles; docs/refit.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlopt.backends.openvino.facts import CAPABILITIES, HINTS, OpenVinoFacts
from rlopt.backends.openvino.library import compile_config, import_openvino, shared_core
from rlopt.errors import BackendUnavailable, StageError, first_line, located
from rlopt.lazy import version_of
from rlopt.stages.base import StageOutput

IR_NAME = "model.xml"  # Triton's OpenVINO backend looks for 1/model.xml with 1/model.bin beside it
NO_RULE = "No conversion rule found for operations:"


def input_bounds(spec: Any) -> dict[str, list[list[int]]]:
    """Input -> [lo, hi] per dim, from the network's profile (lo == hi: a static dim)."""
    return {name: [[lo, hi] for lo, hi in zip(s.dims("min"), s.dims("max"))] for name, s in spec.inputs.items()}


def cache_key(spec: Any) -> dict[str, Any]:
    """What the build depends on beyond its ONNX file: the bounds, the precision, the OpenVINO version, and the CPU
    for a reduced precision (built only where the CPU has it)."""
    from rlopt.machine import cpu_identity

    return {"precision": spec.precision, "input_bounds": input_bounds(spec), "openvino": version_of("openvino"),
            "cpu": cpu_identity() if spec.precision in CAPABILITIES else None}


def convert_ir(onnx_path: Path, xml_path: Path, bounds: dict[str, list[list[int]]]) -> None:
    """Write `xml_path` and its `.bin` from `onnx_path`, every input shaped by `bounds`.

    Raises BackendUnavailable naming the ops OpenVINO's ONNX frontend cannot convert (the other backends go on),
    and StageError for any other conversion failure."""
    ov = import_openvino()
    shapes = [(name, ov.PartialShape([ov.Dimension(lo, hi) if lo != hi else ov.Dimension(lo) for lo, hi in dims]))
              for name, dims in bounds.items()]
    try:
        model = shared_core().read_model(str(onnx_path))
        model.reshape(dict(shapes))
    except Exception as exc:  # OpConversionFailure, RuntimeError: the frontends raise many types
        text = str(exc)
        if NO_RULE in text:
            ops = text.split(NO_RULE, 1)[1].strip().splitlines()[0]
            raise BackendUnavailable(f"openvino {ov.__version__}: its ONNX frontend cannot convert {ops}") from None
        raise StageError(located(onnx_path, "", f"OpenVINO {ov.__version__} cannot convert it ({first_line(exc)})",
                                 "leave openvino out of this recipe's backends")) from None
    ov.save_model(model, str(xml_path), compress_to_fp16=False)


def choose_precision(requested: str, capabilities: list[str]) -> tuple[str, str, str | None]:
    """(precision built, OpenVINO's inference precision hint, notice or None) for a network's `precision` on a CPU
    whose OPTIMIZATION_CAPABILITIES are `capabilities`. A precision the CPU lacks, and int8 (it needs NNCF's
    quantization, which rlopt does not run), build fp32 with a notice saying so."""
    if requested == "fp32":
        return "fp32", HINTS["fp32"], None
    if requested in CAPABILITIES:
        if CAPABILITIES[requested] in capabilities:
            return requested, HINTS[requested], None
        return "fp32", HINTS["fp32"], (f"precision {requested} not applied: this CPU lacks {CAPABILITIES[requested]} "
                                        f"(OpenVINO's capabilities {capabilities}); fp32 used")
    return "fp32", HINTS["fp32"], (f"precision {requested} not applied: OpenVINO int8 needs NNCF post-training "
                                    "quantization, which rlopt does not run; fp32 used")


def build_openvino(onnx_path: Path, folder: Path, spec: Any, *, recipe_path: Path, network: str) -> StageOutput:
    """`folder/model.xml` from `onnx_path`, compiled once for the CPU here with the runner's settings."""
    from rlopt.files import file_record

    ov = import_openvino()
    xml_path = folder / IR_NAME
    bounds = input_bounds(spec)
    convert_ir(onnx_path, xml_path, bounds)
    core = shared_core()
    built, hint, notice = choose_precision(spec.precision, list(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")))
    facts = OpenVinoFacts(onnx=onnx_path.name, input_bounds=bounds, device="CPU", performance_hint="LATENCY",
                          inference_precision=hint, openvino=version_of("openvino"), precision_built=built,
                          **({"notice": notice} if notice else {}))
    try:
        compiled = core.compile_model(core.read_model(str(xml_path)), facts.device, compile_config(facts))
        threads = int(compiled.get_property("INFERENCE_NUM_THREADS"))
    except RuntimeError as exc:
        raise StageError(located(recipe_path, f"networks.{network}", f"OpenVINO {ov.__version__} cannot compile "
                                 f"the converted IR for the CPU ({first_line(exc)})",
                                 "leave openvino out of this recipe's backends")) from None
    weights = file_record(folder.parent, xml_path.with_suffix(".bin"))
    return StageOutput(xml_path, facts.updated(threads_at_build=threads, weights=weights))


__all__ = ["IR_NAME", "build_openvino", "cache_key", "choose_precision", "convert_ir", "input_bounds"]
