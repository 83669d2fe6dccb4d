"""Int8 Linear layers: close to the float layer, exact int8 products, and each output row independent
of the other rows."""

import importlib
import re

import pytest
import torch
from conftest import ROOT, make_model

from transformer.config import ConfigError
from transformer.runtime import int8
from transformer.runtime.int8 import Int8Linear, quantize_int8
from transformer.runtime.threads import parallel_map

KERNELS = [(kernel, levels) for kernel in int8.int8_kernels() for levels in sorted({int8.activation_levels(), 63})]


@pytest.mark.parametrize("kernel, levels", KERNELS)
@pytest.mark.parametrize("bias", [True, False])
def test_int8_linear_is_close_to_the_float_layer(kernel, levels, bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48, bias=bias)
    if bias:
        torch.nn.init.normal_(linear.bias)
    x = torch.randn(5, 2, 64).transpose(0, 1)  # not contiguous
    expected = linear(x).detach()
    layer = Int8Linear(linear, kernel, levels)
    got = layer(x)
    assert got.shape == expected.shape == (2, 5, 48)
    error = (got - expected).abs().max() / expected.abs().max()
    assert 0 < error < (0.02 if levels == 127 else 0.04)  # int8 rounding, not a float layer in disguise
    assert torch.equal(layer(x.bfloat16()), layer(x.bfloat16().float()))


def test_the_kernels_sum_the_same_int8_products():
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 300)
    x = torch.randn(40, 256)
    layers = [Int8Linear(linear, kernel) for kernel in int8.int8_kernels()]
    assert all(torch.equal(layers[0](x), other(x)) for other in layers)


@pytest.mark.skipif("onednn" not in int8.int8_kernels(), reason="oneDNN's int8 linear needs AVX512-VNNI")
@pytest.mark.parametrize("levels", sorted({int8.activation_levels(), 63}))
def test_onednn_gives_the_same_bits_from_int8_and_from_uint8_inputs(levels):
    """AMX takes the whole numbers as int8, other CPUs as uint8 around 128: the same exact sums."""
    torch.manual_seed(0)
    layer = Int8Linear(torch.nn.Linear(256, 300), "onednn", levels)
    x = torch.randn(40, 256)
    outputs = []
    for amx_input in (True, False):
        layer.amx_input = amx_input
        outputs.append(layer(x))
    assert torch.equal(*outputs)


@pytest.mark.parametrize("kernel, levels", KERNELS)
def test_the_largest_products_are_summed_exactly(kernel, levels):
    """No saturation: every activation at ±levels against every weight at ±127, over 1024 inputs."""
    linear = torch.nn.Linear(1024, 16, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.tensor([1.0, -1.0]).repeat(8)[:, None].expand(16, 1024))
    x = torch.tensor([[1.0], [-1.0]]).expand(2, 1024)
    expected = (x.double() @ linear.weight.double().t()).float()  # ±1024
    assert torch.equal(Int8Linear(linear, kernel, levels)(x), expected)


@pytest.mark.parametrize("kernel", int8.int8_kernels())
def test_each_output_row_depends_only_on_its_input_row(kernel):
    torch.manual_seed(0)
    linear = torch.nn.Linear(32, 200)  # 300 x 200 outputs: split between threads, mid-row
    torch.nn.init.normal_(linear.bias)
    layer = Int8Linear(linear, kernel)
    rows = torch.randn(300, 32)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        together = layer(torch.cat([rows, 100 * torch.randn(1, 32)]))[:300]  # a row of large values beside them
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(together, torch.cat([layer(row[None]) for row in rows]))
    assert layer(torch.empty(0, 32)).shape == (0, 200)


@pytest.mark.parametrize("kernel", int8.int8_kernels())
def test_two_workers_share_a_layer_and_get_what_one_gets(kernel):
    torch.manual_seed(0)
    layer = Int8Linear(torch.nn.Linear(64, 4096), kernel)  # one packed weight, read by both threads
    batches = [torch.randn(rows, 64) for rows in (5, 40, 17, 64, 3, 33, 8, 21)]
    assert all(torch.equal(a, b) for a, b in zip(parallel_map(layer, batches, workers=2), map(layer, batches)))


def test_the_kernel_and_its_activation_bits_follow_the_cpu(monkeypatch):
    monkeypatch.setattr(int8, "cpu_flags", lambda: {"avx2", "fma", "avx_vnni"})
    assert (int8.int8_kernels(), int8.activation_levels()) == (["fbgemm"], 63)  # fbgemm's saturating int16
    assert int8.kernel_for(8000) == "fbgemm"
    monkeypatch.setattr(int8, "cpu_flags", lambda: {"avx2", "avx512_vnni"})
    assert (int8.int8_kernels(), int8.activation_levels()) == (["fbgemm", "onednn"], 127)
    assert (int8.kernel_for(8000), int8.kernel_for(1024)) == ("onednn", "fbgemm")  # the output projection
    monkeypatch.setattr(int8, "cpu_flags", lambda: {"avx2", "avx512_vnni", "amx_int8"})
    assert (int8.kernel_for(8000), int8.kernel_for(1024)) == ("onednn", "onednn")  # AMX tiles: every layer
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # oneDNN without VNNI saturates
    assert int8.int8_kernels() == ["fbgemm"]


def test_quantize_int8_replaces_every_linear_and_keeps_the_tied_embedding(monkeypatch):
    model = make_model()
    embedding = model.decoder.embedding.weight.detach().clone()
    quantized = quantize_int8(model)
    assert not any(type(m) is torch.nn.Linear for m in quantized.modules())
    assert isinstance(quantized.output_proj, Int8Linear) and quantized.output_proj.out_features == len(embedding)
    assert quantized.output_proj.kernel == int8.kernel_for(len(embedding))
    with pytest.raises(ValueError, match="not 200"):
        Int8Linear(torch.nn.Linear(4, 4), "fbgemm", 200)
    with pytest.raises(ValueError, match="'mkl' does not sum exactly on this CPU"):
        Int8Linear(torch.nn.Linear(4, 4), "mkl")
    assert torch.equal(quantized.decoder.embedding.weight, embedding)
    monkeypatch.setattr(int8, "quantized_engines", lambda: ["qnnpack", "none"])
    with pytest.raises(ConfigError, match="--quantize int8 needs fbgemm"):
        quantize_int8(make_model())


def test_the_agreement_benchmark_counts_int8_translations(trained_copy_run, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    int8_agreement = importlib.import_module("benchmarks.int8_agreement")
    checkpoint = str(trained_copy_run / "checkpoint_best.pt")
    monkeypatch.setattr("sys.argv", ["int8_agreement", "--checkpoint", checkpoint, "--split", "valid",
                                     "--sentences", "20"])
    int8_agreement.main()
    assert re.fullmatch(r"20 sentences of valid, beam 5: int8 equals fp32 in (1\d|20); int8 at batch_tokens "
                        r"\d+ and \d+ differ in 0\n", capsys.readouterr().out)


def test_the_layer_benchmark_times_fp32_and_both_int8_kernels(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    int8_layers = importlib.import_module("benchmarks.int8_layers")
    records = int8_layers.layer_times([3], repeats=2, shapes=[(32, 48)])
    assert [(r["rows"], r["in"], r["out"]) for r in records] == [(3, 32, 48)]
    assert all(records[0][name] > 0 for name in ["fp32"] + [f"int8 {kernel}" for kernel in int8.int8_kernels()])
