"""Post-norm (the paper, LayerNorm(x + Sublayer(x))) against pre-norm (x + Sublayer(LayerNorm(x)), final LayerNorm)."""

import pytest
import torch
from conftest import make_model
from torch.nn import functional as F

from transformer.model.attention import padding_mask


def model_with_distinct_norms(norm_first: bool):
    """A tiny model whose LayerNorms each have their own random gain and bias, so no two are interchangeable."""
    model = make_model(norm_first=norm_first)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.copy_(1 + 0.5 * torch.randn(module.weight.shape, generator=generator))
                module.bias.copy_(0.5 * torch.randn(module.bias.shape, generator=generator))
    return model


def layer_norm(norm: torch.nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def residual(norm_first: bool, norm: torch.nn.LayerNorm, x: torch.Tensor, sublayer) -> torch.Tensor:
    """One residual connection written out (dropout is 0 in the tiny models)."""
    if norm_first:
        return x + sublayer(layer_norm(norm, x))
    return layer_norm(norm, x + sublayer(x))


def inputs():
    generator = torch.Generator().manual_seed(2)
    src = torch.tensor([[5, 6, 7, 8, 9, 3], [10, 11, 12, 3, 0, 0]])
    return torch.randn(2, 5, 32, generator=generator), torch.randn(2, 6, 32, generator=generator), src


@pytest.mark.parametrize("norm_first", [False, True])
@torch.no_grad()
def test_encoder_layer_places_its_layer_norms_as_configured(norm_first):
    model = model_with_distinct_norms(norm_first)
    layer = model.encoder.layers[0]
    _, memory, src = inputs()
    mask = padding_mask(src, model.pad_id)
    h = residual(norm_first, layer.residual1.norm, memory, lambda y: layer.self_attn(y, mask))
    expected = residual(norm_first, layer.residual2.norm, h, layer.ff)
    torch.testing.assert_close(layer(memory, mask), expected)


@pytest.mark.parametrize("norm_first", [False, True])
@torch.no_grad()
def test_decoder_layer_places_its_layer_norms_as_configured(norm_first):
    model = model_with_distinct_norms(norm_first)
    layer = model.decoder.layers[0]
    x, memory, src = inputs()
    mask = padding_mask(src, model.pad_id)
    h = residual(norm_first, layer.residual1.norm, x, lambda y: layer.self_attn(y, causal=True))
    h = residual(norm_first, layer.residual2.norm, h, lambda y: layer.cross_attn(y, memory, mask)[0])
    expected = residual(norm_first, layer.residual3.norm, h, layer.ff)
    torch.testing.assert_close(layer(x, memory, mask)[0], expected)


@pytest.mark.parametrize("norm_first", [False, True])
@torch.no_grad()
def test_only_pre_norm_stacks_end_with_a_layer_norm(norm_first):
    model = model_with_distinct_norms(norm_first)
    n_norms = sum(isinstance(m, torch.nn.LayerNorm) for m in model.modules())
    per_layer = 2 * len(model.encoder.layers) + 3 * len(model.decoder.layers)
    assert n_norms == per_layer + (2 if norm_first else 0)
    _, _, src = inputs()
    mask = padding_mask(src, model.pad_id)
    stack = model.encoder.positional(model.encoder.embedding(src))
    for layer in model.encoder.layers:
        stack = layer(stack, mask)
    memory = model.encoder(src, mask)
    tgt_in = src[:, :5]
    states = model.decoder.positional(model.decoder.embedding(tgt_in))
    for layer in model.decoder.layers:
        states = layer(states, memory, mask)[0]
    decoded = model.decoder(tgt_in, memory, mask)[0]
    if norm_first:
        torch.testing.assert_close(memory, layer_norm(model.encoder.final_norm, stack))
        torch.testing.assert_close(decoded, layer_norm(model.decoder.final_norm, states))
    else:
        torch.testing.assert_close(memory, stack)
        torch.testing.assert_close(decoded, states)
