"""Each speed path of transformer.fast gives what the plain-PyTorch path gives (the same distribution, for dropout)."""

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import VOCAB, make_model, metric_records, run_config
from test_search import SOURCES, ScriptedModel, beam, greedy, pad, tiny_model_that_stops
from torch import nn

from transformer import fast
from transformer.decoding.search import PLAIN_STEPS
from transformer.fast import attention as fast_attention
from transformer.fast import loss as fast_loss
from transformer.fast.attention import FormulaTrainingAttention
from transformer.fast.dropout import ByteDropout
from transformer.fast.search import FAST_STEPS, rows_in_groups, top_k_in_blocks
from transformer.model.attention import CrossAttention, SelfAttention, padding_mask
from transformer.training import train
from transformer.training.loss import label_smoothed_cross_entropy

A = 4


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_byte_dropout_has_the_distribution_of_torch_dropout(p):
    x = torch.ones(2000, 1000)
    torch.manual_seed(0)
    for module in (nn.Dropout(p), ByteDropout(p)):
        y = module.train()(x)
        kept = y[y != 0]
        assert (y == 0).float().mean().item() == pytest.approx(p, abs=2 / 256)  # p rounded to k/256
        assert torch.allclose(kept, torch.full_like(kept, kept[0].item()))  # survivors scaled alike
        assert kept[0].item() == pytest.approx(1 / (1 - p), rel=0.01)
        assert y.mean().item() == pytest.approx(1.0, abs=5e-3)  # the expectation is kept


def test_formula_training_attention_equals_the_fused_kernel_with_its_gradients():
    torch.manual_seed(0)
    x, memory = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    mask = padding_mask(torch.tensor([[1] * 7, [1] * 4 + [0] * 3]), pad_id=0)
    for plain, call in ((SelfAttention(32, 4), lambda m: m(x, causal=True)),
                        (SelfAttention(32, 4), lambda m: m(x, mask[..., :5], causal=True)),
                        (CrossAttention(32, 4), lambda m: m(x, memory, mask)[0])):
        sped_up = copy.deepcopy(plain)
        fast.for_training(sped_up)
        assert isinstance(sped_up.attention, FormulaTrainingAttention)
        outputs, gradients = [], []
        for module in (plain.train(), sped_up.train()):
            out = call(module)
            out.square().sum().backward()
            outputs.append(out)
            gradients.append([p.grad for p in module.parameters()])
        torch.testing.assert_close(outputs[0], outputs[1], atol=1e-5, rtol=0)
        for plain_grad, fast_grad in zip(*gradients):
            torch.testing.assert_close(plain_grad, fast_grad, atol=1e-4, rtol=1e-5)


def test_the_speed_paths_swapped_into_a_model_in_evaluation_do_not_drop_out():
    """A module made by `replace_modules` takes the mode of the one it replaces: swapped into a model in
    evaluation, dropout and the attention's dropout stayed in training mode and changed its outputs."""
    model = make_model(seed=1, dropout=0.3, attention_dropout=0.3).eval()
    src, tgt = torch.randint(4, VOCAB, (3, 7)), torch.randint(4, VOCAB, (3, 6))
    with torch.no_grad():
        plain = model(src, tgt)
        fast.for_training(model)
        assert not any(module.training for module in model.modules())
        torch.testing.assert_close(model(src, tgt), plain, atol=1e-5, rtol=0)


def test_formula_training_attention_trains_through_the_formula_on_the_cpu_only(monkeypatch):
    """The formula in training on the CPU; in evaluation, and on a GPU (a tensor on the meta device stands in for
    a device other than the CPU), the fused kernel."""
    calls = []
    formula = fast_attention.scaled_dot_product_attention
    monkeypatch.setattr(fast_attention, "scaled_dot_product_attention", lambda *args: calls.append(1) or formula(*args))
    for device, training, expected in (("cpu", True, 1), ("cpu", False, 0), ("meta", True, 0)):
        calls.clear()
        q = torch.randn(2, 4, 5, 8, device=device)
        FormulaTrainingAttention(0.0).train(training)(q, q, q, causal=True)
        assert len(calls) == expected, (device, training)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_hand_written_loss_gradient_equals_autograd_of_torch_cross_entropy(dtype, epsilon):
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, dtype=dtype, requires_grad=True)
    target = torch.randint(1, 11, (3, 5))
    target[0, 3:] = 0  # padding: no loss, no gradient
    values, grads = [], []
    for loss_function in (label_smoothed_cross_entropy, *(form_of_the_fast_loss(form) for form in FORMS)):
        loss, nll = loss_function(logits, target, epsilon, 0)
        (grad,) = torch.autograd.grad(0.7 * loss, logits)
        values.append((loss.item(), nll.item()))
        grads.append(grad)
    for value, grad in zip(values[1:], grads[1:]):  # the eager form, then the compiled one (run eagerly here)
        assert value == pytest.approx(values[0], rel=1e-6)
        assert grad.dtype == dtype and not grad[0, 3:].any()
        torch.testing.assert_close(grad.float(), grads[0].float(), atol=1e-6, rtol=1e-5)


FORMS = (fast_loss.FromLogProbs, fast_loss.FromLogSumExp)


def form_of_the_fast_loss(form):
    """`fast.loss.label_smoothed_cross_entropy` computed through ``form`` whether compiling or not."""
    def loss(logits, target, epsilon, pad_id):
        return form.apply(logits.flatten(0, 1), target.flatten(), epsilon, pad_id)
    return loss


