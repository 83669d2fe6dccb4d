"""The machine a figure was measured on, as training and the benchmark record it."""

import re
import subprocess
from pathlib import Path

import pytest
import torch

from transformer.runtime import cpuinfo
from transformer.runtime import machine as machine_module
from transformer.runtime.machine import FLAGS, code_version, describe_machine, machine_text
from transformer.runtime.precision import cpu_has_fast_bf16, select_precision


def test_the_cpu_generation_is_recorded_where_the_model_name_may_hide_it():
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    if "cpu family" not in cpuinfo:
        pytest.skip("no x86 /proc/cpuinfo here")
    family, model = (re.search(rf"^{name}\s*: (\d+)$", cpuinfo, re.MULTILINE)[1] for name in ("cpu family", "model"))
    machine = describe_machine()
    assert machine["cpu_generation"] == f"family {family} model {model}"
    assert machine_text(machine).startswith(f"{machine['cpu']}, family {family} model {model} (")


def test_machine_text_names_cores_and_flags_and_reads_records_without_a_generation():
    record = {"cpu": "AMD EPYC", "cores": 2, "gpu": None, "flags": {flag: flag == "avx2" for flag in FLAGS}}
    assert machine_text(record) == "AMD EPYC (2 cores; avx2)"
    assert machine_text({**record, "cpu_generation": "family 26 model 2"}) == \
        "AMD EPYC, family 26 model 2 (2 cores; avx2)"
    assert machine_text({**record, "gpu": "NVIDIA H100"}) == "NVIDIA H100"


def test_a_flag_is_a_word_of_the_flags_line_not_of_the_model_name(monkeypatch, tmp_path):
    """The model name, family and flags of the first CPU; a flag's name in the model name is no flag."""
    fake = tmp_path / "cpuinfo"
    first = "processor\t: {}\nmodel name\t: Virtual CPU avx512_bf16 amx_bf16\ncpu family\t: 25\nmodel\t\t: 17\n" \
            "flags\t\t: fpu sse2 avx2 avx512f\n"
    fake.write_text(first.format(0) + "\n" + first.format(1))
    monkeypatch.setattr(cpuinfo, "CPUINFO", fake)
    assert cpuinfo.cpu_flags() == {"fpu", "sse2", "avx2", "avx512f"}
    assert not cpu_has_fast_bf16() and select_precision("auto", torch.device("cpu")) == "fp32"
    machine = describe_machine()
    assert machine["cpu"] == "Virtual CPU avx512_bf16 amx_bf16" and machine["cpu_generation"] == "family 25 model 17"
    assert [flag for flag, present in machine["flags"].items() if present] == ["avx2", "avx512f"]
    assert not machine["fast_bf16"]


def test_records_name_the_commit_of_a_checkout_and_only_the_version_elsewhere(tmp_path, monkeypatch):
    """A figure traced to its code: the checkout's commit and whether files differ from it; a package installed
    from a wheel (no git checkout around it) records its version alone."""
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    recorded = describe_machine()
    assert recorded["commit"] == head and isinstance(recorded["modified"], bool)
    assert recorded["version"] == machine_module.transformer.__version__

    installed = tmp_path / "site-packages" / "transformer"  # in a folder of another git repository
    installed.mkdir(parents=True)
    (installed / "__init__.py").write_text("")
    for command in (["init", "-q"], ["add", "."], ["-c", "user.name=u", "-c", "user.email=u@e", "commit", "-qm", "x"]):
        subprocess.run(["git", "-C", str(tmp_path), *command], check=True, capture_output=True)
    monkeypatch.setattr(machine_module.transformer, "__file__", str(installed / "__init__.py"))
    assert code_version() == {"version": machine_module.transformer.__version__}
