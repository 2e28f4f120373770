"""`rlopt.load` and `Session` (contract section 5). Reads only manifest.json; imports no compile code."""

from __future__ import annotations

import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from rlopt.errors import ArtifactError, UsageError, located
from rlopt.manifest import (
    MANIFEST_NAME,
    BackendRecord,
    FileRecord,
    InputProfile,
    Manifest,
    NetworkRecord,
    checked_file,
    checked_private_copy,
    read_manifest,
    shape_label,
)
from rlopt.backends import BACKENDS, Runner, open_runner, unavailable_reason
from rlopt.backends.tvm.runner import bucket_files, gate_passed, padding_plan

KNOWN_BACKENDS: tuple[str, ...] = tuple(BACKENDS)


def check_feeds(feeds: dict[str, Any], profiles: dict[str, InputProfile]) -> dict[str, np.ndarray]:
    """Inputs must match names, dtype, rank and every dim in [min, max]; else a ValueError naming the input."""
    if not isinstance(feeds, dict):
        raise ValueError(f"Session.run takes a dict of input name -> numpy array, got {type(feeds).__name__}")
    unknown = sorted(set(feeds) - set(profiles))
    missing = sorted(set(profiles) - set(feeds))
    if unknown or missing:
        raise ValueError(
            f"inputs {sorted(feeds)} do not match the network's inputs {sorted(profiles)}"
            + (f"; unknown: {unknown}" if unknown else "")
            + (f"; missing: {missing}" if missing else "")
        )
    checked: dict[str, np.ndarray] = {}
    for name, profile in profiles.items():
        value = feeds[name]
        if not isinstance(value, np.ndarray):
            raise ValueError(f"input '{name}': expected a numpy array, got {type(value).__name__}")
        expected = np.dtype(profile.dtype)
        if value.dtype != expected:
            order = " (big-endian)" if value.dtype.byteorder == ">" else ""
            raise ValueError(
                f"input '{name}': dtype {value.dtype.str}{order} but the network takes {profile.dtype}; "
                f"fix: x.astype(np.{profile.dtype})"
            )
        if value.ndim != len(profile.min):
            raise ValueError(
                f"input '{name}': rank {value.ndim} (shape {list(value.shape)}) but the network takes rank "
                f"{len(profile.min)}, between {profile.min} and {profile.max}"
            )
        for axis, (dim, lo, hi) in enumerate(zip(value.shape, profile.min, profile.max)):
            if not lo <= dim <= hi:
                raise ValueError(
                    f"input '{name}': shape {list(value.shape)} is outside the compiled profile: dim {axis} is "
                    f"{dim}, allowed [{lo}, {hi}] (min {profile.min}, max {profile.max})"
                )
        checked[name] = value if value.flags.c_contiguous else np.ascontiguousarray(value)
    return checked


ShapeKey = tuple[tuple[int, ...], ...]
FAST_PATH_ENTRIES = 256
SWITCH_MARGIN = 0.85  # another backend takes a shape from auto's leader only when at least 15% faster there


