"""reference.npz: recorded inputs at the min/opt/max shapes and PyTorch's outputs for them.

Keys are `<point>:in:<input>` and `<point>:out:<output>`, each stacked over samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from rlopt.errors import ArtifactError, RecipeError, first_line, located
from rlopt.recipe import InputSpec, NetworkSpec
from rlopt.runtime.outputs import flatten_outputs


def random_input(rng: np.random.Generator, spec: InputSpec, shape: list[int]) -> np.ndarray:
    dtype = np.dtype(spec.dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dtype == np.uint8:
        return rng.integers(0, 256, size=shape, dtype=np.uint8)
    if dtype.kind == "i":
        return rng.integers(0, 10, size=shape).astype(dtype)
    return rng.standard_normal(size=shape).astype(dtype)


@dataclass
class Reference:
    """Recorded inputs and outputs per profile point."""

    arrays: dict[str, np.ndarray]
    input_names: list[str]
    output_names: list[str]

    @property
    def points(self) -> list[str]:
        return list(dict.fromkeys(key.split(":")[0] for key in self.arrays))

    def samples(self, point: str) -> int:
        return int(self.arrays[f"{point}:in:{self.input_names[0]}"].shape[0])

    def feeds(self, point: str, index: int) -> dict[str, np.ndarray]:
        return {name: np.ascontiguousarray(self.arrays[f"{point}:in:{name}"][index]) for name in self.input_names}

    def outputs(self, point: str, index: int) -> list[np.ndarray]:
        return [self.arrays[f"{point}:out:{name}"][index] for name in self.output_names]

    def shape(self, point: str) -> dict[str, list[int]]:
        return {name: list(self.arrays[f"{point}:in:{name}"].shape[1:]) for name in self.input_names}

    def head(self, samples: int) -> Reference:
        """The first `samples` recorded samples of every point."""
        return Reference({key: value[:samples] for key, value in self.arrays.items()}, self.input_names,
                         self.output_names)

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


def record_reference(module: Any, spec: NetworkSpec, samples: int, seed: int, *, recipe_path: Path,
                     network: str) -> Reference:
    """Run the eager PyTorch module on random inputs at each profile point."""
    import torch

    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {}
    for point, shapes in spec.points().items():
        per_input: dict[str, list[np.ndarray]] = {name: [] for name in spec.inputs}
        per_output: dict[str, list[np.ndarray]] = {name: [] for name in spec.outputs}
        for _ in range(samples):
            feeds = {name: random_input(rng, s, shapes[name]) for name, s in spec.inputs.items()}
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
            for name in spec.inputs:
                per_input[name].append(feeds[name])
            for name, value in zip(spec.outputs, outputs):
                per_output[name].append(value.detach().numpy().copy())
        arrays.update({f"{point}:in:{n}": np.stack(v) for n, v in per_input.items()})
        arrays.update({f"{point}:out:{n}": np.stack(v) for n, v in per_output.items()})
    return Reference(arrays, list(spec.inputs), list(spec.outputs))
