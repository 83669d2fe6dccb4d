"""Training speed: our `Transformer` against a baseline built from `torch.nn.Transformer`.

Both models have the same sizes, embeddings and seed, and each trains with its own loss and
optimizer (ours as `training.Trainer` does; the baseline with torch's stock cross_entropy with
the same label smoothing; both with fused Adam), so the ratio of their target tokens/s is what our
model and its speed paths buy. The two alternate round by round (A B A B ...) and medians are
reported: the machine may be shared. FLOPs utilisation relates the rates to a matmul peak
measured here, and a profile shows where a step spends its time: forward / loss / backward /
optimizer, then torch.profiler's operators by self time.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer import fast
from transformer.config import DataConfig, ModelConfig, TrainConfig
from transformer.data.batch import Batch
from transformer.model.layers import sinusoidal_positional_encoding
from transformer.model.transformer import Transformer, count_parameters, estimate_flops
from transformer.runtime.cuda_graphs import GraphedSteps
from transformer.runtime.precision import DTYPES, autocast
from transformer.training.schedule import build_optimizer

from .workload import Settings, Workload, native_precisions

CPU = torch.device("cpu")
PAD_ID = DataConfig().pad_id
LABEL_SMOOTHING = TrainConfig().label_smoothing
PRECISIONS = ("fp32", "bf16")
# torch.profiler operators (CPU) and kernels (GPU) grouped by what they compute: the first label with a fragment
# in the lower-cased name wins. GPU names: cuBLAS's "nvjet_*"/"*gemm*" (and its split-K "splitKreduce"), cuDNN's
# "*sdpa*", ATen's "cunn_SoftMax*", "GammaBetaBackward*" (layer norm), "reduce_kernel" (bias gradients, means) and
# embedding backward's "compute_grad_weight"/"sum_and_scatter"; triton's "triton_{poi,red,per}_fused_<ops>_<n>",
# named by their first fused operation other than a cast (`category`).
CATEGORIES = (("Adam", ("adam", "multi_tensor")),
              ("attention", ("scaled_dot_product", "flash", "fmha", "sdpa", "attention")),
              ("layer norm", ("layer_norm", "layernorm", "gammabeta")),
              ("matmul", ("::mm", "_mm", "addmm", "bmm", "mmbackward", "matmul", "linear", "gemm", "nvjet",
                          "splitkreduce")),
              ("dropout", ("dropout", "bernoulli", "random_")), ("softmax", ("softmax",)),
              ("loss", ("nll_loss", "cross_entropy")),
              ("embedding", ("embedding", "index_select", "indexselect", "compute_grad_weight", "sum_and_scatter")),
              ("copy/cast", ("copy_", "_to_copy", "clone", "contiguous")),
              ("reduction", ("reduce_kernel", "sum", "triton_red", "triton_per")),
              ("elementwise", ("elementwise", "add", "mul", "div", "sub", "lerp", "sqrt", "exp_", "relu",
                               "threshold", "fill", "where", "triton_poi")))


class TorchTransformer(nn.Module):
    """The baseline: `torch.nn.Transformer` between the embeddings, positions and tied output
    projection of our model (§3.4, §3.5). nn.Transformer adds a final LayerNorm to each stack."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, pad_id: int) -> None:
        super().__init__()
        self.pad_id, self.scale = pad_id, math.sqrt(cfg.d_model)
        self.embedding = nn.Embedding(vocab_size, cfg.d_model, padding_idx=pad_id)  # source, target and output
        nn.init.normal_(self.embedding.weight, std=cfg.d_model**-0.5)
        self.register_buffer("table", sinusoidal_positional_encoding(cfg.max_positions, cfg.d_model),
                             persistent=False)
        self.dropout = nn.Dropout(cfg.dropout)
        self.transformer = nn.Transformer(cfg.d_model, cfg.n_heads, cfg.n_encoder_layers, cfg.n_decoder_layers,
                                          cfg.d_ff, cfg.dropout, batch_first=True)

    def embed(self, tokens: Tensor) -> Tensor:
        return self.dropout(self.embedding(tokens) * self.scale + self.table[: tokens.size(1)])

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """src (B, S), tgt_in (B, T) -> logits (B, T, V)."""
        padding = src == self.pad_id  # (B, S); True = ignore, nn.Transformer's convention
        length = tgt_in.size(1)
        future = torch.ones(length, length, dtype=torch.bool, device=src.device).triu(1)  # (T, T)
        states = self.transformer(self.embed(src), self.embed(tgt_in), tgt_mask=future, src_key_padding_mask=padding,
                                  memory_key_padding_mask=padding, tgt_is_causal=True)
        return F.linear(states, self.embedding.weight)


