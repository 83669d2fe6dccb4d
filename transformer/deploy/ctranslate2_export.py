"""A trained Transformer as a CTranslate2 model folder, converted through CTranslate2's own spec API.

    model.bin, config.json           CTranslate2's weights and its config (special tokens, epsilon)
    shared_vocabulary.json           or source_vocabulary.json + target_vocabulary.json
    spm.model / spm.{lang}.model     the SentencePiece model(s), to turn text into pieces and back
    config.yaml                      this toolkit's config (decoding settings, maximum length)

The weights map one to one onto a `ctranslate2.specs.TransformerSpec` (post-norm or pre-norm, ReLU):

    encoder/decoder embedding        embeddings.weight, multiplied by sqrt(d_model) (scale_embeddings)
    sinusoidal positions (§3.5)      position_encodings.encodings, stored explicitly: CTranslate2's
                                     built-in table puts all sines before all cosines, ours interleaves
    self_attn.qkv_proj [W^Q;W^K;W^V] self_attention.linear[0] (CTranslate2's fused QKV)
    cross_attn.q_proj, .kv_proj      attention.linear[0], attention.linear[1] (fused [W^K; W^V])
    *.out_proj (W^O)                 *.linear[1] / attention.linear[2]
    residual{1,2,3}.norm             self_attention / attention / ffn .layer_norm
    ff.linear1, ff.linear2           ffn.linear_0, ffn.linear_1
    final_norm (pre-norm only)       encoder/decoder .layer_norm
    output_proj (tied or not)        decoder.projection

Sources get eos appended (``add_source_eos``) and the decoder starts from bos, as in training.
`transformer.deploy.ctranslate2.CTranslate2Translator` translates and scores with such a folder.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

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
from transformer.model.layers import sinusoidal_positional_encoding
from transformer.model.transformer import Decoder, Encoder, Transformer

try:  # the `export` extra: pip install -e ".[export]"; `transformer.deploy.ctranslate2` imports it from here
    import ctranslate2  # noqa: F401  (the translator's runtime, checked here once)
    from ctranslate2.specs import common_spec, transformer_spec
except ImportError:
    raise CheckpointError('CTranslate2 export needs ctranslate2: pip install -e ".[export]"') from None

LAYER_NORM_EPSILON = 1e-5  # torch.nn.LayerNorm's default, which the model uses


def convert_to_ctranslate2(model: Transformer, cfg: Config, tokenizer: Tokenizer, output: Path,
                           quantization: str | None = None) -> Path:
    """Write ``model`` as a CTranslate2 model folder into ``output``, its weights in ``quantization``
    (int8, int8_float32, int8_float16, int16, float16, bfloat16, ...; None keeps float32)."""
    output = Path(output)
    spec = transformer_spec_of(model, cfg, tokenizer)
    spec.optimize(quantization=quantization)
    output.mkdir(parents=True, exist_ok=True)
    spec.save(str(output))
    write_config_and_tokenizer(cfg, tokenizer, output)
    write_checksums(output)
    return output


def export_ctranslate2(checkpoint: Path, output: Path, quantization: str | None = None, force: bool = False) -> Path:
    """`convert_to_ctranslate2` of the model in ``checkpoint`` (its tokenizer beside it) as the folder ``output``,
    which replaces a folder that holds anything only with ``force`` (`check_export_folder`)."""
    checkpoint, output = Path(checkpoint), Path(output)
    check_export_folder(checkpoint, output, force)
    exported = load_for_export(checkpoint)
    with export_folder(output) as folder:
        convert_to_ctranslate2(*exported, folder, quantization)
    return output


def transformer_spec_of(model: Transformer, cfg: Config, tokenizer: Tokenizer) -> transformer_spec.TransformerSpec:
    """The validated, unquantized `TransformerSpec` holding ``model``'s weights and vocabularies."""
    spec = transformer_spec.TransformerSpec(
        transformer_spec.TransformerEncoderSpec(len(model.encoder.layers), cfg.model.n_heads,
                                                pre_norm=cfg.model.norm_first,
                                                activation=common_spec.Activation.RELU),
        transformer_spec.TransformerDecoderSpec(len(model.decoder.layers), cfg.model.n_heads,
                                                pre_norm=cfg.model.norm_first,
                                                activation=common_spec.Activation.RELU,
                                                alignment_heads=cfg.model.n_heads))  # attention: mean of all heads
    positions = stored_positions(cfg)
    _set_encoder(spec.encoder, model.encoder, positions)
    _set_decoder(spec.decoder, model.decoder, positions)
    _set_linear(spec.decoder.projection, model.output_proj)
    spec.register_source_vocabulary(tokenizer.src_pieces(range(tokenizer.src_vocab_size)))
    spec.register_target_vocabulary(tokenizer.tgt_pieces(range(tokenizer.tgt_vocab_size)))
    # CTranslate2 finds its special tokens by name in the vocabulary; SentencePiece names ours so
    specials = {"unk_token": tokenizer.unk_id, "bos_token": tokenizer.bos_id, "eos_token": tokenizer.eos_id}
    for key, index in specials.items():
        setattr(spec.config, key, tokenizer.tgt_pieces([index])[0])
    spec.config.decoder_start_token = spec.config.bos_token  # target input: bos y_1 ... y_n
    spec.config.add_source_eos = True  # source: x_1 ... x_m eos
    spec.config.add_source_bos = False
    spec.config.layer_norm_epsilon = LAYER_NORM_EPSILON
    spec.validate()
    return spec


