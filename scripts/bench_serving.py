"""The serving view of scripts/bench.py (issue 34's done-when), as JSON on stdout and a Markdown section.

For the default policy and the atari CNN (bundled recipes, compiled by the real CLI):
- HTTP: `rlopt serve` in its own process, batcher on (its defaults) against `--max-batch 1`, and an A/A twin of
  the latter, the servers fresh per run and up together; closed-loop batch-1 clients (requests encoded once by
  tritonclient.http, as perf_analyzer does; scripts/bench_serving_load.py) at 1, 4, 16 and 64 at once, spread over
  up to CLIENT_PROCESSES processes: throughput, p50, p99, and the requests in flight on average (Little's law:
  below the client count when the callers, not the server, set the pace);
- in process: `rlopt.Batcher` against one `Session` shared by the threads, and its A/A twin, each in a fresh
  process, same counts;
- each trio timed back to back at each concurrency, which one first rotating, so that this host's phases fall
  on every side of a ratio;
- soak: 64 clients on the batcher for SOAK_S seconds: failed requests, the server's resident memory growth;
- checks: the malformed-request matrix and SIGTERM under load (tests/serve, run by pytest).
Medians over R runs. Wall-clock figures: run it on a quiet machine.

usage: python scripts/bench_serving.py [--runs R] [--duration S] [--soak S] [--quick] [--work-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_models import prepare  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LOAD = Path(__file__).with_name("bench_serving_load.py")
MODELS = {"policy-value-heads": "policy", "atari-cnn": "actor_critic"}
CONCURRENCY = (1, 4, 16, 64)
CLIENT_PROCESSES = 4
MAX_BATCH, MAX_WAIT_US = 8, 500.0  # rlopt serve's defaults: the "batcher on" configuration
WARM_CLIENTS, WARM_S = 4, 2.0  # each server's untimed load before a run's points
AA_HTTP, AA_LOCAL = "http max-batch 1 (A/A)", "in-process shared Session (A/A)"
SOAK_S, SOAK_CLIENTS = 60.0, 64


def env() -> dict[str, str]:
    return dict(os.environ, COLUMNS="300",
                PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def request_spec(model_dir: Path, network: str) -> tuple[dict[str, list[Any]], float]:
    """Batch-1 inputs at the opt shape's other dims, and the max shape's recorded latency (us) on its route."""
    from rlopt.manifest import read_manifest, shape_label

    record = read_manifest(model_dir).networks[network]
    spec = {name: [p.dtype, [1, *p.opt[1:]]] for name, p in record.inputs.items()}
    routes = dict(record.facts.route.routes) if record.facts.route is not None else {}
    label = shape_label([p.max for p in record.inputs.values()])
    backend = routes.get(label) or routes.get("other") or record.selected or next(iter(record.artifacts))
    latency = record.artifacts[backend].latency_us.get("max")
    return spec, latency.p50 if latency else float("nan")


def start_server(model_dir: Path, network: str, max_batch: int) -> tuple[subprocess.Popen[str], int]:
    process = subprocess.Popen([sys.executable, "-m", "rlopt", "serve", str(model_dir), "--network", network,
                                "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", "--max-batch",
                                str(max_batch), "--max-wait-us", str(MAX_WAIT_US)],
                               stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env(), cwd=ROOT)
    assert process.stderr is not None
    while True:
        line = process.stderr.readline()
        found = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
        if found:
            return process, int(found.group(1))
        if not line:
            raise SystemExit(f"bench_serving: rlopt serve did not start: {process.stderr.read()[-400:]}")


def stop_server(process: subprocess.Popen[str]) -> int:
    process.send_signal(signal.SIGTERM)
    return process.wait(120)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def started(commands: list[list[str]], duration: float) -> list[dict[str, Any]]:
    """Run load processes together: each sets up, says `ready`, then all are told one start time; their results."""
    running = [subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env()) for command in commands]
    for process in running:
        assert process.stdout is not None
        if process.stdout.readline().strip() != "ready":
            raise SystemExit(f"bench_serving: a load process failed to start: {process.communicate()[1][-400:]}")
    start = time.time() + 0.5
    for process in running:  # every process told before any is waited for: each times the same window
        assert process.stdin is not None
        process.stdin.write(f"{start}\n")
        process.stdin.flush()
    parts = []
    for process in running:
        out, err = process.communicate(timeout=duration + 300)
        if process.returncode != 0:
            raise SystemExit(f"bench_serving: a load process failed: {err[-400:]}")
        parts.append(json.loads(out.strip().splitlines()[-1]))
    idle = [index for index, part in enumerate(parts) if not part["requests"] and not part["failures"]]
    if idle:
        raise SystemExit(f"bench_serving: load processes {idle} made no request in the timed window")
    return parts


def merged(parts: list[dict[str, Any]], clients: int, duration: float) -> dict[str, Any]:
    import numpy as np

    latencies = np.concatenate([np.asarray(p["latencies_us"], dtype=np.float64) for p in parts])
    requests = sum(p["requests"] for p in parts)
    p50, p99 = (float(v) for v in np.percentile(latencies, [50, 99])) if latencies.size else (float("nan"),) * 2
    cpu = sum((p.get("cpu_us_per_request") or 0.0) * p["requests"] for p in parts)
    throughput = requests / duration
    return {"clients": clients, "requests": requests, "failures": sum(p["failures"] for p in parts),
            "errors": [e for p in parts for e in p["errors"]][:3], "throughput_rps": round(throughput, 1),
            "p50_us": round(p50, 1), "p99_us": round(p99, 1),
            # Little's law: requests in flight on average; well under `clients` when the callers, not the server,
            # set the pace (each caller spends most of its loop outside the request)
            "in_flight": round(throughput * float(latencies.mean()) * 1e-6, 2) if latencies.size else 0.0,
            "load_cpu_us_per_request": round(cpu / requests, 1) if requests else None}


def load(args: list[str], clients: int, duration: float) -> dict[str, Any]:
    """`clients` HTTP callers over up to CLIENT_PROCESSES load processes, timed together; merged figures."""
    processes = min(clients, CLIENT_PROCESSES)
    shares = [clients // processes + (i < clients % processes) for i in range(processes)]
    return merged(started([[sys.executable, str(LOAD), *args, str(share), str(duration)] for share in shares],
                          duration), clients, duration)


def measure_run(models: dict[str, Path], duration: float, concurrency: tuple[int, ...], flip: bool = False
                ) -> dict[str, Any]:
    """One run: per model, the HTTP server both ways and the two in-process candidates, at every concurrency, each
    pair with an A/A twin of its baseline (a second `--max-batch 1` server, a second shared-Session process): how far
    two copies of one candidate read apart is this run's noise. The servers stay up through the run and each trio is
    timed back to back per concurrency (which goes first rotates with `flip` and the concurrency), so a phase of this
    host's speed falls on every side of a ratio alike."""
    run: dict[str, Any] = {}
    for name, model_dir in models.items():
        network = MODELS[name]
        spec, _ = request_spec(model_dir, network)
        spec_text = json.dumps(spec)
        http = (("http batcher", MAX_BATCH), ("http max-batch 1", 1), (AA_HTTP, 1))
        local = (("in-process Batcher", "batcher"), ("in-process shared Session", "session"), (AA_LOCAL, "session"))
        rows: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in (*http, *local)}
        servers: dict[str, tuple[subprocess.Popen[str], int]] = {}
        exits = {}
        try:
            for label, max_batch in http:
                servers[label] = start_server(model_dir, network, max_batch)
            for label, _ in http:  # untimed: a server's first seconds of load read slower than the rest
                load(["http", f"127.0.0.1:{servers[label][1]}", network, spec_text], WARM_CLIENTS, WARM_S)
            for index, clients in enumerate(concurrency):
                turn = (index + 2 * flip) % 3  # which candidate goes first rotates over the points and runs
                for label, _ in http[turn:] + http[:turn]:
                    rows[label].append(load(["http", f"127.0.0.1:{servers[label][1]}", network, spec_text], clients,
                                            duration))
                for label, mode in local[turn:] + local[:turn]:
                    rows[label].append(inproc(model_dir, network, spec_text, mode, clients, duration))
        finally:
            for label, (server, _) in servers.items():
                exits[label] = stop_server(server)
        rows["server_exit"] = exits  # type: ignore[assignment]
        run[name] = rows
        print(f"[bench-serving] {name}: " + "; ".join(
            f"{label} " + " ".join(f"{r['clients']}:{r['throughput_rps']:.0f}/s" for r in rows[label])
            for label in rows if label != "server_exit"), file=sys.stderr)
    return run


