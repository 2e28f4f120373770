"""What scripts/bench.py benches, each compiled once by the real CLI in a fresh process:
- the bundled recipes with their shipped tuning databases (`tuned`);
- users' models, untuned: architectures of the coverage matrix (tests/data/models/coverage.py) that TVM or
  ONNX Runtime serve, among them an SB3-style MLP actor-critic, an LSTM actor that feeds its state back, a GRU
  sequence encoder and an attention policy;
- a tiny PPO (CartPole, trained here offline in a few seconds) compiled from its zip (`rlopt compile agent.zip`);
- networks without a tuning database, where TVM runs on its schedule rules (scripts/bench_nets.py): an MLP grid
  (obs 4-376 x hidden 64-512, Tanh / ReLU / LayerNorm + SiLU) and the full-size NatureCNN (`nature-cnn-untuned`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = {"policy-value-heads": "policy_value_heads.yaml", "ppo-mlp": "ppo_mlp.yaml", "atari-cnn": "atari_cnn.yaml"}
DEFAULT_POLICY = ("policy-value-heads", "policy")  # its max shape's spread over runs is a done-when check
COVERAGE = ["sb3_mlp_actor_critic", "recurrent_ppo_lstm", "gru_cell_state", "gru_sequence_encoder",
            "decision_transformer", "maskable_ppo", "sac_squashed_gaussian", "embedding_ids", "layernorm_gelu_value"]
SB3_PPO = "sb3-ppo-cartpole"
NATURE_CNN_UNTUNED = "nature-cnn-untuned"
QUICK = ["ppo-mlp", "sb3_mlp_actor_critic", "gru_cell_state", SB3_PPO]
# OpenVINO, where installed: a peer the protocol judges `auto` against (Backend.bench_peer) and a candidate of auto
COVERAGE_BACKENDS = ["torchscript", "onnxruntime", "tvm"] + (["openvino"] if find_spec("openvino") else [])


@dataclass
class Model:
    """A compiled MODEL_DIR to bench; `recipe` is what eager needs to rebuild the module (None for a zip)."""

    name: str
    origin: str  # "bundled recipe", "coverage matrix" or "sb3 zip"
    tuned: bool
    model_dir: Path
    recipe: Path | None
    compile_s: float
    compile_exit: int
    compile_error: str | None = None
    tuning: str = "no"  # what the TVM builds applied: "yes", "borrowed from <cpu>" or "no"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "origin": self.origin, "tuned": self.tuned, "tuning": self.tuning,
                "model_dir": str(self.model_dir),
                "recipe": str(self.recipe) if self.recipe else None, "compile_s": round(self.compile_s, 2),
                "compile_exit": self.compile_exit, "compile_error": self.compile_error}


def untuned_models() -> list[str]:
    from bench_nets import mlp_grid

    return [*mlp_grid(), NATURE_CNN_UNTUNED]


def known_models() -> list[str]:
    return [*BUNDLED, *COVERAGE, SB3_PPO, *untuned_models()]


def rlopt_cli(*args: str, cwd: Path = ROOT, timeout_s: float = 1800) -> subprocess.CompletedProcess[str]:
    """This checkout's CLI in a fresh process."""
    env = dict(os.environ, COLUMNS="200",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "rlopt", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=timeout_s)


def _compile(name: str, origin: str, tuned: bool, source: Path, out: Path, recipe: Path | None, cwd: Path) -> Model:
    started = time.perf_counter()
    done = rlopt_cli("compile", str(source), "-o", str(out), "--json", "--no-cache", cwd=cwd)
    error = None
    if done.returncode not in (0, 1) or not (out / "manifest.json").is_file():
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        error = lines[-1] if lines else f"exit {done.returncode}"
    elif done.returncode == 1:
        error = "exit 1: a backend failed verification (benched without it; see its manifest.json)"
    tuning = tuning_applied(out)
    return Model(name, origin, tuning not in ("no", "rules"), out, recipe, time.perf_counter() - started,
                 done.returncode, error, tuning)