Loss = Callable[[Tensor, Tensor], Tensor]  # logits (B, T, V), targets (B, T) -> summed loss


def baseline_loss(logits: Tensor, target: Tensor) -> Tensor:
    """torch's cross_entropy with the same label smoothing."""
    return F.cross_entropy(logits.flatten(0, 1).float(), target.flatten(), ignore_index=PAD_ID,
                           label_smoothing=LABEL_SMOOTHING, reduction="sum")


def device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def fused_adam(model: nn.Module) -> torch.optim.Optimizer:
    """Adam as `training.Trainer` builds it (fused), for both models: the models are compared, not Adams (the
    baseline's stock Adam, the single-tensor loop on the CPU, took ~20 ms a step of the recipe's size to fused
    Adam's ~6 ms, a flag any user of `nn.Transformer` can set)."""
    return build_optimizer(model.parameters(), TrainConfig(), device_of(model))


@dataclass
class Trainee:
    """A model with the loss and the optimizer it trains with."""

    model: nn.Module
    loss: Loss
    make_optimizer: Callable[[nn.Module], torch.optim.Optimizer]
    graphs: GraphedSteps | None = None  # forward and backward replayed from CUDA graphs (train.cuda_graphs)

    def optimizer(self) -> torch.optim.Optimizer:
        """A fresh optimizer, the model in training mode. The learning rate stays at a small
        constant: the schedule costs nothing and is left out."""
        optimizer = self.make_optimizer(self.model.train())
        for group in optimizer.param_groups:
            group["lr"] = 1e-4
        return optimizer


def build_trainees(cfg: ModelConfig, vocab_size: int) -> dict[str, Trainee]:
    """Ours and the baseline, from the same seed, each with its loss and optimizer."""
    torch.manual_seed(0)
    ours = Transformer(cfg, vocab_size, pad_id=PAD_ID)
    loss_function = fast.for_training(ours)  # the CPU speed paths, as the Trainer swaps them in

    def ours_loss(logits: Tensor, target: Tensor) -> Tensor:
        return loss_function(logits, target, LABEL_SMOOTHING, PAD_ID)[0]

    torch.manual_seed(0)
    baseline = TorchTransformer(cfg, vocab_size, PAD_ID)
    return {"ours": Trainee(ours, ours_loss, fused_adam), "baseline": Trainee(baseline, baseline_loss, fused_adam)}


def wait(device: torch.device) -> float:
    """time.perf_counter() once the device has finished the work queued so far."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def loss_scaler(batch: Batch, precision: str) -> torch.amp.GradScaler:
    """The Trainer's GradScaler: scaling the loss in fp16, passing it through otherwise."""
    return torch.amp.GradScaler(batch.src.device.type, enabled=precision == "fp16")