def inproc(model_dir: Path, network: str, spec_text: str, mode: str, threads: int, duration: float
           ) -> dict[str, Any]:
    """An in-process candidate: every thread in one fresh process (the point is the shared Session / Batcher)."""
    command = [sys.executable, str(LOAD), "inproc", str(model_dir), network, spec_text, str(threads), str(duration),
               mode, str(MAX_BATCH), str(MAX_WAIT_US)]
    return merged(started([command], duration), threads, duration)


def soak(model_dir: Path, network: str, seconds: float) -> dict[str, Any]:
    """SOAK_CLIENTS clients on the batcher for `seconds`: failures, and the server's RSS after a warm-up minute
    fraction against the end."""
    spec, _ = request_spec(model_dir, network)
    server, port = start_server(model_dir, network, MAX_BATCH)
    try:
        load(["http", f"127.0.0.1:{port}", network, json.dumps(spec)], SOAK_CLIENTS, min(5.0, seconds))  # warm
        before = rss_kib(server.pid)
        result = load(["http", f"127.0.0.1:{port}", network, json.dumps(spec)], SOAK_CLIENTS, seconds)
        after = rss_kib(server.pid)
    finally:
        exit_code = stop_server(server)
    return result | {"model": network, "seconds": seconds, "rss_start_kib": before, "rss_end_kib": after,
                     "rss_growth": round(after / before - 1, 4) if before else None, "server_exit": exit_code}


