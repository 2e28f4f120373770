"""`rlopt compile agent.zip` and `model: {sb3: ...}` recipes: compile, rollout facts, user errors (section 9)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
pytest.importorskip("sb3_contrib")

from tests.sb3.conftest import AGENTS, agent_files  # noqa: E402

FAST = ["--backend", "torchscript", "--backend", "onnxruntime", "--no-cache"]


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from rlopt.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(args)
    out, err = capsys.readouterr()
    code = exit_info.value.code
    return 0 if code is None else int(code), out, err


@pytest.mark.slow
def test_compile_ppo_zip_with_rollout(agents_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import os

    import gymnasium
    import yaml
    from stable_baselines3 import PPO

    import rlopt

    zip_path, _, env_id = agent_files(agents_dir, "ppo")
    out = tmp_path / "ppo"
    code, stdout, stderr = run_cli(["compile", str(zip_path), "-o", str(out), "--env", env_id, *FAST, "--json"], capsys)
    assert code == 0, stderr
    report = json.loads(stdout)
    assert report["passed"]
    stored = yaml.safe_load((out / "recipe.yaml").read_text())["model"]
    assert stored["sb3"] == os.path.relpath(zip_path, out)   # relative to MODEL_DIR: the folder can move
    rollout = report["manifest"]["networks"]["actor"]["facts"]["rollout"]
    assert set(rollout) == {"torchscript", "onnxruntime"}
    assert all(r["agreement"] == 1.0 and r["steps"] == 1000 for r in rollout.values())
    with np.load(out / "actor" / "reference.npz") as reference:   # the visited observations joined the reference
        assert reference["rollout:in:obs"].shape == (64, 1, 4)
    assert report["manifest"]["networks"]["actor"]["facts"]["rollout_reference"] == {
        "visited": 1000, "kept": 64, "max_samples": 64, "cap_bytes": 50_000_000,
        "bytes": (out / "actor" / "reference.npz").stat().st_size}
    assert any(s.startswith("rollout ") for s in report["manifest"]["networks"]["actor"]["artifacts"]
               ["onnxruntime"]["parity"]["shapes"])
    model = PPO.load(zip_path, device="cpu")
    obs, _ = gymnasium.make(env_id).reset(seed=3)
    session = rlopt.load(out, "actor")
    got = session.run({"obs": obs[None].astype(np.float32)})["action"]
    assert np.array_equal(got[0], model.predict(obs, deterministic=True)[0])


@pytest.mark.slow
def test_recipe_with_sb3_model(agents_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    import yaml

    zip_path, _, env_id = agent_files(agents_dir, "dqn")
    (tmp_path / "agents").mkdir()
    shutil.copy(zip_path, tmp_path / "agents" / "dqn.zip")
    recipe = {"name": "dqn", "model": {"sb3": "agents/dqn.zip"},
              "networks": {"actor": {"module": "actor", "kind": "generic",
                                     "inputs": {"obs": {"dtype": "float32", "min": [1, 4], "opt": [8, 4],
                                                        "max": [16, 4]}},
                                     "outputs": ["action"]}},
              "verify": {"rollout": {"env": env_id, "steps": 200, "seed": 0}}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    code, stdout, stderr = run_cli(["compile", str(path), "-o", str(tmp_path / "out"), *FAST, "--json"], capsys)
    assert code == 0, stderr
    rollout = json.loads(stdout)["manifest"]["networks"]["actor"]["facts"]["rollout"]
    assert all(r["passed"] and r["steps"] == 200 for r in rollout.values())


@pytest.mark.slow
def test_vecnormalize_agent(agents_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    zip_path, pkl, env_id = agent_files(agents_dir, "a2c_vecnorm")
    assert pkl is not None
    out = tmp_path / "a2c"
    code, stdout, stderr = run_cli(["compile", str(zip_path), "-o", str(out), "--vecnormalize", str(pkl),
                                    "--env", env_id, *FAST, "--json"], capsys)
    assert code == 0, stderr
    assert "vecnormalize:" in (out / "recipe.yaml").read_text()
    rollout = json.loads(stdout)["manifest"]["networks"]["actor"]["facts"]["rollout"]
    assert all(r["passed"] and not r["discrete"] and r["max_abs_diff"] <= 1e-4 for r in rollout.values())


@pytest.mark.slow
def test_compile_zip_generates_a_movable_recipe(agents_dir: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    import os
    import shutil

    import gymnasium
    import yaml

    import rlopt

    zip_path, _, env_id = agent_files(agents_dir, "ppo")
    project = tmp_path / "project"
    (project / "agents").mkdir(parents=True)
    shutil.copy(zip_path, project / "agents" / "ppo.zip")
    out = project / "artifacts" / "ppo"
    code, _, stderr = run_cli(["compile", str(project / "agents" / "ppo.zip"), "-o", str(out), "--backend",
                               "onnxruntime", "--no-cache"], capsys)
    assert code == 0, stderr
    assert yaml.safe_load((out / "recipe.yaml").read_text())["model"]["sb3"] == "../../agents/ppo.zip"
    moved = tmp_path / "elsewhere"
    shutil.move(str(project), moved)   # a moved project recompiles from the MODEL_DIR's own recipe
    recipe = moved / "artifacts" / "ppo" / "recipe.yaml"
    code, _, stderr = run_cli(["compile", str(recipe), "-o", str(moved / "again"), "--backend", "onnxruntime",
                               "--no-cache"], capsys)
    assert code == 0, stderr
    again = yaml.safe_load((moved / "again" / "recipe.yaml").read_text())["model"]["sb3"]
    assert again == "../agents/ppo.zip" and os.path.isfile(moved / "again" / again)
    obs, _ = gymnasium.make(env_id).reset(seed=3)
    from stable_baselines3 import PPO

    expected = PPO.load(zip_path, device="cpu").predict(obs, deterministic=True)[0]
    got = rlopt.load(moved / "again", "actor").run({"obs": obs[None].astype(np.float32)})["action"]
    assert np.array_equal(got[0], expected)


@pytest.mark.slow  # a rollout compile of a second agent: ~2-4 s
def test_rollout_in_a_recipe_names_the_backend_that_disagrees(agents_dir: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The default suite's one compile of an agent: 100 rollout steps; onnxruntime is wrong in the rollout only."""
    import shutil

    import yaml

    import rlopt.backends

    real = rlopt.backends.RUNNERS["onnxruntime"]

    def wrong(path: Path, names: list[str], facts: Any) -> Any:
        return WrongAction(real(path, names, facts)) if _in_rollout() else real(path, names, facts)

    monkeypatch.setattr(rlopt.backends, "RUNNERS", {**rlopt.backends.RUNNERS, "onnxruntime": wrong})
    zip_path, _, env_id = agent_files(agents_dir, "ppo")
    shutil.copy(zip_path, tmp_path / "ppo.zip")
    recipe = {"name": "ppo", "model": {"sb3": "ppo.zip"},
              "networks": {"actor": {"module": "actor", "kind": "generic",
                                     "inputs": {"obs": {"dtype": "float32", "min": [1, 4], "opt": [4, 4],
                                                        "max": [8, 4]}},
                                     "outputs": ["action"]}},
              "verify": {"samples": 4, "rollout": {"env": env_id, "steps": 100, "seed": 0}}}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    out = tmp_path / "out"
    code, stdout, stderr = run_cli(["compile", str(tmp_path / "recipe.yaml"), "-o", str(out), *FAST, "--json"],
                                   capsys)
    assert code == 1
    assert "actor/onnxruntime: rollout:" in stderr and "actions differ from predict" in stderr
    assert "actor/torchscript: rollout" not in stderr
    facts = json.loads(stdout)["manifest"]["networks"]["actor"]["facts"]
    assert facts["rollout"]["torchscript"]["passed"] and facts["rollout"]["torchscript"]["steps"] == 100
    assert not facts["rollout"]["onnxruntime"]["passed"]
    assert facts["rollout_reference"]["visited"] == 100 and facts["rollout_reference"]["kept"] == 64
    with np.load(out / "actor" / "reference.npz") as reference:   # the visited observations joined the reference
        assert reference["rollout:in:obs"].shape == (64, 1, 4)
    stored = yaml.safe_load((out / "recipe.yaml").read_text())
    assert stored["model"]["sb3"] == "../ppo.zip"   # relative to MODEL_DIR: the folder moves with its agent
    moved = tmp_path.parent / f"{tmp_path.name}-moved"
    shutil.move(str(tmp_path), moved)
    from rlopt.compile.sources import Sb3Source
    from rlopt.recipe import load_recipe

    source = Sb3Source(load_recipe(moved / "out" / "recipe.yaml"), moved / "out" / "recipe.yaml")
    source.load()
    assert source.agent.zip_path.resolve() == (moved / "ppo.zip").resolve()


