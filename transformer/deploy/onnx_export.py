"""An ONNX model folder: the encoder and one decoder step as two graphs, with the decoder's cache explicit.

    encoder.onnx         src (B, S) -> memory (B, S, D), src_mask (B, 1, 1, S), and for every decoder
                         layer i cross_key_i, cross_value_i (B, H, S, d_head): the keys and values of the
                         encoder output (§3.2.3), projected once per sentence
    decoder_step.onnx    tokens (B, 1), src_mask, cross_key_i, cross_value_i and self_key_i,
                         self_value_i (B, H, T, d_head), the self-attention cache of the T positions decoded
                         so far -> log_probs (B, V) of the next token, new_self_key_i, new_self_value_i
                         (B, H, T + 1, d_head): the grown cache, fed back at the next step
    spm.model, config.yaml   the tokenizer and config (`transformer.deploy.folder`)

Batch, source length and cache length are dynamic. The new token's position is the cache length T,
so a step needs no position input; the positional table is in the graph with ``model.max_positions``
rows, which bounds S and T + 1 (`OnnxTranslator` checks, before any search). Step 0 feeds caches of length 0.

The graphs are captured with ``torch.export`` and translated by torch.onnx's dynamo exporter (onnxscript;
tested with torch 2.13, onnxscript 0.7, onnxruntime 1.32). They run the model's own code: `DecoderStep`
wraps the given tensors in the `DecoderCache` that incremental decoding keeps and calls `Transformer.decode`
with it, so the step computes what the model's own searches compute.
`transformer.deploy.onnx.OnnxTranslator` runs our own greedy and beam search on them.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.export import Dim

from transformer.checkpoint import CheckpointError
from transformer.config import Config
from transformer.data.tokenizer import Tokenizer
from transformer.deploy.folder import (
    check_export_folder,
    export_folder,
    load_for_export,
    write_checksums,
    write_config_and_tokenizer,
)
from transformer.model.attention import padding_mask
from transformer.model.cache import CrossAttentionCache, DecoderCache, KeyValueCache
from transformer.model.transformer import Transformer

try:  # the `export` extra: pip install -e ".[export]"
    import onnxscript  # noqa: F401  (torch.onnx's dynamo exporter needs it, and onnx)
except ImportError:
    raise CheckpointError('ONNX export needs onnx, onnxscript and onnxruntime: pip install -e ".[export]"') from None

# the folder's names, from the module that runs it (onnxruntime): after the check above, which names the whole extra
from transformer.deploy.onnx import DECODER_STEP, ENCODER, layer_names  # noqa: E402  # isort:skip


def pairs(tensors: Sequence[Tensor]) -> list[tuple[Tensor, Tensor]]:
    """(key_0, value_0, key_1, ...) -> [(key_0, value_0), (key_1, value_1), ...]."""
    return list(zip(tensors[0::2], tensors[1::2]))


class EncoderGraph(nn.Module):
    """The encoder, and what every decoder step needs from it: the source mask and the memory's keys and values."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, src: Tensor) -> tuple[Tensor, ...]:
        """src (B, S) -> memory (B, S, D), src_mask (B, 1, 1, S), cross_key_0, cross_value_0, ... (B, H, S, d_head)."""
        src_mask = padding_mask(src, self.model.pad_id)
        memory = self.model.encode(src, src_mask)
        cross = [t for layer in self.model.decoder.layers for t in layer.cross_attn.project_memory(memory)]
        return memory, src_mask, *cross


class DecoderStep(nn.Module):
    """One step of incremental decoding with the caches as tensors in and out: `Transformer.decode` itself."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor, src_mask: Tensor, cross: list[Tensor], past: list[Tensor]) -> tuple[Tensor, ...]:
        """tokens (B, 1) at position T; cross: keys and values of the memory per layer (B, H, S, d_head);
        past: self-attention keys and values per layer (B, H, T, d_head) -> log_probs (B, V), the grown past."""
        cache = DecoderCache([KeyValueCache(key, value) for key, value in pairs(past)],
                             [CrossAttentionCache(key, value) for key, value in pairs(cross)])
        # decode reads the positions of its prefix past the cache's T: here the one new token; no memory, the
        # cross-attention caches hold its keys and values
        prefix = tokens.expand(-1, past[0].size(2) + 1)
        logits = self.model.decode(prefix, None, src_mask, cache)[:, -1]  # (B, V)
        return logits.log_softmax(dim=-1), *(tensor for layer in cache.self_attn for tensor in (layer.key, layer.value))


def convert_to_onnx(model: Transformer, cfg: Config, tokenizer: Tokenizer, output: Path) -> Path:
    """Write a float32 ``model`` as an ONNX model folder into ``output``: the two graphs, tokenizer and config."""
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    n_layers, positions = model.n_decoder_layers, cfg.model.max_positions
    batch, source, cache = Dim("batch"), Dim("source", max=positions), Dim("cache", max=positions - 1)
    cross_names, self_names = layer_names("cross", n_layers), layer_names("self", n_layers)

    encoder = EncoderGraph(model).eval()
    src = torch.full((2, 3), tokenizer.eos_id)  # example inputs: torch.export specialises sizes 0 and 1
    _export(encoder, (src,), ({0: batch, 1: source},), ["src"], ["memory", "src_mask", *cross_names],
            output / ENCODER)

    with torch.no_grad():
        _, src_mask, *cross = encoder(src)
    past = [torch.zeros_like(cross[0][:, :, :2]) for _ in self_names]  # two positions decoded so far
    dynamic_shapes = ({0: batch}, {0: batch, 3: source}, [{0: batch, 2: source}] * len(cross),
                      [{0: batch, 2: cache}] * len(past))
    _export(DecoderStep(model).eval(), (src[:, :1], src_mask, cross, past), dynamic_shapes,
            ["tokens", "src_mask", *cross_names, *self_names], ["log_probs", *layer_names("new_self", n_layers)],
            output / DECODER_STEP)
    write_config_and_tokenizer(cfg, tokenizer, output)
    write_checksums(output)
    return output


def _export(module: nn.Module, args: tuple, dynamic_shapes: tuple, input_names: list[str], output_names: list[str],
            path: Path) -> None:
    """Capture ``module`` on the example ``args`` with torch.export, the sizes in ``dynamic_shapes`` left free,
    and save it as ONNX at ``path``."""
    for name in ("onnxscript", "onnx_ir"):  # their optimiser logs every rewrite at INFO, the commands' level
        logging.getLogger(name).setLevel(logging.WARNING)
    # warns of each torchvision operator it cannot register: the model uses none, and the user needs no torchvision
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="# The axis name")  # says a name is not used; it is
        # torch's own deprecation, inside torch.export: nothing the user can act on
        warnings.filterwarnings("ignore", message=".*isinstance\\(treespec, LeafSpec\\)", category=FutureWarning)
        program = torch.onnx.export(module, args, dynamo=True, dynamic_shapes=dynamic_shapes,
                                    input_names=input_names, output_names=output_names, verbose=False)
    program.save(str(path))


def export_onnx(checkpoint: Path, output: Path, force: bool = False) -> Path:
    """`convert_to_onnx` of the model in ``checkpoint`` (its tokenizer beside it) as the folder ``output``, which
    replaces a folder that holds anything only with ``force`` (`check_export_folder`)."""
    checkpoint, output = Path(checkpoint), Path(output)
    check_export_folder(checkpoint, output, force)
    exported = load_for_export(checkpoint)
    with export_folder(output) as folder:
        convert_to_onnx(*exported, folder)
    return output
