"""Training speed on a GPU (``--parts gpu --device cuda``, issue 32): ours against the `nn.Transformer`
baseline of training.py at the paper's base size (d 512, 6+6 layers, 32k vocabulary) and at the
Multi30k recipe's size (d 256, 3+3, 8k), eager in bf16 and fp16; then, on a GPU, the attention kernels
alone (`attention_kernels`), the recipe's size with CUDA graphs (`GraphedSteps`, train.cuda_graphs=true) on
batches in GPU shapes (data.pad_to_multiple=8, data.pad_rows=true), for issue 32's steps/s target, and the
base size with ours' rows attending in groups (train.attention_row_length, `model.row_groups`) and its residual
stream in bf16 (train.float32_residual=false), eager, under `compile_training` (train.compile=true), and under
CUDA graphs as well, for its MFU target.

The batches are cut as training cuts them (`token_batches`, 4,096 and 25,000 padded tokens a side)
from the lengths of the corpus's sentences in tokens, and filled with random token ids: the real
length distribution and padding, without a tokenizer per vocabulary size. Each case warms up on every
batch (compilation, kernel choice; its seconds are reported), then the two models alternate round by
round and medians are reported. MFU relates the rates to a matrix product measured in the same run,
and torch.profiler's kernels by category (and the time the GPU sat idle) show where a step goes, before
(eager) and after (graphs; compiled and graphs).

With ``--tiny`` (tests/test_benchmark.py) the tiny model and budgets run on the CPU in seconds; on
the CPU only the eager cases run, grouped rows included (see `SKIPPED_ON_CPU`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch
from torch import Tensor, nn

from transformer.config import ModelConfig
from transformer.data.batch import Batch, make_batch
from transformer.data.batching import token_batches
from transformer.errors import first_line
from transformer.fast import replace_modules
from transformer.model.transformer import count_parameters
from transformer.runtime.compile import compile_training
from transformer.runtime.cuda_graphs import CudaGraphRecorder, GraphedSteps
from transformer.runtime.device import avoid_cudnn_attention
from transformer.runtime.precision import DTYPES, AutocastLayerNorm, autocast

from .attention_kernels import attention_kernels
from .report import print_profile, print_table
from .training import PAD_ID, Trainee, build_trainees, matmul_peak, profile_training, time_training, useful_flops
from .workload import DROPOUT, TINY, Workload

SIZES = {"base": (ModelConfig(d_model=512, n_heads=8, d_ff=2048, n_encoder_layers=6, n_decoder_layers=6, **DROPOUT),
                  32000),
         "multi30k": (ModelConfig(d_model=256, n_heads=4, d_ff=1024, n_encoder_layers=3, n_decoder_layers=3,
                                  **DROPOUT), 8000),
         "tiny": (TINY.model, TINY.vocab_size)}
BOS_ID, EOS_ID, FIRST_WORD_ID = 2, 3, 4
ROW_LENGTH = 64  # the memory-efficient kernel's tile: 64 queries by 64 keys at 64 dimensions a head
SKIPPED_ON_CPU = ("the attention kernels, graphs and compiled cases run on a GPU only (the kernels and CUDA graphs "
                  "are CUDA's, and compiling takes minutes and gains nothing on the CPU)")


@dataclass(frozen=True)
class Case:
    size: str
    batch_tokens: int
    precision: str
    compiled: bool
    profiled: bool = False  # where a step's time goes, for the cases the targets are set on
    graphs: bool = False  # forward and backward replayed from CUDA graphs
    row_length: int = 0  # ours: rows attend in groups of up to this many positions (train.attention_row_length)
    float32_residual: bool = True  # ours: false keeps the residual stream in bf16 (train.float32_residual=false)
    gpu_shapes: bool = False  # batches as data.pad_to_multiple=8 data.pad_rows=true data.rows_multiple=8 make them

    def __post_init__(self) -> None:
        assert self.gpu_shapes or not (self.graphs or self.row_length), "graphs and row groups need GPU shapes"

    @property
    def mode(self) -> str:
        modes = (("compiled", self.compiled), ("graphs", self.graphs), (f"rows by {self.row_length}", self.row_length),
                 (f"{self.precision} residual", not self.float32_residual),
                 ("GPU shapes", self.gpu_shapes and not (self.graphs or self.row_length)))
        return "+".join(mode for mode, on in modes if on) or "eager"

    @property
    def reference(self) -> bool:
        """Eager through torch's kernels: the rows the other cases are compared with (their failure ends the run)."""
        return not (self.compiled or self.graphs or self.row_length or not self.float32_residual)

    @property
    def name(self) -> str:
        return f"{self.size} {self.batch_tokens} {self.precision} {self.mode}"


