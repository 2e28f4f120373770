"""One count of usable cores; the load of other processes that a measurement competed with."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from rlopt.machine import OtherLoad, cpu_seconds, usable_core_ids, usable_cores


def test_usable_cores_follow_the_affinity_not_the_machine() -> None:
    assert usable_cores() == len(usable_core_ids()) >= 1
    if hasattr(os, "sched_getaffinity"):
        assert usable_core_ids() == set(os.sched_getaffinity(0))


@pytest.mark.skipif(cpu_seconds() is None, reason="no /proc/stat on this platform")
def test_other_load_counts_another_process_and_not_this_one() -> None:
    busy = "import time\nend = time.time() + 3\nwhile time.time() < end: pass"
    launcher = subprocess.run([sys.executable, "-c", "import subprocess, sys\n"
                               f"print(subprocess.Popen([sys.executable, '-c', {busy!r}], stdout=subprocess.DEVNULL, "
                               "stderr=subprocess.DEVNULL).pid)"],
                              capture_output=True, text=True, check=True)  # not our child: its parent has exited
    try:
        time.sleep(0.3)
        with OtherLoad() as beside_a_busy_process:
            time.sleep(1.0)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(launcher.stdout), signal.SIGKILL)
    assert beside_a_busy_process.cores is not None and beside_a_busy_process.cores >= 0.5
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
    subprocess.run([sys.executable, "-c", "import time\nend = time.process_time() + 0.5\n"
                    "while time.process_time() < end: pass"], check=True)
    after = cpu_seconds()
    assert before is not None and after is not None
    assert after[1] - before[1] >= 0.5, "the child's CPU counts as this process's own, not as another's load"
    running = subprocess.Popen([sys.executable, "-c", "import time\nend = time.process_time() + 0.5\n"
                                "while time.process_time() < end: pass\ntime.sleep(30)"])
    try:
        time.sleep(1.0)
        while_running = cpu_seconds()
        assert while_running is not None and while_running[1] - after[1] >= 0.4, "and so does a running child's"
    finally:
        running.kill()
        running.wait()
