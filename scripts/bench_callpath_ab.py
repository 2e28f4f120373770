"""Before and after, step by step, in one process: what each cut of the batch-1 call path bought (issue 33 item 3).

A shared machine moves a process's timings by more than these cuts are worth, so the call paths are compared in
one process, K interleaved rounds (scripts/bench_callpath.py's `interleaved`), each ratio paired by round. The
baseline is git revision REV's `rlopt/runtime/session.py` and `rlopt/backends/tvm/chain.py`, loaded under other
module names beside this tree's; every variant runs one TVM runner (the same weight tensors) with a KernelChain of
its own, at the network's min shape:
- `REV`: that revision's Session and KernelChain;
- `+ probe`: this tree's Session (the generated feed probe), REV's chain;
- `+ setitem`: this tree's chain (the input copied by `buffer[...] = array`), layout kernels kept;
- `this tree`: this tree's chain with layout-only kernels at either end dropped (`elide_layout_copies`).

usage: python scripts/bench_callpath_ab.py MODEL_DIR --baseline REV [--network N]... [--rounds K] [--calls N]
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_callpath import interleaved  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def baseline_module(revision: str, path: str, name: str, work: Path) -> Any:
    """`path` as it is at `revision`, imported as module `name` (its imports resolve against this tree)."""
    source = subprocess.run(["git", "show", f"{revision}:{path}"], capture_output=True, text=True, check=True,
                            cwd=ROOT).stdout
    file = work / f"{name}.py"
    file.write_text(source)
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def variant(loaded: Any, feeds: dict[str, np.ndarray], session_class: Any, record: Any,
            chain_class: Any) -> Callable[[], Any]:
    """A session of `session_class` on `loaded`'s TVM runner (every variant reads the same weight tensors) with its
    own chain, recorded by `record` and bound as a `chain_class`."""
    from rlopt.backends.tvm import runner as tvm_runner

    gen = loaded._gen
    session = session_class(gen.runners, gen.routes, gen.fallback, loaded.network, loaded.record)
    gen.runners["tvm"]._local.__dict__.pop("plans", None)  # the next call records this variant's chain
    saved = tvm_runner.record_chain, tvm_runner.KernelChain
    tvm_runner.record_chain, tvm_runner.KernelChain = record, chain_class
    try:
        for _ in range(3):  # records the chain, then binds it for this thread
            session.run(feeds)
    finally:
        tvm_runner.record_chain, tvm_runner.KernelChain = saved
    return lambda: session.run(feeds)


def compare(model_dir: Path, network: str, revision: str, rounds: int, calls: int, work: Path) -> list[str]:
    import rlopt
    from rlopt.backends.tvm import chain as chain_now
    from rlopt.runtime.session import Session

    session_then = baseline_module(revision, "rlopt/runtime/session.py", "rlopt_baseline_session", work)
    chain_then = baseline_module(revision, "rlopt/backends/tvm/chain.py", "rlopt_baseline_chain", work)
    loaded = rlopt.load(model_dir, network, backend="tvm")
    rng = np.random.default_rng(0)
    feeds = {name: rng.standard_normal(p.min).astype(p.dtype) for name, p in loaded.inputs.items()}
    variants = {
        revision: variant(loaded, feeds, session_then.Session, chain_then.record_chain, chain_then.KernelChain),
        "+ probe": variant(loaded, feeds, Session, chain_then.record_chain, chain_then.KernelChain),
        "+ setitem": variant(loaded, feeds, Session, functools.partial(chain_now.record_chain, elide=False),
                             chain_now.KernelChain),
        "this tree": variant(loaded, feeds, Session, chain_now.record_chain, chain_now.KernelChain),
    }
    samples = interleaved(variants, rounds, calls)
    base = np.array(samples[revision])
    names = list(variants)
    lines = [f"### {network} at {[list(a.shape) for a in feeds.values()]}", "",
             f"| call path | median us | p10 us | / {revision} (paired by round) | / the step before |",
             "|---|---|---|---|---|"]
    for i, name in enumerate(names):
        values = np.array(samples[name])
        before = np.array(samples[names[i - 1]]) if i else values
        lines.append(f"| {name} | {np.median(values):.2f} | {np.percentile(values, 10):.2f} | "
                     f"{np.median(values / base):.3f} | {np.median(values / before):.3f} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--baseline", required=True, help="git revision of the call path to compare against")
    parser.add_argument("--network", action="append", default=None)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    from rlopt.manifest import read_manifest

    networks = args.network or list(read_manifest(args.model_dir).networks)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="rlopt-callpath-ab-") as work:
        tables = [compare(args.model_dir, n, args.baseline, args.rounds, args.calls, Path(work)) for n in networks]
    load_after = os.getloadavg()
    print(f"load average {[round(v, 2) for v in load_before]} -> {[round(v, 2) for v in load_after]}; "
          f"K = {args.rounds} rounds of N = {args.calls} calls; TVM_NUM_THREADS={os.environ.get('TVM_NUM_THREADS')}\n")
    for table in tables:
        print("\n".join(table) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
