"""train.float32_residual=false: the layer norms return autocast's dtype, so the paper's (post-norm) residual
stream between the layers stays in bf16 (fp16) instead of float32; without autocast nothing changes."""

import pytest
import torch
from conftest import PAD, VOCAB, make_model, metric_records, run_config
from torch import nn

from transformer.checkpoint import load_checkpoint
from transformer.fast import replace_modules
from transformer.runtime.precision import AutocastLayerNorm
from transformer.training import train
from transformer.training.loss import label_smoothed_cross_entropy


def batch():
    generator = torch.Generator().manual_seed(0)
    src, tgt = (torch.randint(4, VOCAB, (6, 9), generator=generator) for _ in range(2))
    src[:3, 6:] = PAD
    return src, tgt


def loss_and_gradients(model, bf16: bool):
    model.zero_grad(set_to_none=True)
    src, tgt = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(src, tgt[:, :-1])
    loss, _ = label_smoothed_cross_entropy(logits, tgt[:, 1:], 0.1, PAD)
    loss.backward()
    return loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])


def layer_output_dtypes(model) -> set[torch.dtype]:
    """The dtypes of what the encoder's and decoder's layers hand on: the residual stream."""
    dtypes = set()
    hooks = [layer.register_forward_hook(lambda module, inputs, output: dtypes.add(
        (output[0] if isinstance(output, tuple) else output).dtype))
        for layer in [*model.encoder.layers, *model.decoder.layers]]
    loss_and_gradients(model, bf16=True)
    for hook in hooks:
        hook.remove()
    return dtypes


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_the_residual_stream_keeps_bf16_and_the_norms_their_float32_parameters(norm_first):
    plain, swapped = (make_model(seed=2, norm_first=norm_first).train() for _ in range(2))
    replace_modules(swapped, nn.LayerNorm, AutocastLayerNorm.sharing)
    norms = [m for m in swapped.modules() if isinstance(m, nn.LayerNorm)]
    assert norms and all(type(m) is AutocastLayerNorm for m in norms)
    assert swapped.state_dict().keys() == plain.state_dict().keys()  # checkpoints as before
    assert all(p.dtype == torch.float32 for p in swapped.parameters())

    assert layer_output_dtypes(plain) == {torch.float32}  # autocast's layer norm: a float32 stream
    # post-norm: the stream is the norms' output; pre-norm's residual path never meets a norm (the embeddings'
    # float32 sum runs through it), and only what enters the sublayers, which autocast casts anyway, is bf16
    assert layer_output_dtypes(swapped) == {torch.float32 if norm_first else torch.bfloat16}

    for bf16 in (False, True):  # without autocast: the same norm; with it, bf16 activations
        (plain_loss, plain_grads), (loss, grads) = (loss_and_gradients(m, bf16) for m in (plain, swapped))
        assert grads.dtype == torch.float32 and torch.isfinite(grads).all()
        if not bf16:
            torch.testing.assert_close(loss, plain_loss, rtol=0, atol=0)
            torch.testing.assert_close(grads, plain_grads, rtol=0, atol=0)
        else:
            torch.testing.assert_close(loss, plain_loss, rtol=2e-2, atol=0)
            assert torch.cosine_similarity(grads, plain_grads, dim=0) > 0.99


def test_a_bf16_run_with_a_bf16_residual_stream_trains_and_resumes_with_a_float32_one(
        copy_corpus, tmp_path, monkeypatch):
    settings = dict(max_steps=30, save_every=15, log_every=5, valid_every=15, precision="bf16")
    train(run_config(copy_corpus, tmp_path / "plain", **settings))
    outputs, forward = [], AutocastLayerNorm.forward

    def recorded(self, x):
        output = forward(self, x)
        outputs.append(output.dtype)
        return output

    monkeypatch.setattr(AutocastLayerNorm, "forward", recorded)
    train(run_config(copy_corpus, tmp_path / "bf16", float32_residual="false", **{**settings, "max_steps": 15}))
    train(run_config(copy_corpus, tmp_path / "bf16", float32_residual="false", **settings))
    assert outputs and set(outputs) == {torch.bfloat16}  # the runs' norms, in training and validation
    plain, bf16 = ([r["loss"] for r in metric_records(tmp_path / run, "train")] for run in ("plain", "bf16"))
    assert len(bf16) == 6 and bf16[-1] < 0.8 * bf16[0]
    assert bf16 == pytest.approx(plain, rel=0.05)  # the same run, in another rounding
    weights = load_checkpoint(tmp_path / "bf16" / "checkpoint_last.pt")["model"]
    assert weights.keys() == load_checkpoint(tmp_path / "plain" / "checkpoint_last.pt")["model"].keys()
    train(run_config(copy_corpus, tmp_path / "bf16", **{**settings, "max_steps": 35}))  # on with float32 norms
    assert metric_records(tmp_path / "bf16", "train")[-1]["step"] == 35
