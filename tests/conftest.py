"""Shared fixtures: `compiled`, a session-wide compile factory, and the tiny recipe (same model code as the
default recipe, small dims) compiled through it.

A compile costs seconds to minutes; a test that only reads a MODEL_DIR asks `compiled(...)` for one and a
test that damages one copies it first (`copy_model_dir`, or the `tiny_copy` fixture).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import pytest

from tests import cli_launcher

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
TEST_MODELS = ROOT / "tests" / "data" / "models"
ALL_BACKENDS = "[torchscript, onnxruntime, tvm, tensorrt]"

TINY_RECIPE = """\
name: tiny-heads
model:
  factory: models/policy_heads.py:PolicyValueHeads
  kwargs: {{hidden: 32, width: 16, n_actions: 5}}
  seed: 3
networks:
  policy:
    module: policy
    kind: policy
    inputs:
      input0: {{dtype: float32, min: [1, 1, 32], opt: [2, 3, 32], max: [4, 6, 32]}}
    outputs: [logits]
  value:
    module: value
    kind: value
    inputs:
      input0: {{dtype: float32, min: [1, 1, 32], opt: [2, 3, 32], max: [4, 6, 32]}}
    outputs: [value]
backends: {backends}
verify:
  samples: 4
"""


@pytest.fixture(scope="session", autouse=True)
def private_stage_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tests (and the CLI subprocesses they start) use their own stage cache, never the user's; the workers of
    one pytest-xdist run share it (entries are renamed into place), so a compile one worker did is a hit.
    `auto` measures its routes in one pass ($RLOPT_ROUTE_PASSES)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = tmp_path_factory.getbasetemp().parent / "rlopt-cache"
        root.mkdir(exist_ok=True)
    else:
        root = tmp_path_factory.mktemp("rlopt-cache")
    os.environ["RLOPT_CACHE"] = str(root)
    # one pass of auto's route measurement per network (a test reads what a route records, not how stable it is);
    # tests of the passes themselves unset it
    os.environ["RLOPT_ROUTE_PASSES"] = "1"
    quick_timing()
    return root


QUICK_TIMING = {"rlopt.compile.latency.TIMING_BUDGET_S": 0.02, "rlopt.compile.route_passes.PASS_BUDGET_S": 0.05,
                "rlopt.compile.apart.ENABLED": False}


def quick_timing() -> None:
    """Compile's timing budgets, cut for the suite, and `auto`'s subjects timed in the compiling process instead of
    a worker each: a test reads what a latency or a route records, never how close it is to the truth
    (scripts/bench.py measures that with the shipped settings; tests/compile/test_rounds.py times apart). The
    launcher does the same."""
    import importlib

    for dotted, value in QUICK_TIMING.items():
        module, name = dotted.rsplit(".", 1)
        setattr(importlib.import_module(module), name, value)


def tiny_recipe_text(backends: str = ALL_BACKENDS, extra: str = "") -> str:
    """The tiny recipe's YAML; its model code is `models/policy_heads.py` beside the recipe."""
    return TINY_RECIPE.format(backends=backends) + extra


def write_tiny_recipe(folder: Path, backends: str = ALL_BACKENDS, extra: str = "", name: str = "tiny.yaml") -> Path:
    """A recipe in `folder` with the default recipe's model code copied beside it."""
    (folder / "models").mkdir(parents=True, exist_ok=True)
    shutil.copy(RECIPES / "models" / "policy_heads.py", folder / "models" / "policy_heads.py")
    path = folder / name
    path.write_text(tiny_recipe_text(backends, extra))
    return path


CompileFactory = Callable[..., Path]


