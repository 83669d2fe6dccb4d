"""train.compile (transformer/runtime/compile.py): the compiled model and loss compute what the eager ones
do, a compiled run trains as an eager one, and checkpoints resume across the two. On the CPU, in fp32,
with a tiny model: inductor's C++ compilation takes most of these tests' time."""

import importlib
import subprocess
import sys

import pytest
import torch
from conftest import PAD, ROOT, VOCAB, make_model, metric_records, run_config, subprocess_env, toy_overrides

from transformer import fast
from transformer.checkpoint import load_checkpoint
from transformer.fast import loss as fast_loss
from transformer.runtime.compile import compile_training
from transformer.training import train

pytestmark = pytest.mark.slow


def loss_and_gradients(model, loss_function, src, tgt, attention_row_length: int = 0):
    model.zero_grad(set_to_none=True)
    loss, _ = loss_function(model(src, tgt[:, :-1], attention_row_length), tgt[:, 1:], 0.1, PAD)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def test_the_compiled_model_and_loss_give_the_eager_loss_and_gradients(monkeypatch):
    traced = {form: 0 for form in (fast_loss.FromLogProbs, fast_loss.FromLogSumExp)}
    for form in traced:  # which form of the loss each runs: the eager one, the one inductor fuses
        def counted(ctx, *args, form=form, forward=form.forward):
            traced[form] += 1
            return forward(ctx, *args)
        monkeypatch.setattr(form, "forward", staticmethod(counted))
    model = make_model(seed=1).train()
    loss_function = fast.for_training(model)  # the Trainer's default: the CPU speed paths, the written-out loss
    compiled_model, compiled_loss = compile_training(model, loss_function)
    generator = torch.Generator().manual_seed(0)
    for rows, src_len, tgt_len in ((6, 9, 8), (4, 7, 10)):  # the second shape runs the dynamic graph
        src, tgt = (torch.randint(4, VOCAB, (rows, n), generator=generator) for n in (src_len, tgt_len))
        src[: rows // 2, src_len - 3:] = PAD  # padding exercises the masks,
        tgt[: rows // 2, tgt_len - 2:] = PAD  # and the loss's ignored positions
        eager_loss, eager_grads = loss_and_gradients(model, loss_function, src, tgt)
        loss, grads = loss_and_gradients(compiled_model, compiled_loss, src, tgt)
        torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-5)
        for grad, eager_grad in zip(grads, eager_grads):
            torch.testing.assert_close(grad, eager_grad, rtol=1e-4, atol=1e-6)
    assert traced[fast_loss.FromLogProbs] == 2 and traced[fast_loss.FromLogSumExp] >= 1


def test_rows_in_groups_compile_once_for_every_group_size_and_give_the_eager_loss(monkeypatch):
    """train.attention_row_length under train.compile: the group size follows the batch (8 rows of 8 positions
    down to 2 of 24), and the layers compiled for dynamic shapes take every size without compiling again; rows
    that attend alone (40 positions) take the layers as compiled without groups, once more."""
    from torch._dynamo.utils import counters

    from transformer.model import transformer

    model = make_model(seed=1, max_positions=64).train()
    loss_function = fast.for_training(model)
    compiled_model, compiled_loss = compile_training(model, loss_function)
    generator = torch.Generator().manual_seed(0)
    graphs, group_sizes, grouped_masks = [], [], transformer.grouped_masks

    def recorded(src_real, tgt_length, size):  # outside the compiled layers: a spy inside them would be guarded on
        group_sizes.append(size)
        return grouped_masks(src_real, tgt_length, size)

    monkeypatch.setattr(transformer, "grouped_masks", recorded)
    for rows, length in ((16, 8), (16, 16), (8, 24), (24, 16), (8, 40), (16, 40)):  # groups of 8, 4, 2, 4, then 1
        src, tgt = (torch.randint(4, VOCAB, (rows, length), generator=generator) for _ in range(2))
        src[::3, length - 3:] = PAD
        eager_loss, eager_grads = loss_and_gradients(model, loss_function, src, tgt)
        loss, grads = loss_and_gradients(compiled_model, compiled_loss, src, tgt, attention_row_length=64)
        graphs.append(counters["stats"]["unique_graphs"])
        torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-5)
        for grad, eager_grad in zip(grads, eager_grads):
            torch.testing.assert_close(grad, eager_grad, rtol=1e-4, atol=1e-5)
    assert group_sizes == [8, 4, 2, 4]  # the batches whose rows attend in groups
    assert graphs[:4] == graphs[:1] * 4 and graphs[4:] == graphs[4:5] * 2  # compiled at the first batch of each


def test_a_compiled_model_with_dropout_trains_on_the_cpu():
    """The CPU's byte dropout (`fast.dropout`) reads its bytes through a view of int64 words, which compiled
    code could not give back (torch 2.13: "setStorage: ... out of bounds", at the first step of any CPU run
    with train.compile=true and dropout): compiled, the layers drop out with torch's own dropout."""
    model = make_model(seed=1, dropout=0.1, attention_dropout=0.1).train()
    compiled_model, compiled_loss = compile_training(model, fast.for_training(model))
    src, tgt = (torch.randint(4, VOCAB, (6, n), generator=torch.Generator().manual_seed(0)) for n in (9, 8))
    loss, grads = loss_and_gradients(compiled_model, compiled_loss, src, tgt)
    assert torch.isfinite(loss) and all(torch.isfinite(grad).all() for grad in grads)
    layer, x = compiled_model.encoder.layers[0], torch.randn(6, 9, model.cfg.d_model)  # compiled, it drops out:
    assert not torch.allclose(layer(x, None), layer(x, None))  # two calls draw two masks
    model.eval()  # without dropout, the compiled layers compute the eager ones
    torch.testing.assert_close(compiled_model(src, tgt[:, :-1]), model(src, tgt[:, :-1]), rtol=1e-5, atol=1e-5)


