"""`Backend`: everything rlopt knows about one backend, declared once in its package's `__init__.py`.

The generic layers (the compile engine, verification, `auto`, the manifest, the runtime, Triton, bench, warmup,
inspect) ask a backend's descriptor and never compare against its name. Importing a descriptor imports no backend
library: code is named by "module:attribute" paths, loaded when used.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any, Callable, Protocol

from pydantic import BaseModel

from rlopt.facts import ArtifactFacts

Table = Mapping[str, Mapping[str, float]]  # candidate -> shape label -> median latency in us


POOL_WORTH_US = 100.0  # one thread's CPU time per call from which a pool can gain: below it, a pool's edge is noise


def clearly_faster(challenger: float, holder: float, margin: float) -> bool:
    """Whether `challenger` beats `holder` by more than `margin` (challenger x (1 + margin) < holder): how `auto`
    lets one configuration or backend replace another at a shape, so timing noise alone never does."""
    return challenger * (1 + margin) < holder


def load_path(path: str) -> Any:
    """The attribute a "module:attribute" path names (its module imported now)."""
    module, attribute = path.split(":")
    return getattr(import_module(module), attribute)


@dataclass(frozen=True)
class TritonModel:
    """How Triton Inference Server serves a backend's artifact (model_config.proto).

    `platform` names Triton's platform (onnxruntime_onnx, pytorch_libtorch, tensorrt_plan), or `backend` a Triton
    backend that has no platform (Triton's own name for it); `filename` is the artifact's name in the version folder (its companion
    files, `ArtifactFacts.companion_files`, keep their own names beside it); `note` one comment line for
    config.pbtxt; `rules` the "module:function" path of a function (config, profiles) -> config that adds what this
    Triton backend needs beyond the generic config (rlopt.compile.triton.model_config: a dict, rlopt.pbtxt.Enum for
    enum values; profiles: rlopt.stages.profiles.ShapeProfiles), e.g. tensor names or an instance group.
    """

    filename: str
    platform: str = ""
    backend: str = ""
    note: str = ""
    rules: str | None = None

    def rules_function(self) -> Callable[[dict[str, Any], Any], dict[str, Any]] | None:
        return load_path(self.rules) if self.rules else None


@dataclass(frozen=True)
class TunedRoute:
    """A backend's choice among its configurations, per shape label (`AutoTuning.choose`): its rows of the alone and
    together tables as chosen, the facts its route opens it with given the labels routed to it, and why."""

    alone: Mapping[str, float]
    together: Mapping[str, float] | None
    options: Callable[[Collection[str]], dict[str, Any]]
    why: str = ""
    configurations: Mapping[str, str] = field(default_factory=dict)  # label -> the configuration chosen there


class AutoTuning(Protocol):
    """How `auto` measures a backend that has other configurations worth a session of their own (ONNX Runtime:
    one intra-op thread against its default pool)."""

    def variants(self, facts: Any, cores: int) -> dict[str, dict[str, Any]]:
        """The configurations to time besides the artifact's own: name -> facts update (none: {})."""
        ...

    def choose(self, alone: Table, together: Table | None, artifact_bytes: int,
               margins: Mapping[str, float] | None = None, cpu: Table | None = None,
               contended: bool = False) -> TunedRoute | None:
        """Per shape label, one configuration: `alone` / `together` map each configuration ('' for the artifact's
        own, else a `variants` name) to its latency per label; `margins[label]`: how much faster a configuration
        must be to count as faster (the measurement's noise); `cpu`: the CPU time per call of the configurations
        that compute on the calling thread alone; `contended`: other processes held a core while it was measured;
        None: keep the artifact's own everywhere."""
        ...


@dataclass(frozen=True)
class Backend:
    """One backend, declared once; every field but the first five has a default that means "nothing special".

    Identity and code:
    - `name` (the registry key, the recipe's and the manifest's name), `module` (its library's Python module:
      availability, import order), `runner` ("module:Class" of its `Runner`), `stages` ("module:Class" of its compile
      stages, run in order after the front end; the artifact is the last applicable one's).
    - `facts`: the typed model of what its build records (an ArtifactFacts subclass); `unavailable`, `threads` and
      the hooks below take it.
    - `config`: its recipe section's model (pydantic, extra keys refused), found in a recipe under `name`
      (rlopt.recipe.Recipe); None: no options.
    - `distributions`: its library's versions, as cache keys and manifests record them: (key, the pip distributions
      that provide it, the first installed counting), e.g. ("onnxruntime", ("onnxruntime", "onnxruntime-gpu")).
    Where it runs:
    - `unavailable(facts)`: None when its artifacts can run here, else one line saying why (the skip reason).
    - `build_unavailable(config)`: why this machine cannot build it (None: it can try); GEMM padding counts only
      backends that can.
    - `threads(facts)`: the threads it computes with (an int, or a line saying whose default).
    - `native`: its artifacts are native code, loaded from a checked private copy; `runtime_env`: settings under
      which its library loads only its runtime (processes that never compile, rlopt.backends.runtime_only_process).
    What the generic layers ask:
    - `pads_gemm(config)`: whether `pad_gemm: auto` pads the ONNX graph for it (its target's matrix units want aligned
      dims); None: it does not read the ONNX graph.
    - `triton`: how Triton serves its artifacts (None: not in MODEL_DIR/triton).
    - `refit`: "module:function" of its RefitHook (new weights without recompiling); None: `rlopt refit` refuses it.
    - `one_thread(facts)`: the facts to open a runner that computes on its calling thread alone (refit then gates it
      side by side, one per core); None: it cannot.
    - `no_spin(facts)`: the facts to open a runner whose idle pool threads sleep at once instead of spinning for the
      next call (`rlopt.load(..., spinning=False)`: a server, whose event loop and callers need the cores between
      calls); None: its pools do not spin, or cannot be told.
    - `timed_apart`: `auto` times it alone in a process of its own (a spinning pool beside other sessions reads
      slower than a session routed to it alone runs it); `auto`: "module:attribute" of its
      AutoTuning (configurations `auto` chooses between per shape); `pool_stalls`: its pool's fork-join waits for a
      fixed chunk per worker, so a call stalls while another process holds a worker's core: `auto` times and routes it
      only as `one_thread` opens it (required with it), which cannot stall; `holds_ties`: `auto` keeps every shape
      on it unless another backend is clearly faster there (ONNX Runtime: the peer users compare against, whose pool
      degrades to one thread's speed on a busy core instead of stalling); `bench_peer`: the project's bench
      (scripts/bench.py) judges `auto` against it too, as a peer users would pick instead (its best with ONNX
      Runtime's sessions), and `auto` lets it hold a route in place of the `holds_ties` backend where clearly
      better (`choose_route`'s rivals).
    - `upgrade_v1_facts(network facts)`: its own keys of a schema 1 manifest's network facts, moved into the current
      layout (removed from the dict, returned as `RoutePlan.options` of this backend).
    """

    name: str
    module: str
    runner: str
    unavailable: Callable[[Any], str | None]
    threads: Callable[[Any], int | str]
    stages: tuple[str, ...] = ()
    facts: type[ArtifactFacts] = ArtifactFacts
    config: type[BaseModel] | None = None
    distributions: tuple[tuple[str, tuple[str, ...]], ...] = ()
    build_unavailable: Callable[[Any], str | None] = lambda config: None
    native: bool = False
    runtime_env: tuple[tuple[str, str], ...] = ()
    pads_gemm: Callable[[Any], bool] | None = None
    triton: TritonModel | None = None
    refit: str | None = None
    one_thread: Callable[[Any], Any] | None = None
    no_spin: Callable[[Any], Any] | None = None
    timed_apart: bool = False
    auto: str | None = None
    pool_stalls: bool = False
    holds_ties: bool = False
    bench_peer: bool = False
    upgrade_v1_facts: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def runner_class(self) -> Any:
        return load_path(self.runner)

    def refit_hook(self) -> Any:
        return load_path(self.refit) if self.refit else None

    def auto_tuning(self) -> AutoTuning | None:
        return load_path(self.auto) if self.auto else None  # type: ignore[no-any-return]

    def route_update(self, facts: Any) -> dict[str, Any]:
        """The facts update an `auto` route opens it with whatever else the route decides: its `one_thread`
        configuration where its pool stalls (the keys it sets: those that change, and those off their default, so
        that the route reads the same whatever thread count the build measured), else none."""
        if not self.pool_stalls or self.one_thread is None:
            return {}
        current = facts.as_dict() if isinstance(facts, ArtifactFacts) else dict(facts)
        single = self.one_thread(facts)
        changed = single.as_dict() if isinstance(single, ArtifactFacts) else dict(single)
        blank = self.facts.model_construct()  # every field at its default: what `one_thread` sets shows as a change
        sets = {key for key, value in self.one_thread(blank).as_dict().items() if blank.as_dict().get(key) != value}
        return {key: value for key, value in changed.items() if current.get(key) != value or key in sets}


__all__ = ["AutoTuning", "Backend", "Table", "TritonModel", "TunedRoute", "clearly_faster", "load_path"]
