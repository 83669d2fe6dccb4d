"""scripts/benchmark.py: the tiny run as a script, then in-process with bf16 emulated, and the BLEU it
reports. Timings are never asserted (the machine may be shared); the figures that follow from the
batches, the models and the outputs are."""

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, subprocess_env, toy_overrides
from pytest import approx
from torch import nn

from transformer.checkpoint import load_checkpoint, save_checkpoint
from transformer.config import ModelConfig
from transformer.data.batch import make_batch, rows_within
from transformer.decoding.translator import Translator
from transformer.evaluate import score_translations
from transformer.model.transformer import Transformer, count_parameters, estimate_flops
from transformer.runtime import machine
from transformer.runtime.precision import AutocastLayerNorm

TABLES = ("== training: target tokens/s", "training step, ms", "== decoding", "== Translator.translate",
          "== ours against CTranslate2", "== padding", "== peak resident memory")


@pytest.fixture
def scripts_path(monkeypatch):
    """scripts/ on sys.path, as when scripts/benchmark.py runs, so that its package benchmarks/ imports
    (here and in the processes the benchmark spawns)."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))


def test_tiny_benchmark_runs_as_a_script(tmp_path):
    """Every default part, their tables and report; one number of decoding workers (each is a round of every
    search and engine, the engines each in a process of its own: half the test's time for another row)."""
    output = tmp_path / "benchmark.json"
    result = subprocess.run([sys.executable, "scripts/benchmark.py", "--tiny", "--threads", "1", "--decode-workers",
                             "2", "--output", str(output)], cwd=ROOT, env=subprocess_env(), capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(output.read_text())
    assert all(title in result.stdout for title in TABLES)
    assert re.search(r"^int8 +beam5 +2 .* \d+\.\d\d$", result.stdout, re.MULTILINE)  # BLEU with 2 decimals
    assert report["environment"]["threads"] == 1
    assert (tmp_path / "benchmark_profiles.png").stat().st_size > 0  # the profiled steps, plotted

    # bf16 is measured exactly where the CPU computes it natively, and named as skipped elsewhere
    fast_bf16 = report["environment"]["fast_bf16"]
    training, decoding = report["training"], report["decoding"]
    trained = ["fp32", "bf16"] if fast_bf16 else ["fp32"]
    decoded = ["fp32", "bf16", "int8"] if fast_bf16 else ["fp32", "int8"]
    assert list(training["matmul_peak_flops"]) == list(training["profile"]) == trained
    assert [p for p in ("fp32", "bf16", "int8") if p in decoding] == decoded
    assert list(decoding["translate_beam5_seconds"]) == decoded
    assert ("skipped" in report) is not fast_bf16

    for precision in trained:
        for model in ("ours", "baseline"):
            assert len(training[precision][model]["rounds"]) == report["settings"]["rounds"]
            assert training[precision][model]["tokens_per_s"] > 0

    # every run of every precision decodes the same sentences: the first 12 of the test split
    assert decoding["sentences"] == report["settings"]["test_sentences"] == 12
    for precision in decoded:
        runs = decoding[precision]
        assert [(run["search"], run["workers"]) for run in runs] == [("greedy", 2), ("beam5", 2)]
        for run in runs:
            assert run["cache"]["sentences"] == decoding["sentences"]
            assert run["cache_subset"]["sentences"] == run["no_cache_subset"]["sentences"] == 6
            assert run["cache_speedup"] == approx(run["no_cache_subset"]["seconds"] / run["cache_subset"]["seconds"])

    # the engines side by side: every engine and precision per number of workers, ratios of their seconds
    engines = report["engines"]
    assert [(run["engine"], run["precision"], run["workers"]) for run in engines["runs"]] == [
        (engine, precision, 2) for engine, precision in
        [*(("ours", p) for p in decoded), ("ctranslate2", "fp32"), ("ctranslate2", "int8")]]
    seconds = {(run["engine"], run["precision"]): run["seconds"] for run in engines["runs"]}
    assert engines["ratio"] == {"2": {precision: approx(seconds["ours", precision] / seconds["ctranslate2", precision])
                                      for precision in ("fp32", "int8")}}

    batching = report["batching"]
    for side in ("src", "tgt"):  # a property of the batches, not a timing
        assert batching["token_budget"][side] < batching["random_fixed_size"][side]
    assert set(batching["batch_building_ms"]) == {"TrainBatches", "Dataset.__getitem__"}
    assert all(ms > 0 for ms in batching["batch_building_ms"].values())
    for phase in ("training", "translation"):
        memory = report["memory"][phase]
        assert memory["peak_rss_mb"] >= memory["rss_after_imports_mb"] > 0


def test_without_native_bf16_nothing_runs_in_bf16(scripts_path, monkeypatch, capsys, tmp_path):
    benchmark = importlib.import_module("benchmark")
    workload = importlib.import_module("benchmarks.workload")
    monkeypatch.setattr(machine, "cpu_has_fast_bf16", lambda: False)
    monkeypatch.setattr(workload, "keep_freed_memory", lambda: None)  # malloc settings would outlive the test
    loaded = []

    def load_and_keep(*args):
        loaded.append(workload.load_workload(*args))
        return loaded[-1]

    monkeypatch.setattr(benchmark, "load_workload", load_and_keep)
    output = tmp_path / "benchmark.json"
    # the parts with precisions of their own (the engines take decoding's: test_engines_score_their_own_translations)
    benchmark.main(["--tiny", "--threads", "1", "--rounds", "1", "--batches", "1", "--decode-workers", "1",
                    "--parts", "training", "decoding", "--output", str(output)])
    report, printed = json.loads(output.read_text()), capsys.readouterr().out

    assert report["environment"]["fast_bf16"] is False
    assert report["skipped"] == {"bf16": workload.BF16_EMULATED}
    assert f"skipped bf16: {workload.BF16_EMULATED}" in printed
    assert not re.search(r"^bf16 ", printed, re.MULTILINE)  # no row of any table
    training, decoding = report["training"], report["decoding"]
    assert "bf16" not in training and list(training["matmul_peak_flops"]) == list(training["profile"]) == ["fp32"]
    assert "bf16" not in decoding and list(decoding["translate_beam5_seconds"]) == ["fp32", "int8"]
    assert len(decoding["fp32"]) == len(decoding["int8"]) == 2  # greedy and beam 5, one worker

    # the models and the FLOPs per token are those of the configured sizes on the batches trained on
    (work,) = loaded
    cfg, vocab = ModelConfig(**report["settings"]["model"]), work.vocab_size
    torch_transformer = nn.Transformer(cfg.d_model, cfg.n_heads, cfg.n_encoder_layers, cfg.n_decoder_layers, cfg.d_ff,
                                       batch_first=True)
    assert training["parameters"] == {"ours": count_parameters(Transformer(cfg, vocab)),
                                      "baseline": vocab * cfg.d_model + count_parameters(torch_transformer)}
    tokens = sum(batch.n_tgt_tokens for batch in work.train_batches)
    flops = sum(estimate_flops(cfg, vocab, (1, work.src_lengths[i]), (1, work.tgt_lengths[i]))  # each sentence's own
                for batch in work.train_batches for i in batch.indices)
    assert training["target_tokens"] == tokens and training["batches"] == len(work.train_batches) == 1
    assert training["flops_per_target_token"] == approx(flops / tokens)


def test_bleu_is_of_each_sentences_own_translation(scripts_path, monkeypatch, tmp_path):
    """The translations a run scores are the model's, in the order of the split: the fp32 greedy run's
    are those of Translator.translate (its own batches), although the benchmark decodes length-sorted
    batches. (A random model's BLEU is 0 whatever it is scored against, so the scored text is checked.)"""
    decoding = importlib.import_module("benchmarks.decoding")
    workload = importlib.import_module("benchmarks.workload")
    scored = []

    def score_and_keep(hypotheses, references):
        scored.append((hypotheses, references))
        return score_translations(hypotheses, references)

    monkeypatch.setattr(decoding, "score_translations", score_and_keep)
    torch.set_num_threads(1)  # as --threads 1 (conftest puts it back): on a busy machine 2 threads crawl
    work = workload.load_workload(tmp_path / "no-corpus", workload.TINY, True, tmp_path)  # the synthetic corpus
    checkpoint = decoding.random_checkpoint(work, workload.TINY.model)
    translator = Translator.from_checkpoint(checkpoint, "cpu")
    greedy = translator.translate(work.test_sources, beam_size=1)
    tokenizer = translator.tokenizer
    batches = decoding.decode_batches(tokenizer.encode_src(work.test_sources), 4, tokenizer.pad_id)
    assert [greedy[i] for positions, _ in batches for i in positions] != greedy  # batch order would fail
    result = decoding.decoding_benchmark(checkpoint, work.test_sources, work.test_references, 4, 6, [1],
                                         fast_bf16=False)
    runs = [run for precision in ("fp32", "int8") for run in result[precision]]
    assert len(scored) == len(runs) == 4
    assert scored[0] == (greedy, [work.test_references])  # fp32 greedy
    for run, (hypotheses, references) in zip(runs, scored):
        assert len(hypotheses) == len(work.test_sources) == 12
        assert run["bleu"] == score_translations(hypotheses, references)["bleu"].score


def test_engines_score_their_own_translations(scripts_path, monkeypatch, tmp_path):
    """Each engine's BLEU is of its own translations of the split, in order; without CTranslate2 the
    comparison is skipped with the reason."""
    pytest.importorskip("ctranslate2", reason="the export extra (ctranslate2) is not installed")
    engines = importlib.import_module("benchmarks.engines")
    workload = importlib.import_module("benchmarks.workload")
    scored = []
    monkeypatch.setattr(engines, "score_translations",
                        lambda hypotheses, references: scored.append(hypotheses) or score_translations(
                            hypotheses, references))
    torch.set_num_threads(1)
    work = workload.load_workload(tmp_path / "no-corpus", workload.TINY, True, tmp_path)
    checkpoint = importlib.import_module("benchmarks.decoding").random_checkpoint(work, workload.TINY.model)
    result = engines.engines_benchmark(checkpoint, work.test_sources, work.test_references, [1], False, tmp_path,
                                       repeats=1)
    expected = {key: engines.load_engine(checkpoint, key, 1, tmp_path).translate(work.test_sources, beam_size=5)
                for key in engines.engine_keys(False)}
    assert [(run["engine"], run["precision"]) for run in result["runs"]] == list(expected)
    assert scored == list(expected.values())
    processes = [process for run in result["runs"] for process in run["processes"]]
    assert os.getpid() not in processes and len(set(processes)) == len(processes) == len(expected)  # one each

    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # as if the extra were not installed
    skipped = engines.engines_benchmark(checkpoint, work.test_sources, work.test_references, [1], False, tmp_path)
    assert skipped == {"skipped": 'CTranslate2 is not installed (pip install -e ".[export]")'}


def test_each_engine_process_runs_with_the_commands_malloc_setting(scripts_path, monkeypatch, tmp_path):
    """A spawned process starts with glibc's defaults: the engines' runs must set what the commands set."""
    engines = importlib.import_module("benchmarks.engines")
    calls = []
    monkeypatch.setattr(engines, "keep_freed_memory", lambda: calls.append("malloc"))
    monkeypatch.setattr(engines, "load_engine", lambda *args: calls.append("load") or type(
        "Echo", (), {"translate": lambda self, sentences, beam_size: sentences})())
    seconds, outputs, _ = engines._load_and_time(tmp_path / "c.pt", ("ours", "fp32"), 1, tmp_path, ["a", "b"],
                                                 torch.get_num_threads())
    assert calls == ["malloc", "load"] and outputs == ["a", "b"] and seconds >= 0


def test_tiny_serving_load_test_answers_every_request_correctly(tmp_path):
    """--parts serving alone: both modes answer every request, batched with what each request gets alone
    (one request per call). The rates are printed, never asserted."""
    pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
    output = tmp_path / "benchmark.json"
    result = subprocess.run([sys.executable, "scripts/benchmark.py", "--tiny", "--parts", "serving", "--threads", "1",
                             "--output", str(output)], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(output.read_text())
    assert set(report) == {"environment", "settings", "corpus", "serving"}  # the other parts did not run
    serving = report["serving"]
    assert re.search(r"^== serving: 4 clients, 16 requests", result.stdout, re.MULTILINE)
    assert list(serving["modes"]) == ["one_at_a_time", "batched"]
    for mode in serving["modes"].values():
        assert (mode["answered"], mode["not_sent"], mode["lost"], mode["exit_status"]) == (16, 0, 0, 0)
        assert mode["latency_ms"]["p50"] <= mode["latency_ms"]["p95"] <= mode["latency_ms"]["p99"]
    assert serving["modes"]["one_at_a_time"]["mean_requests_per_call"] == 1
    assert (serving["modes"]["batched"]["compared"], serving["modes"]["batched"]["mismatched"]) == (16, 0)


def test_tiny_says_when_it_measures_a_synthetic_corpus(scripts_path, tmp_path, capsys):
    """--tiny without the corpus measures random word sequences: said on stderr and in the report, not in the
    JSON alone, so that nobody takes its figures for Multi30k's."""
    workload = importlib.import_module("benchmarks.workload")
    report = importlib.import_module("benchmarks.report")
    work = workload.load_workload(tmp_path / "no-corpus", workload.TINY, True, tmp_path)
    assert work.corpus == "synthetic"
    assert f"corpus not found: {tmp_path / 'no-corpus' / 'multi30k'}; --tiny measures a synthetic corpus" \
        in capsys.readouterr().err
    report.print_report({"environment": {"cpu": "x", "cores": 2, "torch": "t", "threads": 1, "flags": {}},
                         "corpus": work.corpus})
    assert "corpus: synthetic" in capsys.readouterr().out


def test_a_checkpoint_decodes_the_test_split_in_its_own_languages(scripts_path, tmp_path):
    """The workload is de→en; an en→de checkpoint got German sources and English references before."""
    decoding = importlib.import_module("benchmarks.decoding")
    workload = importlib.import_module("benchmarks.workload")
    work = workload.load_workload(tmp_path / "no-corpus", workload.TINY, True, tmp_path)  # synthetic: en = DE upper
    de_en = decoding.random_checkpoint(work, workload.TINY.model)
    assert workload.test_texts(work, de_en) == (work.test_sources, work.test_references)
    state = torch.load(de_en, weights_only=True)
    state["config"]["data"].update(src_lang="en", tgt_lang="de")
    en_de = tmp_path / "en_de.pt"
    torch.save(state, en_de)
    assert workload.test_texts(work, en_de) == (work.test_references, work.test_sources)


def test_the_search_versions_copy_finds_a_relative_dataset_from_another_directory(scripts_path, quick_copy_run,
                                                                                  tmp_path, monkeypatch):
    from benchmarks.search_versions import without_decode_settings

    dataset = load_checkpoint(quick_copy_run / "checkpoint_last.pt")["config"]["data"]["dataset"]
    monkeypatch.chdir(Path(dataset).parent)
    relative = quick_copy_run / "relative.pt"
    state = load_checkpoint(quick_copy_run / "checkpoint_last.pt")
    state["config"]["data"]["dataset"] = Path(dataset).name  # as configs/ name ../shared/data/multi30k
    save_checkpoint(state, relative)
    copy = load_checkpoint(without_decode_settings(relative, tmp_path / "copy"))
    assert copy["config"]["data"]["dataset"] == str(Path(dataset).resolve()) and "decode" not in copy["config"]


def test_training_versions_times_both_commits_on_the_same_runs(copy_corpus, tmp_path):
    """scripts/benchmarks/training_versions.py with this commit as its own base, on the copy task: both
    versions train the same run, so the logged losses are identical, and both are timed in every round."""
    overrides = [o for o in toy_overrides(copy_corpus, tmp_path / "unused") if not o.startswith(
        ("train.run_dir=", "train.max_steps="))]
    result = subprocess.run([sys.executable, "-m", "scripts.benchmarks.training_versions", "--base", "HEAD",
                             "--this", "HEAD", "--config", str(copy_corpus / "copy.yaml"), "--steps", "10",
                             "--rounds", "1", "--precision", "fp32", *overrides, "train.log_every=5"], cwd=ROOT,
                            env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "round 1 this:" in out and "round 1 base:" in out
    assert "training loop, wall: this" in out and "ratio this/base" in out
    assert "losses identical: True (2 logged)" in out


def test_tiny_gpu_part_measures_both_models_on_corpus_length_batches(scripts_path, capsys, tmp_path, monkeypatch):
    """--parts gpu with --tiny on the CPU: every case's batches are cut from the corpus's sentence lengths
    within the case's token budget, its FLOPs are those of those batches, and the profiled cases have a
    breakdown. On the CPU the compiled cases are left out, and said to be; the base size's rows attend in groups
    in its last case."""
    from transformer.model import attention

    gpu = importlib.import_module("benchmarks.gpu")
    workload = importlib.import_module("benchmarks.workload")
    training = importlib.import_module("benchmarks.training")
    torch.set_num_threads(1)
    work = workload.load_workload(tmp_path / "no-corpus", workload.TINY, True, tmp_path)  # the synthetic corpus
    saved = []  # what a run cut short after each case would have kept
    groups, attend_in_groups = [], attention.attend_in_groups

    def recorded(query, key, value, row_groups, dropout_p):
        groups.append(row_groups.mask.size(-2) // query.size(-2))
        return attend_in_groups(query, key, value, row_groups, dropout_p)

    monkeypatch.setattr(attention, "attend_in_groups", recorded)
    norms, time_training = set(), gpu.time_training

    def timed(models, *args, **kwargs):
        norms.clear()
        norms.update(type(m) for m in models["ours"].model.modules() if isinstance(m, nn.LayerNorm))
        return time_training(models, *args, **kwargs)

    monkeypatch.setattr(gpu, "time_training", timed)
    result = gpu.gpu_benchmark(work, rounds=1, batches=2, device=torch.device("cpu"), tiny=True,
                               save=lambda so_far: saved.append([case["name"] for case in so_far["cases"]]))
    gpu.gpu_report(result)
    printed = capsys.readouterr().out

    assert result["device"] == "cpu" and result["skipped"] == gpu.SKIPPED_ON_CPU
    assert [case["name"] for case in result["cases"]] == ["tiny 512 bf16 eager", "tiny 512 fp16 eager",
                                                          "tiny 256 bf16 eager", "tiny 256 fp16 eager",
                                                          "tiny 512 bf16 GPU shapes", "tiny 512 bf16 rows by 64",
                                                          "tiny 512 bf16 rows by 64+bf16 residual"]
    assert saved == [[case["name"] for case in result["cases"][:n]] for n in range(1, 8)]
    assert max(groups) >= 4  # rows of 8 and 16 positions, in groups of 64
    cfg, vocab = gpu.SIZES["tiny"]
    for case in result["cases"][:4]:
        batches = gpu.corpus_batches(work, case["batch_tokens"], vocab, 2, torch.device("cpu"))
        for batch in batches:
            assert max(batch.src.numel(), batch.tgt_in.numel()) <= case["batch_tokens"]
            lengths = sorted(zip((batch.src != 0).sum(1).tolist(), (batch.tgt_out != 0).sum(1).tolist()))
            assert lengths == sorted((work.src_lengths[i], work.tgt_lengths[i]) for i in batch.indices)
        tokens = sum(batch.n_tgt_tokens for batch in batches)
        flops = sum(estimate_flops(cfg, vocab, (1, work.src_lengths[i]), (1, work.tgt_lengths[i]))
                    for batch in batches for i in batch.indices)  # MFU counts the sentences, not their padding
        assert case["target_tokens"] == tokens and case["flops_per_target_token"] == approx(flops / tokens)
        shaped = gpu.corpus_batches(work, case["batch_tokens"], vocab, 2, torch.device("cpu"), gpu_shapes=True)
        for batch in shaped:  # the graphs case's batches (GPU only): in a few shapes, filled to the budget
            assert batch.src.size(1) % 8 == 0 and batch.tgt_in.size(1) % 8 == 0
            assert batch.src.size(0) == rows_within(case["batch_tokens"], max(batch.src.size(1),
                                                                              batch.tgt_in.size(1)), 8)
            assert training.useful_flops(cfg, vocab, batch) == sum(  # filling rows and rounding are not work
                estimate_flops(cfg, vocab, (1, work.src_lengths[i]), (1, work.tgt_lengths[i])) for i in batch.indices)
        for model in ("ours", "baseline"):  # fp16's peak went through a slow a @ b: MFU above 100 %
            assert len(case[model]["rounds"]) == 1 and 0 < case[model]["mfu"] < 1, (case["name"], model)
        assert ("profile" in case) is (case["precision"] == "bf16")
    shaped = gpu.corpus_batches(work, 512, vocab, 2, torch.device("cpu"), gpu_shapes=True)
    for grouped in result["cases"][4:]:  # the GPU shapes' case and the levers' cases
        assert grouped["target_tokens"] == sum(batch.n_tgt_tokens for batch in shaped)  # on batches in GPU shapes
        assert grouped["padded_target_tokens"] == sum(batch.tgt_in.numel() for batch in shaped)
        assert all(0 < grouped[model]["mfu"] < 1 for model in ("ours", "baseline")) and "profile" not in grouped
    assert norms == {AutocastLayerNorm}  # the last case's ours: its layer norms keep bf16
    assert re.search(r"^== training on cpu .* median of 1 rounds", printed, re.MULTILINE)
    assert "tiny 512 bf16 eager training step, ms" in printed
    profiles = gpu.gpu_profiles(result)  # one bar a profiled case and model
    assert list(profiles) == [f"tiny {size} bf16 eager: {model}" for size in (512, 256)
                              for model in ("ours", "baseline")]
    report = importlib.import_module("benchmarks.report")
    assert report.plot_profiles(profiles, tmp_path / "profiles.png").stat().st_size > 0


def test_the_profile_names_what_each_kernel_computes(scripts_path):
    """Kernel names from an H100's profile of the base size (docs/gpu.md), triton's after compile, and the
    CPU's operators: each lands in its kind, not in "other" (which held a quarter of the H100's step)."""
    category = importlib.import_module("benchmarks.training").category
    named = {
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64": "attention",
        "nvjet_sm90_tst_64x32_64x16_1x2_h_bz_NTT": "matmul",
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::"
        "(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)": "softmax",
        "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<float, float, 32u, 32u, "
        "256u, false, false, false>": "layer norm",
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, false>": "layer norm",
        "void at::native::reduce_kernel<128, 4, at::native::ReduceOp<c10::BFloat16, at::native::func_wrapper_t<"
        "c10::BFloat16, at::native::sum_functor<c10::BFloat16, float, c10::BFloat16>": "reduction",
        "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::"
        "TensorIteratorBase&)": "copy/cast",
        "void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda": "copy/cast",
        "void at::native::vectorized_elementwise_kernel<4, at::native::exp_kernel_cuda(at::TensorIteratorBase&)":
            "elementwise",
        "void at::native::(anonymous namespace)::fused_dropout_kernel_vec<c10::BFloat16, float, unsigned int>":
            "dropout",
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
        "FusedOptimizerTensorListMetadata<4>": "Adam",
        "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>": "matmul",
        "void at::native::(anonymous namespace)::compute_grad_weight<c10::BFloat16, float, long>": "embedding",
        "triton_per_fused__log_softmax_gather_mean_0": "softmax",
        "triton_red_fused_native_layer_norm_backward_3": "layer norm",
        "triton_poi_fused_add_native_dropout_relu_2": "dropout",
        "triton_poi_fused__to_copy_add_1": "elementwise",  # a cast fused into an addition
        "triton_red_fused__to_copy_sum_7": "reduction", "triton_poi_fused__to_copy_3": "copy/cast",
        "aten::addmm": "matmul", "aten::bmm": "matmul", "aten::native_layer_norm": "layer norm",
        "aten::_log_softmax": "softmax", "aten::embedding_dense_backward": "embedding", "aten::copy_": "copy/cast",
        "aten::sum": "reduction", "aten::mul": "elementwise", "aten::exp_": "elementwise", "aten::expand": "other",
        "MmBackward0": "matmul", "Optimizer.step#Adam.step": "Adam", "aten::random_": "dropout",
        "aten::nll_loss_backward": "loss",
    }
    assert {name: category(name) for name in named} == named


def test_a_training_step_is_timed_in_four_phases_that_make_the_step(scripts_path):
    """The model's forward, the loss, backward and the optimizer's step, each between two readings of the clock."""
    training = importlib.import_module("benchmarks.training")
    gpu = importlib.import_module("benchmarks.gpu")
    cfg, vocab = gpu.SIZES["tiny"]
    trainee = training.build_trainees(cfg, vocab)["ours"]
    batch = make_batch([[5, 6, 7], [8, 9]], [[10, 11], [12, 13, 14]], [0, 1], 0, 2, 3)
    readings = iter(range(100))
    phases = training.train_step(trainee, trainee.optimizer(), batch, "fp32", clock=lambda: next(readings))
    assert phases == {"forward": 1, "loss": 1, "backward": 1, "optimizer": 1}


def test_the_attention_part_times_the_formula_and_names_the_kernels_a_device_lacks(scripts_path):
    """On the CPU (CI) the fused CUDA kernels are reported unavailable, with torch's reason, and the formula is
    timed; tests/test_cuda.py times all ten on a GPU."""
    attention_kernels = importlib.import_module("benchmarks.attention_kernels").attention_kernels
    result = attention_kernels(torch.device("cpu"), shapes=2, tiny=True)
    grouped = ["memory-efficient, rows by 64", "memory-efficient, rows by 128", "memory-efficient, causal, rows by 64"]
    assert list(result) == ["memory-efficient", "formula", "memory-efficient, no dropout", "flash, padded, no mask",
                            "flash-varlen", "flash, causal", "memory-efficient, causal", *grouped]
    assert all(result[name]["unavailable"] for name in ("memory-efficient", "memory-efficient, no dropout",
                                                        "flash-varlen", "flash, causal", "memory-efficient, causal",
                                                        *grouped))
    for name in ("formula", "flash, padded, no mask"):  # torch's CPU kernel is flash, without dropout
        assert result[name]["first_call_ms"] > 0 and result[name]["next_call_ms"] > 0


def test_a_kernel_failing_without_a_message_is_named_by_its_error_type(scripts_path, monkeypatch):
    """The part quoted a failure's first line as str(error).splitlines()[0]: an error without a message raised
    IndexError inside the handler, ending the benchmark where the other kernels should still run."""
    module = importlib.import_module("benchmarks.attention_kernels")

    def fail(*args, **kwargs):
        raise RuntimeError("")

    monkeypatch.setattr(module.F, "scaled_dot_product_attention", fail)
    result = module.attention_kernels(torch.device("cpu"), shapes=1, tiny=True)
    assert result["flash, padded, no mask"] == {"unavailable": "RuntimeError"} and result["formula"]["next_call_ms"] > 0


def test_the_gpu_cases_measure_the_issues_targets_after_the_eager_figures(scripts_path):
    """On a GPU: eager first (a run cut short keeps them), then the recipe's size under CUDA graphs (the steps/s
    target), without and with the levers, then the base size's levers added in turn on the same batches (GPU
    shapes, rows in groups, a bf16 residual stream), then all of them compiled and under graphs (the MFU
    target); the profiles show the before (eager, bf16) and the after (graphed). Once a case keeps ours'
    residual stream in bf16 (its layer norms swapped for good), every later case of that size does."""
    gpu = importlib.import_module("benchmarks.gpu")
    listed = gpu.cases(tiny=False, gpu=True)
    assert [case.name for case in listed] == [
        "base 25000 bf16 eager", "base 25000 fp16 eager", "multi30k 4096 bf16 eager", "multi30k 4096 fp16 eager",
        "multi30k 4096 bf16 graphs", "multi30k 4096 bf16 graphs+rows by 64+bf16 residual",
        "base 25000 bf16 GPU shapes", "base 25000 bf16 rows by 64", "base 25000 bf16 rows by 64+bf16 residual",
        "base 25000 bf16 compiled+graphs+rows by 64+bf16 residual"]
    assert [case.profiled for case in listed] == [True, False, True, False, True, False, False, False, False, True]
    assert gpu.cases(tiny=False, gpu=False) == [*listed[:4], *listed[6:9]]
    for size in ("base", "multi30k"):
        residual = [case.float32_residual for case in listed if case.size == size]
        assert residual == sorted(residual, reverse=True)


def test_a_gpu_case_that_fails_to_compile_or_record_leaves_the_next_cases_running(scripts_path, capsys, tmp_path,
                                                                                  monkeypatch):
    """A compiled or graphed case that raises (a compilation, a capture, memory) is reported as failed, and the
    cases after it are still measured (the first GPU runs lost every case after a failing one). Each case gets
    its models: the graphs case the eager models under graphs, the compiled+graphs case the compiled view under
    graphs (recorded here, since CUDA graphs need CUDA)."""
    gpu = importlib.import_module("benchmarks.gpu")
    workload = importlib.import_module("benchmarks.workload")
    torch.set_num_threads(1)
    work = workload.load_workload(tmp_path / "no-corpus", workload.TINY, True, tmp_path)
    listed = [gpu.Case("tiny", 512, "bf16", False, graphs=True, gpu_shapes=True),
              gpu.Case("tiny", 256, "bf16", True, graphs=True, gpu_shapes=True), gpu.Case("tiny", 512, "bf16", False)]
    monkeypatch.setattr(gpu, "cases", lambda tiny, on_gpu: listed)
    monkeypatch.setattr(gpu, "graphed", lambda models, precision: {**models, "graphed": True})
    measure, calls = gpu.time_training, []

    def failing_first(models, *args, **kwargs):  # the first two cases fail, as a capture can
        calls.append(models)
        if len(calls) <= 2:
            raise RuntimeError("Cannot capture: operation not permitted when stream is capturing\nmore")
        return measure(models, *args, **kwargs)

    monkeypatch.setattr(gpu, "time_training", failing_first)
    result = gpu.gpu_benchmark(work, rounds=1, batches=2, device=torch.device("cpu"), tiny=True)
    gpu.gpu_report(result)
    error = "Cannot capture: operation not permitted when stream is capturing"
    assert result["failed"] == {"tiny 512 bf16 graphs": error, "tiny 256 bf16 compiled+graphs": error}
    assert [case["name"] for case in result["cases"]] == ["tiny 512 bf16 eager"]
    assert "failed: tiny 256 bf16 compiled+graphs: Cannot capture" in capsys.readouterr().out
    graphed, compiled_graphed, eager = calls
    assert graphed["graphed"] and graphed["ours"].model is eager["ours"].model
    layer = compiled_graphed["ours"].model.encoder.layers[0]
    assert compiled_graphed["graphed"] and isinstance(layer, torch._dynamo.eval_frame.OptimizedModule)


@pytest.mark.parametrize("arguments, message", [
    (["--threads", "0"], "--threads must be >= 1, got 0"),  # a RuntimeError from torch.set_num_threads
    (["--rounds", "-1"], "--rounds must be >= 1, got -1"),  # "no median for empty data"
    (["--decode-batch", "0"], "--decode-batch must be >= 1, got 0"),  # the default, without a word
    (["--checkpoint", "nowhere.pt"], "--checkpoint nowhere.pt: no such file"),  # a traceback after training
    # without a GPU the part ran on the CPU, its report titled as the GPU's
    (["--parts", "gpu"], "--parts gpu trains on CUDA, which this torch or machine has not: give --device cpu to "
                         "try its cases on the CPU"),
])
def test_bad_arguments_are_one_line_before_any_work(scripts_path, capsys, monkeypatch, arguments, message):
    benchmark = importlib.import_module("benchmark")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        benchmark.parse_args(["--tiny", *arguments])
    assert capsys.readouterr().err.splitlines()[-1].endswith(f": error: {message}")
