"""Layering: stages do not import each other, backends do not import each other, the runtime and the
runners reach no compile code, and no import cycle exists (imports inside functions count)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "rlopt"
COMPILE_CODE = ("rlopt.compile", "rlopt.stages", "rlopt.backends.tvm.tuning", "rlopt.backends.tvm.database",
                "rlopt.tools.tune", "rlopt.reference", "rlopt.recipe")


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


def _backend(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["rlopt", "backends"] and parts[2] != "base" else None


def test_stages_do_not_import_each_other() -> None:
    bad = [f"{m} -> {t}" for m, targets in edges().items() if m.startswith("rlopt.stages.")
           for t in targets if t.startswith("rlopt.stages.") and t != "rlopt.stages.base"]
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
        for w in edges()[v]:
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

    for module in edges():
        if module not in index:
            strong(module)
    assert cycles == []


def test_every_module_is_under_400_lines() -> None:
    big = {m: n for m, p in MODULES.items() if (n := len(p.read_text(encoding="utf-8").splitlines())) > 400}
    assert big == {}
