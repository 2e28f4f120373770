"""The coverage matrix (issue 14): compile every architecture of tests/data/models/coverage.py on every backend.

Each architecture is compiled by the real CLI in its own process (`rlopt compile RECIPE --json --no-cache`),
as a user would, and the outcome per backend goes into a Markdown table (architecture x backend): verified
(with max_abs), skipped with the reason, or failed; a recipe refused as a whole (exit 2) says why in one
line. Also: which export path made the ONNX model (script, or the trace or dynamo export after the scripted
graph's op was refused) and that op.

usage: python scripts/coverage.py [--out docs/coverage.md] [--work-dir DIR] [--backend B]... [--note TEXT] [NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.data.models.coverage import ARCHITECTURES, recipe_for  # noqa: E402

BACKENDS = ["torchscript", "onnxruntime", "tvm", "tensorrt"]


def compile_one(work: Path, name: str, backends: list[str]) -> dict[str, Any]:
    import yaml

    folder = work / name
    (folder / "models").mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "tests" / "data" / "models" / "coverage.py", folder / "models" / "coverage.py")
    recipe = folder / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(recipe_for(name, backends), sort_keys=False))
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "rlopt", "compile", str(recipe), "-o", str(folder / "out"),
                           "--json", "--no-cache"], capture_output=True, text=True, cwd=folder,
                          env=dict(os.environ, COLUMNS="200",  # this checkout's rlopt, whatever is installed
                                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))),
                          timeout=900)
    outcome: dict[str, Any] = {"name": name, "exit": proc.returncode, "seconds": time.perf_counter() - started}
    if proc.returncode in (0, 1) and proc.stdout.strip():
        outcome["report"] = json.loads(proc.stdout)
    else:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        outcome["error"] = lines[-1] if lines else f"exit {proc.returncode}"
        outcome["traceback"] = "Traceback" in proc.stderr
    return outcome


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _short_path(text: str, work: Path) -> str:
    return text.replace(str(work) + "/", "")


KNOWN_LIMITS = [
    "TVM (Relax 0.27's ONNX frontend) has no converter for LSTM, GRU or RNN: rlopt unrolls them into MatMul + "
    "gate nodes per step (a dynamic length to the recipe's max, masked); a `sequence_lens` input, other "
    "activations, Loop and Scan skip TVM with the reason named; the other backends go on.",
    "nn.TransformerEncoder and nn.GRUCell, scripted, are refused by the TorchScript ONNX exporter "
    "(aten::is_autocast_enabled, prim::ListConstruct); the eager module is traced instead (`export_path: trace`). "
    "The trace freezes a dynamic sequence dim of the encoder in its Reshapes: the shape probe (the exported graph "
    "run against PyTorch at batch 1 and > 1, every named length and one unnamed one) catches that and the "
    "dynamo exporter takes over (`export_path: dynamo`). A dim no exporter keeps dynamic is refused (exit 2, one "
    "line naming the dim; fix: make it static).",
    "The trace fallback is not tried when the network's own code branches or loops on its inputs' values or "
    "shapes; torch's internal checks and branches on attributes are fine.",
    "TensorRT needs an NVIDIA GPU and NVIDIA's own wheel index; where absent it is skipped with the reason.",
]


def render(outcomes: list[dict[str, Any]], backends: list[str], work: Path, note: str = "") -> str:
    lines = [
        "# Coverage matrix: policy architectures x backends",
        "",
        "Written by `scripts/coverage.py` (models: `tests/data/models/coverage.py`; each compiled by "
        "`rlopt compile --json --no-cache` in its own process) on "
        f"{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}.",
        "verified = every recorded sample at min, opt and max (batch 1 and > 1; recurrent networks: every step, "
        "the state fed back) matched PyTorch within the recipe's tolerances (contract section 7).",
        *([note] if note else []),
        "",
        "| architecture | export | " + " | ".join(backends) + " | exit | s |",
        "|---|---|" + "---|" * len(backends) + "---|---|",
    ]
    notes: list[str] = []
    for outcome in outcomes:
        name = outcome["name"]
        if "report" not in outcome:
            cells = [f"refused: see note {len(notes) + 1}"] * len(backends)
            notes.append(f"{name}: {_short_path(outcome['error'], work)}"
                         + (" (a TRACEBACK reached stderr)" if outcome.get("traceback") else ""))
            lines.append(f"| {name} | - | " + " | ".join(cells) + f" | {outcome['exit']} | {outcome['seconds']:.1f} |")
            continue
        network = outcome["report"]["manifest"]["networks"]["net"]
        facts = network.get("facts", {}).get("onnx") or {}
        if facts.get("export_path"):
            export = facts["export_path"]
            if facts.get("refused"):
                export += f" ({facts['refused'].split(': ')[0]} refused)"
        else:
            export = "script*"  # the manifest does not record the export stage's facts: only script then
        cells = []
        for backend in backends:
            record = network["artifacts"].get(backend)
            if record is None:
                cells.append("-")
            elif record.get("skipped"):
                notes.append(f"{name} / {backend}: {_short_path(record['skipped'], work)}")
                reason = record["skipped"]
                short = "build failed" if reason.startswith("build failed") else "skipped"
                cells.append(f"{short} (note {len(notes)})")
            elif record.get("parity"):
                parity = record["parity"]
                cells.append(("verified" if parity["passed"] else "FAILED") + f" ({parity['max_abs']:.0e})")
            else:
                cells.append(record.get("facts", {}).get("not_verified", "built, not verified"))
        lines.append(f"| {name} | {_cell(export)} | " + " | ".join(_cell(c) for c in cells)
                     + f" | {outcome['exit']} | {outcome['seconds']:.1f} |")
    if any("script*" in line for line in lines):
        lines += ["", "script*: this rlopt's manifest does not record the export stage's facts (`export_path`, "
                  "`refused`); the pipeline then exports from the scripted module only."]
    if notes:
        lines += ["", "Notes:", ""] + [f"{i}. {_cell(text)}" for i, text in enumerate(notes, 1)]
    lines += ["", "Known limits:", ""] + [f"- {text}" for text in KNOWN_LIMITS]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "coverage.md")
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--backend", action="append", default=None)
    parser.add_argument("--note", default="", help="a line to add under the title (e.g. what was applied)")
    parser.add_argument("names", nargs="*")
    args = parser.parse_args()
    names = args.names or list(ARCHITECTURES)
    backends = args.backend or BACKENDS
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="rlopt-coverage-"))
    outcomes = []
    for name in names:
        outcome = compile_one(work, name, backends)
        print(f"{name}: exit {outcome['exit']} in {outcome['seconds']:.1f} s"
              + (f" ({outcome['error']})" if "error" in outcome else ""), file=sys.stderr)
        outcomes.append(outcome)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(outcomes, backends, work, args.note))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
