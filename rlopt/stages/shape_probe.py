"""Does an exported ONNX graph still run at every shape the recipe allows? Run it and see.

An exporter can keep a dim symbolic in the graph's inputs and still bake the example's length into a
Reshape (a traced `nn.TransformerEncoder`), or follow only the branch the example took (a dynamo export of
`if x.size(0) > 1`). Declared dims cannot show that; running the graph can. The probe runs the graph (ONNX
Runtime, else onnx's reference evaluator) against PyTorch on seeded random inputs, varying one group of
dynamic dims at a time from the example (opt) shape, so that a failure names the dim:

- each group's named values (min, opt, max, the recipe's extra shapes): batch 1 and > 1, every named length;
- one value between them the recipe does not name (`unnamed_value`), where the range has room for one;
- then the named shapes themselves (every dim at once).

Dims vary in groups of equal (min, opt, max): dims that must agree (a mask's length and the observation's)
have equal ranges, so a probe never feeds shapes the network cannot take together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlopt.errors import first_line
from rlopt.spec import NetworkSpec

Shapes = dict[str, list[int]]
Group = tuple[int, int, int]  # (min, opt, max) of the dims varied together


@dataclass(frozen=True)
class Probe:
    label: str
    shapes: Shapes
    dim: str  # "input 'tokens' dim 1" or "" for a named shape that varies every dim


@dataclass
class ProbeResult:
    """The first probe the graph failed (None: every probe matched), and what was checked."""

    failed: Probe | None = None
    problem: str = ""
    checked: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # shapes where PyTorch itself fails: nothing to compare
    mismatch_at_example: str = ""  # the graph is off at the example shape: a parity matter, not a frozen dim

    def facts(self) -> dict[str, Any]:
        out: dict[str, Any] = {"checked": self.checked}
        for key in ("skipped", "mismatch_at_example"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        return out


def probe_tolerance(atol: float, rtol: float) -> tuple[float, float]:
    """The probe looks for frozen dims (a graph that raises, or computes another branch), not for rounding: 10x the
    recipe's tolerances, at least 1e-3 / 1e-2, so that a graph a few ulps off is left to the parity gate (exit 1
    with its statistics) instead of being taken for a frozen one."""
    return max(10 * atol, 1e-3), max(10 * rtol, 1e-2)


def unnamed_value(group: Group, named: set[int]) -> int | None:
    """A value inside [min, max] that no named shape uses: the middle of the widest gap between named values."""
    lo, _, hi = group
    values = sorted(v for v in named | {lo, hi} if lo <= v <= hi)
    gaps = [(b - a, a, b) for a, b in zip(values, values[1:]) if b - a > 1]
    if not gaps:
        return None
    _, a, b = max(gaps)
    return (a + b) // 2


def _groups(spec: NetworkSpec) -> dict[Group, list[tuple[str, int]]]:
    groups: dict[Group, list[tuple[str, int]]] = {}
    for name, input_spec in spec.inputs.items():
        for axis in input_spec.dynamic_axes:
            key = (input_spec.dims("min")[axis], input_spec.dims("opt")[axis], input_spec.dims("max")[axis])
            groups.setdefault(key, []).append((name, axis))
    return groups


def opt_shapes(spec: NetworkSpec) -> Shapes:
    """The opt shape of every input (`spec.points()` lists a fully static network's one shape as min only)."""
    return {name: list(input_spec.dims("opt")) for name, input_spec in spec.inputs.items()}


def probe_shapes(spec: NetworkSpec) -> list[Probe]:
    """Every probe, single groups first (in input order), then the named shapes; no shape twice."""
    points = spec.points()
    base = opt_shapes(spec)
    probes: list[Probe] = []
    seen = [base]

    def add(label: str, shapes: Shapes, dim: str) -> None:
        if shapes not in seen:
            seen.append(shapes)
            probes.append(Probe(label, shapes, dim))

    for group, members in _groups(spec).items():
        named = {shapes[name][axis] for shapes in points.values() for name, axis in members}
        values = sorted(named)
        between = unnamed_value(group, named)
        if between is not None:
            values.append(between)
        first_name, first_axis = members[0]
        dim = f"input '{first_name}' dim {first_axis}"
        for value in values:
            shapes = {name: list(dims) for name, dims in base.items()}
            for name, axis in members:
                shapes[name][axis] = value
            add(f"{dim} = {value}" + (" (unnamed)" if value == between else ""), shapes, dim)
    for label, shapes in points.items():
        add(f"the {label} shape", {name: list(dims) for name, dims in shapes.items()}, "")
    return probes


def _graph_runner(onnx_path: Path) -> Any:
    """feeds -> outputs with ONNX Runtime on one thread, else onnx's reference evaluator (no onnxruntime here)."""
    try:
        import onnxruntime as ort
    except ImportError:
        from onnx.reference import ReferenceEvaluator

        evaluator = ReferenceEvaluator(str(onnx_path))
        return lambda feeds: evaluator.run(None, feeds)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 4  # a Reshape that fails is an expected finding here, not a log line
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    return lambda feeds: session.run(None, feeds)


def _difference(expected: list[np.ndarray], got: list[Any], atol: float, rtol: float) -> str:
    """Why `got` does not match `expected` (shape or values, NaN and inf equal in place), or ''."""
    if len(got) != len(expected):
        return f"{len(got)} outputs, PyTorch gives {len(expected)}"
    for index, (want, have) in enumerate(zip(expected, got)):
        have = np.asarray(have)
        if have.shape != want.shape:
            return f"output {index} has shape {list(have.shape)}, PyTorch gives {list(want.shape)}"
        if want.dtype == np.bool_ or want.dtype.kind in "iu":
            if not np.array_equal(want, have):
                return f"output {index} differs"
        elif not np.allclose(have.astype(np.float64), want.astype(np.float64), atol=atol, rtol=rtol, equal_nan=True):
            worst = float(np.nanmax(np.abs(have.astype(np.float64) - want.astype(np.float64))))
            return f"output {index} differs by up to {worst:.3g}"
    return ""


def probe_export(onnx_path: Path, module: Any, spec: NetworkSpec, atol: float, rtol: float,
                 seed: int = 0) -> ProbeResult:
    """Run the exported graph and `module` (PyTorch) at the example shape, then at every probe; stop at the first
    probe the graph fails (raises, other shapes, values off by more than `probe_tolerance(atol, rtol)`)."""
    import torch

    from rlopt.arrays import flatten_outputs
    from rlopt.reference import embedding_range, one_torch_thread, random_input

    atol, rtol = probe_tolerance(atol, rtol)
    rng = np.random.default_rng(seed)
    default_range = embedding_range(module)
    run_graph = _graph_runner(onnx_path)
    result = ProbeResult()

    def compare(shapes: Shapes) -> tuple[bool, str]:
        """(PyTorch ran, why the graph differs or '')."""
        feeds = {name: random_input(rng, s, shapes[name], name=name, default_range=default_range)
                 for name, s in spec.inputs.items()}
        try:
            with torch.inference_mode(), one_torch_thread():
                expected = [t.detach().numpy() for t in flatten_outputs(
                    module(*[torch.from_numpy(feeds[name]) for name in spec.inputs]))]
        except Exception:  # the user's forward may raise anything: a shape it does not take is not probed
            return False, ""
        try:
            got = run_graph(feeds)
        except Exception as exc:  # ONNX Runtime raises its own types (a Reshape to the example's length)
            text = first_line(exc)
            return True, f"the graph fails: {text[:160] + '...' if len(text) > 160 else text}"
        return True, _difference(expected, got, atol, rtol)

    ran, problem = compare(opt_shapes(spec))
    if ran and problem:
        result.mismatch_at_example = problem
        return result  # off at the very shape it was exported at: the parity gate judges it
    for probe in probe_shapes(spec):
        ran, problem = compare(probe.shapes)
        if not ran:
            result.skipped.append(probe.label)
            continue
        if problem:
            result.failed, result.problem = probe, problem
            return result
        result.checked.append(probe.label)
    return result


__all__ = ["Probe", "ProbeResult", "probe_export", "probe_shapes", "probe_tolerance", "unnamed_value"]
