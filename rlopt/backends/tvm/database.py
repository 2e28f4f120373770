"""The tuning database users commit: `<recipe>.tuning/<target key>/` next to the recipe.

Targets and their keys, the database folder, its meta.json, pruning to each kernel's best record,
applying it to a module, and the Workload (one network at one static shape) that is tuned and built.
MetaSchedule records carry no usable target check, so the folder is keyed by target kind and mcpu; another CPU's
database applies when its vector features match, and is borrowed (said so) when none does.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rlopt.errors import StageError, located
from rlopt.lazy import require
from rlopt.spec import NetworkSpec

TUNING_SUFFIX = ".tuning"
META_NAME = "meta.json"
WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
TUNING_EXTRAS = "pip install 'rlopt[tune]' (psutil, cloudpickle, tornado, xgboost-cpu)"
Shapes = dict[str, list[int]]


# ---------------------------------------------------------------- targets and keys

def host_cpu() -> str:
    """LLVM's name for this CPU (e.g. znver4), as TVM's own LLVM sees it."""
    codegen = require("tvm.target.codegen")
    return str(codegen.llvm_get_system_cpu())


def host_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_target(config_target: dict[str, Any]) -> dict[str, Any]:
    """The recipe's target completed for this host: llvm gets mcpu (detected) and num-cores.

    Keys the recipe gives win, so a fleet's CPU can be named explicitly ({kind: llvm, mcpu: skylake-avx512}).
    """
    target = dict(config_target)
    if target.get("kind") == "llvm":
        target.setdefault("mcpu", host_cpu())
        target.setdefault("num-cores", host_cores())
    return target


def target_key(target: dict[str, Any]) -> str:
    """The database folder for a target: what picks the code (kind, mcpu or arch), not the core count."""
    import re

    parts = [str(target.get("kind", "llvm"))] + [str(target[k]) for k in ("mcpu", "arch") if target.get(k)]
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(parts))


# What a tuned fp32 schedule depends on: the vector width and the FMA forms LLVM may use for it. Two CPUs with the
# same of these run each other's schedules alike (LLVM names; znver4, znver5 and icelake-server agree on them).
SCHEDULE_FEATURES = frozenset({"avx", "avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl", "neon", "sve"})


def schedule_features(mcpu: str) -> frozenset[str]:
    """The SCHEDULE_FEATURES LLVM gives an mcpu."""
    tvm = require("tvm")
    codegen = require("tvm.target.codegen")
    features = codegen.llvm_get_cpu_features(tvm.target.Target({"kind": "llvm", "mcpu": mcpu}))
    return frozenset(str(f) for f in features) & SCHEDULE_FEATURES


@dataclass
class DatabaseChoice:
    """The database folder a build applies, and why (for the manifest): exact CPU name, same features, borrowed
    from a CPU with other vector features, or none."""

    directory: Path
    found: bool
    reason: str
    borrowed: bool = False


def choose_database(recipe_path: Path, target: dict[str, Any]) -> DatabaseChoice:
    """`<recipe>.tuning/<kind-mcpu>/` when it exists; else, for an llvm target, a database tuned on a CPU with the
    same schedule features (its records are looked up by workload; the code is still generated for this target);
    else one tuned on the CPU that shares most of them, borrowed: fp32 schedules hold no vector instruction (LLVM
    splits a 16-lane loop into two 8-lane ones), so they run anywhere, and beat no schedule at all by far (the
    default policy at 1x1x768 on znver2: 21 us with znver5's schedules, 465 us without; the gate checks them and
    `auto` times them like any build)."""
    exact = database_dir(recipe_path, target)
    if exact.is_dir():
        return DatabaseChoice(exact, True, f"tuned for {target_key(target)}")
    mcpu = target.get("mcpu")
    candidates = sorted(p for p in tuning_root(recipe_path).glob("llvm-*") if p.is_dir()) \
        if target.get("kind") == "llvm" and mcpu else []
    if not candidates:
        return DatabaseChoice(exact, False, f"no database for {target_key(target)}")
    wanted = schedule_features(str(mcpu))
    others: list[tuple[int, str, Path, frozenset[str]]] = []
    for folder in candidates:
        tuned_for = str(read_meta(folder).get("target", {}).get("mcpu") or folder.name.removeprefix("llvm-"))
        have = schedule_features(tuned_for)
        if have == wanted:
            return DatabaseChoice(folder, True, f"tuned on {tuned_for}, which has the same vector features as "
                                                f"{mcpu} ({', '.join(sorted(have))})")
        others.append((-len(have & wanted), tuned_for, folder, have))
    _, tuned_for, folder, have = min(others, key=lambda other: other[:2])
    return DatabaseChoice(folder, True, f"no database for {target_key(target)}; borrowed the schedules tuned on "
                                        f"{tuned_for} ({tuned_for} has {', '.join(sorted(have ^ wanted))} where "
                                        f"{mcpu} differs): run 'rlopt tune' on this CPU for its own", borrowed=True)


def tuning_root(recipe_path: Path) -> Path:
    """`recipes/ppo_mlp.yaml` -> `recipes/ppo_mlp.tuning/` (committed next to the recipe)."""
    return recipe_path.with_name(recipe_path.stem + TUNING_SUFFIX)


def database_dir(recipe_path: Path, target: dict[str, Any]) -> Path:
    return tuning_root(recipe_path) / target_key(target)


def shape_key(shapes: Shapes) -> str:
    """`input0=1x1x768` (inputs in order, joined by ','): names a workload and a shape-bucket file."""
    return ",".join(f"{name}={'x'.join(str(d) for d in dims)}" for name, dims in shapes.items())


def file_slug(shapes: Shapes) -> str:
    """`1x1x768` for one input, `1x17_4x3` for several: safe in a file name."""
    return "_".join("x".join(str(d) for d in dims) for dims in shapes.values())


def profile_shapes(spec: NetworkSpec) -> list[tuple[list[str], Shapes]]:
    """Distinct static shapes of a network (min/opt/max, then its extra shapes), each with the points it serves."""
    from rlopt.spec import PROFILE_POINTS

    found: dict[tuple, tuple[list[str], Shapes]] = {}
    named = [(point, {name: s.dims(point) for name, s in spec.inputs.items()}) for point in PROFILE_POINTS]
    for point, shapes in [*named, *spec.points().items()]:
        key = tuple(tuple(v) for v in shapes.values())
        points = found.setdefault(key, ([], shapes))[0]
        if point not in points:
            points.append(point)
    return list(found.values())


# ---------------------------------------------------------------- the database

_OPENED: dict[tuple[str, int, int], Any] = {}


def forget_opened() -> None:
    """Drop the databases opened in this process (after tuning rewrote their files)."""
    _OPENED.clear()


def open_database(directory: Path, *, create: bool) -> Any | None:
    """The JSON database in `directory`, or None when there is none (and `create` is False).

    Parsing a shipped database takes ~1 s; compile opens it once per process while its files are unchanged.
    """
    ms = require("tvm.s_tir.meta_schedule")
    exists = (directory / WORKLOAD_FILE).is_file() and (directory / RECORD_FILE).is_file()
    if not exists and not create:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    if not create:
        key = (str(directory.resolve()), (directory / WORKLOAD_FILE).stat().st_mtime_ns,
               (directory / RECORD_FILE).stat().st_mtime_ns)
        if key in _OPENED:
            return _OPENED[key]
    try:
        database = ms.database.JSONDatabase(work_dir=str(directory), allow_missing=True)
        if not create:
            _OPENED[key] = database
        return database
    except Exception as exc:  # TVM raises ValueError/TVMError for unreadable or malformed records
        raise StageError(located(directory, WORKLOAD_FILE, f"not a readable MetaSchedule database "
                                 f"({str(exc).strip().splitlines()[-1]})",
                                 "delete the folder and run 'rlopt tune RECIPE' again")) from None


def read_meta(directory: Path) -> dict[str, Any]:
    path = directory / META_NAME
    if not path.is_file():
        return {}
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return document if isinstance(document, dict) else {}


def write_meta(directory: Path, target: dict[str, Any], cost_model: str, workloads: dict[str, Any]) -> None:
    from rlopt.lazy import version_of
    from rlopt.files import write_json

    meta = read_meta(directory)
    known = dict(meta.get("workloads", {}))
    known.update(workloads)
    write_json(directory / META_NAME, {
        "target": target, "apache-tvm": version_of("apache-tvm"), "cost_model": cost_model,
        "updated": datetime.now(timezone.utc).isoformat(timespec="seconds"), "workloads": known,
    })


def prune_records(directory: Path) -> tuple[int, int]:
    """Keep each workload's fastest record (MetaSchedule's own pruning rule: lowest mean run time).

    Compile applies only the best record per kernel; a full history parses in ~1.5 s, a pruned one in
    ~0.05 s, and a committed database stays small. The workload file (which records index) is untouched
    and the record file is replaced atomically. Returns (records before, records after).
    """
    import math

    path = directory / RECORD_FILE
    best: dict[int, tuple[float, str]] = {}
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for line in lines:
        try:
            workload, record = json.loads(line)
            times = [float(t) for t in record[1]]
        except (ValueError, TypeError, IndexError):
            continue  # a malformed line: TVM itself refuses it when the database opens
        mean = sum(times) / len(times) if times else math.inf
        if not math.isfinite(mean) or mean <= 0 or mean >= 1e9:
            continue  # failed builds and runs are recorded with huge or missing times
        if workload not in best or mean < best[workload][0]:
            best[workload] = (mean, line)
    kept = [best[w][1] for w in sorted(best)]
    if len(kept) < len(lines):
        from rlopt.files import atomic_write_text

        atomic_write_text(path, "".join(line + "\n" for line in kept))
    return len(lines), len(kept)


def apply_database(mod: Any, target: Any, database: Any) -> Any:
    """Replace every fused kernel that has a record with its tuned schedule (under 0.1 s)."""
    relax = require("tvm.relax")
    with target, database:
        return relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(mod)


# ---------------------------------------------------------------- workloads and tasks

@dataclass
class Workload:
    """One network at one static shape: the unit that is tuned and built."""

    network: str
    points: list[str]
    shapes: Shapes
    onnx_model: Any

    @property
    def key(self) -> str:
        return f"{self.network}[{shape_key(self.shapes)}]"