class Session:
    """A loaded network. `run` checks inputs first, so a bad shape never reaches a backend.

    Each (shape, dtype) combination is checked in full the first time it is seen and then remembered
    with the backend call that serves it, so a steady stream of requests costs one dict lookup.
    `backend` is the backend for the opt shape; `routes` says which backend serves which shape.
    """

    def __init__(self, runners: dict[str, Runner], routes: dict[ShapeKey, str], fallback: str, network: str,
                 record: NetworkRecord) -> None:
        self._runners = runners
        self._routes = routes
        self._fallback = fallback
        self.network = network
        self.inputs: dict[str, InputProfile] = dict(record.inputs)
        self.outputs: list[str] = list(record.outputs)
        self._names = list(record.inputs)
        opt = tuple(tuple(p.opt) for p in self.inputs.values())
        self.backend = routes.get(opt, fallback)
        self._fast: dict[tuple[Any, ...], Any] = {}
        self._local = threading.local()  # per thread: signature -> the runner's bound call (or None)

    @property
    def routes(self) -> dict[str, str]:
        """Backend per profile shape ('2x8x768' style keys) and for every other shape ('other')."""
        table = {shape_label(key): name for key, name in self._routes.items()}
        return table | {"other": self._fallback}

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        bound = getattr(self._local, "bound", None)
        try:
            arrays = [feeds[name] for name in self._names]
            key = tuple([(a.shape, a.dtype) for a in arrays if type(a) is np.ndarray and a.flags.c_contiguous])
            if len(feeds) == len(arrays):
                direct = bound.get(key) if bound is not None else None
                if direct is not None:
                    return direct(arrays)  # type: ignore[no-any-return]
                call = self._fast.get(key)
            else:
                call = None
        except (KeyError, TypeError):
            call = None
        if call is None:
            checked = check_feeds(feeds, self.inputs)
            arrays = [checked[name] for name in self._names]
            key = tuple([(a.shape, a.dtype) for a in arrays])
            call = self._ordered_call(self._runner_for(tuple(a.shape for a in arrays)))
            if all(a is feeds[n] for a, n in zip(arrays, self._names)) and len(self._fast) < FAST_PATH_ENTRIES:
                self._fast[key] = call
        outputs = dict(zip(self.outputs, call(arrays, key)))
        if key in self._fast and (bound is None or key not in bound):
            self._bind(key)
        return outputs

    def _bind(self, key: tuple[Any, ...]) -> None:
        """Once per thread and signature, after its first call: the runner's call for it as one function to the
        named outputs, when the runner has one (TVM's KernelChain)."""
        if not hasattr(self._local, "bound"):
            self._local.bound = {}
        self._local.bound[key] = self._runner_for(tuple(shape for shape, _ in key)).bound_call(key, self.outputs)

    def _runner_for(self, shapes: ShapeKey) -> Runner:
        return self._runners[self._routes.get(shapes, self._fallback)]

    def _ordered_call(self, runner: Runner) -> Callable[[list[np.ndarray], tuple[Any, ...]], list[np.ndarray]]:
        """The runner's call on inputs in input order and their ((shape, dtype), ...) signature."""
        return runner.infer_ordered

    def close(self) -> None:
        for runner in self._runners.values():
            runner.close()
        self._fast, self._local = {}, threading.local()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Session(network={self.network!r}, backend={self.backend!r})"


def ranked_backends(record: NetworkRecord) -> list[str]:
    """Verified backends, fastest first at the opt shape (the manifest's `selected` leads)."""

    def opt_p50(name: str) -> float:
        latency = record.artifacts[name].latency_us.get("opt")
        return latency.p50 if latency else float("inf")

    verified = sorted((n for n, r in record.artifacts.items() if r.verified), key=opt_p50)
    if record.selected in verified:
        verified.remove(record.selected)
        verified.insert(0, record.selected)
    return verified


def unbucketed_variant(facts: dict[str, Any]) -> str | None:
    """The path of an artifact with per-shape builds (TVM) that serves every other shape: 'padded' once the parity
    gate passed it and every shape in [min, max] pads into some build, else 'dynamic'; None without such builds."""
    builds = facts.get("shape_builds")
    if not builds:
        return None
    plan = padding_plan(builds, list(builds[0].get("shapes", {})))
    return "padded" if gate_passed(facts, "padded") and plan is not None and plan.covers_range else "dynamic"


def unbucketed_p50(artifact: BackendRecord) -> float:
    """Latency at the opt shape through the code path that serves shapes without their own build.

    TVM serves profile shapes from tuned per-shape libraries and every other shape from its dynamic library, or,
    once the parity gate passed padding and every shape pads into some build, from a bigger build padded with
    zeros; compile times each path separately (`facts.variant_latency_us`); unmeasured = never picked.
    """
    variant = unbucketed_variant(artifact.facts)
    if variant is not None:
        value = artifact.facts.get("variant_latency_us", {}).get(variant, {}).get("opt")
        return float(value) if value else float("inf")
    latency = artifact.latency_us.get("opt")
    return latency.p50 if latency else float("inf")


