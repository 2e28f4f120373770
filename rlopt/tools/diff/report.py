"""The reports CI systems read, from a DiffReport: JUnit XML (`--junit FILE`) and GitHub's job summary (markdown
appended to `$GITHUB_STEP_SUMMARY`). Plain text, no rich: the terminal tables are rlopt.render.diff's.

JUnit: one <testsuite> per network, one <testcase> per check (parity, latency at each named shape, routes,
drift, backends, files); a regression is a <failure> whose message is its one line; a shape that could not be
timed on OLD_DIR's side is <skipped>. The layout is the Ant / Jenkins one that GitLab, Jenkins and GitHub's JUnit
actions read.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rlopt.errors import UsageError, located
from rlopt.manifest import shape_label
from rlopt.tools.diff.schema import DiffReport, FileChanges, NetworkDiff, ShapeLatency

SUMMARY_ENV = "GITHUB_STEP_SUMMARY"


@dataclass
class Check:
    """One test case: its name, its regression lines (none: passed), a reason to skip it, and what it found."""

    name: str
    failures: list[str] = field(default_factory=list)
    skipped: str = ""
    details: list[str] = field(default_factory=list)


def _us(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.2f} ms" if value >= 1000 else f"{value:.1f} us"


def shape_name(row: ShapeLatency) -> str:
    return f"{row.point} {shape_label(row.shape.values())}"


def latency_text(row: ShapeLatency, max_ratio: float) -> str:
    if row.ratio is None:
        return row.note
    again = "" if row.confirm_ratio is None else f"; timed again: {row.confirm_ratio:.3f}x, A/A noise " \
        f"{row.confirm_aa_noise:.3f}"
    return (f"OLD_DIR {_us(row.old_us)} on {row.old_route}, NEW_DIR {_us(row.new_us)} on {row.new_route}: "
            f"{row.ratio:.3f}x, A/A noise {row.aa_noise:.3f}, {row.rounds} rounds{again}; regression above "
            f"{max_ratio:g} and the A/A noise (both times)")


def ratio_text(row: ShapeLatency) -> str:
    if row.ratio is None:
        return "-"
    return f"{row.ratio:.2f}" + ("" if row.confirm_ratio is None else f", again {row.confirm_ratio:.2f}")


def drift_text(network: NetworkDiff) -> str:
    drift = network.drift
    if drift is None:
        return "not measured"
    if drift.metric == "kl":
        text = f"KL(old || new) mean {drift.kl_mean:.3g}, max {drift.kl_max:.3g}"
    elif drift.metric == "relative_error":
        text = f"relative error {drift.relative_error:.3g}"
    else:
        text = f"max abs difference {drift.max_abs:.3g}"
    if drift.argmax_agree is not None:
        text += f", argmax agreement {drift.argmax_agree:.3f}"
    if drift.metric != "max_abs":
        text += f", max abs {drift.max_abs:.3g}"
    return f"{text} over {drift.compared} reference samples"


def file_text(changes: FileChanges, what: str = "files") -> list[str]:
    lines = [f"{what} {kind}: {', '.join(paths)}" for kind, paths in
             (("added", changes.added), ("dropped", changes.dropped), ("changed", changes.changed)) if paths]
    return lines + [f"{what} unchanged: {changes.same}"]


def checks(network: NetworkDiff, max_ratio: float) -> list[Check]:
    """The test cases of one network, in the order CI lists them."""
    found = network.regressions
    if network.status != "compared":
        where = "in NEW_DIR only: nothing to compare" if network.status == "added" else "in OLD_DIR only"
        return [Check("network", found.get("network", []), details=[f"{network.network}: {where}"])]
    parity = [f"{c.name}: {c.new} in NEW_DIR at compile time" for c in network.backends if c.new]
    result = [Check("parity", found.get("parity", []), details=parity)]
    for row in network.latency:
        name = f"latency {shape_name(row)}"
        failures = [line for line in found.get("latency", []) if f": {shape_name(row)}: " in line]
        skip = row.note if row.ratio is None and not failures else ""
        result.append(Check(name, failures, skip, [latency_text(row, max_ratio)]))
    result.append(Check("routes", details=[f"{c.name}: {c.old} -> {c.new}" + (" (changed)" if c.changed else "")
                                           for c in network.routes]))
    result.append(Check("drift", found.get("drift", []), details=[drift_text(network)]))
    result.append(Check("backends", found.get("backends", []),
                        details=[f"{c.name}: {c.old or 'absent'} -> {c.new or 'absent'}"
                                 + ("" if c.same_bytes is None else " (same bytes)" if c.same_bytes else " (rebuilt)")
                                 for c in network.backends]))
    result.append(Check("files", details=file_text(network.files) + file_text(network.triton_models, "Triton models")))
    return result


def junit_xml(report: DiffReport) -> str:
    """The JUnit XML document (see the module docstring)."""
    max_ratio = report.thresholds.max_latency_ratio
    root = ElementTree.Element("testsuites", name="rlopt diff")
    totals = {"tests": 0, "failures": 0}
    for network in report.networks:
        cases = checks(network, max_ratio)
        failed = sum(1 for c in cases if c.failures)
        suite = ElementTree.SubElement(root, "testsuite", name=network.network, tests=str(len(cases)),
                                       failures=str(failed), errors="0",
                                       skipped=str(sum(1 for c in cases if c.skipped)), timestamp=report.created_at)
        properties = ElementTree.SubElement(suite, "properties")
        for key, value in (("old_dir", report.old_dir), ("new_dir", report.new_dir), ("kind", network.kind),
                           ("max_latency_ratio", f"{max_ratio:g}"),
                           ("max_drift_kl", "none" if report.thresholds.max_drift_kl is None
                            else f"{report.thresholds.max_drift_kl:g}")):
            ElementTree.SubElement(properties, "property", name=key, value=value)
        for case in cases:
            element = ElementTree.SubElement(suite, "testcase", name=case.name, classname=f"rlopt.diff.{network.network}")
            for line in case.failures:
                ElementTree.SubElement(element, "failure", message=line, type="regression").text = line
            if case.skipped:
                ElementTree.SubElement(element, "skipped", message=case.skipped)
            ElementTree.SubElement(element, "system-out").text = "\n".join(case.details)
        totals["tests"] += len(cases)
        totals["failures"] += failed
    root.set("tests", str(totals["tests"]))
    root.set("failures", str(totals["failures"]))
    root.set("errors", "0")
    ElementTree.indent(root)
    return ElementTree.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_summary(report: DiffReport) -> str:
    """GitHub-flavoured markdown: the verdict, the regressions, a table of latencies, a table of drift, changes."""
    head = [f"### rlopt diff: `{report.old_dir}` -> `{report.new_dir}`", ""]
    if report.regressions:
        head += [f"**{len(report.regressions)} regression{'s' if len(report.regressions) > 1 else ''}**", ""]
        head += [f"- {_cell(line)}" for line in report.regressions]
    else:
        head.append("**No regression**")
    max_ratio = report.thresholds.max_latency_ratio
    rows = ["", f"| network | shape | route (old -> new) | old | new | new / old | A/A noise | max {max_ratio:g} |",
            "|---|---|---|---|---|---|---|---|"]
    for network in report.networks:
        for row in network.latency:
            route = row.new_route if row.old_route == row.new_route else f"{row.old_route} -> {row.new_route}"
            verdict = "**slower**" if row.regression else ("ok" if row.ratio is not None else _cell(row.note))
            ratio = ratio_text(row)
            noise = "-" if row.aa_noise is None else f"{row.aa_noise:.2f}"
            rows.append(f"| {network.network} | {shape_name(row)} | {route} | {_us(row.old_us)} | {_us(row.new_us)} "
                        f"| {ratio} | {noise} | {verdict} |")
    limit = report.thresholds.max_drift_kl
    rows += ["", f"| network | kind | drift (old -> new) | max_drift_kl {'none' if limit is None else f'{limit:g}'} |",
             "|---|---|---|---|"]
    for network in report.networks:
        if network.drift is not None:
            verdict = "**over**" if network.drift.regression else "ok" if limit is not None and network.kind == "policy" \
                else "reported"
            rows.append(f"| {network.network} | {network.kind} | {_cell(drift_text(network))} | {verdict} |")
    changes = [f"- {network.network}: {network.status}" for network in report.networks if network.status != "compared"]
    for network in report.networks:
        routes = [f"{c.name} {c.old} -> {c.new}" for c in network.routes if c.changed]
        backends = [f"{c.name} {c.old or 'absent'} -> {c.new or 'absent'}" for c in network.backends if c.changed]
        for what, items in (("routes", routes), ("backends", backends)):
            if items:
                changes.append(f"- {network.network}: {what}: {_cell('; '.join(items))}")
        moved = {k: len(getattr(network.files, k)) for k in ("added", "dropped", "changed")}
        if any(moved.values()):
            changes.append(f"- {network.network}: files " + ", ".join(f"{n} {k}" for k, n in moved.items() if n))
    tail = ["", "Changes:", "", *changes] if changes else ["", "No route, backend or file changed."]
    return "\n".join(head + rows + tail) + "\n"


def write_reports(report: DiffReport, junit: Path | None, environ: Mapping[str, str] = os.environ) -> list[str]:
    """Write `junit` (when given) and append the markdown summary to $GITHUB_STEP_SUMMARY (when set); the paths."""
    written = []
    targets = ([(Path(junit), junit_xml(report), "w", "--junit")] if junit else []) + \
        ([(Path(environ[SUMMARY_ENV]), markdown_summary(report), "a", SUMMARY_ENV)] if environ.get(SUMMARY_ENV) else [])
    for path, text, mode, source in targets:
        try:
            with open(path, mode, encoding="utf-8") as handle:
                handle.write(text)
        except OSError as exc:
            raise UsageError(located(path, source, f"cannot be written ({exc.strerror or exc})",
                                     "give a path in a writable folder")) from None
        written.append(str(path))
    return written


def check_writable(junit: Path | None) -> None:
    """Refuse, before anything is timed, a --junit path whose folder does not exist."""
    if junit is not None and not Path(junit).resolve().parent.is_dir():
        raise UsageError(located(junit, "--junit", "its folder does not exist", "create the folder or give another path"))


__all__ = ["SUMMARY_ENV", "Check", "check_writable", "checks", "drift_text", "junit_xml", "latency_text",
           "markdown_summary", "ratio_text", "shape_name", "write_reports"]