def tuning_applied(model_dir: Path) -> str:
    """The tuning database the MODEL_DIR's TVM builds applied (`facts.database`): "yes" when tuned for this CPU or one
    with its vector features, "borrowed from <cpu>" when another CPU's schedules were borrowed; without one, "rules"
    when TVM's schedule rules scheduled its kernels, else "no"."""
    try:
        networks = json.loads((model_dir / "manifest.json").read_text(encoding="utf-8"))["networks"]
    except (OSError, ValueError, KeyError):
        return "no"
    tvm_facts = [(net["artifacts"].get("tvm") or {}).get("facts", {}) for net in networks.values()]
    applied = [facts.get("database") or {} for facts in tvm_facts]
    if not applied or not all(db.get("found") for db in applied):
        ruled = any(build.get("rule_kernels") for facts in tvm_facts for build in facts.get("shape_builds", []))
        return "rules" if ruled else "no"
    borrowed = sorted({db["dir"].rsplit("/", 1)[-1].removeprefix("llvm-") for db in applied if db.get("borrowed")})
    return f"borrowed from {', '.join(borrowed)}" if borrowed else "yes"


def prepare(name: str, work_dir: Path) -> Model:
    """Compile model `name` (see known_models) under work_dir."""
    if name in BUNDLED:
        recipe = ROOT / "recipes" / BUNDLED[name]
        return _compile(name, "bundled recipe", True, recipe, work_dir / name, recipe, ROOT)
    if name in COVERAGE:
        return _compile(name, "coverage matrix", False, *_coverage_recipe(name, work_dir))
    if name in untuned_models():
        return _compile(name, "untuned", False, *_untuned_recipe(name, work_dir))
    if name == SB3_PPO:
        folder = work_dir / name
        folder.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        train_ppo(folder / f"{name}.zip")
        print(f"[bench] trained {name} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        return _compile(name, "sb3 zip", False, folder / f"{name}.zip", folder / "out", None, folder)
    raise SystemExit(f"bench.py: unknown model {name!r}; fix: one of {', '.join(known_models())}")


def _coverage_recipe(name: str, work_dir: Path) -> tuple[Path, Path, Path, Path]:
    """(recipe, MODEL_DIR, recipe, cwd) for a coverage architecture, written as scripts/coverage.py does."""
    import yaml

    sys.path.insert(0, str(ROOT))
    from tests.data.models.coverage import recipe_for

    folder = work_dir / name
    (folder / "models").mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "tests" / "data" / "models" / "coverage.py", folder / "models" / "coverage.py")
    recipe = folder / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(recipe_for(name, COVERAGE_BACKENDS), sort_keys=False))
    return recipe, folder / "out", recipe, folder


def _untuned_recipe(name: str, work_dir: Path) -> tuple[Path, Path, Path, Path]:
    """(recipe, MODEL_DIR, recipe, cwd) for a network of scripts/bench_nets.py, with no tuning database beside it."""
    import yaml
    from bench_nets import mlp_recipe, nature_cnn_recipe

    folder = work_dir / name
    (folder / "models").mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(__file__).with_name("bench_nets.py"), folder / "models" / "bench_nets.py")
    shutil.copy(ROOT / "recipes" / "models" / "atari.py", folder / "models" / "atari.py")
    document = nature_cnn_recipe(name) if name == NATURE_CNN_UNTUNED else mlp_recipe(name)
    document["backends"] = COVERAGE_BACKENDS
    recipe = folder / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(document, sort_keys=False))
    return recipe, folder / "out", recipe, folder


def train_ppo(zip_path: Path, timesteps: int = 256) -> None:
    """SB3 PPO MlpPolicy (its default [64, 64] nets) on CartPole-v1: a few seconds, offline, seeded."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.logger import Logger

    env = make_vec_env("CartPole-v1", n_envs=1, seed=0)
    model = PPO("MlpPolicy", env, seed=0, device="cpu", n_steps=128, batch_size=64, n_epochs=1)
    model.set_logger(Logger(None, []))  # SB3's default logger leaves an empty SB3-<time> folder in /tmp
    model.learn(timesteps)
    model.save(zip_path)
    env.close()


__all__ = ["BUNDLED", "COVERAGE", "DEFAULT_POLICY", "NATURE_CNN_UNTUNED", "QUICK", "SB3_PPO", "Model", "known_models",
           "prepare", "rlopt_cli", "train_ppo", "untuned_models"]
