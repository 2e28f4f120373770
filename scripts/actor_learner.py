"""An actor-learner loop on the default recipe's heads: the actor acts from a compiled MODEL_DIR while the
learner updates the policy; each iteration refits the weights (`rlopt.refit`) and the acting session picks
them up live (`Session.reload`).

The learner takes a real gradient step per iteration: a REINFORCE-style update of the policy head towards
actions with a random advantage, on random hidden states. The actor is a thread calling `Session.run` on a
batch of observations without pause. Per iteration it prints the refit time, the reload time and the actor's
calls/s over the iteration. Refits alternate between two MODEL_DIRs, so the one the session reads is never the
one being replaced.

usage: python scripts/actor_learner.py [--iterations 5] [--work-dir DIR] [--backend auto]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "policy_value_heads.yaml"


def compile_base(work_dir: Path) -> Path:
    """The default recipe with every backend that has a refit hook (see scripts/bench_refit.py)."""
    from rlopt.backends import BACKENDS
    from rlopt.compile import compile_recipe
    from rlopt.recipe import load_recipe

    backends = [name for name in load_recipe(RECIPE).backends if BACKENDS[name].refit is not None]
    result = compile_recipe(RECIPE, work_dir / "a", backends=backends)
    if not result.passed:
        raise SystemExit("compile failed: " + "; ".join(result.failures))
    return result.model_dir


class Learner:
    """The recipe's model and an SGD optimizer over its policy head."""

    def __init__(self) -> None:
        import torch

        from rlopt.recipe import load_recipe
        from rlopt.user_model import build_model

        self.torch = torch
        self.model, _ = build_model(load_recipe(RECIPE).model, RECIPE)
        self.optimizer = torch.optim.SGD(self.model.policy.parameters(), lr=0.05)
        self.generator = torch.Generator().manual_seed(0)

    def step(self, checkpoint: Path) -> float:
        torch = self.torch
        obs = torch.randn(8, 16, 768, generator=self.generator)
        logits = self.model.policy(obs)
        actions = torch.distributions.Categorical(logits=logits).sample()
        advantage = torch.randn(actions.shape, generator=self.generator)
        loss = -(torch.log_softmax(logits, -1).gather(-1, actions[..., None]).squeeze(-1) * advantage).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        torch.save(self.model.state_dict(), checkpoint)
        return float(loss.detach())


def main() -> None:
    import rlopt

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--backend", default="auto")
    args = parser.parse_args()
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="rlopt-actor-learner-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    current = compile_base(work_dir)
    learner = Learner()
    session = rlopt.load(current, "policy", backend=args.backend)
    feeds = {"input0": np.random.default_rng(0).standard_normal((4, 8, 768)).astype(np.float32)}
    calls, stop = [0], threading.Event()

    def act() -> None:
        while not stop.is_set():
            session.run(feeds)
            calls[0] += 1

    actor = threading.Thread(target=act)
    actor.start()
    print("iter  loss      refit_s  reload_ms  actor_calls/s  drift_kl")
    try:
        for iteration in range(1, args.iterations + 1):
            started, before = time.perf_counter(), calls[0]
            loss = learner.step(work_dir / "learner.pt")
            target = work_dir / ("b" if current.name == "a" else "a")
            refit_started = time.perf_counter()
            rlopt.refit(current, work_dir / "learner.pt", target)
            refit_s = time.perf_counter() - refit_started
            reload_started = time.perf_counter()
            session.reload(target)
            reload_ms = (time.perf_counter() - reload_started) * 1e3
            current = target
            rate = (calls[0] - before) / (time.perf_counter() - started)
            from rlopt.manifest import read_manifest

            drift = read_manifest(current).networks["policy"].drift
            print(f"{iteration:>4}  {loss:+.4f}  {refit_s:7.3f}  {reload_ms:9.1f}  {rate:13.0f}  "
                  f"{drift.kl_mean if drift else float('nan'):.2e}", flush=True)
    finally:
        stop.set()
        actor.join()
        session.close()


if __name__ == "__main__":
    main()
