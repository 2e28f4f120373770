"""reference.npz: recorded inputs at the min/opt/max shapes and PyTorch's outputs for them.

Keys are `<point>:in:<input>` and `<point>:out:<output>`, each stacked over samples. A network with
recurrent state adds, for steps k >= 1, `<point>:step<k>:in:<input>` (fresh observations; the state
inputs hold PyTorch's own fed-back state) and `<point>:step<k>:out:<output>`, and `meta:state`
(JSON of {input: output}). Older files without those keys read as before.
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from rlopt.arrays import flatten_outputs
from rlopt.errors import ArtifactError, RecipeError, first_line, located
from rlopt.lazy import require
from rlopt.spec import NetworkSpec


META_STATE = "meta:state"
DEFAULT_INTEGER_RANGE = (0, 9)
REFERENCE_BYTES = 50_000_000   # reference.npz stays under this: extra points (an agent's rollout) are subsampled


def evenly_spaced(count: int, keep: int) -> np.ndarray:
    """Indices of `keep` of `count` samples, spread evenly from the first to the last."""
    if keep <= 0 or count <= 0:
        return np.zeros(0, dtype=np.int64)
    return np.unique(np.linspace(0, count - 1, min(keep, count)).round().astype(np.int64))


def room_for(arrays: dict[str, np.ndarray], sample_bytes: int, budget: int | None = None) -> int:
    """How many more samples of `sample_bytes` fit beside `arrays` under `budget` (default REFERENCE_BYTES)."""
    budget = REFERENCE_BYTES if budget is None else budget
    used = sum(int(value.nbytes) for value in arrays.values())
    return max(0, (budget - used) // max(1, sample_bytes))


def is_mask(name: str, shape: list[int]) -> bool:
    """A bool input named like a mask, or shaped like one ([..., n] with n > 1 after a batch dim), is sampled
    with at least one True (legal action) per row: a row with no legal action is no policy input. A bool of
    shape [batch] (a flag such as `done`) is sampled freely."""
    return "mask" in name.lower() or (len(shape) >= 2 and shape[-1] > 1)


def random_input(rng: np.random.Generator, spec: Any, shape: list[int], *, name: str = "",
                 default_range: tuple[int, int] | None = None) -> np.ndarray:
    """Random values for one input: `spec` needs `.dtype` and may have `.range` (integers, inclusive)."""
    dtype = np.dtype(spec.dtype)
    if dtype == np.bool_:
        values = rng.integers(0, 2, size=shape).astype(np.bool_)
        if is_mask(name, list(shape)) and values.ndim and values.shape[-1]:
            rows = values.reshape(-1, values.shape[-1])
            pick = rng.integers(0, values.shape[-1], size=rows.shape[0])
            rows[np.arange(rows.shape[0]), pick] = True  # a row with no legal action is no policy input
            values = rows.reshape(values.shape)
        return values
    given = getattr(spec, "range", None)
    if dtype == np.uint8 and given is None:
        return rng.integers(0, 256, size=shape, dtype=np.uint8)
    if dtype.kind in "iu":
        lo, hi = given if given is not None else (default_range or DEFAULT_INTEGER_RANGE)
        return rng.integers(lo, hi, size=shape, endpoint=True).astype(dtype)
    return rng.standard_normal(size=shape).astype(dtype)


def embedding_range(module: Any) -> tuple[int, int] | None:
    """[0, num_embeddings - 1] of the first nn.Embedding in `module` (the table integer ids index), or None."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is needed to record at all
        return None
    for sub in module.modules():
        if isinstance(sub, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
            return (0, int(sub.num_embeddings) - 1)
    return None


@dataclass
class Reference:
    """Recorded inputs and outputs per profile point."""

    arrays: dict[str, np.ndarray]
    input_names: list[str]
    output_names: list[str]
    state: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.state and META_STATE in self.arrays:
            self.state = dict(json.loads(str(self.arrays[META_STATE])))
        if self.state:
            self.arrays[META_STATE] = np.array(json.dumps(self.state))

    @property
    def points(self) -> list[str]:
        return list(dict.fromkeys(key.split(":")[0] for key in self.arrays if not key.startswith("meta:")))

    def steps(self, point: str) -> int:
        """1 + the recorded extra steps at `point` (1 for a network without state)."""
        count = 1
        while f"{point}:step{count}:out:{self.output_names[0]}" in self.arrays:
            count += 1
        return count

    def step_feeds(self, point: str, index: int, step: int) -> dict[str, np.ndarray]:
        """Inputs of step `step` >= 1 (state inputs hold PyTorch's own fed-back state)."""
        return {name: np.ascontiguousarray(self.arrays[f"{point}:step{step}:in:{name}"][index])
                for name in self.input_names}

    def step_outputs(self, point: str, index: int, step: int) -> list[np.ndarray]:
        return [self.arrays[f"{point}:step{step}:out:{name}"][index] for name in self.output_names]

    def samples(self, point: str) -> int:
        return int(self.arrays[f"{point}:in:{self.input_names[0]}"].shape[0])

    def feeds(self, point: str, index: int) -> dict[str, np.ndarray]:
        return {name: np.ascontiguousarray(self.arrays[f"{point}:in:{name}"][index]) for name in self.input_names}

    def outputs(self, point: str, index: int) -> list[np.ndarray]:
        return [self.arrays[f"{point}:out:{name}"][index] for name in self.output_names]

    def shape(self, point: str) -> dict[str, list[int]]:
        return {name: list(self.arrays[f"{point}:in:{name}"].shape[1:]) for name in self.input_names}

    def head(self, samples: int, points: list[str] | None = None) -> Reference:
        """The first `samples` recorded samples of every point (or of `points` only)."""
        kept = set(self.points if points is None else points)
        return Reference({key: value if key.startswith("meta:") else value[:samples]
                          for key, value in self.arrays.items()
                          if key.startswith("meta:") or key.split(":")[0] in kept},
                         self.input_names, self.output_names, dict(self.state))

    def smallest_point(self) -> str:
        """The point whose inputs hold the fewest elements (its calls are the cheapest)."""
        return min(self.points, key=lambda point: sum(int(np.prod(shape)) for shape in self.shape(point).values()))

    def pairs(self) -> Iterator[tuple[str, dict[str, np.ndarray], list[np.ndarray]]]:
        for point in self.points:
            for index in range(self.samples(point)):
                yield point, self.feeds(point, index), self.outputs(point, index)

    def save(self, path: Path) -> None:
        with open(path, "wb") as handle:
            np.savez(handle, **self.arrays)

    @classmethod
    def load(cls, path: Path, input_names: list[str], output_names: list[str]) -> Reference:
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = {key: data[key] for key in data.files}
        except Exception as exc:  # numpy/zipfile raise several types for a corrupt archive
            raise ArtifactError(located(path, "", f"cannot read reference data ({exc})", "recompile MODEL_DIR")) from None
        return cls(arrays, input_names, output_names)


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """PyTorch on one intra-op thread while a reference is recorded or a gate runs: the batches are small, a
    reference must not depend on the thread count (kernels split sums by thread, so two compiles of the same
    weights would record different last bits), and on a shared machine two threads waiting on each other made
    the same work 5-10x slower. Restored after (it is process-wide). A process that has not imported torch runs
    no PyTorch code here and is left alone."""
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


FeedsOf = Callable[[int, int], dict[str, np.ndarray]]  # (sample, step) -> that call's inputs


def record_reference(module: Any, spec: NetworkSpec, samples: int, seed: int, *, recipe_path: Path,
                     network: str, steps: int = 4) -> Reference:
    """Run the eager PyTorch module on random inputs at each profile point.

    With recurrent `state`, each sample runs `steps` steps, PyTorch's own next state fed back.
    """
    rng = np.random.default_rng(seed)
    default_range = embedding_range(module)
    state = dict(spec.state)
    steps = steps if state else 1

    def fresh(shapes: dict[str, list[int]]) -> FeedsOf:
        return lambda sample, step: {name: random_input(rng, s, shapes[name], name=name, default_range=default_range)
                                     for name, s in spec.inputs.items()}

    plan = {point: (shapes, samples, steps, fresh(shapes)) for point, shapes in spec.points().items()}
    return _record(module, spec, state, plan, recipe_path=recipe_path, network=network)


def rerecord_reference(module: Any, spec: NetworkSpec, old: Reference, *, recipe_path: Path,
                       network: str) -> Reference:
    """PyTorch's outputs again on `old`'s inputs: a refit keeps its samples (rollout ones included) and records
    what the new weights give; with recurrent state, each later step gets the new weights' own fed-back state."""
    state = dict(old.state)

    def recorded(point: str) -> FeedsOf:
        return lambda sample, step: old.step_feeds(point, sample, step) if step else old.feeds(point, sample)

    plan = {point: ({name: list(old.arrays[f"{point}:in:{name}"].shape[1:]) for name in old.input_names},
                    old.samples(point), old.steps(point) if state else 1, recorded(point)) for point in old.points}
    meta = {key: value for key, value in old.arrays.items() if key.startswith("meta:")}
    return _record(module, spec, state, plan, recipe_path=recipe_path, network=network, arrays=meta)


def _record(module: Any, spec: NetworkSpec, state: dict[str, str],
            plan: dict[str, tuple[dict[str, list[int]], int, int, FeedsOf]], *, recipe_path: Path, network: str,
            arrays: dict[str, np.ndarray] | None = None) -> Reference:
    """PyTorch's outputs per point of `plan` (shapes, samples, steps, the feeds of (sample, step)); from step 1 on,
    each state input is PyTorch's own previous state output, checked to have the state input's shape."""
    import torch

    arrays = dict(arrays or {})
    with one_torch_thread():
        _record_points(torch, module, spec, state, plan, arrays, recipe_path=recipe_path, network=network)
    return Reference(arrays, list(spec.inputs), list(spec.outputs), state)


def _record_points(torch: Any, module: Any, spec: NetworkSpec, state: dict[str, str],
                   plan: dict[str, tuple[dict[str, list[int]], int, int, FeedsOf]], arrays: dict[str, np.ndarray], *,
                   recipe_path: Path, network: str) -> None:
    for point, (shapes, samples, steps, feeds_of) in plan.items():
        prefixes = [f"{point}:"] + [f"{point}:step{k}:" for k in range(1, steps)]
        per_input: dict[tuple[int, str], list[np.ndarray]] = {(k, n): [] for k in range(steps) for n in spec.inputs}
        per_output: dict[tuple[int, str], list[np.ndarray]] = {(k, n): [] for k in range(steps) for n in spec.outputs}
        for sample in range(samples):
            previous: dict[str, np.ndarray] = {}
            for k in range(steps):
                feeds = feeds_of(sample, k)
                for state_input, state_output in state.items():
                    if k:
                        feeds[state_input] = previous[state_output].astype(feeds[state_input].dtype)
                outputs = _run(torch, module, spec, feeds, recipe_path=recipe_path, network=network,
                               point=point, shapes=shapes)
                named = dict(zip(spec.outputs, outputs))
                for state_input, state_output in state.items():
                    if list(named[state_output].shape) != list(feeds[state_input].shape):
                        raise RecipeError(located(recipe_path, f"networks.{network}.state",
                                                  f"'{state_output}' has shape {list(named[state_output].shape)} "
                                                  f"at the {point} shape, but it feeds '{state_input}' "
                                                  f"{list(feeds[state_input].shape)}",
                                                  "pair each state input with the output of the same shape"))
                for name in spec.inputs:
                    per_input[(k, name)].append(feeds[name])
                for name in spec.outputs:
                    per_output[(k, name)].append(named[name])
                previous = named
        for (k, name), values in per_input.items():
            arrays[f"{prefixes[k]}in:{name}"] = np.stack(values)
        for (k, name), values in per_output.items():
            arrays[f"{prefixes[k]}out:{name}"] = np.stack(values)


def _run(torch: Any, module: Any, spec: NetworkSpec, feeds: dict[str, np.ndarray], *, recipe_path: Path,
         network: str, point: str, shapes: dict[str, list[int]]) -> list[np.ndarray]:
    try:
        with torch.inference_mode():
            result = module(*[torch.from_numpy(feeds[name]) for name in spec.inputs])
    except Exception as exc:  # the user's forward may raise anything
        first = first_line(exc)
        raise RecipeError(located(recipe_path, f"networks.{network}.inputs",
                                  f"the module's forward fails at the {point} shape {shapes}: {first}",
                                  "give input shapes and dtypes the module accepts")) from None
    outputs = flatten_outputs(result)
    if len(outputs) != len(spec.outputs) or not all(isinstance(o, torch.Tensor) for o in outputs):
        raise RecipeError(located(recipe_path, f"networks.{network}.outputs",
                                  f"the module returns {len(outputs)} output(s), the recipe names "
                                  f"{len(spec.outputs)} {spec.outputs}",
                                  "list one name per returned tensor, in order"))
    return [value.detach().numpy().copy() for value in outputs]


def add_rollout_point(reference: Reference, module: Any, feeds: dict[str, Any]) -> None:
    """Point `rollout` of reference.npz: the visited inputs and the eager module's outputs for each, as many as
    fit under REFERENCE_BYTES beside the random samples (evenly spaced along the rollout)."""
    torch = require("torch")

    if not feeds:
        return
    names, per_output = reference.input_names, {n: [] for n in reference.output_names}
    count = len(feeds[names[0]])
    with torch.inference_mode():
        first = flatten_outputs(module(*[torch.from_numpy(np.ascontiguousarray(feeds[n][0])) for n in names]))
    sample_bytes = sum(int(feeds[n][0].nbytes) for n in names) + sum(int(v.numpy().nbytes) for v in first)
    index = evenly_spaced(count, room_for(reference.arrays, sample_bytes))
    if not len(index):
        return
    feeds = {n: feeds[n][index] for n in names}
    for i in range(len(index)):
        with torch.inference_mode():
            result = flatten_outputs(module(*[torch.from_numpy(np.ascontiguousarray(feeds[n][i])) for n in names]))
        for name, value in zip(reference.output_names, result):
            per_output[name].append(value.detach().numpy().copy())
    for name in names:
        reference.arrays[f"rollout:in:{name}"] = np.ascontiguousarray(feeds[name])
    for name, values in per_output.items():
        reference.arrays[f"rollout:out:{name}"] = np.stack(values)
