"""The machine a figure was measured on, as training and the benchmark record it."""

import re
from pathlib import Path

import pytest

from transformer.runtime.machine import FLAGS, describe_machine, machine_text


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
