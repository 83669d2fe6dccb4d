"""`transformer.training.loss.label_smoothed_cross_entropy` with its gradient written out, in two forms: one for
eager PyTorch, one for torch.compile (train.compile=true), which compiles the loss on its own.

Eager (`FromLogProbs`), measured (2-core CPU, torch 2.13): autograd's backward of the loss took ~15% of a training
step of the Multi30k model, allocating and filling several (tokens, vocabulary) buffers; this backward turns the
saved log-probabilities into the gradient in place, in one.

Compiled (`FromLogSumExp`): in-place operations and a saved float32 copy of the (tokens, vocabulary) logits keep
inductor from fusing the loss: on one H200 (bf16, base size, 25k tokens) the compiled loss and its gradient took
about 5.2 ms of a 51 ms compiled and graphed step, in passes over float32 buffers of 3.2 GB. Saving the logits as
they come (bf16) and one log-sum-exp per token, with the gradient written out of place, inductor reads the logits
once forward and once backward and writes the gradient once (on the CPU inductor writes one kernel for each).
Measured on the CPU (`python -m scripts.benchmarks.loss_forms`: 4,096 tokens by a 32k vocabulary, forward and
backward, median of 5; 2-core AMD EPYC Zen 5, torch 2.14.1): compiled, 102 ms against the in-place form's 248 in
bf16 (2.4 times as fast), 151 against 178 in fp32; eagerly it is the slower by far (0.9-1.4 s against 0.2-0.4), hence
one form each.
"""

from __future__ import annotations

import torch
from torch import Tensor


def label_smoothed_cross_entropy(logits: Tensor, target: Tensor, epsilon: float, pad_id: int) -> tuple[Tensor, Tensor]:
    """Sums over non-padding tokens of the label-smoothed loss (§5.4) and of the plain NLL.

    The smoothed target q puts 1 - epsilon on the reference token and spreads epsilon uniformly
    over the vocabulary. Computed in float32 whatever the autocast precision. Only the first
    sum has a gradient. Shapes: logits (B, T, V), target (B, T) -> two scalars.
    """
    form = FromLogSumExp if torch.compiler.is_compiling() else FromLogProbs
    return form.apply(logits.flatten(0, 1), target.flatten(), epsilon, pad_id)


def _sums(nll: Tensor, uniform: Tensor, real: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """The smoothed loss and the NLL summed over real tokens, from each token's NLL and its cross-entropy against
    the uniform distribution."""
    smoothed = ((1.0 - epsilon) * nll + epsilon * uniform).masked_fill(~real, 0.0).sum()
    return smoothed, nll.masked_fill(~real, 0.0).sum()


class FromLogProbs(torch.autograd.Function):
    """The loss with its gradient written out: d loss / d logits = softmax(logits) - q per token.

    The backward turns the saved log-probabilities into that gradient in place, one
    (tokens, vocabulary) buffer where autograd's backward of the same formula would allocate and
    fill several (the loss's backward took ~15% of a training step on the CPU).
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float, pad_id: int) -> tuple[Tensor, Tensor]:
        log_probs = logits.float().log_softmax(dim=-1)  # (N, V)
        real = target != pad_id
        nll = -log_probs.gather(1, target[:, None]).squeeze(1)  # (N,)
        uniform = -log_probs.mean(dim=-1)  # cross-entropy against the uniform distribution
        smoothed, nll = _sums(nll, uniform, real, epsilon)
        ctx.save_for_backward(log_probs, target, real)
        ctx.epsilon, ctx.logits_dtype = epsilon, logits.dtype
        ctx.mark_non_differentiable(nll)
        return smoothed, nll

    @staticmethod
    def backward(ctx, grad_smoothed: Tensor, _grad_nll: Tensor) -> tuple[Tensor | None, ...]:
        log_probs, target, real = ctx.saved_tensors
        grad = log_probs.exp_()  # softmax; a second backward through this graph is refused by autograd
        grad.sub_(ctx.epsilon / grad.size(1))
        rows = torch.arange(grad.size(0), device=grad.device)
        grad[rows, target] -= 1.0 - ctx.epsilon
        grad.mul_(real[:, None] * grad_smoothed)  # padding positions get no gradient
        return grad.to(ctx.logits_dtype), None, None, None


class FromLogSumExp(torch.autograd.Function):
    """The same loss and gradient from the logits as they come and one log-sum-exp per token, every operation out
    of place: what inductor fuses into one reduction forward and one elementwise pass backward."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float, pad_id: int) -> tuple[Tensor, Tensor]:
        wide = logits.float()
        log_sum_exp = wide.logsumexp(dim=-1)  # (N,)
        real = target != pad_id
        nll = log_sum_exp - wide.gather(1, target[:, None]).squeeze(1)
        uniform = log_sum_exp - wide.mean(dim=-1)
        smoothed, nll = _sums(nll, uniform, real, epsilon)
        ctx.save_for_backward(logits, log_sum_exp, target, real)
        ctx.epsilon = epsilon
        ctx.mark_non_differentiable(nll)
        return smoothed, nll

    @staticmethod
    def backward(ctx, grad_smoothed: Tensor, _grad_nll: Tensor) -> tuple[Tensor | None, ...]:
        logits, log_sum_exp, target, real = ctx.saved_tensors
        epsilon, vocabulary = ctx.epsilon, logits.size(1)
        softmax = (logits.float() - log_sum_exp[:, None]).exp()
        reference = torch.arange(vocabulary, device=logits.device) == target[:, None]
        q = torch.where(reference, 1.0 - epsilon + epsilon / vocabulary, epsilon / vocabulary)  # the smoothed target
        grad = (softmax - q) * (real[:, None] * grad_smoothed)
        return grad.to(logits.dtype), None, None, None
