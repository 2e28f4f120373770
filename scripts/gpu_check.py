"""The one prepared check for a GPU machine (run it through scripts/gpu_check.sh).

Needs CUDA torch, numpy, onnx, onnxruntime (CPU is enough), pydantic and pyyaml; no TVM, no TensorRT, no network.
In well under 8 minutes it:
1. compiles the default recipe's networks (recipes/policy_value_heads.yaml) as TorchScript on CUDA with CUDA
   graphs (`torchscript: {device: cuda}`), which gates each artifact against the recorded PyTorch reference;
2. checks each artifact against eager PyTorch on the same GPU, in the artifact's precision, at every named shape;
3. times eager CUDA PyTorch, TorchScript on CUDA (eager) and the CUDA graphs at every named shape: numpy in,
   numpy out, blocks of calls interleaved round by round, medians per call;
4. runs a 30 s warmup of the chatbot profile at concurrency 4 on the CUDA graphs;
5. writes one JSON report (default gpu-check.json) and prints a summary; exit 1 when a check failed.
Without a GPU it prints one line saying so and exits 0 (CI runs that path); a missing module is one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NEEDED = {"torch": "torch (a CUDA build)", "numpy": "numpy", "onnx": "onnx", "onnxruntime": "onnxruntime",
          "pydantic": "pydantic", "yaml": "pyyaml"}
ROUNDS, BLOCK_US, WARMUP_S, CONCURRENCY = 15, 2000.0, 30.0, 4
DEVICE = "cuda"  # where eager PyTorch runs
CANDIDATES = ("eager cuda", "torchscript cuda", "cuda graphs")


def missing_modules() -> list[str]:
    """The pip names of the modules this check imports that are not installed."""
    return [pip for module, pip in NEEDED.items() if find_spec(module) is None]


def cuda_recipe(folder: Path) -> Path:
    """The default recipe with TorchScript on CUDA as its only backend, beside a copy of its model code."""
    import yaml

    recipe = yaml.safe_load((ROOT / "recipes" / "policy_value_heads.yaml").read_text())
    recipe.update(backends=["torchscript"], torchscript={"device": "cuda", "cuda_graphs": True})
    shutil.copytree(ROOT / "recipes" / "models", folder / "models")
    path = folder / "policy_value_heads_cuda.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def medians_interleaved(calls: dict[str, Callable[[], object]], rounds: int = ROUNDS) -> dict[str, float]:
    """Median microseconds per call of each candidate: per round, one block of calls each, the order rotated."""
    names = list(calls)
    blocks = {}
    for name, call in calls.items():  # warm, then size a block to about BLOCK_US
        for _ in range(3):
            call()
        start = time.perf_counter()
        call()
        blocks[name] = max(3, int(BLOCK_US / max((time.perf_counter() - start) * 1e6, 1.0)))
    samples: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        for name in names[index % len(names):] + names[:index % len(names)]:
            call, count = calls[name], blocks[name]
            start = time.perf_counter()
            for _ in range(count):
                call()
            samples[name].append((time.perf_counter() - start) * 1e6 / count)
    return {name: round(statistics.median(values), 2) for name, values in samples.items()}


def eager_module(recipe_path: Path, network: str, precision: str) -> tuple[Any, Any]:
    """The network as an nn.Module on the GPU, in the artifact's precision (fp32 at its inputs and outputs)."""
    import torch

    from rlopt.compile.sources import model_source
    from rlopt.recipe import load_recipe

    recipe = load_recipe(recipe_path)
    model, _ = model_source(recipe, recipe_path).load()
    module = model
    for part in filter(None, recipe.networks[network].module.split(".")):
        module = getattr(module, part)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    module = module.eval().to(DEVICE)
    return (module.to(dtype) if dtype is not None else module), dtype


def eager_call(module: Any, dtype: Any, names: list[str]) -> Callable[[dict[str, Any]], list[Any]]:
    import torch

    from rlopt.backends.base import flatten_outputs

    def call(feeds: dict[str, Any]) -> list[Any]:
        with torch.inference_mode():
            tensors = [torch.from_numpy(feeds[name]).to(DEVICE) for name in names]
            if dtype is not None:
                tensors = [t.to(dtype) if t.is_floating_point() else t for t in tensors]
            return [t.float().cpu().numpy() if t.is_floating_point() else t.cpu().numpy()
                    for t in flatten_outputs(module(*tensors))]

    return call