@dataclass(frozen=True)
class AutoPlan:
    """What `auto` loads: a backend per measured shape, one for every other shape, and whether ONNX Runtime may
    spin (only when it is the session's only backend: its spinning pool starves another backend's threads)."""

    routes: dict[ShapeKey, str]
    fallback: str
    onnxruntime_spinning: bool


def _best_routes(record: NetworkRecord, usable: list[str], quiet_ort: bool) -> tuple[dict[ShapeKey, str], str]:
    ort = record.artifacts.get("onnxruntime")
    quiet: dict[str, float] = ort.facts.get("latency_without_spinning_us", {}) if quiet_ort and ort else {}

    def p50(name: str, point: str) -> float:
        if name == "onnxruntime" and point in quiet:
            return float(quiet[point])
        return record.artifacts[name].latency_us[point].p50

    points = list(dict.fromkeys(p for name in usable for p in record.artifacts[name].latency_us))
    everywhere = [p for p in points if all(p in record.artifacts[name].latency_us for name in usable)]

    def overall(name: str) -> float:
        """Geometric mean p50 over the shapes every usable backend was timed at (scale-free across shapes)."""
        return float(np.exp(np.mean([np.log(max(p50(name, p), 1e-9)) for p in everywhere])))

    # the leader is the best backend over the whole profile: one shape's short compile-time timing (opt's, say,
    # hit by a descheduled thread) must not hand every close shape to another backend
    leader = min(usable, key=lambda name: (overall(name), usable.index(name))) if everywhere else usable[0]

    def pick(candidates: list[str], cost: Callable[[str], float]) -> str:
        """The fastest, but the leader keeps a shape unless another backend is clearly faster: compile-time
        timings are short, and every extra backend in a session costs (see AutoPlan)."""
        best = min(candidates, key=lambda name: (cost(name), usable.index(name)))
        if leader in candidates and best != leader and not cost(best) < SWITCH_MARGIN * cost(leader):
            return leader
        return best

    routes: dict[ShapeKey, str] = {}
    for point in points:
        measured = [name for name in usable if point in record.artifacts[name].latency_us]
        if measured:
            best = pick(measured, lambda name: p50(name, point))
            shape = record.artifacts[best].latency_us[point].shape
            routes.setdefault(tuple(tuple(int(d) for d in shape[n]) for n in record.inputs), best)
    timed = {name: unbucketed_p50(record.artifacts[name]) for name in usable}
    if "onnxruntime" in timed and "opt" in quiet:
        timed["onnxruntime"] = float(quiet["opt"])
    fallback = pick(usable, lambda name: timed[name])
    if timed[fallback] == float("inf"):
        fallback = usable[0]
    return routes, fallback


def auto_routes(record: NetworkRecord, usable: list[str]) -> AutoPlan:
    """`auto`: per measured shape the usable backend with the lowest p50 there, for other shapes the lowest
    `unbucketed_p50`; a backend takes a shape from the leader (lowest geometric-mean p50 over the shapes) only when
    more than 15% faster there. Only verified backends that can run here (`usable`, best first) count. When that
    mixes ONNX Runtime with another backend, ORT runs without spinning and the routes are re-chosen with its latency
    so."""
    routes, fallback = _best_routes(record, usable, quiet_ort=False)
    chosen = set(routes.values()) | {fallback}
    if "onnxruntime" in chosen and len(chosen) > 1:
        routes, fallback = _best_routes(record, usable, quiet_ort=True)
        chosen = set(routes.values()) | {fallback}
    return AutoPlan(routes, fallback, onnxruntime_spinning=chosen == {"onnxruntime"} or "onnxruntime" not in chosen)


