"""One stage interface: a `Stage` declares what it reads and writes and implements one hook, `run(ctx)`.

Everything around a stage (timing, progress, skips, the stage cache and its keys) belongs to the
engine (rlopt/compile/engine.py). A stage reads its inputs from the per-network `Context` by
name and returns a `StageOutput`; the engine files its artifact under the stage's declared output.
The front end's stages are in `frontend.py`; each backend's in `rlopt/backends/<name>/stages.py`.
"""

from __future__ import annotations

import hashlib
import inspect
import sys
from dataclasses import dataclass, field
from functools import cached_property
from importlib import import_module
from pathlib import Path
from typing import Any, ClassVar

from rlopt.facts import Facts
from rlopt.spec import NetworkSpec, RecipeSpec


@dataclass
class StageOutput:
    """An artifact a stage wrote (or None) and its facts: the stage's `facts_model` where it declares one (a
    backend's build: its `Backend.facts`), else a dict the front end reads."""

    artifact: Path | None
    facts: Any = field(default_factory=dict)


@dataclass
class Context:
    """What one network's stages share: the recipe, where to write, and named artifacts with their cache keys.

    `artifacts` maps an artifact name (`model.ts`, `model.onnx`, `reference.npz`, a backend) to what
    a stage produced (usually a Path); `keys` maps the same name to its identity for cache keys
    downstream (a stage's cache key digest, or components such as {graph, weights}).
    `pad_multiple` is the multiple GEMM padding writes model.padded.onnx with (0: none) and `padded_for` the
    backends that read it where it was written: compile decides both from the backends' declarations.
    """

    recipe: RecipeSpec
    recipe_path: Path
    name: str
    spec: NetworkSpec
    staging: Path
    module: Any = None
    artifacts: dict[str, Any] = field(default_factory=dict)
    keys: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, StageOutput] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    stages: list[dict[str, Any]] = field(default_factory=list)
    pad_multiple: int = 0
    padded_for: frozenset[str] = frozenset()

    @property
    def dir(self) -> Path:
        return self.staging / self.name

    @property
    def scope(self) -> str:
        return f"{self.recipe.name}/{self.name}"

    @cached_property
    def reference(self) -> Any:
        """The recorded reference (`reference.npz`), read once."""
        from rlopt.reference import Reference

        return Reference.load(self.artifacts["reference.npz"], list(self.spec.inputs), list(self.spec.outputs))

    def onnx_for(self, backend: str) -> str:
        """The name of the ONNX artifact `backend` consumes: model.padded.onnx where it was written for `backend`."""
        on = backend in self.padded_for and self.artifacts.get("model.padded.onnx") is not None
        return "model.padded.onnx" if on else "model.onnx"


class Stage:
    """One step of compiling a network. Subclasses set the class attributes and implement `run`.

    - `name`: the stage's row in progress and in the manifest's `stages`.
    - `inputs` / `outputs`: artifact names in the Context it reads / the one it writes (`outputs[0]`).
    - `cached`: whether the engine may reuse its output from the stage cache.
    - `machine_dependent`: the output depends on this CPU (its identity joins the cache key).
    - `weights_dependent`: the output bakes the weights (their digest joins the key, not only the graph's).
    - `helpers`: modules besides the stage's own whose source is part of its code version.
    - `facts_model`: the typed model its output's facts are (rlopt.facts.Facts; a backend's build stage: its
      `Backend.facts`), so a cached output comes back typed; None: a dict.
    """

    name: ClassVar[str] = ""
    inputs: ClassVar[tuple[str, ...]] = ()
    outputs: ClassVar[tuple[str, ...]] = ()
    cached: ClassVar[bool] = False
    machine_dependent: ClassVar[bool] = False
    weights_dependent: ClassVar[bool] = True
    helpers: ClassVar[tuple[str, ...]] = ()
    facts_model: ClassVar[type[Facts] | None] = None

    @property
    def label(self) -> str:
        """The name shown and recorded; an instance may refine it (e.g. 'verify tvm')."""
        return self.name

    def config(self, ctx: Context) -> Any:
        """The slice of the recipe / network spec this stage reads (JSON-able); part of its cache key."""
        return None

    def applies(self, ctx: Context) -> bool:
        """False when the stage has nothing to do for this network (it is then not run nor reported)."""
        return True

    def cacheable(self, ctx: Context) -> bool:
        return self.cached

    def upstream(self, ctx: Context) -> dict[str, Any]:
        """The identities of the inputs this stage reads, for its cache key."""
        return {name: ctx.keys.get(name) for name in self.inputs}

    def run(self, ctx: Context) -> StageOutput:
        """The one hook: read inputs from `ctx`, write files under `ctx.dir`, return the artifact and facts."""
        raise NotImplementedError

    def detail(self, ctx: Context, out: StageOutput) -> str:
        """One line for progress once the stage finished."""
        return out.artifact.name if isinstance(out.artifact, Path) else ""

    def artifact_identity(self, ctx: Context, out: StageOutput) -> Any:
        """What identifies the artifact this stage produced, for the cache key of its verification; None: the bytes
        of its files. A stage whose file differs byte for byte between identical builds names what it is built
        from instead."""
        return None

    @classmethod
    def code_version(cls) -> str:
        """sha256 of the stage's own module and its declared helpers: editing other rlopt code keeps its entries."""
        return code_digest([cls.__module__, *cls.helpers])


def code_digest(modules: list[str]) -> str:
    digest = hashlib.sha256()
    for name in sorted(set(modules)):
        module = sys.modules.get(name) or import_module(name)
        try:
            source = inspect.getsource(module)
        except (OSError, TypeError):
            source = name
        digest.update(name.encode())
        digest.update(source.encode())
    return digest.hexdigest()


def package_digest(module: str) -> str:
    """sha256 of every source file of the package that holds `module` (read, not imported): a backend's runner and
    whatever it uses from its own package, for a verdict that must not outlive the code that ran it."""
    package = import_module(module.rsplit(".", 1)[0] if "." in module else module)
    folder = Path(inspect.getfile(package)).parent
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*.py")):
        digest.update(path.relative_to(folder).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def load_stage(path: str) -> type[Stage]:
    """A stage class from its "module:Class" path (imported only when the stage runs)."""
    module, attribute = path.split(":")
    stage = getattr(import_module(module), attribute)
    if not (isinstance(stage, type) and issubclass(stage, Stage)):
        raise TypeError(f"{path} is not a Stage")
    return stage


__all__ = ["Context", "Stage", "StageOutput", "code_digest", "load_stage", "package_digest"]
