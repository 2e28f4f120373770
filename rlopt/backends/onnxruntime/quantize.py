"""Stage: int8 on CPU = ONNX Runtime dynamic quantization (int8 weights, activations quantized per call).

Kept only if it passes the parity gate of the network's kind at the recipe's reduced-precision
tolerances (verify.reduced_precision); either way the accuracy cost (max |diff|, KL for a policy)
is reported beside the speed gain measured at the opt shape. When it fails, the fp32 model stays
the onnxruntime artifact and the manifest says why.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rlopt.errors import StageError, first_line, located
from rlopt.lazy import require
from rlopt.parity import ParityAccumulator, Tolerance
from rlopt.reference import Reference
from rlopt.stages.base import StageOutput
from rlopt.timing import measure


def _session(path: Path) -> Any:
    from rlopt.onnx_session import make_session

    session = make_session(path)
    names = [o.name for o in session.get_outputs()]
    return lambda feeds: list(session.run(names, feeds))


def quantize_int8(onnx_path: Path, out_path: Path, reference: Reference, *, kind: str, distribution: str,
                  gate: Tolerance, recipe_path: Path, network: str) -> StageOutput:
    """Write `out_path` (model.int8.onnx) and keep it when it passes the gate; else the fp32 model, with the reason."""
    quantization = require("onnxruntime.quantization")
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantizer logs a pre-processing hint through the root logger
    try:
        quantization.quantize_dynamic(str(onnx_path), str(out_path), weight_type=quantization.QuantType.QInt8,
                                      extra_options={"EnableSubgraph": True})
    except Exception as exc:  # the quantizer raises many types for graphs it cannot handle
        first = first_line(exc)
        raise StageError(located(recipe_path, f"networks.{network}.precision", f"int8 dynamic quantization failed "
                                 f"({first})", "use precision fp32 for this network")) from None
    finally:
        root.setLevel(level)
    fp32, int8 = _session(onnx_path), _session(out_path)
    gated = ParityAccumulator(kind, distribution, reference.output_names, gate)  # the gate, without rlopt.verify
    for _point, point_feeds, expected in reference.pairs():
        gated.add(expected, int8(point_feeds))
    parity = gated.result()
    opt = "opt" if "opt" in reference.points else reference.points[0]
    feeds = reference.feeds(opt, 0)
    fp32_us = measure(lambda: fp32(feeds), budget_s=0.3).p50_us
    int8_us = measure(lambda: int8(feeds), budget_s=0.3).p50_us
    report = {"kept": parity.passed, "gate": {"atol": gate.atol, "rtol": gate.rtol, "max_kl": gate.max_kl},
              "max_abs": parity.max_abs, "max_rel": parity.max_rel, "kl": parity.kl,
              "argmax_agree": parity.argmax_agree, "compared": parity.compared,
              "p50_us_at_opt": {"fp32": round(fp32_us, 2), "int8": round(int8_us, 2)},
              "speedup_at_opt": round(fp32_us / int8_us, 3) if int8_us > 0 else None,
              "method": "onnxruntime.quantization.quantize_dynamic, QInt8 weights"}
    if parity.passed:
        return StageOutput(out_path, {"int8": report, "precision_built": "int8"})
    out_path.unlink(missing_ok=True)
    failed = next((o for o in parity.outputs if not o.passed), parity.outputs[0])
    why = failed.reason or f"max_abs {failed.max_abs:.3g} on '{failed.name}'"
    notice = (f"int8 not kept: dynamic quantization failed the {kind} parity gate ({why}); fp32 model used")
    return StageOutput(onnx_path, {"int8": report, "precision_built": "fp32", "notice": notice})
