"""The CUDA paths: autocast on the GPU, fp16 loss scaling, GPU checkpoints read on the CPU, GPU
decoding, train.compile on the GPU, the GPU benchmark. They run where a GPU is present and are skipped
elsewhere (CI has none); scripts/gpu_check.sh runs them on a lent GPU (docs/gpu.md)."""

import json
import subprocess
import sys

import pytest
import torch
from conftest import PAD, ROOT, VOCAB, make_model, metric_records, run_config, subprocess_env, training_step

from transformer import fast
from transformer.checkpoint import load_checkpoint
from transformer.decoding.translator import Translator
from transformer.fast.loss import label_smoothed_cross_entropy
from transformer.runtime.compile import compile_training
from transformer.runtime.cuda_graphs import CudaGraphRecorder, GraphedSteps
from transformer.runtime.precision import autocast
from transformer.training import train
from transformer.training.checkpoint_writer import CheckpointWriter

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def cuda_run(corpus, run_dir, **values):
    return run_config(corpus, run_dir, device="cuda", **values)


def loss_and_gradients(device: str, precision: str, compile: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """One label-smoothed loss on a fixed padded batch and all parameter gradients, flattened; with
    ``compile``, through `compile_training` as train.compile=true runs it."""
    model = make_model(seed=1).train().to(device)
    forward, loss_function = model, label_smoothed_cross_entropy
    if compile:
        forward, loss_function = compile_training(model, fast.for_training(model))
    generator = torch.Generator().manual_seed(0)
    src, tgt = (torch.randint(4, VOCAB, (8, 12), generator=generator) for _ in range(2))
    src[:4, 9:] = PAD  # padded sources exercise the attention masks,
    tgt[2:6, 10:] = PAD  # padded targets the positions the loss skips
    src, tgt = src.to(device), tgt.to(device)
    with autocast(torch.device(device), precision):
        logits = forward(src, tgt[:, :-1])
    loss, _ = loss_function(logits, tgt[:, 1:], 0.1, PAD)
    loss.backward()
    return loss.detach().cpu(), torch.cat([p.grad.flatten() for p in model.parameters()]).float().cpu()


def gradients(device: str, precision: str) -> torch.Tensor:
    return loss_and_gradients(device, precision)[1]


def test_gpu_gradients_equal_the_cpu_ones():
    cpu = gradients("cpu", "fp32")
    torch.testing.assert_close(gradients("cuda", "fp32"), cpu, atol=1e-5, rtol=1e-3)
    for precision in ("bf16", "fp16"):
        assert torch.cosine_similarity(gradients("cuda", precision), cpu, dim=0) > 0.999, precision


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_gpu_training_lowers_the_loss_and_saves_a_cpu_loadable_checkpoint(copy_corpus, tmp_path, precision):
    summary = train(cuda_run(copy_corpus, tmp_path, max_steps=40, precision=precision))
    losses = [r["loss"] for r in metric_records(tmp_path, "train")]
    assert summary.step == 40 and losses[-1] < 0.7 * losses[0]
    state = load_checkpoint(tmp_path / "checkpoint_last.pt")  # weights_only, mapped to the CPU
    assert all(t.device.type == "cpu" and t.dtype == torch.float32 for t in state["model"].values())
    if precision == "fp16":
        assert state["scaler"]["scale"] > 0  # the GradScaler is saved to resume with the same loss scale


def test_the_same_seed_gives_the_same_curve_on_the_gpu(copy_corpus, tmp_path):
    for name in ("a", "b"):
        train(cuda_run(copy_corpus, tmp_path / name, max_steps=20, precision="bf16", log_every=2))
    assert metric_records(tmp_path / "a", "train") == metric_records(tmp_path / "b", "train")


@pytest.mark.parametrize("graphs", [{}, {"cuda_graphs": True, "data.pad_rows": "true", "data.pad_to_multiple": 8}],
                         ids=["eager", "graphs"])
def test_a_resumed_gpu_run_equals_an_uninterrupted_one(copy_corpus, tmp_path, graphs):
    """Under CUDA graphs too: the warm-up before each recording gives back the random numbers it drew."""
    settings = dict(max_steps=16, save_every=8, log_every=4, precision="fp16", **{"model.dropout": 0.1}, **graphs)
    train(cuda_run(copy_corpus, tmp_path / "straight", **settings))
    train(cuda_run(copy_corpus, tmp_path / "resumed", **{**settings, "max_steps": 8}))
    train(cuda_run(copy_corpus, tmp_path / "resumed", **settings))
    straight = load_checkpoint(tmp_path / "straight" / "checkpoint_last.pt")
    resumed = load_checkpoint(tmp_path / "resumed" / "checkpoint_last.pt")
    for name, tensor in straight["model"].items():
        assert torch.equal(tensor, resumed["model"][name]), name
    assert metric_records(tmp_path / "straight", "train") == metric_records(tmp_path / "resumed", "train")


@pytest.mark.parametrize("beam_size", [1, 3])
def test_gpu_translations_equal_the_cpu_ones(trained_copy_run, copy_corpus, beam_size):
    sources = (copy_corpus / "valid.src").read_text().splitlines()[:40]
    checkpoint = trained_copy_run / "checkpoint_best.pt"
    cpu = Translator.from_checkpoint(checkpoint, device="cpu").translate(sources, beam_size=beam_size)
    gpu = Translator.from_checkpoint(checkpoint, device="cuda")
    assert next(gpu.model.parameters()).is_cuda
    assert gpu.translate(sources, beam_size=beam_size) == cpu
    bf16 = Translator.from_checkpoint(checkpoint, device="cuda", dtype="bf16").translate(sources, beam_size=beam_size)
    assert sum(a == b for a, b in zip(bf16, cpu)) >= 0.9 * len(cpu)


def test_gpu_scores_of_given_translations_equal_the_cpu_ones(trained_copy_run, copy_corpus):
    sources = (copy_corpus / "valid.src").read_text().splitlines()[:40]
    given = (copy_corpus / "valid.tgt").read_text().splitlines()[:40]
    checkpoint = trained_copy_run / "checkpoint_best.pt"
    cpu = Translator.from_checkpoint(checkpoint, device="cpu").score(sources, given)
    assert Translator.from_checkpoint(checkpoint, device="cuda").score(sources, given) == pytest.approx(cpu, abs=1e-4)


# -- train.compile and the GPU benchmark (issue 32) ------------------------------------------------

@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_compiled_model_and_loss_give_the_eager_loss_and_gradients_on_the_gpu(precision):
    eager_loss, eager_grads = loss_and_gradients("cuda", precision)
    loss, grads = loss_and_gradients("cuda", precision, compile=True)
    if precision == "fp32":
        torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(grads, eager_grads, atol=1e-5, rtol=1e-3)
    else:  # inductor fuses what eager rounds to bf16 between operations
        torch.testing.assert_close(loss, eager_loss, rtol=1e-2, atol=0)
        assert torch.cosine_similarity(grads, eager_grads, dim=0) > 0.999


def test_compiled_gpu_training_lowers_the_loss_and_saves_plain_weights(copy_corpus, tmp_path):
    summary = train(cuda_run(copy_corpus, tmp_path, max_steps=40, precision="bf16", compile=True))
    losses = [r["loss"] for r in metric_records(tmp_path, "train")]
    assert summary.step == 40 and losses[-1] < 0.7 * losses[0]
    state = load_checkpoint(tmp_path / "checkpoint_last.pt")
    assert not any("_orig_mod" in key for key in state["model"])


def test_cuda_graphs_replay_the_steps_and_train_as_the_eager_run(copy_corpus, tmp_path):
    """train.cuda_graphs=true on batches in GPU shapes (data.pad_rows, data.pad_to_multiple): one graph per
    batch shape, gradient accumulation included, and the run follows the eager run of the same batches;
    with dropout (as the recipes train), with train.compile as well, and with rows attending in groups and a bf16
    residual stream, it trains."""
    from transformer.runtime import cuda_graphs

    recorded = []
    record = cuda_graphs.CudaGraphRecorder.record

    def counting_record(self, function):
        recorded.append(True)
        return record(self, function)

    settings = dict(max_steps=30, precision="fp32", accumulate=2, log_every=1,
                    **{"data.pad_rows": "true", "data.pad_to_multiple": 8})
    train(cuda_run(copy_corpus, tmp_path / "eager", **settings))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cuda_graphs.CudaGraphRecorder, "record", counting_record)
        summary = train(cuda_run(copy_corpus, tmp_path / "graphs", cuda_graphs=True, **settings))
    assert summary.step == 30 and 1 <= len(recorded) <= 20  # a handful of shapes, not one graph a batch
    eager, graphs = ([r["loss"] for r in metric_records(tmp_path / run, "train")] for run in ("eager", "graphs"))
    assert graphs == pytest.approx(eager, rel=2e-3)

    from transformer.model import transformer
    from transformer.runtime.precision import AutocastLayerNorm

    group_sizes, grouped_masks, norm_dtypes, norm = [], transformer.grouped_masks, [], AutocastLayerNorm.forward

    def recorded(src_real, tgt_length, size):  # Python runs at a shape's warm-up and capture, not at its replays
        group_sizes.append(size)
        return grouped_masks(src_real, tgt_length, size)

    def recorded_norm(self, x):
        out = norm(self, x)
        norm_dtypes.append(out.dtype)
        return out

    for name, extra in (("dropout", {}), ("compiled", {"compile": True}), ("rows in groups, a bf16 residual stream", {
            "attention_row_length": 64, "float32_residual": "false", "data.rows_multiple": 8})):
        run = cuda_run(copy_corpus, tmp_path / name, cuda_graphs=True, **{**settings, "max_steps": 40,
                       "precision": "bf16", "model.dropout": 0.1, "model.attention_dropout": 0.1, **extra})
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(transformer, "grouped_masks", recorded)
            patch.setattr(AutocastLayerNorm, "forward", recorded_norm)
            assert train(run).step == 40
        losses = [r["loss"] for r in metric_records(tmp_path / name, "train")]
        assert losses[-1] < 0.8 * losses[0], name
    assert group_sizes and min(group_sizes) >= 2  # the last run's graphs hold rows in groups,
    assert torch.bfloat16 in norm_dtypes  # and its norms hand on bf16 (recorded at warm-up and capture)


