"""Where a batch-1 call's microseconds go (issue 33 item 3): `Session.run` down to TVM's kernels, in one process.

For each network of a compiled MODEL_DIR, at its min shape (batch 1), K rounds; each round times a block of N calls
of every layer below, in an order shuffled each round; a layer's figure is the median (and 10th percentile) over
rounds of its block's mean per call. Layers, outermost first:
- `tvm`: `rlopt.load(..., backend="tvm").run(feeds)`, as a user calls it;
- ONNX Runtime's own `InferenceSession.run` at 1 thread, for scale (a pool of several threads would spin on the
  cores between its calls and slow the other layers: `rlopt bench` times `auto` against ONNX Runtime's best, each
  in its own process);
- TVM's bound call: what `Session.run` calls once it has found the signature (its own layer = the difference);
- TVM's kernels alone: the KernelChain's kernels on their recorded buffers, no input or output copy;
- each kernel, named by its symbol, with the weight bytes it reads;
- the staging copy of the input and the copy of each output (what the bound call adds to the kernels);
- numpy's `x @ W` (its BLAS) at each matrix kernel's shape, and one read of every kernel's weights from cache
  (scripts/roofline.c, 1 thread and all cores): the roofs the kernels are measured against.
numpy runs its BLAS on one thread (OPENBLAS_NUM_THREADS=1, set before numpy loads), as TVM's kernels do at
TVM_NUM_THREADS=1. The machine is shared: read the ratios between layers of one run, and the 10th percentiles,
and rerun; the load average is printed.

usage: python scripts/bench_callpath.py MODEL_DIR [--network N]... [--rounds K] [--calls N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy loads its BLAS

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_limits import Roofline  # noqa: E402


def time_layers(layers: dict[str, Callable[[], Any]], rounds: int, calls: int) -> dict[str, dict[str, float]]:
    """Median, 10th percentile and minimum over rounds of each layer's mean per call (us), blocks interleaved."""
    return {name: {"median_us": float(np.median(v)), "p10_us": float(np.percentile(v, 10)), "min_us": min(v)}
            for name, v in interleaved(layers, rounds, calls).items()}


def interleaved(layers: dict[str, Callable[[], Any]], rounds: int, calls: int) -> dict[str, list[float]]:
    """Per layer, its mean per call (us) in each round; a round times a block of `calls` calls of every layer, in an
    order shuffled each round."""
    for call in layers.values():
        for _ in range(20):
            call()
    samples: dict[str, list[float]] = {name: [] for name in layers}
    order = list(layers.items())
    for _ in range(rounds):
        random.shuffle(order)
        for name, call in order:
            start = time.perf_counter_ns()
            for _ in range(calls):
                call()
            samples[name].append((time.perf_counter_ns() - start) / calls / 1e3)
    return samples


def kernel_layers(session: Any, feeds: dict[str, np.ndarray]) -> tuple[dict[str, Callable[[], Any]], dict[str, int],
                                                                     list[tuple[str, int, int, int]]]:
    """The TVM session's inner layers at `feeds`: callables, weight bytes per kernel, and the (symbol, M, K, N) of each
    kernel that multiplies by a weight matrix. Reaches into the runner (a diagnostic, not an API)."""
    runner = session._gen.runners["tvm"]
    arrays = [feeds[name] for name in session.inputs]
    signature = tuple((a.shape, a.dtype) for a in arrays)
    chain = runner._local.plans[signature]
    bound = runner.bound_call(signature, session.outputs)
    params = {t.data_ptr() for weights in runner._params.values() for t in weights}
    symbols = getattr(chain, "symbols", None) or [f"kernel {i}" for i in range(len(chain.calls))]
    layers: dict[str, Callable[[], Any]] = {}
    if bound is not None:
        layers["tvm bound call"] = lambda: bound(feeds, arrays)
    plain = [(call[0], call[1]) for call in chain.calls]

    def kernels() -> None:
        for function, args in plain:
            function(*args)

    layers["tvm kernels alone"] = kernels
    weights, matrices = {}, []
    for i, (symbol, (function, args)) in enumerate(zip(symbols, plain)):
        name = f"tvm kernel {i}: {symbol}"
        layers[name] = lambda f=function, a=args: f(*a)
        held = [a for a in args if hasattr(a, "data_ptr") and a.data_ptr() in params]
        weights[name] = sum(int(np.prod(a.shape)) * a.dtype.itemsize for a in held)
        first, last = args[0], args[-1]
        if held and hasattr(first, "shape") and hasattr(last, "shape"):
            k, n = int(first.shape[-1]), int(last.shape[-1])
            m = int(np.prod(last.shape)) // n
            if any(int(np.prod(a.shape)) == k * n for a in held):
                matrices.append((symbol, m, k, n))
    for slot, (buffer, array) in enumerate(zip(chain.buffers, arrays)):
        layers[f"input copy {slot} ({array.nbytes} B)"] = lambda b=buffer, a=array: b.__setitem__(Ellipsis, a)
    for slot, output in enumerate(chain.outputs):
        layers[f"output copy {slot} ({output.nbytes} B)"] = output.copy
    return layers, weights, matrices