def stored_positions(cfg: Config) -> int:
    """Rows of the positional tables written into the folder: ``model.max_positions``, as the ONNX graphs
    and our model's initial table (at least a longest source with eos, or target with bos and eos).
    CTranslate2 does not extend them: a search that needs more is refused before it starts."""
    return max(cfg.model.max_positions, cfg.data.max_length + 2)


def _array(tensor: Tensor) -> np.ndarray:
    """A copy: quantizing the spec rewrites its arrays in place, which must not reach the model's weights."""
    return tensor.detach().to("cpu", torch.float32, copy=True).numpy()


def _set_linear(spec: common_spec.LinearSpec, linear: nn.Linear) -> None:
    spec.weight = _array(linear.weight)
    if linear.bias is not None:
        spec.bias = _array(linear.bias)


def _set_layer_norm(spec: common_spec.LayerNormSpec, norm: nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _array(norm.weight), _array(norm.bias)


def _set_inputs(spec, stack: Encoder | Decoder, positions: int) -> None:
    """Embeddings scaled by sqrt(d_model) (§3.4) plus our interleaved sinusoids (§3.5), position 0 first."""
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = _array(stack.embedding.weight)
    spec.scale_embeddings = True  # CTranslate2: multiply by sqrt(depth)
    d_model = stack.embedding.weight.size(1)
    spec.position_encodings.encodings = _array(sinusoidal_positional_encoding(positions, d_model))
    if isinstance(stack.final_norm, nn.LayerNorm):  # pre-norm
        _set_layer_norm(spec.layer_norm, stack.final_norm)


def _set_encoder(spec: transformer_spec.TransformerEncoderSpec, encoder: Encoder, positions: int) -> None:
    _set_inputs(spec, encoder, positions)
    for layer_spec, layer in zip(spec.layer, encoder.layers):
        _set_self_attention(layer_spec.self_attention, layer)
        _set_ffn(layer_spec.ffn, layer.ff, layer.residual2.norm)


def _set_decoder(spec: transformer_spec.TransformerDecoderSpec, decoder: Decoder, positions: int) -> None:
    _set_inputs(spec, decoder, positions)
    for layer_spec, layer in zip(spec.layer, decoder.layers):
        _set_self_attention(layer_spec.self_attention, layer)
        _set_linear(layer_spec.attention.linear[0], layer.cross_attn.q_proj)
        _set_linear(layer_spec.attention.linear[1], layer.cross_attn.kv_proj)
        _set_linear(layer_spec.attention.linear[2], layer.cross_attn.out_proj)
        _set_layer_norm(layer_spec.attention.layer_norm, layer.residual2.norm)
        _set_ffn(layer_spec.ffn, layer.ff, layer.residual3.norm)


def _set_self_attention(spec, layer: nn.Module) -> None:
    """An encoder or decoder layer's self-attention: fused [W^Q; W^K; W^V], W^O, and its LayerNorm."""
    _set_linear(spec.linear[0], layer.self_attn.qkv_proj)
    _set_linear(spec.linear[1], layer.self_attn.out_proj)
    _set_layer_norm(spec.layer_norm, layer.residual1.norm)


def _set_ffn(spec, ff: nn.Module, norm: nn.LayerNorm) -> None:
    _set_linear(spec.linear_0, ff.linear1)
    _set_linear(spec.linear_1, ff.linear2)
    _set_layer_norm(spec.layer_norm, norm)
