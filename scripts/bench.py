"""The project's own benchmark: compile the bundled recipes, bench every network, measure this machine's limits.

Writes bench-results.json (`--out`) with, per recipe and network, everything `rlopt bench --json` reports
(every built backend, PyTorch eager, the TorchScript module, torch.compile, ONNX Runtime at 1 and at all
threads, interleaved) plus this machine's limits measured in the same run, so each result can be read as
a fraction of the hardware:
- large-sgemm GFLOP/s (numpy float32 matmul, n = 4096, best of 3): a practical compute roof (numpy's
  OpenBLAS; ONNX Runtime's MLAS can beat it on cache-resident weights, so a fraction can exceed 100%);
- read bandwidth (numpy sum over a 256 MiB array, best of 5) and, per network, the batch-1
  bandwidth bound = weight bytes / read bandwidth: the time to stream the weights once from DRAM.
  Small weights sit in cache, so a result can beat this bound; it is a DRAM floor, not a cache one;
- the roofs no fp32 code can pass, from scripts/roofline.c (built here with the system C compiler; absent,
  with the reason, where there is none): the FMA peak on 1 and on all cores, and per network the time to
  read its weights once from where repeated calls leave them (the cache, when they fit), on one core or
  all, whichever is faster.
  The targets table says what each of issue 5's ratio targets would need of those roofs, so a target
  that asks for more than 100% of one is out of reach on this machine for any fp32 implementation.
Each compile and each bench runs in its own fresh process (`rlopt compile`, `rlopt bench --json`), as a
user would run them: benched in the process that had just compiled, every PyTorch candidate showed
4 ms-quantized stalls (32-40 ms medians for 0.1-0.3 ms calls), which a fresh process does not.
Prints a Markdown table (for the README) on stdout. The default run stays under about 3 minutes on
2 cores (compiles ~50 s, torch.compile ~40 s, the rest timing).

usage: python scripts/bench.py [--out bench-results.json] [--budget 1.0] [--work-dir DIR] [RECIPE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = [ROOT / "recipes" / name for name in ("policy_value_heads.yaml", "ppo_mlp.yaml", "atari_cnn.yaml")]


def sgemm_gflops(n: int = 4096, repeats: int = 3) -> float:
    """Best-of-N float32 matmul throughput with numpy's BLAS, all its threads."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2 * n**3 / best / 1e9


