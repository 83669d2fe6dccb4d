"""The machine a figure was measured on (CPU model, the flags that decide bf16/int8 speed, torch, threads), said in a
line or, for a results table, in a few words; and the code that measured it: the toolkit's version and, in a git
checkout, its commit.

Training speed and quality within a time budget depend on them (an AVX2-only EPYC trains at about half
the tokens/s of one with AVX512-BF16), so training and the benchmark record them beside their figures.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import torch

import transformer
from transformer.runtime.cpuinfo import cpu_fields, cpu_flags
from transformer.runtime.precision import cpu_has_fast_bf16

FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")


def describe_machine() -> dict:
    """CPU model and core count, which of `FLAGS` it has, torch's CPU capability and version, threads."""
    fields, flags = cpu_fields(), cpu_flags()
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    # a virtual machine's model name can hide the generation ("AMD EPYC"); x86 family and model tell it
    # (AMD family 25: Zen 3/4, 26: Zen 5), and with it how fast the same flags run
    generation = f"family {fields['cpu family']} model {fields['model']}" if "cpu family" in fields else None
    return {"cpu": fields.get("model name") or platform.processor(), "cpu_generation": generation,
            "cores": os.cpu_count(),
            "flags": {flag: flag in flags for flag in FLAGS}, "fast_bf16": cpu_has_fast_bf16(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(), "gpu": gpu,
            "torch": torch.__version__, "python": platform.python_version(), "threads": torch.get_num_threads(),
            **code_version()}


def code_version() -> dict:
    """The toolkit's ``version``; where it runs from a git checkout, also its ``commit`` and whether tracked files
    differ from it (``modified``): a figure can then be traced to the code that made it."""
    version = {"version": transformer.__version__}
    checkout = Path(transformer.__file__).resolve().parents[1]

    def git(*args: str) -> str:
        # --no-optional-locks: a status that refreshes the index would take the user's .git/index.lock
        return subprocess.run(["git", "--no-optional-locks", "-C", str(checkout), *args], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()

    try:
        top, commit = git("rev-parse", "--show-toplevel", "HEAD").splitlines()  # one git start for both
        if Path(top).resolve() != checkout:  # installed inside another repository
            return version
        return {**version, "commit": commit, "modified": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):  # no git, or not a checkout
        return version


def flags_text(machine: dict) -> str:
    """The flags ``machine`` has, space-separated, e.g. ``avx2 avx512f avx512_bf16`` (``none of ...`` if none)."""
    present = [flag for flag, on in machine["flags"].items() if on]
    return " ".join(present) if present else f"none of {' '.join(machine['flags'])}"


def machine_text(machine: dict) -> str:
    """``machine`` in a line: the GPU, or the CPU with its generation, cores and `flags_text`."""
    if machine["gpu"]:
        return machine["gpu"]
    generation = f", {machine['cpu_generation']}" if machine.get("cpu_generation") else ""  # older records: none
    return f"{machine['cpu']}{generation} ({machine['cores']} cores; {flags_text(machine)})"


def cpu_generation(machine: dict) -> str:
    """AMD's x86 family and model as a Zen generation (a virtual machine's model name hides it), else ''."""
    family, _, model = (machine.get("cpu_generation") or "").removeprefix("family ").partition(" model ")
    if "AMD" not in machine["cpu"] or not family.isdigit():
        return ""
    if family == "23":
        return " Zen 2" if int(model) >= 0x30 else " Zen"
    if family == "25":
        return " Zen 4" if machine["flags"].get("avx512f") else " Zen 3"  # Zen 4 is AMD's first with AVX-512
    return " Zen 5" if family == "26" else ""


def machine_brief(session: dict) -> str:
    """A session's machine in a few words: ``2-core Xeon, AMX, bf16`` or ``1 H100, bf16``."""
    if session["gpu"]:
        name = session["gpu"].removeprefix("NVIDIA ").split()[0]
        return f"{session.get('ranks', 1)} {name}, {session['precision']}"
    words = session["cpu"].replace("(R)", "").replace("(TM)", "").split()
    brand = next((w for w in words if w in ("Xeon", "EPYC", "Ryzen", "Core", "Threadripper")), " ".join(words[:2]))
    flags = session["flags"]
    widest = next((text for flag, text in (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16"),
                                           ("avx512f", "AVX-512"), ("avx2", "AVX2")) if flags.get(flag)), "no AVX2")
    return f"{session['cores']}-core {brand}{cpu_generation(session)}, {widest}, {session['precision']}"
