"""rlopt.tools.diff.report: JUnit XML valid against the JUnit schema (tests/data/junit.xsd), a testsuite per network
and a testcase per check; GitHub's job summary renders as markdown tables; rlopt.render.diff's tables."""

from __future__ import annotations

import io
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
import xmlschema
from markdown_it import MarkdownIt
from rich.console import Console

from rlopt.errors import UsageError
from rlopt.render.diff import diff_tables
from rlopt.tools.diff import DiffReport, junit_xml, markdown_summary, write_reports
from rlopt.tools.diff.schema import Change, DriftResult, FileChanges, NetworkDiff, ShapeLatency, Thresholds

SCHEMA = xmlschema.XMLSchema(Path(__file__).resolve().parents[1] / "data" / "junit.xsd")
SLOWER = ("policy: max 4x6x32: latency 1.50x OLD_DIR's (100.0 us -> 150.0 us, route tvm) > max_latency_ratio 1.1 "
          "and A/A noise 1.02")
DROPPED = "policy: backend tvm dropped: built in OLD_DIR, skipped: no | pipe in NEW_DIR"


def shape(point: str, dims: list[int], ratio: float | None, regression: bool = False) -> ShapeLatency:
    return ShapeLatency(point=point, shape={"input0": dims}, old_route="tvm", new_route="tvm", old_us=100.0,
                        new_us=None if ratio is None else 100.0 * ratio, ratio=ratio, aa_noise=None if ratio is None
                        else 1.02, rounds=20, regression=regression,
                        note="" if ratio is not None else "not timed: old: cannot be loaded")


@pytest.fixture(scope="module")
def report() -> DiffReport:
    """Two compared networks (one with a slower shape, a shape OLD_DIR could not time and a dropped backend), one
    added network and one dropped."""
    policy = NetworkDiff(
        network="policy", kind="policy",
        latency=[shape("min", [1, 1, 32], 1.01), shape("opt", [2, 3, 32], None), shape("max", [4, 6, 32], 1.5, True)],
        routes=[Change(name="selected", old="tvm", new="tvm"), Change(name="1x1x32", old="tvm", new="onnxruntime")],
        backends=[Change(name="tvm", old="verified", new="skipped: no | pipe"),
                  Change(name="onnxruntime", old="verified", new="verified", same_bytes=False)],
        files=FileChanges(changed=["policy/model.onnx"], dropped=["policy/tvm-llvm.so"], same=2),
        drift=DriftResult(metric="kl", value=0.01, kl_mean=0.01, kl_max=0.03, argmax_agree=0.95, max_abs=0.2,
                          max_rel=0.5, relative_error=0.1, compared=12),
        regressions={"latency": [SLOWER], "backends": [DROPPED]})
    value = NetworkDiff(network="value", kind="value", latency=[shape("min", [1, 1, 32], 0.98)],
                        drift=DriftResult(metric="relative_error", value=0.2, max_abs=0.3, max_rel=1.0,
                                          relative_error=0.2, compared=12))
    added = NetworkDiff(network="critic", kind="value", status="added")
    dropped = NetworkDiff(network="actor", kind="policy", status="dropped",
                          regressions={"network": ["actor: network dropped: in OLD_DIR, not in NEW_DIR"]})
    networks = [policy, value, added, dropped]
    return DiffReport(created_at="2026-12-06T00:00:00+00:00", model_dir="new", old_dir="old", new_dir="new",
                      thresholds=Thresholds(max_drift_kl=0.5), method="m", budget_s=2.0, seed=1, networks=networks,
                      regressions=[line for n in networks for lines in n.regressions.values() for line in lines])


