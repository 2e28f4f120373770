"""rlopt.logs: C-level writes to file descriptor 2 go to a log under the cache directory, not the terminal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlopt.logs import native_output_to_log
from rlopt.machine import cache_root

CHILD = """
import os, sys
from rlopt.logs import native_output_to_log
with native_output_to_log("test") as log:
    os.write(2, b"Fast mode segfaults when there are out-of-bounds indices\\n")  # as TVM does, from C
    sys.stderr.write("rlopt progress\\n")                                         # Python's stderr: the terminal
    sys.stderr.flush()
    print(log.path)
os.write(2, b"after\\n")
"""


def run_child(cache: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, RLOPT_CACHE=str(cache))
    return subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=60,
                          check=False)


def test_c_level_writes_to_fd_2_land_in_the_log_not_the_terminal(tmp_path: Path) -> None:
    proc = run_child(tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    log = Path(proc.stdout.strip())
    assert log.parent == tmp_path / "cache" / "logs" and log.name.startswith("test-")
    assert log.read_text() == "Fast mode segfaults when there are out-of-bounds indices\n"
    assert proc.stderr == "rlopt progress\nafter\n"  # fd 2 is restored afterwards


def test_in_process_redirection_and_an_empty_log_is_removed(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLOPT_CACHE", str(tmp_path))
    with native_output_to_log("bench") as log:
        os.write(2, b"native noise\n")
    assert log.path is not None and log.has_output() and log.path.read_text() == "native noise\n"
    assert "native noise" not in capfd.readouterr().err
    with native_output_to_log("bench") as quiet:
        pass
    assert quiet.path is not None and not quiet.path.exists() and not quiet.has_output()


def test_an_unwritable_cache_leaves_fd_2_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capfd: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("RLOPT_CACHE", str(blocker))  # logs/ cannot be made under a file
    with native_output_to_log("warmup") as log:
        os.write(2, b"still visible\n")
    assert log.path is None and "still visible" in capfd.readouterr().err


def test_cache_dir_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RLOPT_CACHE", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_root() == tmp_path / "a"
    monkeypatch.delenv("RLOPT_CACHE")
    assert cache_root() == tmp_path / "x" / "rlopt"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "rlopt"


JSON_CHILD = """
import os
from rlopt.logs import stdout_kept_for_json
with stdout_kept_for_json():
    os.write(1, b"TVM printed this\\n")  # a native library writing to stdout while a --json command works
print('{"passed": true}')
"""


def test_native_stdout_during_a_json_command_goes_to_stderr() -> None:
    proc = subprocess.run([sys.executable, "-c", JSON_CHILD], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == '{"passed": true}\n' and proc.stderr == "TVM printed this\n"
