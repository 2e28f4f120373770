"""Can this CPU run a TVM library built for an `mcpu`? Checked from /proc/cpuinfo, without importing TVM.

A library built with `mcpu: znver4` uses AVX-512; loaded on a CPU without it, it dies with
SIGILL instead of an error. The build records the instruction-set features the mcpu implies
(LLVM names); the runtime compares them with the kernel's flags before loading anything.
"""

from __future__ import annotations

from pathlib import Path

ISA_PREFIXES = ("avx", "sse", "fma", "bmi", "f16c", "amx", "gfni", "vaes", "vpclmul", "sha", "aes", "popcnt",
                "lzcnt", "movbe")
# LLVM feature name -> /proc/cpuinfo flag, where they differ beyond '.', '_' and '-'
LLVM_TO_CPUINFO = {"sse3": "pni", "bmi": "bmi1", "lzcnt": "abm", "sha": "shani"}


def _normalize(name: str) -> str:
    return name.lower().replace(".", "").replace("_", "").replace("-", "")


def isa_features(llvm_features: set[str] | list[str]) -> list[str]:
    """The instruction-set extensions among LLVM's features for a CPU (tuning flags such as fast-imm16 dropped)."""
    return sorted(f for f in llvm_features if f.startswith(ISA_PREFIXES))


def host_flags() -> set[str] | None:
    """This CPU's flags, normalized; None where /proc/cpuinfo is not available (then nothing is checked)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return {_normalize(flag) for flag in line.split(":", 1)[1].split()}
    return None


def missing_features(required: list[str]) -> list[str]:
    """LLVM feature names from `required` this CPU lacks ([] when all are present or the CPU cannot be read)."""
    flags = host_flags()
    if flags is None:
        return []
    return [f for f in required if _normalize(LLVM_TO_CPUINFO.get(f, f)) not in flags]
