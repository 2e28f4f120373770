"""kill -9 at any moment of a compile leaves the previous MODEL_DIR intact or none; concurrent compiles refuse.

Every compile here is a real `rlopt compile` process killed with SIGKILL. Each is forked from one warm process
(`launcher`) that imported rlopt and its heavy modules once, so a compile costs about a second instead of the
seconds every fresh interpreter spends importing torch; the session stage cache is warm (`tiny_compiled`), so
each kill point is a moment of the publish protocol reached within that second.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import rlopt
from rlopt.errors import ArtifactError
from rlopt.verify import verify_model_dir
from tests.conftest import assert_one_line_error, write_tiny_recipe

# Kill points found by watching the staging directory: each is a moment inside a real compile.
KILL_POINTS = [
    "staging created",
    "policy/model.onnx",
    "policy/tvm-llvm.so",
    "value/reference.npz",
    "manifest.json",
]

# Reads one JSON request a line ({"argv": [...], "log": prefix}), forks a child that runs rlopt's CLI on it with
# stdout/stderr in <prefix>.out/.err and its exit code in <prefix>.rc, and answers the child's pid.
# SIGCHLD is ignored here, so a child that exits or is killed is reaped at once: its pid is gone, as a
# killed `python -m rlopt` would be. The child restores SIGCHLD so its own subprocesses can be waited for.
LAUNCHER = r"""
import json, os, signal, sys
import numpy, onnx, onnxruntime, torch, tvm
import rlopt.cli, rlopt.compile.pipeline, rlopt.stages.load_model
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
print("ready", flush=True)
for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        prefix = request["log"]
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(os.open(prefix + ".out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
        os.dup2(os.open(prefix + ".err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        code = 0
        try:
            rlopt.cli.main(request["argv"])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            with open(prefix + ".rc.tmp", "w") as f:
                f.write(str(code))
            os.rename(prefix + ".rc.tmp", prefix + ".rc")
            os._exit(code)
    print(pid, flush=True)
"""


class Compile:
    """A forked `rlopt compile`: Popen's poll / wait / send_signal, and its output once it has exited."""

    def __init__(self, pid: int, log: Path, argv: list[str]) -> None:
        self.pid, self.log, self.argv = pid, log, argv

    def _alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def poll(self) -> int | None:
        if self._alive():
            return None
        rc = Path(f"{self.log}.rc")
        return int(rc.read_text()) if rc.exists() else -signal.SIGKILL

    def wait(self, timeout: float = 240) -> int:
        deadline = time.monotonic() + timeout
        while (code := self.poll()) is None:
            if time.monotonic() > deadline:
                self.send_signal(signal.SIGKILL)
                raise AssertionError(f"{self.argv} still running after {timeout} s")
            time.sleep(0.002)
        return code

    def send_signal(self, sig: int) -> None:
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def result(self) -> subprocess.CompletedProcess[str]:
        code = self.wait()
        return subprocess.CompletedProcess(self.argv, code, Path(f"{self.log}.out").read_text(),
                                           Path(f"{self.log}.err").read_text())


class Launcher:
    def __init__(self, logs: Path) -> None:
        self.logs, self.count = logs, 0
        env = dict(os.environ, COLUMNS="200")
        self.proc = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"

    def start(self, *args: str) -> Compile:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.count += 1
        log = self.logs / f"compile-{self.count}"
        argv = ["compile", *args]
        self.proc.stdin.write(json.dumps({"argv": argv, "log": str(log)}) + "\n")
        self.proc.stdin.flush()
        return Compile(int(self.proc.stdout.readline()), log, argv)

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.start(*args).result()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def launcher(tiny_compiled: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    """`tiny_compiled` warms the session's stage cache for the tiny recipe these compiles use."""
    launcher = Launcher(tmp_path_factory.mktemp("compile-logs"))
    yield launcher
    launcher.close()


def _kill_when(proc: Compile, parent: Path, name: str, point: str, timeout: float = 240) -> bool:
    """SIGKILL the compile as soon as `point` exists in its staging dir; False if it finished first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        for staging in parent.glob(f".{name}.partial-{proc.pid}-*"):
            if point == "staging created" or (staging / point).exists():
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return True
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    raise AssertionError(f"compile never reached {point}")


def _assert_absent(out: Path) -> None:
    assert not out.exists(), "a killed first compile must leave no MODEL_DIR"
    with pytest.raises(ArtifactError):
        rlopt.load(out, "policy")


@pytest.mark.parametrize("point", KILL_POINTS)
def test_kill_during_first_compile_leaves_nothing_that_loads(launcher: Launcher, tmp_path: Path, point: str) -> None:
    recipe = write_tiny_recipe(tmp_path, backends="[onnxruntime, tvm]")
    out = tmp_path / "out"
    if _kill_when(launcher.start(str(recipe), "-o", str(out)), tmp_path, "out", point):
        _assert_absent(out)
    else:  # the compile won the race (the manifest point is microseconds before the rename): it must be whole
        assert point == "manifest.json" and verify_model_dir(out).passed


def test_kill_during_recompile_keeps_the_previous_model_dir(launcher: Launcher, tiny_copy: Path,
                                                            tmp_path: Path) -> None:
    from rlopt.manifest import read_manifest

    before = read_manifest(tiny_copy).created_at
    recipe = write_tiny_recipe(tmp_path / "src", backends="[onnxruntime, tvm]")
    for point in ("policy/model.onnx", "value/tvm-llvm.so"):
        assert _kill_when(launcher.start(str(recipe), "-o", str(tiny_copy)), tiny_copy.parent, tiny_copy.name, point)
        assert verify_model_dir(tiny_copy).passed
        assert read_manifest(tiny_copy).created_at == before
    leftovers = list(tiny_copy.parent.glob(f".{tiny_copy.name}.partial-*"))
    assert leftovers, "killed compiles leave hidden partial dirs (never loadable)"
    proc = launcher.run(str(recipe), "-o", str(tiny_copy), "--backend", "onnxruntime")
    assert proc.returncode == 0, proc.stderr
    assert not list(tiny_copy.parent.glob(f".{tiny_copy.name}.partial-*")), "stale partials of dead pids are removed"
    assert set(read_manifest(tiny_copy).networks["policy"].artifacts) == {"onnxruntime"}


def test_second_concurrent_compile_refuses_and_stale_lock_is_recovered(launcher: Launcher, tmp_path: Path) -> None:
    recipe = write_tiny_recipe(tmp_path, backends="[onnxruntime, tvm]")
    out = tmp_path / "out"
    first = launcher.start(str(recipe), "-o", str(out))
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob(".out.partial-*")) and time.monotonic() < deadline:
            time.sleep(0.002)
        os.kill(first.pid, signal.SIGSTOP)  # hold the lock while the second compile asks for it
        second = launcher.run(str(recipe), "-o", str(out))
        assert_one_line_error(second, 2, "another rlopt compile", f"pid {first.pid}", "fix:")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert (tmp_path / ".out.lock").exists(), "the killed holder left its lock file behind"
    third = launcher.run(str(recipe), "-o", str(out), "--backend", "onnxruntime")
    assert third.returncode == 0, third.stderr
    assert verify_model_dir(out).passed
