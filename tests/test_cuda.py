"""The CUDA paths: autocast on the GPU, fp16 loss scaling, GPU checkpoints read on the CPU, GPU
decoding. They run where a GPU is present and are skipped elsewhere (CI has none)."""

import pytest
import torch
from conftest import PAD, VOCAB, make_model, metric_records, run_config

from transformer.checkpoint import load_checkpoint
from transformer.decoding.translator import Translator
from transformer.fast.loss import label_smoothed_cross_entropy
from transformer.runtime.precision import autocast
from transformer.training import train

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def cuda_run(corpus, run_dir, **values):
    return run_config(corpus, run_dir, device="cuda", **values)


def gradients(device: str, precision: str) -> torch.Tensor:
    """All parameter gradients of one label-smoothed loss on a fixed padded batch, flattened."""
    model = make_model(seed=1).train().to(device)
    generator = torch.Generator().manual_seed(0)
    src, tgt = (torch.randint(4, VOCAB, (8, 12), generator=generator) for _ in range(2))
    src[:4, 9:] = PAD  # padded sources exercise the attention masks
    src, tgt = src.to(device), tgt.to(device)
    with autocast(torch.device(device), precision):
        logits = model(src, tgt[:, :-1])
    loss, _ = label_smoothed_cross_entropy(logits, tgt[:, 1:], 0.1, PAD)
    loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()]).float().cpu()


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


def test_a_resumed_gpu_run_equals_an_uninterrupted_one(copy_corpus, tmp_path):
    settings = dict(max_steps=16, save_every=8, log_every=4, precision="fp16", **{"model.dropout": 0.1})
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
