"""One count of usable cores; the load of other processes that a measurement competed with."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlopt.machine import OtherLoad, cpu_seconds, usable_core_ids, usable_cores


def test_usable_cores_follow_the_affinity_not_the_machine() -> None:
    assert usable_cores() == len(usable_core_ids()) >= 1
    if hasattr(os, "sched_getaffinity"):
        assert usable_core_ids() == set(os.sched_getaffinity(0))


BURN = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass\n"


def _recording(readings: list[tuple[float, float]]):
    """cpu_seconds, with every reading kept: the test asserts on CPU seconds, never on how long anything took."""
    def read() -> tuple[float, float] | None:
        value = cpu_seconds()
        assert value is not None
        readings.append(value)
        return value
    return read


@pytest.mark.skipif(cpu_seconds() is None, reason="no /proc/stat on this platform")
def test_other_load_counts_another_process_and_not_this_one(tmp_path: Path) -> None:
    done = tmp_path / "burnt"
    burn = BURN + f"open({str(done)!r}, 'w').close()"
    readings: list[tuple[float, float]] = []
    with OtherLoad(read=_recording(readings), clock=iter([0.0, 1.0]).__next__) as load:
        # not our child: its parent has exited, so its 0.5 s of CPU is another process's load
        subprocess.run([sys.executable, "-c", "import subprocess, sys\n"
                        f"subprocess.Popen([sys.executable, '-c', {burn!r}], stdout=subprocess.DEVNULL, "
                        "stderr=subprocess.DEVNULL)"], check=True)
        while not done.exists():  # the grandchild has burnt its CPU (pytest's timeout bounds a hang)
            time.sleep(0.01)
    (machine_before, ours_before), (machine_after, ours_after) = readings
    tick = 1 / os.sysconf("SC_CLK_TCK")
    assert (machine_after - machine_before) - (ours_after - ours_before) >= 0.5 - 2 * tick
    assert load.cores is not None and load.cores >= 0.5 - 2 * tick, "cores = other CPU seconds / 1 s of clock"
    ours = OtherLoad(read=lambda: (10.0, 10.0), clock=iter([0.0, 1.0]).__next__)
    with ours:
        pass
    assert ours.cores == 0.0, "CPU this process used is not another's load"
    spinning = iter([(0.0, 0.0), (2.0, 1.5)])  # the machine used 2 s of CPU in 1 s, 1.5 s of it ours
    with OtherLoad(read=spinning.__next__, clock=iter([0.0, 1.0]).__next__) as load:
        pass
    assert load.cores == 0.5


@pytest.mark.skipif(cpu_seconds() is None, reason="no /proc/stat on this platform")
def test_a_child_this_process_waited_for_is_its_own_work() -> None:
    before = cpu_seconds()
    subprocess.run([sys.executable, "-c", BURN], check=True)
    after = cpu_seconds()
    assert before is not None and after is not None
    assert after[1] - before[1] >= 0.5, "the child's CPU counts as this process's own, not as another's load"
    running = subprocess.Popen([sys.executable, "-c", BURN + "print('burnt', flush=True)\ntime.sleep(30)"],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert running.stdout is not None and running.stdout.readline() == "burnt\n"  # 0.5 s of CPU used, still alive
        while_running = cpu_seconds()
        assert while_running is not None and while_running[1] - after[1] >= 0.5 - 2 / os.sysconf("SC_CLK_TCK"), \
            "and so does a running child's"
    finally:
        running.kill()
        running.wait()