def read_bandwidth_gbs(mib: int = 256, repeats: int = 5) -> float:
    """Best-of-N bytes per second of a sum over an array far larger than the caches."""
    data = np.ones(mib * (1 << 20) // 4, dtype=np.float32)
    data.sum()
    best = min(_timed(data.sum) for _ in range(repeats))
    return data.nbytes / best / 1e9


class Roofline:
    """scripts/roofline.c, compiled for this CPU: FMA peak and cache-resident read time (see its header)."""

    def __init__(self, work_dir: Path) -> None:
        self.binary: Path | None = None
        self.reason = ""
        name = os.environ.get("CC", "cc")
        compiler = shutil.which(name)
        if compiler is None:
            self.reason = f"no C compiler ({name}) on this machine"
            return
        binary = work_dir / "roofline"
        built = subprocess.run([compiler, "-O3", "-march=native", "-fopenmp", str(ROOT / "scripts" / "roofline.c"),
                                "-o", str(binary)], capture_output=True, text=True)
        if built.returncode != 0:
            self.reason = f"cc could not build scripts/roofline.c: {(built.stderr.strip().splitlines() or ['?'])[-1]}"
            return
        self.binary = binary

    def _ask(self, *args: int | str) -> list[float]:
        assert self.binary is not None
        done = subprocess.run([str(self.binary), *map(str, args)], capture_output=True, text=True, check=True)
        return [float(v) for v in done.stdout.split()]

    def peak_gflops(self, threads: int) -> float | None:
        return self._ask("peak", threads)[0] if self.binary else None

    def read_us(self, nbytes: int) -> float | None:
        """The faster of one core and all cores: small weights do not pay for waking a second thread."""
        if self.binary is None:
            return None
        from rlopt.machine import usable_cores

        return min(self._ask("read", nbytes, threads)[1] for threads in {1, usable_cores()})


def _timed(call: Any) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def weight_bytes(torchscript_path: Path) -> int:
    """Bytes of the network's parameters and buffers: what one call reads. (Not the ONNX initializers: an
    exported `If` carries a copy of the weights per branch, which doubled the default policy's count.)"""
    import torch

    module = torch.jit.load(str(torchscript_path), map_location="cpu")
    tensors = {t.data_ptr(): t for t in [*module.parameters(), *module.buffers()]}
    return int(sum(t.numel() * t.element_size() for t in tensors.values()))


def openblas_core() -> str | None:
    """The kernel family numpy's OpenBLAS dispatched to on this CPU (it falls back to Haswell = AVX2 on CPUs it
    does not know, e.g. Zen 5, so its sgemm is an AVX2 roof, not the AVX-512 peak that TVM and MLAS use)."""
    import ctypes
    import glob

    root = Path(np.__file__).parent.parent
    for library in glob.glob(str(root / "numpy.libs" / "*openblas*")) + glob.glob(str(root / "scipy_openblas*" / "lib" / "*.so")):
        for name in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename"):
            try:
                function = getattr(ctypes.CDLL(library), name)
            except (OSError, AttributeError):
                continue
            function.restype = ctypes.c_char_p
            return str(function().decode())
    return None


def untuned_recipe(recipe: Path, work_dir: Path) -> Path:
    """A copy of `recipe` (and the files it references) without its tuning database, for an untuned compile."""
    folder = work_dir / f"{recipe.stem}.untuned-src"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for item in recipe.parent.iterdir():
        if item.is_dir() and not item.name.endswith(".tuning"):
            shutil.copytree(item, folder / item.name)
    shutil.copy(recipe, folder / recipe.name)
    return folder / recipe.name


def _rlopt(*args: str, cache: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The real CLI in a fresh process (see the module docstring for why); `cache` = its RLOPT_CACHE."""
    env = dict(os.environ, **({"RLOPT_CACHE": str(cache)} if cache is not None else {}))
    return subprocess.run([sys.executable, "-m", "rlopt", *args], capture_output=True, text=True, cwd=ROOT, env=env)


def bench_recipe(recipe: Path, work_dir: Path, budget_s: float, limits: dict[str, Any],
                 roofline: Roofline) -> dict[str, Any]:
    from rlopt.manifest import read_manifest

    started = time.perf_counter()
    out = work_dir / recipe.stem
    cache = work_dir / f"{recipe.stem}.cache"
    print(f"[bench] compiling {recipe.name} (empty stage cache)", file=sys.stderr)
    compiled = _rlopt("compile", str(recipe), "-o", str(out), "--json", cache=cache)
    if compiled.returncode not in (0, 1):
        raise SystemExit(f"rlopt compile {recipe} failed: {compiled.stderr.strip()}")
    compile_s = time.perf_counter() - started
    warm_started = time.perf_counter()
    warm = _rlopt("compile", str(recipe), "-o", str(work_dir / f"{recipe.stem}.warm"), "--json", cache=cache)
    warm_s = time.perf_counter() - warm_started
    hits = [s.get("cache", "") for n in json.loads(warm.stdout)["manifest"]["networks"].values() for s in n["stages"]
            if "cache" in s] if warm.returncode in (0, 1) else []
    print(f"[bench] compiled {recipe.name} in {compile_s:.1f} s cold, {warm_s:.1f} s warm; benching", file=sys.stderr)
    untuned_started = time.perf_counter()
    untuned = _rlopt("compile", str(untuned_recipe(recipe, work_dir)), "-o", str(work_dir / f"{recipe.stem}.untuned"),
                     "--json", cache=work_dir / f"{recipe.stem}.untuned-cache")
    untuned_s = time.perf_counter() - untuned_started
    print(f"[bench] untuned compile (no database, empty cache) {untuned_s:.1f} s", file=sys.stderr)
    started += warm_s + untuned_s
    benched = _rlopt("bench", str(out), "--recipe", str(recipe), "--budget", str(budget_s), "--json")
    if benched.returncode != 0:
        raise SystemExit(f"rlopt bench {out} failed: {benched.stderr.strip()}")
    report = json.loads(benched.stdout)
    bench_s = time.perf_counter() - started - compile_s
    manifest = read_manifest(out)
    networks = []
    for net in report["networks"]:
        record = manifest.networks[net["network"]]
        weights = weight_bytes(out / record.files["model.ts"].path)
        bound_us = weights / (limits["read_bandwidth_gbs"] * 1e9) * 1e6
        cache_us = roofline.read_us(weights)
        for shape in net["shapes"]:
            for row in shape["results"]:
                flops = row["gflops_per_s"]
                row["fraction_of_numpy_sgemm"] = round(flops / limits["sgemm_gflops"], 4) if flops else None
                if shape["point"] == "min":
                    row["bandwidth_bound_over_median"] = round(bound_us / row["median_us"], 3)
        networks.append({"weight_bytes": weights, "batch1_bandwidth_bound_us": round(bound_us, 3),
                         "weights_cache_read_us": cache_us,
                         "auto_routes": record.facts.get("auto_routes", {}), **net})
    return {"recipe": str(recipe.relative_to(ROOT) if recipe.is_relative_to(ROOT) else recipe),
            "name": manifest.name, "compile_s": round(compile_s, 2), "bench_s": round(bench_s, 2),
            "compile_warm_s": round(warm_s, 2), "warm_over_cold": round(warm_s / compile_s, 3),
            "compile_untuned_s": round(untuned_s, 2), "compile_untuned_passed": untuned.returncode == 0,
            "warm_cache_hits": f"{hits.count('hit')}/{len(hits)}",
            "compile_passed": compiled.returncode == 0, "bench_machine": report["machine"],
            "warnings": report.get("warnings", []), "networks": networks}


def markdown(results: dict[str, Any]) -> str:
    """The tables the README shows: every candidate per shape, then the batch-1 bound per network."""
    limits = results["limits"]
    peak = limits.get("fma_peak_gflops")
    lines = [f"numpy sgemm {limits['sgemm_gflops']:.0f} GFLOP/s, "
             f"read bandwidth {limits['read_bandwidth_gbs']:.1f} GB/s, "
             + (f"FMA peak {limits['fma_peak_gflops_1_core']:.0f} GFLOP/s on 1 core, {peak:.0f} on "
                f"{limits['cores']}" if peak else f"FMA peak not measured: {limits.get('roofline_unavailable')}"),
             "", "| recipe / network | shape | candidate | median | p99 | x ORT best | % of numpy sgemm |",
             "|---|---|---|---|---|---|---|"]
    bounds = ["", "| recipe / network | weights | batch-1 DRAM bound | one read of the weights from cache | "
              "fastest at min | its median | DRAM bound / median | median / cache read |", "|---|---|---|---|---|---|---|---|"]
    for recipe in results["recipes"]:
        for net in recipe["networks"]:
            for shape in net["shapes"]:
                dims = _dims(shape["shape"])
                for row in shape["results"]:
                    share = row.get("fraction_of_numpy_sgemm")
                    ratio = "-" if row["ratio_to_ort_best"] is None else f"{row['ratio_to_ort_best']:.2f}"
                    lines.append(f"| {recipe['name']} / {net['network']} | {shape['point']} {dims} | "
                                 f"{row['candidate']} | {_us(row['median_us'])} | {_us(row['p99_us'])} | {ratio} | "
                                 f"{'-' if share is None else f'{share:.1%}'} |")
            fastest = net["shapes"][0]["results"][0] if net["shapes"] and net["shapes"][0]["results"] else None
            if fastest is not None:
                cache_us = net.get("weights_cache_read_us")
                over_cache = f"{fastest['median_us'] / cache_us:.1f}" if cache_us else "-"
                bounds.append(f"| {recipe['name']} / {net['network']} | {net['weight_bytes'] / 1e6:.2f} MB | "
                              f"{_us(net['batch1_bandwidth_bound_us'])} | {_us(cache_us) if cache_us else '-'} | "
                              f"{fastest['candidate']} | {_us(fastest['median_us'])} | "
                              f"{fastest['bandwidth_bound_over_median']:.2f} | "
                              f"{over_cache} |")
    compiles = ["", "| recipe | compile, shipped database, empty cache | warm cache | warm / cold | cached stages hit "
                "| untuned (no database), empty cache |", "|---|---|---|---|---|---|"]
    for recipe in results["recipes"]:
        compiles.append(f"| {recipe['name']} | {recipe['compile_s']:.1f} s | {recipe['compile_warm_s']:.1f} s | "
                        f"{recipe['warm_over_cold']:.2f} | {recipe['warm_cache_hits']} | "
                        f"{recipe.get('compile_untuned_s', float('nan')):.1f} s |")
    return "\n".join(targets_table(results) + lines + bounds + compiles)


TARGET_RATIOS = {"min": 0.35, "opt": 0.6, "max": 0.6}  # issue 5: auto / ONNX Runtime's best, per profile point


def target_needs(point: str, ort_best_us: float, gflop: float | None, peak_gflops: float | None,
                 weights_read_us: float | None) -> str:
    """Issue 5's target latency at `point` and what it asks of the machine: its FLOPs as a share of the FMA peak,
    and the one read of the weights it must contain as a share of its time. Over 100% means no fp32 code can."""
    ratio = TARGET_RATIOS.get(point)
    if ratio is None:
        return "-"
    target_us = ratio * ort_best_us
    needs = []
    if gflop and peak_gflops:
        needs.append(f"{gflop * 1e6 / target_us / peak_gflops:.0%} of FMA peak")
    if weights_read_us:
        needs.append(f"{weights_read_us / target_us:.0%} on reading the weights")
    return f"{_us(target_us)}" + (f" ({', '.join(needs)})" if needs else "")


def targets_table(results: dict[str, Any]) -> list[str]:
    """What `auto` gives per shape, as a ratio to ONNX Runtime's best and a share of numpy's sgemm; next to it the
    same backend's own candidate (`rlopt <backend>`, another worker process running the same code there), since
    on a noisy 2-core VM one process can run a whole shape slower than its twin; last, the target and what it
    would need of this machine's roofs."""
    from rlopt.manifest import shape_label

    limits = results["limits"]
    rows = ["| recipe / network | shape | rlopt auto | ONNX Runtime best | auto / ORT best | auto GFLOP/s "
            "(% of numpy sgemm) | auto's backend | that backend's own session (/ ORT best) | target, and what it "
            "needs |", "|---|---|---|---|---|---|---|---|---|"]
    for recipe in results["recipes"]:
        for net in recipe["networks"]:
            routes = net.get("auto_routes", {})
            for shape in net["shapes"]:
                by_name = {row["candidate"]: row for row in shape["results"]}
                auto, best = by_name.get("rlopt auto"), by_name.get(shape.get("ort_best") or "")
                if auto is None or best is None:
                    continue
                dims = _dims(shape["shape"])
                flops = auto.get("gflops_per_s")
                share = f"{flops:.0f} ({flops / limits['sgemm_gflops']:.0%})" if flops else "-"
                backend = routes.get(shape_label(shape["shape"].values())) or routes.get("other") or "-"
                twin = by_name.get(f"rlopt {backend}")
                alone = f"{_us(twin['median_us'])} ({twin['median_us'] / best['median_us']:.2f})" if twin else "-"
                needs = target_needs(shape["point"], best["median_us"], shape.get("gflop"),
                                     limits.get("fma_peak_gflops"), net.get("weights_cache_read_us"))
                rows.append(f"| {recipe['name']} / {net['network']} | {shape['point']} {dims} | "
                            f"{_us(auto['median_us'])} | {_us(best['median_us'])} | "
                            f"{auto['median_us'] / best['median_us']:.2f} | {share} | {backend} | {alone} | "
                            f"{needs} |")
    return rows + [""]


def _dims(shape: dict[str, list[int]]) -> str:
    """`4x8x768` per input, space-separated: how the tables print a shape."""
    return " ".join("x".join(map(str, d)) for d in shape.values())


def _us(value: float) -> str:
    return f"{value / 1000:.2f} ms" if value >= 1000 else f"{value:.1f} us"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipes", nargs="*", type=Path, help="recipes to bench (default: the bundled three)")
    parser.add_argument("--out", type=Path, default=Path("bench-results.json"))
    parser.add_argument("--budget", type=float, default=1.0, help="seconds of timed rounds per shape")
    parser.add_argument("--work-dir", type=Path, default=None, help="keep the compiled MODEL_DIRs here")
    args = parser.parse_args(argv)
    recipes = [r.resolve() for r in args.recipes] or BUNDLED
    started = time.perf_counter()
    load_at_start = [round(v, 2) for v in os.getloadavg()]
    from rlopt.compile import tool_versions
    from rlopt.machine import machine_facts, usable_cores

    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="rlopt-bench-"))
    try:
        work_dir.mkdir(parents=True, exist_ok=True)
        roofline = Roofline(work_dir)
        cores = usable_cores()
        limits = {"sgemm_gflops": round(sgemm_gflops(), 2), "read_bandwidth_gbs": round(read_bandwidth_gbs(), 2),
                  "sgemm_openblas_core": openblas_core(), "cores": cores,
                  "fma_peak_gflops_1_core": roofline.peak_gflops(1), "fma_peak_gflops": roofline.peak_gflops(cores),
                  "roofline_unavailable": roofline.reason or None}
        print(f"[bench] machine limits: {limits}", file=sys.stderr)
        runs = [bench_recipe(recipe, work_dir, args.budget, limits, roofline) for recipe in recipes]
    finally:
        if args.work_dir is None:
            shutil.rmtree(work_dir, ignore_errors=True)
    results = {
        "kind": "rlopt-bench-results", "schema_version": 1,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_facts(), "versions": tool_versions(),
        "load_average_at_start": load_at_start,
        "limits": limits | {"sgemm": "numpy float32 4096x4096 matmul, best of 3",
                            "read_bandwidth": "numpy float32 sum over 256 MiB, best of 5",
                            "batch1_bandwidth_bound": "weight bytes / read bandwidth (a DRAM floor; cached "
                                                      "weights can beat it)",
                            "fma_peak": "scripts/roofline.c: fp32 FMAs in registers, best of 5",
                            "weights_cache_read": "scripts/roofline.c: read the weights once, where repeated reads "
                                                  "leave them, on 1 core or all (the faster), best of 2000"},
        "budget_s_per_shape": args.budget, "recipes": runs, "seconds": round(time.perf_counter() - started, 1),
    }
    tmp = args.out.with_name(f".{args.out.name}.tmp")
    tmp.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    tmp.replace(args.out)
    print(markdown(results))
    print(f"[bench] wrote {args.out} in {results['seconds']:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