def test_rows_in_groups_give_the_loss_and_gradients_of_rows_alone_through_the_fused_kernels():
    """train.attention_row_length on the GPU: the grouped rows' masks go to the memory-efficient kernel (no fallback
    to the formula allowed), and give what rows attending alone give."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from transformer.model import transformer
    from transformer.model.row_groups import grouped_masks

    model = make_model(seed=1).train().cuda()
    generator = torch.Generator().manual_seed(0)
    src, tgt = (torch.randint(4, VOCAB, (8, 12), generator=generator).cuda() for _ in range(2))
    src[:4, 7:] = PAD
    masks = []

    def recorded(src_real, tgt_length, size):
        masks.append(grouped_masks(src_real, tgt_length, size))
        return masks[-1]

    def loss_and_gradients(row_length):
        model.zero_grad(set_to_none=True)
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
            loss, _ = label_smoothed_cross_entropy(model(src, tgt[:, :-1], row_length), tgt[:, 1:], 0.1, PAD)
            loss.backward()
        return loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])

    alone = loss_and_gradients(0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(transformer, "grouped_masks", recorded)
        grouped = loss_and_gradients(64)
    assert [m.encoder.mask.shape for m in masks] == [(2, 1, 48, 48)]  # groups of 4 rows of 12 positions
    torch.testing.assert_close(grouped[0], alone[0], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(grouped[1], alone[1], atol=1e-5, rtol=1e-3)


def test_a_replayed_graph_draws_new_dropout_masks():
    """A graph keeps its dropout's draws as offsets into the generator's state, which every replay advances: the
    same batch replayed twice gives two losses, as two eager steps would."""
    from transformer.data.batch import make_batch

    model = make_model(seed=1, dropout=0.3).train().cuda()
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    graphed = GraphedSteps(training_step(model), lambda: [p.grad for p in model.parameters()],
                           CudaGraphRecorder(torch.device("cuda")))
    batch = make_batch([[5, 6, 7], [8, 9]], [[10, 11], [12, 13, 14]], [0, 1], PAD, 2, 3, pad_to_multiple=8).to("cuda")
    losses = [graphed(batch.src, batch.tgt_in, batch.tgt_out, 1.0)[0].item() for _ in range(2)]
    assert len(graphed.graphs) == 1 and losses[0] != losses[1]


def test_a_batch_reaches_the_gpu_through_pinned_memory_unchanged():
    from transformer.data.batch import make_batch

    batch = make_batch([[5, 6, 7], [8]], [[9], [10, 11]], [0, 1], PAD, 2, 3, pad_to_multiple=8, fill_tokens=32)
    moved = batch.to("cuda")
    torch.cuda.synchronize()
    for name in ("src", "tgt_in", "tgt_out"):
        assert getattr(moved, name).is_cuda and torch.equal(getattr(moved, name).cpu(), getattr(batch, name))


def test_a_checkpoint_of_gpu_tensors_is_written_from_pinned_host_copies_of_its_step():
    writer, seen = CheckpointWriter(), []
    weight = torch.arange(6.0, device="cuda")
    torch.cuda._sleep(500_000_000)  # the GPU busy for a while: the copy to host waits behind it, and the job with it
    writer.write({"model": {"weight": weight, "tied": weight}}, seen.append)
    weight.add_(1)  # the next step, queued on the GPU after the copy
    writer.close()
    copy = seen[0]["model"]["weight"]
    assert copy.device.type == "cpu" and copy.is_pinned()
    assert copy.untyped_storage().data_ptr() == seen[0]["model"]["tied"].untyped_storage().data_ptr()
    assert copy.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_a_gpu_run_keeps_attention_off_cudnn_and_masked_attention_runs():
    """`select_device` turns cuDNN's attention off (a plan per shape); padded attention still runs, fused."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from transformer.runtime.device import select_device

    torch.backends.cuda.enable_cudnn_sdp(True)
    device = select_device("cuda")
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    q = torch.randn(3, 4, 10, 64, device=device, dtype=torch.bfloat16)
    mask = (torch.arange(10, device=device) < 7).expand(3, 1, 1, 10)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):  # no math fallback
        fused = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    plain = torch.nn.functional.scaled_dot_product_attention(q.float(), q.float(), q.float(), attn_mask=mask)
    torch.testing.assert_close(fused.float(), plain, atol=2e-2, rtol=2e-2)