def test_junit_is_valid_with_a_suite_per_network_and_a_case_per_check(report: DiffReport) -> None:
    text = junit_xml(report)
    SCHEMA.validate(text)
    root = ElementTree.fromstring(text)
    suites = {suite.get("name"): suite for suite in root.iter("testsuite")}
    assert list(suites) == ["policy", "value", "critic", "actor"]
    assert (root.get("tests"), root.get("failures")) == ("16", "3")
    policy = suites["policy"]
    cases = {case.get("name"): case for case in policy.iter("testcase")}
    assert list(cases) == ["parity", "latency min 1x1x32", "latency opt 2x3x32", "latency max 4x6x32", "routes",
                           "drift", "backends", "files"]
    assert (policy.get("tests"), policy.get("failures"), policy.get("skipped")) == ("8", "2", "1")
    assert [f.get("message") for f in cases["latency max 4x6x32"].iter("failure")] == [SLOWER]
    assert [f.get("message") for f in cases["backends"].iter("failure")] == [DROPPED]
    assert cases["latency opt 2x3x32"].find("skipped") is not None and cases["drift"].find("failure") is None
    assert "1x1x32: tvm -> onnxruntime (changed)" in (cases["routes"].findtext("system-out") or "")
    assert [c.get("name") for c in suites["critic"].iter("testcase")] == ["network"]
    assert suites["actor"].find("testcase/failure") is not None and suites["critic"].find("testcase/failure") is None
    properties = {p.get("name"): p.get("value") for p in policy.iter("property")}
    assert properties["max_drift_kl"] == "0.5" and properties["old_dir"] == "old"


def test_the_schema_rejects_what_ci_readers_reject(report: DiffReport) -> None:
    root = ElementTree.fromstring(junit_xml(report))
    suite = root.find("testsuite")
    assert suite is not None
    del suite.attrib["tests"]
    assert not SCHEMA.is_valid(ElementTree.tostring(root, encoding="unicode"))
    case = ElementTree.fromstring(junit_xml(report)).find("testsuite/testcase")
    assert case is not None
    ElementTree.SubElement(case, "stdout")
    assert not SCHEMA.is_valid(ElementTree.tostring(case, encoding="unicode"))


def table_rows(html: str) -> list[list[str]]:
    root = ElementTree.fromstring(f"<root>{html}</root>")
    return [["".join(cell.itertext()) for cell in row] for table in root.iter("table") for row in table.iter("tr")]


def test_the_github_summary_renders_as_markdown_tables(report: DiffReport) -> None:
    text = markdown_summary(report)
    html = MarkdownIt("commonmark").enable("table").render(text)
    rows = table_rows(html)
    assert rows[0] == ["network", "shape", "route (old -> new)", "old", "new", "new / old", "A/A noise", "max 1.1"]
    assert ["policy", "max 4x6x32", "tvm", "100.0 us", "150.0 us", "1.50", "1.02", "slower"] in rows
    assert "<strong>slower</strong>" in html
    assert ["policy", "opt 2x3x32", "tvm", "100.0 us", "-", "-", "-", "not timed: old: cannot be loaded"] in rows
    drift_header = ["network", "kind", "drift (old -> new)", "max_drift_kl 0.5"]
    assert drift_header in rows and len(rows[rows.index(drift_header) + 1]) == 4
    assert "<strong>3 regressions</strong>" in html and "skipped: no | pipe" in html  # a | in a cell is escaped
    assert "- actor: dropped" in text and "- policy: routes: 1x1x32 tvm -&gt; onnxruntime" in html.replace("<li>", "- ")


def test_reports_are_written_and_the_summary_appended(report: DiffReport, tmp_path: Path) -> None:
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    junit = tmp_path / "diff.xml"
    assert write_reports(report, junit, {"GITHUB_STEP_SUMMARY": str(summary)}) == [str(junit), str(summary)]
    write_reports(report, None, {"GITHUB_STEP_SUMMARY": str(summary)})
    assert summary.read_text().startswith("earlier step\n### rlopt diff") and summary.read_text().count("### ") == 2
    SCHEMA.validate(str(junit))
    assert write_reports(report, None, {}) == []
    with pytest.raises(UsageError, match="--junit: cannot be written"):
        write_reports(report, tmp_path / "no" / "such" / "folder.xml", {})


@pytest.mark.parametrize("width", [80, 100])
def test_terminal_tables_fit_80_and_100_columns(report: DiffReport, width: int) -> None:
    from tests.render.test_tables import assert_fits

    for table in diff_tables(report):
        assert_fits(table, width)


def test_terminal_tables(report: DiffReport) -> None:
    console = Console(file=io.StringIO(), width=300)
    for table in diff_tables(report):
        console.print(table)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert "max 4x6x32" in out and "slower" in out and "1.50" in out
    assert "1x1x32 tvm -> onnxruntime" in out and "tvm verified -> skipped: no | pipe" in out
    assert "relative error 0.2" in out and "(reported, not a failure)" in out  # a value network's drift