def check_network(model_dir: Path, recipe_path: Path, name: str, record: Any) -> dict[str, Any]:
    """Eager-PyTorch-on-GPU parity and the three timings of one network's CUDA TorchScript artifact."""
    import numpy as np

    from rlopt.backends import open_runner
    from rlopt.manifest import checked_file
    from rlopt.reference import Reference

    artifact = record.artifacts["torchscript"]
    if not artifact.verified:
        return {"artifact": artifact.model_dump(mode="json"), "checked": False}
    runner = open_runner("torchscript", checked_file(model_dir, artifact), list(record.inputs), artifact.facts)
    precision = artifact.facts.get("precision_built", "fp32")
    module, dtype = eager_module(recipe_path, name, precision)
    eager = eager_call(module, dtype, list(record.inputs))
    reference = Reference.load(checked_file(model_dir, record.reference), list(record.inputs), record.outputs)
    gate = artifact.facts.get("parity_gate") or record.tolerance
    worst, timings = 0.0, {}
    passed = True
    for point in reference.points:
        for sample in range(min(4, reference.samples(point))):
            feeds = reference.feeds(point, sample)
            for got, want in zip(runner.infer(feeds), eager(feeds)):
                error = np.abs(got.astype(np.float64) - want.astype(np.float64))
                worst = max(worst, float(error.max()))
                passed &= bool(np.all(error <= gate["atol"] + gate["rtol"] * np.abs(want)))
        feeds = reference.feeds(point, 0)
        timings[point] = {"shape": {n: list(a.shape) for n, a in feeds.items()}, **medians_interleaved({
            "eager cuda": lambda: eager(feeds), "torchscript cuda": lambda: runner.eager(feeds),
            "cuda graphs": lambda: runner.infer(feeds)})}
    events = runner.events()
    runner.close()
    return {"checked": True, "precision": precision, "graphs": sorted(artifact.facts.get("graph_shapes", {})),
            "capture_events": events, "compile_parity": artifact.parity.model_dump(mode="json"),
            "eager_gpu_parity": {"passed": passed, "max_abs": worst, "tolerance": dict(gate)},
            "median_us_per_call": timings}


def run(out: Path) -> int:
    import torch

    from rlopt.compile import compile_recipe
    from rlopt.compile.cache import StageCache
    from rlopt.machine import gpu_identity
    from rlopt.manifest import read_manifest
    from rlopt.tools.warmup import run_warmup

    started = time.perf_counter()
    report: dict[str, Any] = {"gpu": gpu_identity(), "torch": torch.__version__, "cuda": torch.version.cuda}
    with tempfile.TemporaryDirectory(prefix="rlopt-gpu-check-") as scratch:
        recipe_path = cuda_recipe(Path(scratch))
        result = compile_recipe(recipe_path, Path(scratch) / "model", cache=StageCache(enabled=False))
        report["compile"] = {"passed": result.passed, "failures": result.failures,
                             "seconds": round(time.perf_counter() - started, 1)}
        manifest = read_manifest(result.model_dir)
        report["networks"] = {name: check_network(result.model_dir, recipe_path, name, record)
                              for name, record in manifest.networks.items()}
        warmup = run_warmup(result.model_dir, ROOT / "recipes" / "warmup_profiles" / "chatbot.json",
                            duration_s=WARMUP_S, concurrency=CONCURRENCY, backend="torchscript", write_files=False)
        report["warmup"] = warmup.report.model_dump(mode="json")
    report["seconds"] = round(time.perf_counter() - started, 1)
    failures = list(result.failures)
    failures += [f"{n}: eager GPU parity failed" for n, r in report["networks"].items()
                 if r.get("checked") and not r["eager_gpu_parity"]["passed"]]
    failures += [f"{n}: not built or not verified" for n, r in report["networks"].items() if not r.get("checked")]
    if not report["warmup"]["consistency"]["passed"]:
        failures.append("warmup: outputs under concurrency differed from single-threaded outputs")
    report["failures"] = failures
    out.write_text(json.dumps(report, indent=2, default=str))
    _summary(report, out)
    return 1 if failures else 0


def _summary(report: dict[str, Any], out: Path) -> None:
    gpu = report["gpu"] or {}
    print(f"gpu_check: {gpu.get('name')} (compute {gpu.get('compute_capability')}), torch {report['torch']}, "
          f"CUDA {report['cuda']}; {report['seconds']} s; report {out}")
    for name, network in report["networks"].items():
        if not network.get("checked"):
            print(f"  {name}: not checked (artifact not verified)")
            continue
        parity = network["eager_gpu_parity"]
        print(f"  {name} ({network['precision']}): eager-GPU parity {'ok' if parity['passed'] else 'FAILED'} "
              f"(max abs {parity['max_abs']:.2e})")
        for point, row in network["median_us_per_call"].items():
            print(f"    {point:>4} " + "  ".join(f"{c} {row[c]:.1f} us" for c in CANDIDATES))
    print(f"  warmup: {report['warmup'].get('requests')} requests at concurrency {CONCURRENCY}, "
          f"passed {report['warmup'].get('passed')}")
    for failure in report["failures"]:
        print(f"  FAIL {failure}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", type=Path, default=Path("gpu-check.json"), help="the JSON report to write")
    args = parser.parse_args()
    from rlopt.machine import gpu_absent_reason

    absent = gpu_absent_reason()
    if absent is not None:
        print(f"gpu_check: {absent}; nothing to check on this machine")
        return 0
    missing = missing_modules()
    if missing:
        print(f"gpu_check: missing python modules: {', '.join(missing)}; fix: pip install {' '.join(missing)}",
              file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print(f"gpu_check: torch {torch.__version__} cannot use the GPU (CUDA build: {torch.version.cuda}); fix: "
              "install a CUDA build of torch that matches the driver", file=sys.stderr)
        return 2
    return run(args.out)


if __name__ == "__main__":
    sys.exit(main())