def test_the_tiny_gpu_benchmark_runs_every_case_on_the_gpu(tmp_path):
    output = tmp_path / "gpu.json"
    result = subprocess.run([sys.executable, "scripts/benchmark.py", "--tiny", "--parts", "gpu", "--device", "cuda",
                             "--rounds", "1", "--batches", "2", "--output", str(output)], cwd=ROOT,
                            env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    gpu = json.loads(output.read_text())["gpu"]
    assert gpu["device"] == torch.cuda.get_device_name() and "skipped" not in gpu
    assert [case["name"] for case in gpu["cases"]] == [
        *(f"tiny {budget} {precision} eager" for budget in (512, 256) for precision in ("bf16", "fp16")),
        "tiny 256 bf16 graphs", "tiny 256 bf16 graphs+rows by 64+bf16 residual", "tiny 512 bf16 GPU shapes",
        "tiny 512 bf16 rows by 64",
        "tiny 512 bf16 rows by 64+bf16 residual", "tiny 512 bf16 compiled+graphs+rows by 64+bf16 residual"]
    assert all(times["next_call_ms"] > 0 for times in gpu["attention_kernels"].values())
    for case in gpu["cases"]:
        assert case["ours"]["tokens_per_s"] > 0 and case["baseline"]["tokens_per_s"] > 0
        if case["profiled"]:
            assert "GPU idle" in case["profile"]["ours"]["categories_ms"]
    assert (tmp_path / "gpu_profiles.png").stat().st_size > 0
