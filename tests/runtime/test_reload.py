"""Session.reload: a live swap to another MODEL_DIR's weights under load; incompatible dirs refused."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

import rlopt
from tests.conftest import write_tiny_recipe


def _compile(folder: Path, seed: int, extra_kwargs: str = "") -> Path:
    from rlopt.compile import compile_recipe

    recipe = write_tiny_recipe(folder, backends="[onnxruntime]")
    text = recipe.read_text().replace("seed: 3", f"seed: {seed}")
    if extra_kwargs:
        text = text.replace("n_actions: 5", extra_kwargs)
    recipe.write_text(text)
    result = compile_recipe(recipe, folder / "out")
    assert result.passed, result.failures
    return result.model_dir


@pytest.fixture(scope="module")
def two_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return (_compile(tmp_path_factory.mktemp("old"), 3), _compile(tmp_path_factory.mktemp("new"), 4))


FEEDS = {"input0": np.linspace(-1, 1, 2 * 3 * 32, dtype=np.float32).reshape(2, 3, 32)}


def _outputs(model_dir: Path, backend: str) -> np.ndarray:
    with rlopt.load(model_dir, "policy", backend=backend) as sess:
        return sess.run(FEEDS)["logits"]


@pytest.mark.parametrize("backend", ["onnxruntime", "auto"])
def test_reload_under_load(two_dirs: tuple[Path, Path], backend: str) -> None:
    old_dir, new_dir = two_dirs
    old, new = _outputs(old_dir, backend), _outputs(new_dir, backend)
    assert not np.array_equal(old, new)
    sess = rlopt.load(old_dir, "policy", backend=backend)
    stop, failures, seen = threading.Event(), [], {"old": 0, "new": 0}

    def loop() -> None:
        while not stop.is_set():
            try:
                got = sess.run(FEEDS)["logits"]
            except Exception as exc:  # noqa: BLE001 - any failure is a test failure
                failures.append(repr(exc))
                return
            if np.array_equal(got, old):
                seen["old"] += 1
            elif np.array_equal(got, new):
                seen["new"] += 1
            else:
                failures.append("an answer matching neither dir")
                return

    threads = [threading.Thread(target=loop) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        while seen["old"] < 50:
            pass
        sess.reload(new_dir)
        for _ in range(20):
            assert np.array_equal(sess.run(FEEDS)["logits"], new)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert failures == []
    assert seen["old"] >= 50
    sess.close()


def test_reload_refuses_an_incompatible_dir(two_dirs: tuple[Path, Path]) -> None:
    old_dir, new_dir = two_dirs
    with rlopt.load(old_dir, "policy", backend="onnxruntime") as sess:
        sess._reopen = lambda d: rlopt.load(d, "value", backend="onnxruntime")  # noqa: SLF001 - another network
        with pytest.raises(ValueError) as info:
            sess.reload(new_dir)
        message = str(info.value)
        assert "\n" not in message and "network 'value' is not 'policy'" in message
        assert np.array_equal(sess.run(FEEDS)["logits"], _outputs(old_dir, "onnxruntime"))  # still the old one
