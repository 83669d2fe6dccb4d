"""scripts/benchmark.py --tiny runs every mode and reports its figures; timings are never asserted."""

import itertools
import json
import re
import subprocess
import sys

from conftest import ROOT, subprocess_env


def positive(value) -> bool:
    return isinstance(value, (int, float)) and value > 0


def test_tiny_benchmark_reports_every_mode(tmp_path):
    output = tmp_path / "benchmark.json"
    env = subprocess_env()  # HF offline, set by conftest
    result = subprocess.run([sys.executable, "scripts/benchmark.py", "--tiny", "--threads", "1", "--output",
                             str(output)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(output.read_text())
    assert "ours/baseline" in result.stdout  # the printed tables
    assert re.search(r"^int8 +beam5 +2 .* \d+\.\d\d$", result.stdout, re.MULTILINE)  # BLEU with 2 decimals

    environment = report["environment"]
    assert environment["torch"] and environment["threads"] == 1 and "avx512_bf16" in environment["flags"]

    training = report["training"]
    for precision in ("fp32", "bf16"):
        assert positive(training["matmul_peak_flops"][precision])
        assert positive(training[precision]["ratio"])
        for model in ("ours", "baseline"):
            figures = training[precision][model]
            assert all(positive(figures[key]) for key in ("tokens_per_s", "flops_per_s", "mfu"))
            assert len(figures["rounds"]) == report["settings"]["rounds"]
    for precision, model in itertools.product(("fp32", "bf16"), ("ours", "baseline")):
        profile = training["profile"][precision][model]
        assert all(positive(profile["phases_ms"][phase]) for phase in ("forward", "backward", "optimizer"))
        assert profile["top_ops_ms"] and positive(profile["categories_ms"]["matmul"])

    decoding = report["decoding"]
    for precision in ("fp32", "bf16", "int8"):
        runs = decoding[precision]
        expected = [(search, workers) for workers in (1, 2) for search in ("greedy", "beam5")]
        assert [(run["search"], run["workers"]) for run in runs] == expected
        for entry in runs:
            for run in ("cache", "cache_subset", "no_cache_subset"):
                assert all(positive(entry[run][key]) for key in ("sentences_per_s", "tokens_per_s", "seconds"))
            assert entry["cache"]["sentences"] == decoding["sentences"]
            assert entry["no_cache_subset"]["sentences"] == decoding["no_cache_sentences"]
            assert positive(entry["cache_speedup"])
            assert 0 <= entry["bleu"] <= 100  # a random model: BLEU may well be 0
        assert all(positive(decoding["translate_beam5_seconds"][precision][workers]) for workers in ("1", "2"))

    batching = report["batching"]
    for kind in ("token_budget", "random_fixed_size"):
        assert all(0 <= batching[kind][side] < 1 for side in ("src", "tgt"))
    assert batching["token_budget"]["src"] < batching["random_fixed_size"]["src"]  # a property, not a timing

    for phase in ("training", "translation"):
        memory = report["memory"][phase]
        assert positive(memory["peak_rss_mb"]) and memory["peak_rss_mb"] >= memory["rss_after_imports_mb"]