@pytest.mark.parametrize("compiling", [False, True])
def test_the_fast_loss_saves_log_probs_eagerly_and_the_logits_when_compiled(monkeypatch, compiling):
    # inductor fuses the log-sum-exp form into a pass forward and one backward (2.4 times as fast compiled in bf16 on
    # the CPU), which eagerly is ten times slower than the in-place form: the form follows torch.compile
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
    logits = torch.randn(2, 3, 7, dtype=torch.bfloat16, requires_grad=True)
    loss, _ = fast_loss.label_smoothed_cross_entropy(logits, torch.randint(1, 7, (2, 3)), 0.1, 0)
    saved = loss.grad_fn.saved_tensors
    assert type(loss.grad_fn).__name__ == ("FromLogSumExp" if compiling else "FromLogProbs") + "Backward"
    assert saved[0].dtype == (torch.bfloat16 if compiling else torch.float32)


def test_for_training_swaps_modules_but_not_parameters():
    model = tiny_model_that_stops()
    keys = list(model.state_dict())
    loss_function = fast.for_training(model)
    assert loss_function is fast_loss.label_smoothed_cross_entropy
    assert not any(type(m) is nn.Dropout for m in model.modules())
    assert any(isinstance(m, ByteDropout) for m in model.modules())
    assert list(model.state_dict()) == keys


def test_training_with_and_without_the_fast_paths_follows_the_same_curve(copy_corpus, tmp_path):
    # without dropout (the copy model has none) the two paths compute the same updates
    for name, switch in (("fast", "true"), ("plain", "false")):
        train(run_config(copy_corpus, tmp_path / name, max_steps=10, log_every=1, precision="fp32", fast_paths=switch))
    fast_run, plain_run = (metric_records(tmp_path / name, "train") for name in ("fast", "plain"))
    assert [r["loss"] for r in fast_run] == pytest.approx([r["loss"] for r in plain_run], rel=1e-4)


def test_fast_search_steps_give_the_plain_translations():
    model, src = tiny_model_that_stops(), pad(SOURCES)
    assert greedy(model, src, steps=FAST_STEPS) == greedy(model, src, steps=PLAIN_STEPS)
    for beam_size in (2, 5):
        fast_result = beam(model, src, beam_size=beam_size, nbest=2, steps=FAST_STEPS)
        plain_result = beam(model, src, beam_size=beam_size, nbest=2, steps=PLAIN_STEPS)
        assert [[h.tokens for h in n] for n in fast_result] == [[h.tokens for h in n] for n in plain_result]
        # rows that ride along change the matrix products' row count, hence the last float bits
        assert [[h.score for h in n] for n in fast_result] == [
            pytest.approx([h.score for h in n], rel=1e-6) for n in plain_result]


def test_finished_sentences_ride_along_until_a_group_has_finished():
    src = torch.tensor([[5, 6, 7, 3], [5, 3, 0, 0]])  # at most 3 and 2 output tokens
    never_eos = {A: 0.7, 5: 0.2, 3: 0.1}
    grouped, alone = ScriptedModel({}, default=never_eos), ScriptedModel({}, default=never_eos)
    settings = dict(beam_size=2, nbest=2, length_penalty=0.0, max_len_a=0.5, max_len_b=1)
    assert beam(grouped, src, steps=FAST_STEPS, **settings) == beam(alone, src, steps=PLAIN_STEPS, **settings)
    assert grouped.batch_sizes == [4, 4, 4, 4]  # the second sentence, done at step 2, stays: 1 row is not 4
    assert alone.batch_sizes == [4, 4, 4, 2]
    searching = torch.tensor([True, False, True, False, False, True, False, False])
    assert rows_in_groups(searching).tolist() == [0, 1, 2, 5]  # 3 searching + the first finished: 4 rows
    assert rows_in_groups(torch.tensor([True, True, False, True, True, True])).tolist() == [0, 1, 2, 3, 4, 5]
    assert rows_in_groups(torch.tensor([False, True, False, False, False])).tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("width", [8000, 8000 - 8, 640])  # block search; two widths that fall back to topk
def test_top_k_in_blocks_finds_the_columns_of_topk(width):
    torch.manual_seed(0)
    scores = torch.randn(50, width).log_softmax(dim=-1)
    scores[:10, 5000 % width :] += 5.0  # the best of some rows crowd into neighbouring blocks
    scores[10] = float("-inf")
    scores[10, 3] = 0.0  # a row with one finite score (eos forced)
    expected = scores.topk(10, dim=1).indices
    found = top_k_in_blocks(scores, 10)
    others = torch.arange(50) != 10
    assert torch.equal(found.sort(dim=1).values[others], expected.sort(dim=1).values[others])
    assert found[10].unique().numel() == 10 and 3 in found[10].tolist()


def test_plain_loss_is_torch_cross_entropy_with_label_smoothing():
    torch.manual_seed(0)
    logits, target = torch.randn(2, 3, 7), torch.tensor([[1, 2, 0], [3, 0, 0]])
    loss, nll = label_smoothed_cross_entropy(logits, target, 0.1, 0)
    real = target != 0
    assert loss.item() == pytest.approx(F.cross_entropy(logits[real], target[real], label_smoothing=0.1,
                                                        reduction="sum").item())
    assert nll.item() == pytest.approx(F.cross_entropy(logits[real], target[real], reduction="sum").item())
