"""Golden check for a refactor: two MODEL_DIRs of the same recipe, compiled before and after, must agree.

Usage: python scripts/golden_check.py OLD_DIR NEW_DIR [--json]

Compared, per network:
- exact: the artifact list (backend -> built or skipped, and why), every file listed in the manifest,
  the parity statistics of every backend (max_abs, max_rel, kl, argmax_agree, compared, shapes, passed),
  `reference.npz` (bitwise), and TorchScript and ONNX Runtime outputs of both directories on the old
  reference inputs (bitwise);
- timing-dependent, reported apart: `selected`, `auto`'s routes (`facts.route.routes`; schema 1: `facts.auto_routes`)
  (both come from latencies measured at compile time, so two compiles of the same code can differ).
Exit 0 when every exact item agrees, 1 otherwise.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

PARITY_FIELDS = ("passed", "max_abs", "max_rel", "kl", "argmax_agree", "compared", "shapes")
RUN_BACKENDS = ("torchscript", "onnxruntime")


def _manifest(model_dir: Path) -> dict[str, Any]:
    return json.loads((model_dir / "manifest.json").read_text())


def _artifacts(network: dict[str, Any]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for backend, record in network["artifacts"].items():
        if record.get("skipped"):
            summary[backend] = {"skipped": record["skipped"]}
            continue
        parity = record.get("parity") or {}
        summary[backend] = {"path": record.get("path"), "parity": {k: parity.get(k) for k in PARITY_FIELDS}}
    return summary


def _routes(network: dict[str, Any]) -> dict[str, str] | None:
    """`auto`'s routes as the manifest records them (schema 2: facts.route.routes, schema 1: facts.auto_routes)."""
    facts = network.get("facts", {})
    return (facts.get("route") or {}).get("routes") or facts.get("auto_routes")


def _reference(model_dir: Path, network: str) -> dict[str, np.ndarray]:
    with np.load(model_dir / network / "reference.npz") as data:
        return {key: data[key] for key in data.files}


def _outputs(model_dir: Path, network: str, backend: str, record: dict[str, Any],
             reference: dict[str, np.ndarray], inputs: list[str]) -> list[np.ndarray]:
    """Every recorded sample run through one artifact, outputs concatenated in a fixed order."""
    path = model_dir / record["path"]
    points = list(dict.fromkeys(key.split(":")[0] for key in reference))
    results: list[np.ndarray] = []
    if backend == "torchscript":
        import torch

        module = torch.jit.load(str(path)).eval()
        with torch.inference_mode():
            for point in points:
                for i in range(reference[f"{point}:in:{inputs[0]}"].shape[0]):
                    out = module(*[torch.from_numpy(reference[f"{point}:in:{n}"][i].copy()) for n in inputs])
                    results += [t.numpy() for t in (out if isinstance(out, (tuple, list)) else [out])]
    else:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
        for point in points:
            for i in range(reference[f"{point}:in:{inputs[0]}"].shape[0]):
                results += session.run(None, {n: reference[f"{point}:in:{n}"][i] for n in inputs})
    return results


def compare(old_dir: Path, new_dir: Path) -> dict[str, Any]:
    old, new = _manifest(old_dir), _manifest(new_dir)
    exact: list[str] = []
    timing: list[str] = []
    if sorted(old["networks"]) != sorted(new["networks"]):
        exact.append(f"networks differ: {sorted(old['networks'])} vs {sorted(new['networks'])}")
    for name in sorted(set(old["networks"]) & set(new["networks"])):
        before, after = old["networks"][name], new["networks"][name]
        if _artifacts(before) != _artifacts(after):
            exact.append(f"{name}: artifacts/parity differ: {_artifacts(before)} vs {_artifacts(after)}")
        if sorted(before.get("files", {})) != sorted(after.get("files", {})):
            exact.append(f"{name}: files differ: {sorted(before.get('files', {}))} vs {sorted(after.get('files', {}))}")
        reference = _reference(old_dir, name)
        fresh = _reference(new_dir, name)
        if sorted(reference) != sorted(fresh) or any(not np.array_equal(reference[k], fresh[k]) for k in reference):
            exact.append(f"{name}: reference.npz differs")
        inputs = list(before["inputs"])
        for backend in RUN_BACKENDS:
            a, b = before["artifacts"].get(backend, {}), after["artifacts"].get(backend, {})
            if not a.get("path") or not b.get("path"):
                continue
            got_old = _outputs(old_dir, name, backend, a, reference, inputs)
            got_new = _outputs(new_dir, name, backend, b, reference, inputs)
            if len(got_old) != len(got_new) or any(x.tobytes() != y.tobytes() for x, y in zip(got_old, got_new)):
                exact.append(f"{name}/{backend}: outputs on reference.npz are not bitwise equal")
        if before.get("selected") != after.get("selected"):
            timing.append(f"{name}: selected {before.get('selected')} -> {after.get('selected')}")
        routes_old, routes_new = _routes(before), _routes(after)
        if routes_old != routes_new:
            timing.append(f"{name}: auto_routes {routes_old} -> {routes_new}")
    return {"old": str(old_dir), "new": str(new_dir), "exact_differences": exact,
            "timing_dependent_differences": timing, "passed": not exact}


def main(argv: list[str]) -> int:
    args = [a for a in argv if a != "--json"]
    if len(args) != 2:
        print(__doc__.splitlines()[2], file=sys.stderr)
        return 2
    result = compare(Path(args[0]), Path(args[1]))
    if "--json" in argv:
        print(json.dumps(result, indent=2))
    else:
        for line in result["exact_differences"]:
            print(f"DIFF {line}")
        for line in result["timing_dependent_differences"]:
            print(f"timing-dependent {line}")
        print(f"golden check: {'passed' if result['passed'] else 'FAILED'} ({result['old']} vs {result['new']})")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
