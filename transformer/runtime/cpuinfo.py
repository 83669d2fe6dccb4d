"""The CPU as Linux describes it in /proc/cpuinfo: its model name, generation and feature flags.

Precision (bf16), int8 kernels and the machine record read it here. A flag is a word of the "flags" field
only: a model name may hold a flag's name.
"""

from __future__ import annotations

from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def cpu_fields() -> dict[str, str]:
    """The fields of the first CPU in /proc/cpuinfo ("model name", "cpu family", "flags", ...); empty where
    there is none."""
    try:
        text = CPUINFO.read_text()
    except OSError:
        return {}
    first_cpu = text.partition("\n\n")[0].splitlines()
    return {key.strip(): value.strip() for key, value in (line.split(":", 1) for line in first_cpu if ":" in line)}


def cpu_flags() -> set[str]:
    """The CPU's feature flags (empty where /proc/cpuinfo has none)."""
    return set(cpu_fields().get("flags", "").split())