def train_step(trainee: Trainee, optimizer: torch.optim.Optimizer, batch: Batch, precision: str,
               scaler: torch.amp.GradScaler | None = None,
               clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """One update like `Trainer.update` (in fp16, pass the run's `loss_scaler`); returns seconds of the model's
    forward, the loss, backward, step by ``clock`` (on a GPU, phases are only timed with a clock that `wait`s for
    the device)."""
    scaler = scaler or loss_scaler(batch, precision)
    start = clock()
    if trainee.graphs is not None:  # forward, loss and backward in one replay, all counted as "forward" (no loss scale)
        trainee.graphs(batch.src, batch.tgt_in, batch.tgt_out, 1.0 / batch.n_tgt_tokens)
        forward = loss_forward = backward = clock()
    else:
        with autocast(batch.src.device, precision):
            logits = trainee.model(batch.src, batch.tgt_in)
        forward = clock()
        loss = trainee.loss(logits, batch.tgt_out)
        loss_forward = clock()
        scaler.scale(loss / batch.n_tgt_tokens).backward()
        backward = clock()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=trainee.graphs is None)  # a graph adds to gradients at fixed addresses
    return {"forward": forward - start, "loss": loss_forward - forward, "backward": backward - loss_forward,
            "optimizer": clock() - backward}


def time_training(trainees: dict[str, Trainee], batches: list[Batch], precision: str, rounds: int,
                  warm_up: int = 1) -> dict:
    """Target tokens/s of each model, alternating models round by round after ``warm_up`` steps each
    (kernels chosen or compiled, Adam's state allocated), whose seconds are reported too."""
    device = batches[0].src.device
    optimizers = {name: trainee.optimizer() for name, trainee in trainees.items()}
    scalers = {name: loss_scaler(batches[0], precision) for name in trainees}
    warm_up_seconds = {}
    for name, trainee in trainees.items():
        start = wait(device)
        for batch in batches[:warm_up]:
            train_step(trainee, optimizers[name], batch, precision, scalers[name])
        warm_up_seconds[name] = wait(device) - start
    tokens = sum(batch.n_tgt_tokens for batch in batches)
    rates: dict[str, list[float]] = {name: [] for name in trainees}
    for _ in range(rounds):
        for name, trainee in trainees.items():
            start = wait(device)
            for batch in batches:
                train_step(trainee, optimizers[name], batch, precision, scalers[name])
            rates[name].append(tokens / (wait(device) - start))
    result = {name: {"tokens_per_s": statistics.median(values), "rounds": values,
                     "warm_up_seconds": warm_up_seconds[name]} for name, values in rates.items()}
    result["ratio"] = result["ours"]["tokens_per_s"] / result["baseline"]["tokens_per_s"]
    return result


def matmul_peak(dtype: torch.dtype, size: int, device: torch.device = CPU, repeats: int = 5) -> float:
    """Best FLOP/s of a size x size matrix product in ``dtype``, through `F.linear` as autocast runs the Linears
    (on a CPU without native fp16, ``a @ b`` in fp16 took a path 7-10x slower than F.linear's, and the tiny
    GPU part's fp16 MFU on the CPU came out above 100 %); on a GPU, of ten products in a row, so that waiting
    for the device is a small part of the time."""
    a, b = (torch.randn(size, size, device=device).to(dtype) for _ in range(2))
    products = 10 if device.type == "cuda" else 1
    F.linear(a, b)  # warm-up
    best = math.inf
    for _ in range(repeats):
        start = wait(device)
        for _ in range(products):
            F.linear(a, b)
        best = min(best, wait(device) - start)
    return 2 * size**3 * products / best


def category(name: str) -> str:
    """The kind of computation of a torch.profiler operator or GPU kernel (see CATEGORIES)."""
    name = name.lower()
    if name.startswith("triton_") and re.search(r"fused_+[a-z]", name.replace("_to_copy", "")):
        name = name.replace("_to_copy", "")  # autocast's casts fuse into most kernels: the other operations say more
    return next((label for label, parts in CATEGORIES if any(part in name for part in parts)), "other")