def usable_backends(manifest: Manifest, model_dir: Path, network: str) -> list[str]:
    """Verified backends that can run on this machine, `selected` first, then by opt latency."""
    record = manifest.network(network, model_dir)
    usable, reasons = [], []
    for name in ranked_backends(record):
        reason = unavailable_reason(name, record.artifacts[name].facts)
        if reason is None:
            usable.append(name)
        else:
            reasons.append(f"{name}: {reason}")
    if not usable:
        raise ArtifactError(
            located(model_dir / MANIFEST_NAME, f"networks.{network}", "no verified backend can run on this machine"
                    + (f" ({'; '.join(reasons)})" if reasons else ""), "recompile on this machine")
        )
    return usable


def resolve_backend(manifest: Manifest, model_dir: Path, network: str, backend: str) -> str:
    record = manifest.network(network, model_dir)
    if backend == "auto":
        return usable_backends(manifest, model_dir, network)[0]
    if backend not in KNOWN_BACKENDS:
        raise UsageError(f"backend '{backend}' is unknown; fix: use auto or one of {', '.join(KNOWN_BACKENDS)}")
    artifact = record.artifacts.get(backend)
    if artifact is None:
        raise ArtifactError(located(model_dir / MANIFEST_NAME, f"networks.{network}.artifacts",
                                    f"backend '{backend}' was not compiled", "add it to the recipe's backends"))
    if artifact.skipped:
        raise ArtifactError(located(model_dir / MANIFEST_NAME, f"networks.{network}.artifacts.{backend}",
                                    f"skipped at compile time: {artifact.skipped}", "use another backend or auto"))
    if artifact.facts.get("verified") is False:
        raise ArtifactError(located(model_dir / MANIFEST_NAME, f"networks.{network}.artifacts.{backend}",
                                    f"built but never verified: {artifact.facts.get('not_verified')}",
                                    "recompile MODEL_DIR on a machine that can run it"))
    if not artifact.verified:
        raise ArtifactError(located(model_dir / MANIFEST_NAME, f"networks.{network}.artifacts.{backend}",
                                    "failed verification at compile time", "fix the parity failure and recompile"))
    return backend


def open_artifact(model_dir: Path, backend: str, artifact: BackendRecord, input_names: list[str]) -> Runner:
    """Open a backend's artifact after its sha256 matches; native code is loaded from a checked private copy."""
    if BACKENDS[backend].native:
        with tempfile.TemporaryDirectory(prefix="rlopt-load-") as private:
            for extra in bucket_files(artifact.facts):  # TVM's per-shape libraries travel with the main one
                checked_private_copy(model_dir, FileRecord.model_validate(extra), Path(private))
            return open_runner(backend, checked_private_copy(model_dir, artifact, Path(private)), input_names,
                               artifact.facts)
    return open_runner(backend, checked_file(model_dir, artifact), input_names, artifact.facts)


def load(model_dir: str | Path, network: str, backend: str = "auto") -> Session:
    """Load one network of a compiled MODEL_DIR; the artifact's sha256 is checked before it is opened."""
    model_dir = Path(model_dir)
    manifest = read_manifest(model_dir)
    spinning = True
    if backend == "auto":
        record = manifest.network(network, model_dir)
        plan = auto_routes(record, usable_backends(manifest, model_dir, network))
        routes, fallback, spinning = plan.routes, plan.fallback, plan.onnxruntime_spinning
    else:
        fallback = resolve_backend(manifest, model_dir, network, backend)
        record, routes = manifest.networks[network], {}
    runners: dict[str, Runner] = {}
    try:
        for name in dict.fromkeys([fallback, *routes.values()]):
            artifact = record.artifacts[name]
            if name == "onnxruntime" and not spinning:
                artifact = artifact.model_copy(update={"facts": {**artifact.facts, "allow_spinning": False}})
            runners[name] = open_artifact(model_dir, name, artifact, list(record.inputs))
    except BaseException:
        for runner in runners.values():
            runner.close()
        raise
    return Session(runners, routes, fallback, network, record)


__all__ = ["Session", "load", "open_artifact", "check_feeds", "ranked_backends", "auto_routes", "AutoPlan",
           "KNOWN_BACKENDS"]
