"""`rlopt diff` and `rlopt compile --baseline` from the command line: one end-to-end run with real worker processes
(no figure asserted), exit codes with injected timings, and the one-line errors (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import xmlschema

from rlopt.manifest import MANIFEST_NAME, read_manifest, write_json
from tests.conftest import assert_one_line_error, copy_model_dir, run_rlopt
from tests.tools.diff_common import scaled_timer

SCHEMA = Path(__file__).resolve().parents[1] / "data" / "junit.xsd"


@pytest.fixture(scope="module")
def same(ort_compiled: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_model_dir(ort_compiled, tmp_path_factory.mktemp("same"))


def test_diff_end_to_end_times_both_routes_in_worker_processes(ort_compiled: Path, same: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    junit = tmp_path / "diff.xml"
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    proc = run_rlopt("diff", str(ort_compiled), str(same), "--network", "policy", "--budget", "0.05", "--json",
                     "--junit", str(junit), "--max-latency-ratio", "100")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["kind"] == "rlopt-diff" and report["passed"] is True and report["regressions"] == []
    (policy,) = report["networks"]
    assert [row["point"] for row in policy["latency"]] == ["min", "opt", "max"]
    for row in policy["latency"]:
        assert row["rounds"] >= 10 and row["ratio"] > 0 and row["aa_noise"] >= 1 and row["note"] == ""
        assert row["old_route"] == row["new_route"] and row["new_route"].startswith("onnxruntime (")
    assert policy["drift"]["value"] == 0 and policy["drift"]["argmax_agree"] == 1
    xmlschema.validate(str(junit), str(SCHEMA))
    assert summary.read_text().startswith(f"### rlopt diff: `{ort_compiled}` -> `{same}`")


@pytest.fixture()
def injected(monkeypatch: pytest.MonkeyPatch) -> dict[tuple[str, str], float]:
    """The ratios NEW / OLD the diff's timer reports, per (network, point); in-process runs only."""
    ratios: dict[tuple[str, str], float] = {}
    monkeypatch.setattr("rlopt.tools.diff.driver.time_network", scaled_timer(ratios))
    return ratios


@pytest.fixture(autouse=True)
def wide_consoles(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process runs print through rlopt.render's consoles, sized when first imported: wide, as when piped."""
    from rlopt import render

    for console in (render.stdout, render.stderr):
        monkeypatch.setattr(console, "_width", render.PIPED_WIDTH)


def run_main(*argv: str) -> int:
    from rlopt.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    code = exit_info.value.code
    return code if isinstance(code, int) else 0


def test_exit_0_with_tables_and_1_with_a_line_per_slower_shape(ort_compiled: Path, same: Path, tmp_path: Path,
                                                               injected: dict[tuple[str, str], float],
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert run_main("diff", str(ort_compiled), str(same)) == 0
    out = capsys.readouterr().out
    assert "no regression" in out and "max 4x6x32" in out and "1.00" in out
    assert "**No regression**" in summary.read_text()
    injected.update({("value", "max"): 1.4, ("policy", "min"): 1.25})
    assert run_main("diff", str(ort_compiled), str(same)) == 1
    failed = [line for line in capsys.readouterr().err.splitlines() if line.startswith("FAIL")]
    assert [line.split(": latency ")[0] for line in failed] == ["FAIL policy: min 1x1x32", "FAIL value: max 4x6x32"]
    assert "1.40x" in failed[1] and "**2 regressions**" in summary.read_text()
    assert run_main("diff", str(ort_compiled), str(same), "--max-latency-ratio", "1.5") == 0


def test_compile_with_a_baseline_ends_with_the_diff(ort_compiled: Path, tmp_path: Path,
                                                    injected: dict[tuple[str, str], float],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    recipe = ort_compiled.parent / "tiny.yaml"
    junit = tmp_path / "diff.xml"
    assert run_main("compile", str(recipe), "-o", str(tmp_path / "new"), "--baseline", str(ort_compiled),
                    "--junit", str(junit), "--json") == 0
    document = json.loads(capsys.readouterr().out)
    assert document["passed"] is True and document["diff"]["passed"] is True
    assert document["diff"]["old_dir"] == str(ort_compiled) and document["diff"]["new_dir"] == str(tmp_path / "new")
    xmlschema.validate(str(junit), str(SCHEMA))
    injected[("policy", "opt")] = 2.0
    assert run_main("compile", str(recipe), "-o", str(tmp_path / "slower"), "--baseline", str(ort_compiled)) == 1
    assert "FAIL policy: opt 2x3x32: latency 2.00x" in capsys.readouterr().err
    assert (tmp_path / "slower" / MANIFEST_NAME).is_file()  # the MODEL_DIR is written; the gate failed


def test_one_line_errors_exit_2(ort_compiled: Path, tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    assert_one_line_error(run_rlopt("diff", str(missing), str(ort_compiled)), 2, str(missing), "MODEL_DIR not found")
    assert_one_line_error(run_rlopt("diff", str(ort_compiled), str(ort_compiled), "--max-latency-ratio", "0.5"), 2,
                          "--max-latency-ratio 0.5", "fix: e.g. --max-latency-ratio 1.1")
    assert_one_line_error(run_rlopt("diff", str(ort_compiled), str(ort_compiled), "--junit",
                                    str(tmp_path / "no" / "diff.xml")), 2, "--junit: its folder does not exist")
    assert_one_line_error(run_rlopt("diff", str(ort_compiled), str(ort_compiled), "--network", "critic"), 2,
                          "no network 'critic' (--network)", "policy, value")
    other = copy_model_dir(ort_compiled, tmp_path, "other")
    manifest = read_manifest(other)
    manifest.networks["policy"].inputs["input0"].max = [8, 6, 32]
    write_json(other / MANIFEST_NAME, manifest.seal().model_dump(mode="json"))
    assert_one_line_error(run_rlopt("diff", str(ort_compiled), str(other)), 2, "networks.policy.inputs.input0: differs",
                          "max [4, 6, 32] in OLD_DIR", "max [8, 6, 32] in NEW_DIR")
    recipe = ort_compiled.parent / "tiny.yaml"
    assert_one_line_error(run_rlopt("compile", str(recipe), "-o", str(tmp_path / "x"), "--baseline", str(missing)), 2,
                          "MODEL_DIR not found")
    assert not (tmp_path / "x").exists()  # refused before compiling
    assert_one_line_error(run_rlopt("compile", str(recipe), "-o", str(other), "--baseline", str(other)), 2,
                          "--baseline is the MODEL_DIR this compile replaces (-o)")
    assert_one_line_error(run_rlopt("compile", str(recipe), "-o", str(tmp_path / "y"), "--junit",
                                    str(tmp_path / "d.xml")), 2, "--junit writes the diff's report")
