"""Warmup report files: reports/warmup-<profile>.json and a latency-over-time PNG (matplotlib), written atomically."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from rlopt.errors import located
from rlopt.manifest import write_json
from rlopt.tools.warmup.analysis import WarmupResult


def report_paths(model_dir: Path, profile_name: str) -> tuple[Path, Path]:
    folder = model_dir / "reports"
    return folder / f"warmup-{profile_name}.json", folder / f"warmup-{profile_name}.png"


def write_reports(result: WarmupResult, model_dir: Path) -> str | None:
    """Write the JSON report and the plot; returns a one-line error instead of raising, so the run is not lost."""
    json_path, png_path = report_paths(model_dir, result.report.profile_name)
    try:
        json_path.parent.mkdir(exist_ok=True)
        plot_timeline(result, png_path)
        result.report.files = {"json": str(json_path), "png": str(png_path)}
        write_json(json_path, result.report.model_dump(mode="json"))
    except OSError as exc:
        return located(json_path.parent, "", f"cannot write the warmup report ({exc.strerror or exc})",
                       "make MODEL_DIR writable, or copy it somewhere writable")
    return None


def rolling_p99(starts: np.ndarray, values: np.ndarray, bins: int = 60) -> tuple[np.ndarray, np.ndarray]:
    """p99 per time bin (bins with fewer than 5 requests are left out): the curve the eye should follow."""
    if starts.size == 0:
        return np.empty(0), np.empty(0)
    edges = np.linspace(starts[0], starts[-1] + 1e-9, bins + 1)
    index = np.digitize(starts, edges) - 1
    times, p99 = [], []
    for b in range(bins):
        chunk = values[index == b]
        if chunk.size >= 5:
            times.append(edges[b])
            p99.append(float(np.percentile(chunk, 99)))
    return np.asarray(times), np.asarray(p99)


def plot_timeline(result: WarmupResult, path: Path) -> None:
    """Latency over time per shape (log scale), first calls marked, steady state as a dashed line."""
    from rlopt.lazy import require

    matplotlib = require("matplotlib")
    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    report, timeline = result.report, result.timeline
    figure = Figure(figsize=(10, 5.5), dpi=110)
    axes = figure.add_subplot()
    colors = matplotlib.colormaps["tab10"]
    rng = np.random.default_rng(0)
    for i, shape in enumerate(report.shapes):
        color = colors(i % 10)
        starts, latencies = timeline.starts[i], timeline.latencies[i] * 1e3
        if starts.size > 20000:
            keep = np.sort(rng.choice(starts.size, 20000, replace=False))
            starts, latencies = starts[keep], latencies[keep]
        axes.scatter(starts, latencies, s=3, alpha=0.35, color=color, linewidths=0,
                     label=f"{shape.label} ({shape.count} req)")
        p99_times, p99_values = rolling_p99(timeline.starts[i], timeline.latencies[i] * 1e3)
        axes.step(p99_times, p99_values, where="post", color=color, linewidth=1.4)
        first_at, first_latency = timeline.first_calls[i]
        axes.scatter([first_at], [first_latency * 1e3], s=60, marker="X", color=color, edgecolors="black",
                     linewidths=0.6, zorder=3)
        if shape.time_to_steady_s is not None:
            axes.axvline(shape.time_to_steady_s, color=color, linestyle="--", linewidth=1)
    if report.slo is not None:
        axes.axhline(report.slo.p99_ms, color="red", linewidth=1, label=f"SLO p99 {report.slo.p99_ms:g} ms")
    axes.set_yscale("log")
    axes.set_xlabel("seconds since rlopt.load began")
    axes.set_ylabel("latency (ms, log scale)")
    steady = "not reached" if report.time_to_steady_s is None else f"{report.time_to_steady_s:.2f} s"
    axes.set_title(f"{report.network} on {report.backend}, {report.concurrency} thread(s): "
                   f"X = first call, line = rolling p99, dashed = steady state ({steady})", fontsize=10)
    axes.grid(True, which="both", alpha=0.25)
    axes.legend(loc="upper right", fontsize=8, markerscale=3)
    figure.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    figure.savefig(tmp, format="png")
    os.replace(tmp, path)


__all__ = ["plot_timeline", "report_paths", "rolling_p99", "write_reports"]
