"""`python -m rlopt ...` in its own process, forked from one warm interpreter instead of started cold.

A fresh interpreter spends seconds importing torch, ONNX, ONNX Runtime and TVM before the CLI does anything;
the test suite starts dozens. The launcher imports them once, then forks a child per command: a real process
with its own pid, environment, working directory, stdout, stderr and exit code, running `rlopt/__main__.py` as
`python -m rlopt` does. It ends with os._exit once its output is flushed: the normal shutdown would run C++
destructors that join thread pools which exist only in the launcher, and hang. A child that exits or is killed
is reaped at once (the launcher ignores SIGCHLD), so its pid is gone as a killed `python -m rlopt`'s would be.

What it cannot show is import-time behaviour: tests/test_dependencies.py starts its own interpreters for that,
and `RLOPT_TEST_FRESH_PROCESS=1` makes `run_rlopt` start a fresh interpreter for every command.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# One JSON request a line: {"argv", "env", "cwd", "log"}; the answer is the child's pid. The child writes
# stdout/stderr to <log>.out/.err and its exit code to <log>.rc, then leaves with os._exit.
# The server first forks away from the process pytest started, so it is nobody's child in the test session
# (tests check that pytest is left without child processes); it ends when its stdin closes.
_SERVER = r"""
import json, os, runpy, signal, sys
if os.fork():
    os._exit(0)
os.setsid()
import numpy, onnx, onnxruntime, torch, tvm
import rlopt.cli, rlopt.compile.driver, rlopt.compile.network, rlopt.user_model
import rlopt.compile.apart, rlopt.compile.latency, rlopt.compile.route_passes
rlopt.compile.latency.TIMING_BUDGET_S, rlopt.compile.route_passes.PASS_BUDGET_S = 0.02, 0.05  # conftest.QUICK_TIMING
rlopt.compile.apart.ENABLED = False
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
print("ready", os.getpid(), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()
    pid = os.fork()
    if pid:
        print(pid, flush=True)
        continue
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    log = request["log"]
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(os.open(log + ".out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
    os.dup2(os.open(log + ".err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = ["rlopt", *request["argv"]]
    code = 0
    try:
        runpy.run_module("rlopt", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, (int, type(None))):
            print(exc.code, file=sys.stderr)
    except BaseException:
        import traceback
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    with open(log + ".rc.tmp", "w") as f:
        f.write(str(code))
    os.rename(log + ".rc.tmp", log + ".rc")
    os._exit(code)
"""


class Child:
    """A forked `rlopt` command: Popen's pid / poll / wait / send_signal, and its output once it has exited."""

    def __init__(self, pid: int, log: str, args: list[str]) -> None:
        self.pid, self.log, self.args = pid, log, args

    def poll(self) -> int | None:
        try:
            os.kill(self.pid, 0)
            return None
        except ProcessLookupError:
            rc = Path(self.log + ".rc")
            return int(rc.read_text()) if rc.exists() else -signal.SIGKILL

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            time.sleep(0.003)
        return code

    def send_signal(self, sig: int) -> None:
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        """Wait (SIGKILL and TimeoutExpired past `timeout`, as subprocess.run does), then the captured output."""
        try:
            code = self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.wait()
            raise
        output = [Path(self.log + suffix).read_text(errors="replace") for suffix in (".out", ".err")]
        return subprocess.CompletedProcess(self.args, code, output[0], output[1])


class Launcher:
    """The warm interpreter; `start` forks a command and returns at once, `run` waits for it."""

    def __init__(self) -> None:
        self.logs = Path(tempfile.mkdtemp(prefix="rlopt-cli-"))
        self.count = 0
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, cwd=Path(__file__).resolve().parents[1])
        self.proc.wait()  # the first process exits at once, its forked server goes on with the same pipes
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline().split()
        if ready[:1] != ["ready"]:
            raise RuntimeError(f"the rlopt launcher did not start (said {ready!r}; see stderr above)")
        self.server = Child(int(ready[1]), "", ["rlopt launcher"])

    def start(self, *args: str, cwd: Path | str | None = None, env: dict[str, str] | None = None) -> Child:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.count += 1
        log = str(self.logs / f"{self.count}")
        request = {"argv": list(args), "env": dict(os.environ if env is None else env),
                   "cwd": str(cwd or os.getcwd()), "log": log}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return Child(int(self.proc.stdout.readline()), log, [sys.executable, "-m", "rlopt", *args])

    def run(self, *args: str, cwd: Path | str | None = None, env: dict[str, str] | None = None,
            timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        return self.start(*args, cwd=cwd, env=env).communicate(timeout)

    def alive(self) -> bool:
        try:
            os.kill(self.server.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.stdout.close()
        deadline = time.monotonic() + 30
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if self.alive():
            self.server.kill()
        import shutil

        shutil.rmtree(self.logs, ignore_errors=True)


_LAUNCHER: Launcher | None = None


def launcher() -> Launcher:
    """The session's launcher, started on first use (pytest_sessionfinish in conftest closes it)."""
    global _LAUNCHER
    if _LAUNCHER is None or not _LAUNCHER.alive():
        _LAUNCHER = Launcher()
    return _LAUNCHER


def close_launcher() -> None:
    global _LAUNCHER
    if _LAUNCHER is not None:
        _LAUNCHER.close()
        _LAUNCHER = None
