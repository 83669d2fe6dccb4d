"""A CTranslate2 model folder: the trained Transformer converted through CTranslate2's own spec API.

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
`CTranslate2Translator` translates and scores with such a folder.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from tqdm import tqdm

from transformer.checkpoint import CheckpointError
from transformer.config import Config, DecodeConfig
from transformer.data.textio import InputError
from transformer.data.tokenizer import Tokenizer
from transformer.decoding.inputs import forced_ids, source_ids
from transformer.decoding.search import normalized_score
from transformer.decoding.translator import AttentionMap
from transformer.deploy.folder import FolderTranslator, load_for_export, write_config_and_tokenizer
from transformer.model.layers import sinusoidal_positional_encoding
from transformer.model.transformer import Decoder, Encoder, Transformer

try:  # the `export` extra: pip install -e ".[export]"
    import ctranslate2
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
    return output


def export_ctranslate2(checkpoint: Path, output: Path, quantization: str | None = None) -> Path:
    """`convert_to_ctranslate2` of the model in ``checkpoint`` (its tokenizer beside it)."""
    return convert_to_ctranslate2(*load_for_export(checkpoint), output, quantization)


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


def _length_limit(source: list[str], decode: DecodeConfig) -> int:
    """Our output length limit for a source of these pieces: a * (pieces + eos) + b."""
    return int(decode.max_len_a * (len(source) + 1) + decode.max_len_b)


class CTranslate2Translator(FolderTranslator):
    """Translate and score with a folder of `convert_to_ctranslate2`, like `Translator` does with a checkpoint.

    Our decoding settings map onto CTranslate2's ``translate_batch`` options as follows (its
    documentation: the docstring of ``ctranslate2.Translator.translate_batch`` and the
    ``TranslationOptions`` struct of ``include/ctranslate2/translation.h``):

    - ``beam_size`` -> ``beam_size`` (1 is greedy search in both); ``nbest`` -> ``num_hypotheses``.
    - ``length_penalty``: ours is GNMT's, log P(Y) / ((5 + |Y|) / 6)^alpha with |Y| counting eos;
      CTranslate2's "exponential penalty applied to the length during beam search", normalises
      ``hypothesis_score /= (hypothesis_length ** length_penalty)``. No CTranslate2 setting gives
      GNMT's formula, so the beam searches with CTranslate2's normalisation and the same alpha
      (both are 0 = raw log-probabilities), and the hypotheses it returns are scored again with
      ``score_batch`` to give our score (see `translate_nbest`). Greedy search ignores the
      penalty in both, so it is exactly ours.
    - ``max_len_a``/``max_len_b``: ours allow int(a * source_length + b) tokens before eos, per
      sentence (source_length counts the source's eos); ``translate_batch`` has only absolute
      limits, ``max_decoding_length`` ("Maximum prediction length", default 256) and
      ``min_decoding_length``, one number per call, and no relative limit; so sentences are
      grouped by their limit and each group is one call. At the limit CTranslate2 stops the
      hypothesis where ours forces eos: the tokens are the same (the tests compare greedy outputs
      that end both ways), only the beam score lacks the eos term, hence the rescoring below.
      ``min_decoding_length`` (default 1: eos may not come first) is set to 0: ours allows an
      empty output.
    - ``max_input_length`` (default 1024: "truncate inputs after this many tokens") is set to 0:
      sources are cut here as `Translator` cuts them, to ``data.max_length`` tokens with eos.
    - End of sentence: CTranslate2 stops on the model's ``eos_token`` (``end_token``) and leaves it
      out of the hypothesis; the decoder starts from ``decoder_start_token`` = bos, as ours.
    """

    def __init__(self, directory: str | Path, device: str = "cpu", compute_type: str = "default",
                 threads: int = 0, workers: int = 1, overrides: Sequence[str] = ()) -> None:
        """``threads`` per batch (CTranslate2's intra_threads; 0: its default) and ``workers`` batches
        at once (inter_threads), as `Translator`'s threads and workers; ``overrides`` are decode.key=value."""
        super().__init__(Path(directory), "a CTranslate2 model folder", ["model.bin"], overrides)
        self.precision = compute_type
        self.translator = ctranslate2.Translator(str(directory), device=device, compute_type=compute_type,
                                                 intra_threads=threads, inter_threads=workers)
        self._tgt_ids = {piece: i for i, piece in
                         enumerate(self.tokenizer.tgt_pieces(range(self.tokenizer.tgt_vocab_size)))}

    def translate(self, sentences: list[str], progress: bool = False, prefixes: Sequence[str] | None = None,
                  constraints: Sequence[Sequence[str]] | None = None, **overrides: Any) -> list[str]:
        """Detokenized best translation of each sentence; an empty sentence gives an empty line (or its prefix)."""
        decode = self.settings(**overrides)
        # one hypothesis needs no score to be ranked: the scoring pass runs only for an n-best list
        found = self._search(sentences, decode, progress, prefixes, constraints, scored=decode.nbest > 1)
        return [hypotheses[0][0] for hypotheses in found]

    def translate_nbest(self, sentences: list[str], progress: bool = False, prefixes: Sequence[str] | None = None,
                        constraints: Sequence[Sequence[str]] | None = None,
                        **overrides: Any) -> list[list[tuple[str, float]]]:
        """The ``nbest`` best translations of each sentence with our GNMT-normalised scores, best first."""
        decode = self.settings(**overrides)
        return self._search(sentences, decode, progress, prefixes, constraints, scored=True)

    def _search(self, sentences: list[str], decode: DecodeConfig, progress: bool, prefixes: Sequence[str] | None,
                constraints: Sequence[Sequence[str]] | None, scored: bool) -> list[list[tuple[str, float]]]:
        """Translate the sentences of each length limit in one asynchronous call (so that CTranslate2's
        inter_threads translate several at once), in token-budget batches as `Translator`; with
        ``scored``, rank each sentence's hypotheses by our score."""
        if decode.sampling:  # its generators are seeded once per thread: the same seed would not give the same samples
            raise InputError("decode.sampling runs on the torch and onnx engines: CTranslate2's samples cannot be "
                             "reproduced with a seed")
        if constraints is not None and any(constraints):
            raise InputError("constraints run on the torch and onnx engines: CTranslate2 has no lexically "
                             "constrained search")
        sources = self._source_pieces(sentences)
        forced = [self.tokenizer.tgt_pieces(ids) for ids in
                  forced_ids(self.tokenizer, prefixes, len(sentences), self.max_source_length, "prefix")]
        groups: dict[int, list[int]] = {}
        for i, source in enumerate(sources):
            if sentences[i].strip():
                groups.setdefault(_length_limit(source, decode) + len(forced[i]), []).append(i)
        self._check_positions(max(groups, default=0))
        pending: list[tuple[int, Any]] = []  # (sentence, its ctranslate2.AsyncTranslationResult)
        for limit, indices in groups.items():
            pending += zip(indices, self._translate_batch(
                [sources[i] for i in indices], decode, limit, target_prefix=[forced[i] or None for i in indices],
                num_hypotheses=decode.nbest, asynchronous=True, batch_type="tokens",
                max_batch_size=max(decode.batch_tokens // decode.beam_size, 1)))
        hypotheses: list[list[list[str]]] = [[] for _ in sentences]
        for i, found in tqdm(pending, disable=not progress, unit="sent", desc="translating", leave=False):
            hypotheses[i] = found.result().hypotheses
        scores = self._gnmt_scores(sources, hypotheses, decode) if scored else [[0.0] * len(h) for h in hypotheses]
        return [sorted(zip(map(self._detokenize, found), score), key=lambda pair: -pair[1]) if found
                else [(self._detokenize(prefix), 0.0)]
                for found, score, prefix in zip(hypotheses, scores, forced)]

    def attention(self, sentence: str, **overrides: Any) -> AttentionMap:
        """Translate one sentence and return CTranslate2's attention of it: the last decoder layer's
        cross-attention, mean over its heads (the export's ``alignment_heads``), as weights (1, 1, target,
        source). Unlike `Translator.attention`, the source's eos is not among the columns."""
        decode = self.settings(**overrides, nbest=1)
        (source,) = self._source_pieces([sentence])
        self._check_positions(_length_limit(source, decode))
        (result,) = self._translate_batch([source], decode, _length_limit(source, decode), return_attention=True,
                                          return_end_token=True)
        return AttentionMap(source, result.hypotheses[0], torch.tensor([[result.attention[0]]]))

    def _check_positions(self, limit: int) -> None:
        """A one-line error when outputs of ``limit`` tokens (bos at position 0) need more positions than stored."""
        if limit + 1 > stored_positions(self.cfg):
            raise InputError(f"this CTranslate2 model holds {stored_positions(self.cfg)} target positions "
                             f"(model.max_positions) and outputs of up to {limit} tokens need {limit + 1}: lower "
                             f"decode.max_len_a or decode.max_len_b, or the prefix")

    def _translate_batch(self, sources: list[list[str]], decode: DecodeConfig, limit: int,
                         **options: Any) -> list:
        """``translate_batch`` with our settings mapped as the class says, and ``options`` of its own."""
        return self.translator.translate_batch(sources, beam_size=decode.beam_size,
                                               length_penalty=decode.length_penalty, max_decoding_length=limit,
                                               min_decoding_length=0, max_input_length=0, **options)

    def score(self, sources: list[str], targets: list[str]) -> list[list[float]]:
        """Teacher-forced log P(y_t | y_<t, x) of each target token and of the final eos."""
        pieces = [self.tokenizer.tgt_pieces(ids) for ids in self.tokenizer.encode_tgt(targets)]
        found = self.translator.score_batch(self._source_pieces(sources), pieces, max_input_length=0)
        return [list(result.log_probs) for result in found]

    def _source_pieces(self, sentences: Sequence[str]) -> list[list[str]]:
        """Source pieces cut as `Translator` cuts them, without the eos that CTranslate2 appends."""
        return [self.tokenizer.src_pieces(ids[:-1])
                for ids in source_ids(self.tokenizer, list(sentences), self.max_source_length)]

    def _detokenize(self, pieces: list[str]) -> str:
        return self.tokenizer.decode_tgt([[self._tgt_ids[piece] for piece in pieces]])[0]

    def _gnmt_scores(self, sources: list[list[str]], hypotheses: list[list[list[str]]],
                     decode: DecodeConfig) -> list[list[float]]:
        """Our `normalized_score` of each hypothesis: log P(Y + eos | X), scored again by CTranslate2 in one
        call (its beam scores leave out eos where the length limit ended a hypothesis), / ((6 + |Y|) / 6)^alpha."""
        pairs = [(source, tokens) for source, found in zip(sources, hypotheses) for tokens in found]
        found = iter(self.translator.score_batch([source for source, _ in pairs], [tokens for _, tokens in pairs],
                                                 max_input_length=0, max_batch_size=decode.batch_tokens,
                                                 batch_type="tokens"))
        return [[normalized_score(sum(next(found).log_probs), len(tokens) + 1, decode.length_penalty)
                 for tokens in each] for each in hypotheses]
