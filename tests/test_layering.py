"""Layering: with each package as one node, imports run one way down the layer order (ARCHITECTURE.md) and no
package cycle exists; stage work modules do not import each other, backends do not import each other, the runtime
and the runners reach no compile code, and no module import cycle exists (imports inside functions count)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "rlopt"
COMPILE_CODE = ("rlopt.compile", "rlopt.stages", "rlopt.backends.tvm.tuning", "rlopt.backends.tvm.database",
                "rlopt.tools.tune", "rlopt.reference", "rlopt.recipe", "rlopt.refit")

# The layer order, lowest first: a package (or top-level module) may import its own layer's and any lower layer's.
# Layers of one rank sit side by side and import neither: `build` (compile code) and `serving` (what runs
# artifacts: bench, warmup, diff, serve) both stand on the runtime. Every package of rlopt is in exactly one layer.
LAYERS: list[tuple[int, str, set[str]]] = [
    (0, "foundation", {"errors", "lazy", "machine", "timing", "yaml_file", "locking", "logs", "files", "arrays",
                       "facts", "parity", "drift", "onnx_graph", "onnx_session", "pbtxt", "tools"}),  # `tools`: the bare namespace
    (1, "spec", {"spec", "ci_config", "user_model", "sb3"}),
    (2, "stages", {"stages", "reference"}),
    (3, "backends", {"backends"}),
    (4, "records", {"recipe", "manifest", "manifest_v1", "warmup_profile"}),
    (5, "runtime", {"runtime"}),
    (6, "checks", {"verify"}),
    (7, "build", {"compile", "refit", "tools.tune"}),
    (7, "serving", {"tools.bench", "tools.warmup", "tools.report", "tools.diff", "serve"}),
    (8, "interface", {"cli", "render", "schema", "rlopt", "__main__"}),
]
LAYER_OF = {node: (rank, name) for rank, name, nodes in LAYERS for node in nodes}


def _modules() -> dict[str, Path]:
    modules = {}
    for path in sorted(ROOT.rglob("*.py")):
        name = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    return modules


MODULES = _modules()


def _imports(module: str, path: Path) -> set[str]:
    """rlopt modules `module` imports anywhere in its body (functions included), resolved to known modules."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            while target and target not in MODULES:
                target = target.rsplit(".", 1)[0] if "." in target else ""
            # importing a.b.c runs a/__init__ and a/b/__init__ first: those are edges too
            while target:
                if target in MODULES and target != module and not module.startswith(target + "."):
                    found.add(target)
                target = target.rsplit(".", 1)[0] if "." in target else ""
    return found


@functools.cache
def edges() -> dict[str, set[str]]:
    """Module -> the rlopt modules it imports; parsed on first use, not at collection (every worker collects)."""
    return {module: _imports(module, path) for module, path in MODULES.items()}


def _reach(start: str) -> dict[str, str]:
    """Every module reachable from `start`, each with the module it was reached from."""
    seen, todo = {start: ""}, [start]
    while todo:
        current = todo.pop()
        for target in edges()[current]:
            if target not in seen:
                seen[target] = current
                todo.append(target)
    return seen


def _chain(seen: dict[str, str], end: str) -> str:
    chain = [end]
    while seen[chain[-1]]:
        chain.append(seen[chain[-1]])
    return " -> ".join(reversed(chain))


def node(module: str) -> str:
    """The package a module belongs to, as one node: `rlopt.compile.engine` -> compile, `rlopt.tools.bench.driver`
    -> tools.bench (each tool is a package of its own), `rlopt.recipe` -> recipe; `rlopt` itself -> rlopt."""
    parts = module.split(".")[1:]
    if not parts:
        return "rlopt"
    if parts[0] == "tools" and len(parts) > 1:
        return f"tools.{parts[1]}"
    return parts[0]