def cases(tiny: bool, gpu: bool) -> list[Case]:
    """The paper's base size at 25k-token batches and the recipe's at 4k, eager in bf16 and fp16; then in bf16,
    on a GPU: the recipe's size under CUDA graphs (issue 32's steps/s target; recorded in seconds), without and
    with the base size's levers below (whether the GPU recipes should take them); the base size
    eager on batches in GPU shapes, then on the same batches with ours' rows attending in groups of up to
    `ROW_LENGTH` positions, then with its residual stream in bf16 as well (what each lever gains, one at a time,
    in the same run); last, with both, compiled and under CUDA graphs: the MFU target (compiling both base models
    takes the longest; the plain compiled and graphed step was measured on an H200 on 2026-11-27, and a second
    compilation would not fit the 3 minutes). A run cut short keeps the eager figures. The before and after are
    profiled: the eager bf16 cases and the graphed ones (the profiler costs seconds a case). Once a case keeps
    ours' residual stream in bf16, every later case of that size does (its layer norms are swapped for good)."""
    base, recipe = ("tiny", 512) if tiny else ("base", 25000), ("tiny", 256) if tiny else ("multi30k", 4096)
    eager = [Case(*size, precision, False, profiled=precision == "bf16") for size in (base, recipe)
             for precision in ("bf16", "fp16")]
    shaped = dict(gpu_shapes=True)
    fastest = dict(row_length=ROW_LENGTH, float32_residual=False, **shaped)
    levers = [Case(*base, "bf16", False, **shaped), Case(*base, "bf16", False, row_length=ROW_LENGTH, **shaped),
              Case(*base, "bf16", False, **fastest)]
    if not gpu:
        return [*eager, *levers]
    return [*eager, Case(*recipe, "bf16", False, profiled=True, graphs=True, **shaped),
            Case(*recipe, "bf16", False, graphs=True, **fastest), *levers,
            Case(*base, "bf16", True, profiled=True, graphs=True, **fastest)]


class WithRowGroups(nn.Module):
    """Ours, its rows attending in groups of up to ``row_length`` positions: the forward the Trainer runs with
    train.attention_row_length."""

    def __init__(self, model: nn.Module, row_length: int) -> None:
        super().__init__()
        self.model, self.row_length = model, row_length

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        return self.model(src, tgt_in, self.row_length)


def corpus_batches(workload: Workload, batch_tokens: int, vocab_size: int, count: int, device: torch.device,
                   gpu_shapes: bool = False) -> list[Batch]:
    """The first ``count`` token-budget batches of an epoch of the corpus's sentence lengths, random ids; with
    ``gpu_shapes``, as data.pad_to_multiple=8 data.pad_rows=true data.rows_multiple=8 make them."""
    multiple = 8 if gpu_shapes else 1
    src, tgt = workload.src_lengths, workload.tgt_lengths
    order = token_batches(src, tgt, batch_tokens, seed=0, epoch=0, pool_batches=workload.data.pool_batches,
                          pad_to_multiple=multiple, rows_multiple=multiple)
    generator = torch.Generator().manual_seed(0)

    def words(length: int) -> list[int]:  # a row's ids without the eos / bos that make_batch adds
        return torch.randint(FIRST_WORD_ID, vocab_size, (length - 1,), generator=generator).tolist()

    return [make_batch([words(src[i]) for i in indices], [words(tgt[i]) for i in indices], indices, PAD_ID, BOS_ID,
                       EOS_ID, multiple, batch_tokens if gpu_shapes else 0, multiple).to(device)
            for indices in order[:count]]