def profile_training(trainee: Trainee, batches: list[Batch], precision: str, top: int = 12) -> dict:
    """Phase times of plain steps, then torch.profiler's breakdown per step: on the CPU the operators by self
    CPU time; on a GPU the kernels by device time, and the time the GPU sat idle (waiting for launches)."""
    device = batches[0].src.device
    optimizer, scaler = trainee.optimizer(), loss_scaler(batches[0], precision)
    train_step(trainee, optimizer, batches[0], precision, scaler)
    phases = [train_step(trainee, optimizer, batch, precision, scaler, lambda: wait(device)) for batch in batches]
    gpu = device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if gpu else [])
    with torch.profiler.profile(activities=activities) as profiler:
        start = wait(device)
        for batch in batches:
            train_step(trainee, optimizer, batch, precision, scaler)
        seconds = wait(device) - start
    if gpu:
        events = [e for e in profiler.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
        busy = {e.key: e.self_device_time_total for e in events}
    else:
        events = list(profiler.key_averages())
        busy = {e.key: e.self_cpu_time_total for e in events}
    events.sort(key=lambda e: -busy[e.key])
    per_step = 1e-3 / len(batches)  # µs over all steps -> ms per step
    categories: dict[str, float] = {}
    for event in events:
        label = category(event.key)
        categories[label] = categories.get(label, 0.0) + busy[event.key] * per_step
    if gpu:  # the step's wall time (under the profiler) that no kernel ran in
        categories["GPU idle"] = max(0.0, 1e3 * seconds / len(batches) - sum(categories.values()))
    phases_ms = {name: 1e3 * statistics.mean(p[name] for p in phases) for name in phases[0]}
    return {"phases_ms": {**phases_ms, "step": sum(phases_ms.values())},
            "categories_ms": dict(sorted(categories.items(), key=lambda kv: -kv[1])),
            "top_ops_ms": [{"op": e.key, "self_ms": busy[e.key] * per_step,
                            "calls": e.count / len(batches)} for e in events[:top]]}


def useful_flops(cfg: ModelConfig, vocab_size: int, batch: Batch) -> float:
    """`estimate_flops` of the batch's sentences at their own lengths, what MFU divides by: the work asked for,
    without the padding of short rows or the empty rows that fill a batch to GPU shapes (data.pad_rows),
    which a padded batch computes too and which would raise MFU for nothing."""
    rows = len(batch.indices)  # the real pairs come first; filling rows follow
    src, tgt = ((tensor[:rows] != PAD_ID).sum(1).tolist() for tensor in (batch.src, batch.tgt_out))
    return sum(estimate_flops(cfg, vocab_size, (1, s), (1, t)) for s, t in zip(src, tgt))


def training_benchmark(workload: Workload, settings: Settings, fast_bf16: bool) -> dict:
    """Throughput of both models in fp32 and, where the CPU computes it natively (``fast_bf16``),
    bf16; their FLOPs utilisation, and profiles of both."""
    trainees = build_trainees(settings.model, workload.vocab_size)
    precisions = native_precisions(PRECISIONS, fast_bf16)
    batches = workload.train_batches
    tokens = sum(batch.n_tgt_tokens for batch in batches)
    flops_per_token = sum(useful_flops(settings.model, workload.vocab_size, batch) for batch in batches) / tokens
    peaks = {precision: matmul_peak(DTYPES[precision], settings.matmul_size) for precision in precisions}
    result = {"parameters": {name: count_parameters(trainee.model) for name, trainee in trainees.items()},
              "batches": len(batches), "target_tokens": tokens, "padded_target_tokens": sum(
                  batch.tgt_in.numel() for batch in batches), "flops_per_target_token": flops_per_token,
              "matmul_peak_flops": peaks, "matmul_size": settings.matmul_size}
    for precision in precisions:
        timing = time_training(trainees, batches, precision, settings.rounds)
        for name in trainees:
            achieved = timing[name]["tokens_per_s"] * flops_per_token
            timing[name].update(flops_per_s=achieved, mfu=achieved / peaks[precision])
        result[precision] = timing
    result["profile"] = {precision: {name: profile_training(trainee, batches, precision)
                                     for name, trainee in trainees.items()} for precision in precisions}
    return result
