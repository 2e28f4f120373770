"""`rlopt diff OLD_DIR NEW_DIR`: a release gate for CI (contract section 15).

`driver` runs it; `pair` reads and checks the two MODEL_DIRs and the thresholds; `latency` times both selected
routes now with the bench protocol (the only module that reads a clock); `outputs` measures the drift through
the runtime; `compare` turns all of it into the report (pure); `schema` is the report; `report` writes what CI
systems read (JUnit XML, GitHub's job summary). Rendering (rich tables) is the CLI's: `rlopt.render.diff`.
"""

from rlopt.tools.diff.compare import NetworkTiming
from rlopt.tools.diff.driver import run_diff
from rlopt.tools.diff.report import junit_xml, markdown_summary, write_reports
from rlopt.tools.diff.schema import DiffReport, DriftResult, NetworkDiff, ShapeLatency, Thresholds

__all__ = ["DiffReport", "DriftResult", "NetworkDiff", "NetworkTiming", "ShapeLatency", "Thresholds", "junit_xml",
           "markdown_summary", "run_diff", "write_reports"]