def checks() -> dict[str, Any]:
    """The malformed-request matrix and SIGTERM under load, by pytest (tests/serve)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/serve/test_malformed.py", "tests/serve/test_cli_serve.py::"
                           "test_sigterm_under_load_answers_what_was_accepted_and_exits_zero"],
                          capture_output=True, text=True, cwd=ROOT, env=env(), timeout=1800)
    tail = [line for line in done.stdout.splitlines() if line.strip()][-1:]
    return {"passed": done.returncode == 0, "summary": tail[0] if tail else f"exit {done.returncode}"}


def summarize(runs: list[dict[str, Any]], latencies: dict[str, float]) -> dict[str, Any]:
    """Medians over runs per (model, candidate, clients), and the done-when verdicts."""
    table: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for name in runs[0]:
        table[name] = {}
        for label, rows in runs[0][name].items():
            if label == "server_exit":
                continue
            table[name][label] = [{key: statistics.median(run[name][label][i][key] for run in runs)
                                   for key in ("throughput_rps", "p50_us", "p99_us", "in_flight")}
                                  | {"clients": row["clients"],
                                     "failures": sum(run[name][label][i]["failures"] for run in runs)}
                                  for i, row in enumerate(rows)]
    verdicts = {}

    def at(name: str, label: str, clients: int) -> dict[str, Any] | None:
        return next((r for r in table.get(name, {}).get(label, []) if r["clients"] == clients), None)

    def ratio(a: dict[str, Any], b: dict[str, Any]) -> float:
        return a["throughput_rps"] / b["throughput_rps"] if b["throughput_rps"] else float("nan")

    atari = [at("atari-cnn", label, 16) for label in ("http batcher", "http max-batch 1", "in-process Batcher",
                                                      "in-process shared Session")]
    twins = [at("atari-cnn", label, 16) for label in (AA_HTTP, AA_LOCAL)]
    if all(atari) and all(twins):
        http, inproc_ratio = ratio(atari[0], atari[1]), ratio(atari[2], atari[3])  # type: ignore[arg-type]
        aa_http, aa_local = ratio(twins[0], atari[1]), ratio(twins[1], atari[3])  # type: ignore[arg-type]
        verdicts["atari 16 HTTP clients: batcher / max-batch 1 >= 1.2 (A/A)"] = [
            round(http, 3), round(aa_http, 3), http >= 1.2]
        verdicts["atari 16 threads: Batcher / shared Session >= 1.5 (A/A)"] = [
            round(inproc_ratio, 3), round(aa_local, 3), inproc_ratio >= 1.5]
    policy = table.get("policy-value-heads", {})
    if policy:
        ratios = [ratio(b, o) for b, o in zip(policy["http batcher"], policy["http max-batch 1"])]
        twin_ratios = [ratio(t, o) for t, o in zip(policy[AA_HTTP], policy["http max-batch 1"])]
        noise = [max(t, 1 / t) for t in twin_ratios]
        verdicts["default policy: batcher / max-batch 1 >= 0.95 / A/A noise at every concurrency (A/A)"] = [
            [round(r, 3) for r in ratios], [round(t, 3) for t in twin_ratios],
            all(r >= 0.95 / n for r, n in zip(ratios, noise))]
        one, sixteen = at("policy-value-heads", "http batcher", 1), at("policy-value-heads", "http batcher", 16)
        if one and sixteen:
            bound = one["p99_us"] + MAX_WAIT_US + 2 * latencies["policy-value-heads"]
            # Little's law: 16 closed-loop callers wait 16 / throughput on average, so p99 cannot be below that
            floor = 16e6 / sixteen["throughput_rps"] if sixteen["throughput_rps"] else float("nan")
            verdicts["default policy: p99 at 16 <= p99 at 1 + max_wait + 2 max-shape latencies (mean wait at 16)"] = [
                [round(sixteen["p99_us"], 1), round(bound, 1)], [round(floor, 1)], sixteen["p99_us"] <= bound]
    return {"table": table, "verdicts": verdicts}


def markdown(result: dict[str, Any]) -> str:
    lines = ["### Serving (rlopt serve over HTTP, rlopt.Batcher in process; medians)", "",
             f"{result['runs']} runs of {result['duration_s']:g} s per point; batch-1 clients, closed loop; batcher "
             f"on = --max-batch {MAX_BATCH} --max-wait-us {MAX_WAIT_US:g}. Throughput in requests/s, p50/p99 in us.",
             "", "| model | candidate | " + " | ".join(f"{c} clients" for c in result["concurrency"]) + " |",
             "|---|---|" + "---|" * len(result["concurrency"])]
    for name, candidates in result["summary"]["table"].items():
        for label, rows in candidates.items():
            cells = [f"{r['throughput_rps']:.0f}/s, {r['p50_us']:.0f}/{r['p99_us']:.0f}"
                     + (f", {r['failures']} failed" if r["failures"] else "") for r in rows]
            lines.append(f"| {name} | {label} | " + " | ".join(cells) + " |")
    lines += ["", "| done-when check | measured | passed |", "|---|---|---|"]
    for check, (*values, passed) in result["summary"]["verdicts"].items():
        shown = ", ".join(str(v) for v in values)
        lines.append(f"| {check} | {shown} | {'yes' if passed else 'no'} |")
    soaked = result.get("soak")
    if soaked:
        growth = soaked["rss_growth"]
        lines.append(f"| {soaked['seconds']:g} s at {SOAK_CLIENTS} clients ({soaked['model']}): no failed request, "
                     f"RSS growth < 10% | {soaked['failures']} failed, RSS {soaked['rss_start_kib']} -> "
                     f"{soaked['rss_end_kib']} KiB ({growth:+.1%}) | "
                     f"{'yes' if soaked['failures'] == 0 and growth is not None and growth < 0.10 else 'no'} |")
    checked = result.get("checks")
    if checked:
        lines.append(f"| malformed requests (24 cases) and SIGTERM under load (tests/serve) | {checked['summary']} | "
                     f"{'yes' if checked['passed'] else 'no'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=None, help="R runs (default 3; --quick 1)")
    parser.add_argument("--duration", type=float, default=None, help="seconds per point (default 5; --quick 1)")
    parser.add_argument("--soak", type=float, default=None, help=f"soak seconds (default {SOAK_S:g}; --quick 5)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 run, short points, 1 and 16 clients")
    parser.add_argument("--no-checks", action="store_true", help="skip the pytest checks")
    parser.add_argument("--work-dir", type=Path, default=None, help="compiled MODEL_DIRs (reused when present)")
    args = parser.parse_args(argv)
    runs = args.runs or (1 if args.quick else 3)
    duration = args.duration or (1.0 if args.quick else 5.0)
    concurrency = (1, 16) if args.quick else CONCURRENCY
    work_dir = args.work_dir or Path(os.environ.get("TMPDIR", "/tmp")) / "rlopt-bench-serving"
    work_dir.mkdir(parents=True, exist_ok=True)
    models = {}
    for name in MODELS:
        model_dir = work_dir / name
        if not (model_dir / "manifest.json").is_file():
            print(f"[bench-serving] compiling {name}", file=sys.stderr)
            prepare(name, work_dir)
        models[name] = model_dir
    latencies = {name: request_spec(model_dir, MODELS[name])[1] for name, model_dir in models.items()}
    measured = [measure_run(models, duration, concurrency, flip=bool(run % 2)) for run in range(runs)]
    result: dict[str, Any] = {"kind": "rlopt-bench-serving", "runs": runs, "duration_s": duration,
                              "concurrency": list(concurrency), "max_shape_latency_us": latencies,
                              "per_run": measured, "summary": summarize(measured, latencies)}
    result["soak"] = soak(models["policy-value-heads"], MODELS["policy-value-heads"],
                          args.soak or (5.0 if args.quick else SOAK_S))
    if not args.no_checks:
        result["checks"] = checks()
    result["markdown"] = markdown(result)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