@pytest.mark.parametrize("case", ["missing", "not_zip", "env_on_yaml", "unknown_env"])
def test_user_errors_are_one_line_exit_2(case: str, agents_dir: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    zip_path, _, _ = agent_files(agents_dir, "ppo")
    bogus = tmp_path / "bogus.zip"
    bogus.write_text("not a zip")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: x\n")
    args = {"missing": [str(tmp_path / "nope.zip")], "not_zip": [str(bogus)],
            "env_on_yaml": [str(recipe), "--env", "CartPole-v1"],
            "unknown_env": [str(zip_path), "--env", "NoSuchEnv-v9"]}[case]
    code, _, stderr = run_cli(["compile", *args, "-o", str(tmp_path / "out"), *FAST], capsys)
    assert code == 2, stderr
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr
    assert stderr.strip().startswith("rlopt: error:")


class WrongAction:
    """A test double: the real runner, with every action shifted by one."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.input_names = inner.input_names

    def infer(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        outputs = self._inner.infer(feeds)
        return [(outputs[0] + 1) % 2, *outputs[1:]]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.mark.slow
def test_disagreeing_backend_fails_named(agents_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    import rlopt.backends

    real = rlopt.backends.RUNNERS["onnxruntime"]

    def wrong(path: Path, names: list[str], facts: Any) -> Any:   # parity sees the real one, the rollout this
        return WrongAction(real(path, names, facts)) if _in_rollout() else real(path, names, facts)

    monkeypatch.setattr(rlopt.backends, "RUNNERS", {**rlopt.backends.RUNNERS, "onnxruntime": wrong})
    zip_path, _, env_id = agent_files(agents_dir, "ppo")
    code, _, stderr = run_cli(["compile", str(zip_path), "-o", str(tmp_path / "out"), "--env", env_id, *FAST],
                              capsys)
    assert code == 1
    assert "actor/onnxruntime: rollout:" in stderr and "actions differ from predict" in stderr
    assert "actor/torchscript: rollout" not in stderr


def _in_rollout() -> bool:
    import inspect

    return any(frame.function == "rollout_failures" for frame in inspect.stack())


SLOW_AGENTS = ["ppo", "a2c_vecnorm", "sac", "td3", "dqn", "recurrent", "maskable", "cnn", "dict"]


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW_AGENTS)
def test_every_algorithm_compiles_from_its_zip(name: str, agents_dir: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    zip_path, pkl, env_id = agent_files(agents_dir, name)
    args = ["compile", str(zip_path), "-o", str(tmp_path / name), "--env", env_id, "--no-cache", "--json"]
    if pkl is not None:
        args += ["--vecnormalize", str(pkl)]
    code, stdout, stderr = run_cli(args, capsys)
    report = json.loads(stdout)
    assert code == 0 and report["failures"] == [], stderr
    manifest = report["manifest"]
    rollout = manifest["networks"]["actor"]["facts"]["rollout"]
    built = [b for b, r in manifest["networks"]["actor"]["artifacts"].items()
             if r.get("skipped") is None and r.get("parity") and r["parity"]["passed"]]
    assert set(rollout) == set(built) and rollout
    for report in rollout.values():
        assert report["passed"] and report["steps"] == 1000
        assert report["discrete"] or report["max_abs_diff"] <= 1e-4
    assert AGENTS[name]


@pytest.mark.parametrize("model", ["{factory: 'm:f', sb3: a.zip}", "{}", "{factory: 'm:f', vecnormalize: s.pkl}",
                                   "{sb3: missing.zip}"])
def test_model_section_errors(model: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: x\nmodel: {model}\nnetworks:\n  actor:\n    module: actor\n    inputs:\n"
                      "      obs: {dtype: float32, min: [1, 4], opt: [1, 4], max: [1, 4]}\n    outputs: [action]\n")
    code, _, stderr = run_cli(["compile", str(recipe), "-o", str(tmp_path / "out"), *FAST], capsys)
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "model" in lines[0] and "Traceback" not in stderr


@pytest.mark.slow
def test_recurrent_ppo_actor_builds_on_tvm_and_follows_predict_over_a_rollout(
        agents_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    zip_path, _, env_id = agent_files(agents_dir, "recurrent")
    code, stdout, stderr = run_cli(["compile", str(zip_path), "-o", str(tmp_path / "out"), "--env", env_id,
                                    "--backend", "tvm", "--no-cache", "--json"], capsys)
    assert code == 0, stderr
    actor = json.loads(stdout)["manifest"]["networks"]["actor"]
    tvm = actor["artifacts"]["tvm"]
    assert tvm.get("skipped") is None and tvm["parity"]["passed"], tvm
    assert actor["facts"]["rollout"]["tvm"]["passed"] and actor["facts"]["rollout"]["tvm"]["steps"] == 1000