def test_only_the_layers_are_compiled_in_a_view_that_shares_the_models_parameters():
    """Regional compilation: each layer of the encoder and decoder stacks is compiled; the model itself,
    which validation, decoding and checkpoints use, stays plain, and the view trains its very parameters."""
    model = make_model(seed=1)
    loss_function = fast.for_training(model)
    view, compiled_loss = compile_training(model, loss_function)
    assert compiled_loss.__wrapped__ is loss_function  # the loss is compiled too (torch.compile's wrapper)
    stacks = [view.encoder.layers, view.decoder.layers]
    assert all(isinstance(layer, torch._dynamo.eval_frame.OptimizedModule) for stack in stacks for layer in stack)
    assert not any(isinstance(module, torch._dynamo.eval_frame.OptimizedModule) for module in model.modules())
    assert [layer._orig_mod for layer in view.encoder.layers] == list(model.encoder.layers)
    assert view.state_dict().keys() != model.state_dict().keys()  # the view's names carry _orig_mod
    assert set(map(id, view.parameters())) == set(map(id, model.parameters()))
    view.eval()
    assert not model.encoder.layers[0].training  # train()/eval() reach the shared layers
    view.train()
    assert model.encoder.layers[0].training


# Adam's epsilon 1e-3 instead of 1e-9 in the runs compared: with 1e-9 Adam moves a weight whose gradient is rounding
# noise (the attention keys' bias) by a whole step of the learning rate, in a direction the rounding picks, so
# compiled and eager runs could only be compared within a step (2e-3), more than 4 steps move any weight here: a
# run that never updated passed. With 1e-3, noise moves a weight by a thousandth of a step, while 4 steps move the
# median weight by 6.5e-4 and 98% of them by more than 1e-5 (measured against a run at a learning rate of 1e-12).
RUN = dict(precision="fp32", adam_eps=1e-3)


def assert_same_weights(run_dir, reference_dir) -> None:
    """Equal within 1e-5 (runs with `RUN`): compiled code sums in its own order, and differed by up to 1.1e-6."""
    weights = load_checkpoint(run_dir / "checkpoint_last.pt")["model"]
    assert not any("_orig_mod" in key for key in weights)  # the plain model's keys
    for name, tensor in load_checkpoint(reference_dir / "checkpoint_last.pt")["model"].items():
        torch.testing.assert_close(weights[name], tensor, rtol=0, atol=1e-5, msg=lambda found: f"{name}: {found}")


def test_a_compiled_run_trains_as_an_eager_one_and_resumes_either_way(copy_corpus, tmp_path):
    settings = dict(max_steps=4, save_every=2, log_every=1, **RUN)
    train(run_config(copy_corpus, tmp_path / "eager", **settings))
    train(run_config(copy_corpus, tmp_path / "compiled", compile=True, **settings))
    eager, compiled = (metric_records(tmp_path / name, "train") for name in ("eager", "compiled"))
    assert [r["loss"] for r in compiled] == pytest.approx([r["loss"] for r in eager], rel=1e-4)
    assert_same_weights(tmp_path / "compiled", tmp_path / "eager")

    # an eager checkpoint resumes compiled, and a compiled one eager: both end where the eager run did
    train(run_config(copy_corpus, tmp_path / "eager_then_compiled", **{**settings, "max_steps": 2}))
    train(run_config(copy_corpus, tmp_path / "eager_then_compiled", compile=True, **settings))
    train(run_config(copy_corpus, tmp_path / "compiled_then_eager", compile=True, **{**settings, "max_steps": 2}))
    train(run_config(copy_corpus, tmp_path / "compiled_then_eager", **settings))
    for run in ("eager_then_compiled", "compiled_then_eager"):
        assert_same_weights(tmp_path / run, tmp_path / "eager")
        assert [r["loss"] for r in metric_records(tmp_path / run, "train")] == pytest.approx(
            [r["loss"] for r in eager], rel=1e-4)


def test_two_process_ddp_over_the_compiled_layers_makes_the_eager_single_process_update(copy_corpus, tmp_path):
    """DDP wraps the view of compiled layers (the Trainer compiles first): its gradient hooks sit on the shared
    parameters, so two ranks of one batch each end where one eager process with two accumulated batches does."""
    settings = dict(max_steps=3, device="cpu", log_every=1, **RUN)
    train(run_config(copy_corpus, tmp_path / "single", accumulate=2, **settings))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "-m", "transformer", "train", str(copy_corpus / "copy.yaml"),
               *toy_overrides(copy_corpus, tmp_path / "ddp", accumulate=1, compile="true", **settings)]
    result = subprocess.run(command, cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_weights(tmp_path / "ddp", tmp_path / "single")
    ddp, single = ([r["loss"] for r in metric_records(tmp_path / run, "train")] for run in ("ddp", "single"))
    assert len(ddp) == 3 and ddp == pytest.approx(single, rel=1e-4)


def test_the_loss_benchmark_times_both_forms_eager_and_compiled(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    loss_forms = importlib.import_module("benchmarks.loss_forms")
    records = loss_forms.form_times(16, 11, repeats=1, device=torch.device("cpu"), precisions=(torch.float32,))
    assert [(r["form"], r["precision"]) for r in records] == [(form, "float32") for form in loss_forms.FORMS]
    assert all(r["eager ms"] > 0 and r["compiled ms"] > 0 for r in records)
