"""scripts/bench.py's rows and docs/benchmarks.md: per model, network and shape, the protocol's ratios over R runs
(rlopt.tools.bench.protocol), the done-when verdict, and the Markdown table set one invocation writes."""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any

from rlopt.tools.bench.protocol import CEILING, SPREAD_LIMIT, TOLERANCE, shape_ratios, spread, verdict

MARKER = "<!-- table sets: scripts/bench.py writes below this line, the newest first -->"
KEEP_SETS = 3
DEFAULT_POLICY = ("policy-value-heads", "policy")
TARGET_RATIOS = {"min": 0.35, "opt": 0.6, "max": 0.6}  # issue 5: auto / ONNX Runtime's best, per profile point


def collect_rows(models: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (model, network, shape) from each model's `runs` (rlopt bench reports, as JSON)."""
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for model in models:
        for run in model.get("runs", []):
            for net in run["networks"]:
                for shape in net["shapes"]:
                    key = (model["name"], net["network"], shape["point"])
                    row = rows.setdefault(key, {"model": model["name"], "origin": model["origin"],
                                                "tuned": model["tuned"],
                                                "tuning": model.get("tuning", "yes" if model["tuned"] else "no"),
                                                "network": net["network"],
                                                "point": shape["point"], "shape": shape["shape"],
                                                "gflop": shape.get("gflop"), "backend": None, "runs": []})
                    ratios = shape_ratios(shape.get("round_medians_us", {}))
                    row["runs"].append(None if ratios is None else ratios.to_json())
                    routes = model.get("auto_routes", {}).get(net["network"], {})
                    label = "-".join("x".join(map(str, d)) for d in shape["shape"].values())
                    row["backend"] = (routes.get(label) or routes.get("other") or row["backend"]
                                      or net.get("workers", {}).get("rlopt auto", {}).get("backend"))
    for row in rows.values():
        summarize(row)
    return list(rows.values())


def summarize(row: dict[str, Any]) -> None:
    """Add the row's medians over runs, the spread of auto / ORT best and the done-when verdict."""
    runs = [r for r in row["runs"] if r is not None and r["auto"] is not None]
    if not runs:
        row.update(auto=None, verdict=None, spread=None)
        return
    autos = [r["auto"] for r in runs]
    low, high, width = spread(autos)
    row["auto"] = statistics.median(autos)
    row["spread"] = {"min": low, "max": high, "relative": round(width, 4)}
    row["verdict"] = verdict(autos, [r["aa"] for r in runs]).to_json()
    for key in ("eager", "sb3"):
        values = [r[key] for r in runs if r[key] is not None]
        row[key] = statistics.median(values) if values else None
    row["ort_best_us"] = statistics.median(r["ort_best_us"] for r in runs)
    row["auto_us"] = statistics.median(r["ort_best_us"] * r["auto"] for r in runs)
    sessions = sorted({r["ort_best"] for r in runs})
    row["ort_best"] = " / ".join(s.removeprefix("onnxruntime ") for s in sessions)


def default_policy_spread(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The done-when check on the default policy's max shape: its auto / ORT best spread over runs."""
    for row in rows:
        if (row["model"], row["network"], row["point"]) == (*DEFAULT_POLICY, "max") and row.get("spread"):
            width, runs = row["spread"]["relative"], len(row["runs"])
            return {"relative": width, "runs": runs, "passed": width <= SPREAD_LIMIT if runs > 1 else None}
    return None


def fmt_us(value: float) -> str:
    return f"{value / 1000:.2f} ms" if value >= 1000 else f"{value:.1f} us"


def dims(shape: dict[str, list[int]]) -> str:
    """`4x8x768` per input, space-separated."""
    return " ".join("x".join(map(str, d)) for d in shape.values())


def target_needs(point: str, ort_best_us: float, gflop: float | None, peak_gflops: float | None) -> str:
    """Issue 5's target latency at `point` (bundled recipes) and its FLOPs as a share of the FMA peak: over 100%
    means no fp32 code can reach it on this machine."""
    ratio = TARGET_RATIOS.get(point)
    if ratio is None:
        return "-"
    target_us = ratio * ort_best_us
    share = f" ({gflop * 1e6 / target_us / peak_gflops:.0%} of FMA peak)" if gflop and peak_gflops else ""
    return fmt_us(target_us) + share


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _aa_cell(row: dict[str, Any]) -> str:
    return " ".join("-" if r is None or r["aa"] is None else f"{r['aa']:.2f}" for r in row["runs"])


def _verdict_cell(row: dict[str, Any]) -> str:
    v = row.get("verdict")
    if v is None:
        return "no ratio (no rlopt auto or ONNX Runtime)"
    return f"{'pass' if v['passed'] else 'FAIL'} ({v['within']}/{v['runs']} within)" + (
        "" if v["passed"] else f": {v['reason']}")


def table_set(results: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """The Markdown one invocation writes: its date, commit and machine line, then its tables."""
    proto = results["protocol"]
    limits = results.get("limits", {})
    peak = limits.get("fma_peak_gflops")
    lines = [f"## Run of {results['created_at']} (commit {results['commit']}, R = {proto['runs']} runs, "
             f"K = {proto['rounds']} rounds{', --quick' if proto.get('quick') else ''})", "",
             f"{results['machine_line']}. Load average at start {results['load_average_at_start']}, at end "
             f"{results['load_average_at_end']}; {results['seconds']:.0f} s in all." + (
                 f" Roofs in the same run: FMA peak {peak:.0f} GFLOP/s on {limits['cores']} cores, numpy sgemm "
                 f"{limits['sgemm_gflops']:.0f} GFLOP/s." if peak else ""), ""]
    spread_check = default_policy_spread(rows)
    if spread_check and spread_check["passed"] is None:
        lines += ["Default policy, max shape: one run, so no spread to judge.", ""]
    elif spread_check:
        lines += [f"Default policy, max shape: auto / ORT best spread over {spread_check['runs']} runs "
                  f"{spread_check['relative']:.1%} ({'within' if spread_check['passed'] else 'over'} "
                  f"{SPREAD_LIMIT:.0%}).", ""]
    lines += ["| model / network | tuned | shape | auto's backend | auto | ORT best (session) | auto / ORT best | "
              "runs min-max (spread) | A/A per run | eager / ORT best | sb3 predict / ORT best | done when | "
              "issue 5 target |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        if row.get("auto") is None:
            lines.append(f"| {row['model']} / {row['network']} | {row['tuning']} | "
                         f"{row['point']} {dims(row['shape'])} | {row['backend'] or '-'} | - | - | - | - | - | - | "
                         f"- | {_verdict_cell(row)} | - |")
            continue
        s = row["spread"]
        target = target_needs(row["point"], row["ort_best_us"], row.get("gflop"), peak) if row["tuned"] else "-"
        lines.append(f"| {row['model']} / {row['network']} | {row['tuning']} | "
                     f"{row['point']} {dims(row['shape'])} | {row['backend'] or '-'} | {fmt_us(row['auto_us'])} | "
                     f"{fmt_us(row['ort_best_us'])} ({row['ort_best']}) | {row['auto']:.2f} | "
                     f"{s['min']:.2f}-{s['max']:.2f} ({s['relative']:.0%}) | {_aa_cell(row)} | "
                     f"{_ratio(row['eager'])} | {_ratio(row['sb3'])} | {_verdict_cell(row)} | {target} |")
    problems = [f"- {m['name']}: {m['compile_error']}" for m in results["models"] if m.get("compile_error")]
    problems += [f"- {m['name']}: {e}" for m in results["models"] for e in m.get("run_errors", [])]
    if problems:
        lines += ["", "Not benched or partly benched:", "", *problems]
    lines += ["", results.get("refit_markdown") or "Refit: not measured in this run.", ""]
    lines += [results.get("serving_markdown") or "Serving: not measured in this run.", ""]
    return "\n".join(lines)


def write_doc(path: Path, new_set: str) -> None:
    """Rewrite `path` atomically: its hand-written part (above MARKER) kept, then the new table set, then up to
    KEEP_SETS - 1 earlier ones."""
    header, earlier = "# Benchmarks\n", []
    if path.is_file():
        text = path.read_text(encoding="utf-8")
        header, _, body = text.partition(MARKER)
        parts = re.split(r"(?m)^(?=## Run of )", body)
        earlier = [part for part in parts if part.startswith("## Run of ")]
    sets = [new_set.strip(), *(s.strip() for s in earlier)][:KEEP_SETS]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(header.rstrip() + "\n\n" + MARKER + "\n\n" + "\n\n".join(sets) + "\n", encoding="utf-8")
    tmp.replace(path)


__all__ = ["CEILING", "KEEP_SETS", "MARKER", "TOLERANCE", "collect_rows", "default_policy_spread", "dims", "fmt_us",
           "summarize", "table_set", "target_needs", "write_doc"]