@functools.cache
def package_edges() -> dict[str, dict[str, list[str]]]:
    """Node -> node it imports -> the module imports that make the edge."""
    graph: dict[str, dict[str, list[str]]] = {}
    for module, targets in edges().items():
        for target in targets:
            if node(module) != node(target):
                graph.setdefault(node(module), {}).setdefault(node(target), []).append(f"{module} -> {target}")
    return graph


def _backend(module: str) -> str | None:
    """The backend package a module belongs to (rlopt/backends/<name>/), None for any other module."""
    parts = module.split(".")
    in_package = len(parts) > 2 and parts[:2] == ["rlopt", "backends"] and (ROOT / "backends" / parts[2]).is_dir()
    return parts[2] if in_package else None


def test_every_package_has_a_layer() -> None:
    assert sorted({node(m) for m in MODULES} - set(LAYER_OF)) == []


def test_imports_run_down_the_layer_order() -> None:
    """A node imports only its own layer and lower ranks; side-by-side layers (same rank) do not import each other."""
    bad = []
    for source, targets in package_edges().items():
        rank, layer = LAYER_OF[source]
        for target, imports in targets.items():
            target_rank, target_layer = LAYER_OF[target]
            if target_rank > rank or (target_rank == rank and target_layer != layer):
                bad.append(f"{source} ({layer}) -> {target} ({target_layer}): {imports[0]}")
    assert not bad, "\n".join(bad)


def test_no_package_cycles() -> None:
    """With each package as one node, the import graph is acyclic (a cycle hidden by same-layer imports too)."""
    graph = {source: set(targets) for source, targets in package_edges().items()}
    cycles = _strong_components(graph)
    assert cycles == [], [[(a, b, package_edges()[a][b][0]) for a in c for b in c if b in graph.get(a, ())]
                          for c in cycles]


def test_stage_work_modules_do_not_import_each_other() -> None:
    """A stage's work (`rlopt/stages/<job>.py`) imports no other job's module but `base` (the interface); the stage
    list (`frontend`) imports every job. The export records the refit map by exporting once more, so it imports
    `weight_map`, the module refit reads the map with; it asks `control_flow` whether tracing would freeze a branch
    and runs each exported graph through `shape_probe`, two helpers that serve the export alone."""
    allowed = {("rlopt.stages.export_onnx", "rlopt.stages.weight_map"),
               ("rlopt.stages.export_onnx", "rlopt.stages.control_flow"),
               ("rlopt.stages.export_onnx", "rlopt.stages.shape_probe")}
    bad = [f"{m} -> {t}" for m, targets in edges().items() if m.startswith("rlopt.stages.") and m != "rlopt.stages.frontend"
           for t in targets if t.startswith("rlopt.stages.") and t != "rlopt.stages.base" and (m, t) not in allowed]
    assert not bad, bad


def test_backends_do_not_import_each_other() -> None:
    bad = [f"{m} -> {t}" for m, targets in edges().items() if _backend(m)
           for t in targets if _backend(t) and _backend(t) != _backend(m)]
    assert not bad, bad


def test_runtime_and_runners_reach_no_compile_code() -> None:
    starts = [m for m in MODULES if m == "rlopt.runtime" or m.startswith("rlopt.runtime.")
              or (_backend(m) and m.endswith(".runner"))]
    assert "rlopt.backends.tvm.runner" in starts
    bad = []
    for start in starts:
        seen = _reach(start)
        bad += [_chain(seen, m) for m in seen if m.startswith(COMPILE_CODE)]
    assert not bad, "\n".join(bad)


def test_no_import_cycles() -> None:
    assert _strong_components(edges()) == []


def _strong_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan: every strongly connected component of more than one node, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, set()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for vertex in list(graph):
        if vertex not in index:
            strong(vertex)
    return cycles


def test_every_module_is_under_400_lines() -> None:
    big = {m: n for m, p in MODULES.items() if (n := len(p.read_text(encoding="utf-8").splitlines())) > 400}
    assert big == {}