def compiled(trainees: dict[str, Trainee]) -> dict[str, Trainee]:
    """Both models and their losses under `compile_training`, as train.compile=true compiles ours."""
    return {name: Trainee(*compile_training(trainee.model, trainee.loss), trainee.make_optimizer)
            for name, trainee in trainees.items()}


def graphed(trainees: dict[str, Trainee], precision: str) -> dict[str, Trainee]:
    """Both models' forward, loss and backward replayed from CUDA graphs, as train.cuda_graphs=true runs ours;
    their gradients become zeroed buffers, which the graphs add to."""
    assert precision != "fp16", "the graphed benchmark steps scale no loss: bf16 or fp32"
    result = {}
    for name, trainee in trainees.items():
        for parameter in trainee.model.parameters():
            parameter.grad = torch.zeros_like(parameter)

        def step(src: Tensor, tgt_in: Tensor, tgt_out: Tensor, factor: Tensor,
                 trainee: Trainee = trainee) -> tuple[Tensor, Tensor]:
            with autocast(src.device, precision):
                logits = trainee.model(src, tgt_in)
            loss = trainee.loss(logits, tgt_out)
            (loss * factor).backward()
            return loss.detach(), loss.detach()

        graphs = GraphedSteps(step, lambda model=trainee.model: [p.grad for p in model.parameters()],
                              CudaGraphRecorder(next(trainee.model.parameters()).device))
        result[name] = replace(trainee, graphs=graphs)
    return result


def gpu_benchmark(workload: Workload, rounds: int, batches: int, device: torch.device, tiny: bool,
                  save: Callable[[dict], None] | None = None) -> dict:
    """Every case of `cases`: target tokens/s of both models, their MFU, warm-up seconds, profiles.

    ``save`` gets the result so far after each case: a run cut short by its time limit keeps its figures.
    """
    started = time.perf_counter()
    gpu = device.type == "cuda"
    listed = cases(tiny, gpu)
    peaks = {precision: matmul_peak(DTYPES[precision], 256 if tiny else 8192, device)
             for precision in dict.fromkeys(case.precision for case in listed)}
    result: dict = {"device": torch.cuda.get_device_name(device) if gpu else "cpu", "torch": torch.__version__,
                    "cuda": torch.version.cuda, "matmul_peak_flops": peaks, "rounds": rounds, "cases": []}
    if not gpu:
        result["skipped"] = SKIPPED_ON_CPU
    trainees: dict[str, dict[str, dict[str, Trainee]]] = {}
    for size in dict.fromkeys(case.size for case in listed):
        cfg, vocab = SIZES[size]
        eager = {name: Trainee(t.model.to(device), t.loss, t.make_optimizer)
                 for name, t in build_trainees(cfg, vocab).items()}
        trainees[size] = {"eager": eager}
        result.setdefault("parameters", {})[size] = {name: count_parameters(t.model) for name, t in eager.items()}
    if gpu:  # the cases train as training does: without cuDNN's attention
        avoid_cudnn_attention()
    for case in listed:
        if gpu and not case.reference and "attention_kernels" not in result:  # after the eager figures, seconds
            result["attention_kernels"] = attention_kernels(device, 4 if tiny else 8, tiny)
            print(f"[gpu part, {time.perf_counter() - started:.0f} s] attention at a new shape and again, ms: "
                  f"{result['attention_kernels']}", flush=True)
        cfg, vocab = SIZES[case.size]
        data = corpus_batches(workload, case.batch_tokens, vocab, batches, device, gpu_shapes=case.gpu_shapes)
        tokens = sum(batch.n_tgt_tokens for batch in data)
        flops_per_token = sum(useful_flops(cfg, vocab, batch) for batch in data) / tokens
        sized = trainees[case.size]
        if case.compiled and "compiled" not in sized:  # one compiled view a size, shared by its compiled cases
            sized["compiled"] = compiled(sized["eager"])
        models = sized["compiled" if case.compiled else "eager"]
        if not case.float32_residual:  # in the plain model's layers, which the compiled view shares
            replace_modules(sized["eager"]["ours"].model, nn.LayerNorm, AutocastLayerNorm.sharing)
        if case.row_length:
            grouped = WithRowGroups(models["ours"].model, case.row_length)
            models = {**models, "ours": replace(models["ours"], model=grouped)}
        if case.graphs:
            models = graphed(models, case.precision)
        try:
            timing = time_training(models, data, case.precision, rounds, warm_up=len(data))
            profile = {name: profile_training(t, data, case.precision) for name, t in models.items()} \
                if case.profiled else None
        except RuntimeError as error:  # a compilation or capture that fails: the next cases still run
            if case.reference:
                raise
            if gpu:  # a capture that failed may leave its stream current
                torch.cuda.set_stream(torch.cuda.default_stream(device))
                torch.cuda.synchronize(device)
            cause = error.__context__ or error  # a failed capture's own error comes first
            result.setdefault("failed", {})[case.name] = first_line(cause)[:300]
            print(f"[gpu part] {case.name} failed: {result['failed'][case.name]}", flush=True)
            continue
        for name in models:
            achieved = timing[name]["tokens_per_s"] * flops_per_token
            timing[name].update(flops_per_s=achieved, mfu=achieved / peaks[case.precision])
        entry = {**asdict(case), "name": case.name, "batches": len(data), "target_tokens": tokens,
                 "padded_target_tokens": sum(b.tgt_in.numel() for b in data), "sentences": sum(
                     len(b.indices) for b in data), "flops_per_target_token": flops_per_token, **timing}
        if case.profiled:
            entry["profile"] = profile
        result["cases"].append(entry)
        result["seconds"] = time.perf_counter() - started
        if save is not None:
            save(result)
        ours, baseline = timing["ours"], timing["baseline"]
        print(f"[gpu part, {time.perf_counter() - started:.0f} s] {case.name}: target tokens/s ours "
              f"{ours['tokens_per_s']:,.0f} (MFU {ours['mfu']:.1%}), baseline {baseline['tokens_per_s']:,.0f} (MFU "
              f"{baseline['mfu']:.1%})", flush=True)
    result["seconds"] = time.perf_counter() - started
    return result