@contextmanager
def _compile_lock(cache_root: Path, key: str) -> Iterator[None]:
    """Two pytest-xdist workers asking for the same compile: the second waits, then hits the shared stage cache."""
    with open(cache_root / f"compile-{key[:16]}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def compiled(tmp_path_factory: pytest.TempPathFactory, private_stage_cache: Path) -> CompileFactory:
    """`compiled(recipe, backends=None, name="recipe.yaml", files=None) -> MODEL_DIR`, one compile per session.

    `recipe` is a recipe file (a Path: compiled where it lies, so its model code and tuning database are
    found) or recipe text (a str: written as `name` beside copies of recipes/models/ and tests/data/models/,
    plus `files`, relative path -> text). The same (recipe content, backends, name, files) compiles once per
    session, in process, with the session's private stage cache; the MODEL_DIR is `<folder>/out`, next to
    the recipe. The compile must pass verification. Callers must not modify the result: copy it first.
    """
    from rlopt.compile.cache import StageCache
    from rlopt.compile import compile_recipe

    done: dict[str, Path] = {}

    def compile_once(recipe: Path | str, backends: Sequence[str] | None = None, *, name: str = "recipe.yaml",
                     files: dict[str, str] | None = None) -> Path:
        if isinstance(recipe, Path):
            identity = ["path", str(recipe.resolve()), recipe.read_text()]
        else:
            identity = ["text", recipe, name, *sorted((files or {}).items())]
        key = hashlib.sha256(repr((identity, list(backends or []))).encode()).hexdigest()
        if key not in done:
            with _compile_lock(private_stage_cache, key):
                done[key] = _compile_into(tmp_path_factory.mktemp("compiled"), recipe, backends, name, files)
        return done[key]

    def _compile_into(folder: Path, recipe: Path | str, backends: Sequence[str] | None, name: str,
                      files: dict[str, str] | None) -> Path:
        if isinstance(recipe, Path):
            path = recipe
        else:
            shutil.copytree(RECIPES / "models", folder / "models")
            shutil.copytree(TEST_MODELS, folder / "models", dirs_exist_ok=True)
            for relative, text in (files or {}).items():
                (folder / relative).parent.mkdir(parents=True, exist_ok=True)
                (folder / relative).write_text(text)
            path = folder / name
            path.write_text(recipe)
        result = compile_recipe(path, folder / "out", backends=list(backends) if backends else None,
                                cache=StageCache(private_stage_cache))
        assert result.passed, result.failures
        return result.model_dir

    return compile_once


def copy_model_dir(model_dir: Path, folder: Path, name: str = "model_dir") -> Path:
    """A private copy of a MODEL_DIR from `compiled` that a test may damage or recompile into."""
    target = folder / name
    shutil.copytree(model_dir, target)
    return target


@pytest.fixture(scope="session")
def tiny_compiled(compiled: CompileFactory) -> Path:
    """A MODEL_DIR compiled from the tiny recipe with every backend; tests must not modify it.

    The recipe is `tiny_compiled.parent / "tiny.yaml"`.
    """
    return compiled(tiny_recipe_text(), name="tiny.yaml")


@pytest.fixture()
def tiny_copy(tiny_compiled: Path, tmp_path: Path) -> Path:
    """A private copy of the compiled MODEL_DIR that a test may damage."""
    return copy_model_dir(tiny_compiled, tmp_path)


def tensorrt_missing() -> str | None:
    """Why TensorRT cannot build here; None on a machine with an NVIDIA GPU, TensorRT and a CUDA build of torch. A
    test expects a TensorRT artifact skipped with this reason, or built and verified, as the machine allows."""
    from rlopt.backends.tensorrt.gate import unavailable_reason

    return unavailable_reason()


def assert_tensorrt_as_this_machine_allows(record: Any) -> None:
    """A manifest's TensorRT record: skipped with the machine's reason, or (on a GPU machine) built and verified."""
    reason = tensorrt_missing()
    if reason is None:
        assert record.verified and record.path and record.path.endswith("model.plan"), record
    else:
        assert record.skipped == reason and record.path is None, record


def run_rlopt(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`python -m rlopt ARGS` in its own process, forked from a warm interpreter (tests/cli_launcher.py) unless
    RLOPT_TEST_FRESH_PROCESS=1 asks for a fresh interpreter each time."""
    env = dict(os.environ, COLUMNS="200")
    if os.environ.get("RLOPT_TEST_FRESH_PROCESS") == "1":
        return subprocess.run([sys.executable, "-m", "rlopt", *args], capture_output=True, text=True, cwd=cwd,
                              timeout=timeout, env=env)
    return cli_launcher.launcher().run(*args, cwd=cwd, env=env, timeout=timeout)


SLOW_TIMEOUT_S = 900  # a slow test (a MetaSchedule tune, a full-size recipe) may take minutes; a hang still fails


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Slow tests get SLOW_TIMEOUT_S unless they name their own limit; every other test has pyproject's `timeout`."""
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    cli_launcher.close_launcher()


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    """A user error: the contract's exit code, one line on stderr naming what is wrong, no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]