def breakdown(model_dir: Path, network: str, rounds: int, calls: int, roofline: Roofline) -> dict[str, Any]:
    import onnxruntime as ort

    import rlopt
    from rlopt.machine import usable_cores

    tvm = rlopt.load(model_dir, network, backend="tvm")
    rng = np.random.default_rng(0)
    feeds = {name: rng.standard_normal(p.min).astype(p.dtype) for name, p in tvm.inputs.items()}
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    plain = ort.InferenceSession(str(model_dir / network / "model.onnx"), options, providers=["CPUExecutionProvider"])
    layers: dict[str, Callable[[], Any]] = {"tvm: Session.run": lambda: tvm.run(feeds),
                                            "ONNX Runtime InferenceSession.run, 1 thread": lambda: plain.run(None, feeds)}
    tvm.run(feeds)
    inner, weights, matrices = kernel_layers(tvm, feeds)
    layers.update(inner)
    for symbol, m, k, n in matrices:
        x, w = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
        layers[f"numpy x @ W at {symbol}'s shape ({m}x{k} @ {k}x{n})"] = lambda x=x, w=w: x @ w
    timed = time_layers(layers, rounds, calls)
    total = sum(weights.values())
    roofs = {threads: roofline.read_us(total, threads) for threads in sorted({1, usable_cores()})}
    return {"network": network, "shape": {n: list(a.shape) for n, a in feeds.items()}, "layers": timed,
            "weight_bytes": weights, "roof_read_us": roofs, "tvm_threads": int(os.environ.get("TVM_NUM_THREADS") or 1)}


def render(result: dict[str, Any]) -> str:
    layers = result["layers"]
    lines = [f"### {result['network']} at {result['shape']}", "",
             "| layer | median us | p10 us | min us | weights read |", "|---|---|---|---|---|"]
    for name, figures in layers.items():
        nbytes = result["weight_bytes"].get(name)
        lines.append(f"| {name} | {figures['median_us']:.2f} | {figures['p10_us']:.2f} | {figures['min_us']:.2f} | "
                     f"{f'{nbytes / 1024:.0f} KiB' if nbytes else ''} |")
    for threads, roof in result["roof_read_us"].items():
        if roof is not None:
            lines.append(f"| roof: one read of all {sum(result['weight_bytes'].values()) / 1024:.0f} KiB of weights "
                         f"from cache, {threads} thread(s) | | | {roof:.2f} | |")
    derived = []  # from the 10th percentiles: on a shared machine the medians carry other processes' time
    run, bound = layers.get("tvm: Session.run"), layers.get("tvm bound call")
    kernels = layers.get("tvm kernels alone")
    if run and bound:
        derived.append(f"Session layer (run - bound call) {run['p10_us'] - bound['p10_us']:.2f} us")
    if bound and kernels:
        derived.append(f"copies and call (bound call - kernels alone) {bound['p10_us'] - kernels['p10_us']:.2f} us")
    lines += ["", "At the 10th percentiles: " + "; ".join(derived) + f"; TVM_NUM_THREADS={result['tvm_threads']}."]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--network", action="append", default=None)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    from rlopt.manifest import read_manifest

    networks = args.network or list(read_manifest(args.model_dir).networks)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="rlopt-callpath-") as work:
        roofline = Roofline(Path(work))
        results = [breakdown(args.model_dir, n, args.rounds, args.calls, roofline) for n in networks]
    load_after = os.getloadavg()
    print(f"load average {[round(v, 2) for v in load_before]} -> {[round(v, 2) for v in load_after]}; "
          f"K = {args.rounds} rounds of N = {args.calls} calls\n")
    for result in results:
        print(render(result) + "\n")
    if args.json:
        args.json.write_text(json.dumps({"load_average": [load_before, load_after], "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