def gpu_report(gpu: dict) -> None:
    """The cases as one table, then each profiled case's step: phases and kernels (operators on the CPU)."""
    peaks = ", ".join(f"{p} {flops / 1e12:,.3g} TFLOP/s" for p, flops in gpu["matmul_peak_flops"].items())
    print_table(f"training on {gpu['device']} (torch {gpu['torch']}): target tokens/s, median of {gpu['rounds']} "
                f"rounds; matmul peak {peaks}; {gpu['seconds']:.0f} s in all",
                ["size tokens precision mode", "ours", "nn.Transformer", "ours/baseline", "MFU ours", "MFU baseline",
                 "warm-up s ours", "warm-up s baseline", "padding"],
                [[case["name"], case["ours"]["tokens_per_s"], case["baseline"]["tokens_per_s"], case["ratio"],
                  f"{case['ours']['mfu']:.1%}", f"{case['baseline']['mfu']:.1%}", case["ours"]["warm_up_seconds"],
                  case["baseline"]["warm_up_seconds"],
                  f"{1 - case['target_tokens'] / case['padded_target_tokens']:.1%}"]
                 for case in gpu["cases"]])
    if "skipped" in gpu:
        print(f"skipped: {gpu['skipped']}")
    for name, error in gpu.get("failed", {}).items():
        print(f"failed: {name}: {error}")
    if "attention_kernels" in gpu:
        print_table("attention on padded rows, forward + backward, ms (dropout 0.1 unless named): at a shape's first "
                    "call and at its next",
                    ["kernel", "first call", "next call"],
                    [[name, times.get("first_call_ms", times.get("unavailable")), times.get("next_call_ms", "")]
                     for name, times in gpu["attention_kernels"].items()])
    for case in (case for case in gpu["cases"] if "profile" in case):
        print_profile(f"{case['name']} training step, ms: phases, then torch.profiler by kind of kernel",
                      case["profile"])


def gpu_profiles(gpu: dict) -> dict[str, dict]:
    """Every profiled case's step, ours and the baseline, labelled for `plot_profiles`."""
    return {f"{case['name']}: {model}": profile for case in gpu["cases"] if "profile" in case
            for model, profile in case["profile"].items()}
