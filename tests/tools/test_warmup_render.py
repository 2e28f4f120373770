"""`rlopt warmup` rendering: the human report (readable when piped), the live display or plain progress lines."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from rlopt.render.warmup import LiveDisplay, PlainProgress, monitor_for
from rlopt.tools.warmup import LiveShape, LiveStatus
from tests.tools.common import TINY_PROFILE, run_piped, write_profile


def test_positional_model_dir_and_human_table(ort_copy: Path, tmp_path: Path) -> None:
    """Piped, with no COLUMNS: no live display on stderr, the report on stdout laid out at 100 columns."""
    profile = write_profile(tmp_path, TINY_PROFILE)
    proc = run_piped("warmup", str(ort_copy), "--profile", str(profile), "--duration", "1", "--backend",
                     "onnxruntime")
    assert proc.returncode == 0, proc.stderr
    assert "warmup policy on onnxruntime" in proc.stdout and "1x1x32" in proc.stdout
    assert "consistency: ok" in proc.stdout
    assert max(len(line) for line in proc.stdout.splitlines()) <= 100 and "…" not in proc.stdout, proc.stdout
    words = " ".join(proc.stdout.split())
    assert "steady state at " in words or "steady state not reached" in words, proc.stdout
    assert proc.stdout.endswith("\n") and "\x1b" not in proc.stdout + proc.stderr and "\r" not in proc.stderr
    progress = [line for line in proc.stderr.splitlines() if line.strip()]
    assert [line.split(": ", 1)[1] for line in progress if line.startswith("warmup ")][:2] == [
        "first calls", "under load from 2 thread(s) for 1 s"], progress
    assert all(line.startswith(("warmup policy on onnxruntime: ", "native library messages: ")) for line in progress)
    assert "shape" not in proc.stderr, "no live table on a pipe"


def status(phase: str, requests: int = 0) -> LiveStatus:
    return LiveStatus(phase, "policy", "tvm", 1.0, 2.0, 2, requests, 3, 0, [LiveShape("1x1x32", requests, 0.5, 0.1,
                                                                                       0.2)])


def test_a_console_that_is_not_a_terminal_gets_one_line_per_phase() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, width=80)
    monitor = monitor_for(console)
    assert isinstance(monitor, PlainProgress)
    with monitor:
        for phase, requests in [("first calls", 0), ("first calls", 0), ("under load", 5), ("under load", 9),
                                ("done", 12)]:
            monitor(status(phase, requests))
    assert buffer.getvalue().splitlines() == [
        "warmup policy on tvm: first calls",
        "warmup policy on tvm: under load from 2 thread(s) for 2 s",
        "warmup policy on tvm: done, 12 requests in 1.0 s, 3 probes, 0 diverged"]
    assert buffer.getvalue().endswith("\n")


def test_a_terminal_gets_the_live_table() -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    monitor = monitor_for(console)
    assert isinstance(monitor, LiveDisplay)
    with monitor:
        monitor(status("under load", 5))
    assert "p99 ms (last 2 s)" in console.file.getvalue()
