"""Int8 Linear layers: close to the float layer, and each output row independent of the other rows."""

import pytest
import torch
from conftest import make_model

from transformer.runtime import int8
from transformer.runtime.int8 import Int8Linear, quantize_int8


@pytest.mark.parametrize("levels", [127, 63])
@pytest.mark.parametrize("bias", [True, False])
def test_int8_linear_is_close_to_the_float_layer(levels, bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48, bias=bias)
    if bias:
        torch.nn.init.normal_(linear.bias)
    x = torch.randn(2, 5, 64)
    expected = linear(x).detach()
    got = Int8Linear(linear, levels)(x)
    assert got.shape == expected.shape == (2, 5, 48)
    error = (got - expected).abs().max() / expected.abs().max()
    assert 0 < error < (0.02 if levels == 127 else 0.04)  # int8 rounding, not a float layer in disguise


def test_each_output_row_depends_only_on_its_input_row():
    torch.manual_seed(0)
    linear = torch.nn.Linear(32, 20)  # 20 outputs: rows alone and together split differently into vectors
    torch.nn.init.normal_(linear.bias)
    layer = Int8Linear(linear)
    rows = torch.randn(6, 32)
    together = layer(torch.cat([rows, 100 * torch.randn(1, 32)]))[:6]  # a row of large values beside them
    assert torch.equal(together, torch.cat([layer(row[None]) for row in rows]))
    assert layer(torch.empty(0, 32)).shape == (0, 20)


def test_weight_levels_are_7_bits_without_vnni(monkeypatch):
    monkeypatch.setattr(int8, "cpu_flags", lambda: {"avx2", "fma"})
    assert int8.weight_levels() == 63
    monkeypatch.setattr(int8, "cpu_flags", lambda: {"avx2", "avx512_vnni"})
    assert int8.weight_levels() == 127


def test_quantize_int8_replaces_every_linear_and_keeps_the_tied_embedding():
    model = make_model()
    embedding = model.decoder.embedding.weight.detach().clone()
    quantized = quantize_int8(model)
    assert not any(type(m) is torch.nn.Linear for m in quantized.modules())
    assert isinstance(quantized.output_proj, Int8Linear)
    assert torch.equal(quantized.decoder.embedding.weight, embedding)
