"""kill -9 at any moment of a compile leaves the previous MODEL_DIR intact or none; concurrent compiles refuse.

Every compile here is a real `rlopt compile` process killed with SIGKILL, forked from the session's warm
interpreter (tests/cli_launcher.py), so a compile costs about a second instead of the seconds a fresh
interpreter spends importing torch; the stage cache is warm (the `launcher` fixture compiles the same recipe
first), so each kill point is a moment of the publish protocol reached within that second.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

import rlopt
from rlopt.errors import ArtifactError
from rlopt.verify import verify_model_dir
from tests import cli_launcher
from tests.conftest import CompileFactory, assert_one_line_error, tiny_recipe_text, write_tiny_recipe

# Kill points found by watching the staging directory: each is a moment inside a real compile.
KILL_POINTS = [
    "staging created",
    "policy/model.onnx",
    "policy/tvm-llvm.so",
    "value/reference.npz",
    "manifest.json",
]

@pytest.fixture(scope="module")
def launcher(compiled: CompileFactory) -> cli_launcher.Launcher:
    """The launcher, after one compile of the recipe these tests compile has warmed the session's stage cache
    (the cache keys of a stage differ with the backend set, so the all-backend `tiny_compiled` is not enough)."""
    compiled(tiny_recipe_text("[onnxruntime, tvm]"), name="tiny.yaml")
    return cli_launcher.launcher()


def _kill_when(proc: cli_launcher.Child, parent: Path, name: str, point: str, timeout: float = 240) -> bool:
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
def test_kill_during_first_compile_leaves_nothing_that_loads(launcher: cli_launcher.Launcher, tmp_path: Path, point: str) -> None:
    recipe = write_tiny_recipe(tmp_path, backends="[onnxruntime, tvm]")
    out = tmp_path / "out"
    killed = _kill_when(launcher.start("compile", str(recipe), "-o", str(out)), tmp_path, "out", point)
    if point == "manifest.json" and (not killed or out.exists()):
        # the manifest is written microseconds before the rename: the compile may win the race, before or after
        # the staging dir was seen; then the MODEL_DIR must be whole
        assert verify_model_dir(out).passed
    else:
        _assert_absent(out)


def test_kill_during_recompile_keeps_the_previous_model_dir(launcher: cli_launcher.Launcher, tiny_copy: Path,
                                                            tmp_path: Path) -> None:
    from rlopt.manifest import read_manifest

    before = read_manifest(tiny_copy).created_at
    recipe = write_tiny_recipe(tmp_path / "src", backends="[onnxruntime, tvm]")
    for point in ("policy/model.onnx", "value/tvm-llvm.so"):
        compile_ = launcher.start("compile", str(recipe), "-o", str(tiny_copy))
        assert _kill_when(compile_, tiny_copy.parent, tiny_copy.name, point)
        assert verify_model_dir(tiny_copy).passed
        assert read_manifest(tiny_copy).created_at == before
    leftovers = list(tiny_copy.parent.glob(f".{tiny_copy.name}.partial-*"))
    assert leftovers, "killed compiles leave hidden partial dirs (never loadable)"
    proc = launcher.run("compile", str(recipe), "-o", str(tiny_copy), "--backend", "onnxruntime")
    assert proc.returncode == 0, proc.stderr
    assert not list(tiny_copy.parent.glob(f".{tiny_copy.name}.partial-*")), "stale partials of dead pids are removed"
    assert set(read_manifest(tiny_copy).networks["policy"].artifacts) == {"onnxruntime"}


def test_second_concurrent_compile_refuses_and_stale_lock_is_recovered(launcher: cli_launcher.Launcher, tmp_path: Path) -> None:
    recipe = write_tiny_recipe(tmp_path, backends="[onnxruntime, tvm]")
    out = tmp_path / "out"
    first = launcher.start("compile", str(recipe), "-o", str(out))
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob(".out.partial-*")) and time.monotonic() < deadline:
            time.sleep(0.002)
        os.kill(first.pid, signal.SIGSTOP)  # hold the lock while the second compile asks for it
        second = launcher.run("compile", str(recipe), "-o", str(out))
        assert_one_line_error(second, 2, "another rlopt compile", f"pid {first.pid}", "fix:")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert (tmp_path / ".out.lock").exists(), "the killed holder left its lock file behind"
    third = launcher.run("compile", str(recipe), "-o", str(out), "--backend", "onnxruntime")
    assert third.returncode == 0, third.stderr
    assert verify_model_dir(out).passed
