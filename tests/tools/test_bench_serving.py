"""scripts/bench_serving.py's load harness: every load process times the same window; the verdicts read A/A twins."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import bench_serving  # noqa: E402

# a load process as scripts/bench_serving_load.py behaves: `ready`, then the start time on stdin; it reports when
# it read that time, and a request only when it read it before the window opened
FAKE_LOAD = textwrap.dedent("""
    import json, sys, time
    print("ready", flush=True)
    start = float(sys.stdin.readline())
    read_at = time.time()
    time.sleep(max(0.0, start - time.time()) + 0.3)
    print(json.dumps({"requests": int(read_at < start), "failures": 0, "errors": [], "read_at": read_at,
                      "start": start, "latencies_us": [100.0], "cpu_us_per_request": 5.0}))
""")


def test_every_load_process_is_told_the_start_before_the_window_opens() -> None:
    parts = bench_serving.started([[sys.executable, "-c", FAKE_LOAD]] * 3, duration=0.3)
    assert len(parts) == 3
    assert all(part["read_at"] < part["start"] for part in parts), [p["read_at"] - p["start"] for p in parts]


def test_a_load_process_without_a_request_in_the_window_stops_the_bench() -> None:
    late = FAKE_LOAD.replace('int(read_at < start)', '0')
    with pytest.raises(SystemExit, match="made no request"):
        bench_serving.started([[sys.executable, "-c", FAKE_LOAD], [sys.executable, "-c", late]], duration=0.3)


def test_merged_reports_the_requests_in_flight_by_littles_law() -> None:
    parts = [{"requests": 400, "failures": 0, "errors": [], "latencies_us": [2000.0] * 400, "cpu_us_per_request": 10.0},
             {"requests": 400, "failures": 0, "errors": [], "latencies_us": [2000.0] * 400, "cpu_us_per_request": 30.0}]
    row = bench_serving.merged(parts, clients=2, duration=1.0)
    assert row["throughput_rps"] == 800.0 and row["in_flight"] == 1.6
    assert row["load_cpu_us_per_request"] == 20.0


def _point(rps: float, clients: int) -> dict:
    return {"clients": clients, "throughput_rps": rps, "p50_us": 100.0, "p99_us": 200.0, "in_flight": 1.0,
            "failures": 0}


def _run(batcher: float, baseline: float, twin: float) -> dict:
    rows = {"http batcher": [_point(batcher, 1)], "http max-batch 1": [_point(baseline, 1)],
            bench_serving.AA_HTTP: [_point(twin, 1)]}
    return {"policy-value-heads": rows}


@pytest.mark.parametrize(("batcher", "twin", "passed"), [(930.0, 1080.0, True), (930.0, 1010.0, False),
                                                         (960.0, 1000.0, True)])
def test_the_policy_check_allows_the_ratio_what_the_a_a_twin_reads_as_noise(batcher: float, twin: float,
                                                                          passed: bool) -> None:
    summary = bench_serving.summarize([_run(batcher, 1000.0, twin)], {"policy-value-heads": 400.0})
    (verdict,) = [v for k, v in summary["verdicts"].items() if k.startswith("default policy: batcher")]
    assert verdict[0] == [round(batcher / 1000.0, 3)] and verdict[1] == [round(twin / 1000.0, 3)]
    assert verdict[-1] is passed
    json.dumps(summary)
