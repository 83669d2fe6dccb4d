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
rows, which bounds S and T + 1 (`OnnxTranslator` checks). Step 0 feeds caches of length 0.

The graphs are captured with ``torch.export`` and translated by torch.onnx's dynamo exporter (onnxscript;
tested with torch 2.13, onnxscript 0.7, onnxruntime 1.32). They run the model's own modules: `DecoderStep`
wraps the given tensors in the `KeyValueCache` and `CrossAttentionCache` that the decoder layers take
in incremental decoding, so the step computes what `Transformer.decode` computes with a cache.
`OnnxTranslator` searches with onnxruntime and numpy as `transformer.decoding.search` does.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.export import Dim
from tqdm import tqdm

from transformer.checkpoint import CheckpointError
from transformer.config import Config, DecodeConfig
from transformer.data.batching import eval_batches, pad_sequences
from transformer.data.textio import InputError
from transformer.data.tokenizer import Tokenizer
from transformer.decoding.search import Hypothesis, max_output_lengths, normalized_score
from transformer.decoding.translator import source_ids
from transformer.deploy.folder import FolderTranslator, load_for_export, write_config_and_tokenizer
from transformer.model.attention import padding_mask
from transformer.model.cache import CrossAttentionCache, KeyValueCache
from transformer.model.transformer import Transformer

try:  # the `export` extra: pip install -e ".[export]"
    import onnxruntime
    import onnxscript  # noqa: F401  (torch.onnx's dynamo exporter needs it, and onnx)
except ImportError:
    raise CheckpointError('ONNX export needs onnx, onnxscript and onnxruntime: pip install -e ".[export]"') from None

ENCODER, DECODER_STEP = "encoder.onnx", "decoder_step.onnx"


def layer_names(prefix: str, n_layers: int) -> list[str]:
    """``{prefix}_key_i``, ``{prefix}_value_i`` for every layer i, in that order."""
    return [f"{prefix}_{kind}_{i}" for i in range(n_layers) for kind in ("key", "value")]


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
    """One step of incremental decoding with the caches as tensors in and out: the decoder's own layers."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor, src_mask: Tensor, cross: list[Tensor], past: list[Tensor]) -> tuple[Tensor, ...]:
        """tokens (B, 1) at position T; cross: keys and values of the memory per layer (B, H, S, d_head);
        past: self-attention keys and values per layer (B, H, T, d_head) -> log_probs (B, V), the grown past."""
        decoder = self.model.decoder
        x = decoder.positional(decoder.embedding(tokens), offset=past[0].size(2))  # (B, 1, D)
        grown = []
        for layer, (key, value), (cross_key, cross_value) in zip(decoder.layers, pairs(past), pairs(cross)):
            cache = KeyValueCache(key, value)
            # no memory: the cross-attention cache already holds its keys and values
            x, _ = layer(x, None, src_mask, cache, CrossAttentionCache(cross_key, cross_value))
            grown += [cache.key, cache.value]
        logits = self.model.output_proj(decoder.final_norm(x))[:, -1]  # (B, V)
        return logits.log_softmax(dim=-1), *grown


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
    return output


def _export(module: nn.Module, args: tuple, dynamic_shapes: tuple, input_names: list[str], output_names: list[str],
            path: Path) -> None:
    """Capture ``module`` on the example ``args`` with torch.export, the sizes in ``dynamic_shapes`` left free,
    and save it as ONNX at ``path``."""
    for name in ("onnxscript", "onnx_ir"):  # their optimiser logs every rewrite at INFO, the commands' level
        logging.getLogger(name).setLevel(logging.WARNING)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="# The axis name")  # says a name is not used; it is
        program = torch.onnx.export(module, args, dynamo=True, dynamic_shapes=dynamic_shapes,
                                    input_names=input_names, output_names=output_names, verbose=False)
    program.save(str(path))


def export_onnx(checkpoint: Path, output: Path) -> Path:
    """`convert_to_onnx` of the model in ``checkpoint`` (its tokenizer beside it)."""
    return convert_to_onnx(*load_for_export(checkpoint), output)


class OnnxTranslator(FolderTranslator):
    """Translate and score with a folder of `convert_to_onnx` on onnxruntime, as `Translator` does with a checkpoint.

    `search_batch` is `transformer.decoding.search.beam_search` in numpy: the best 2K continuations of
    each sentence (ties to the lower index), those ending in eos among the first K finished, the same
    stopping rule, eos forced at ``int(max_len_a * source_length + max_len_b)`` tokens, GNMT-normalised
    scores; beam_size=1 is greedy search. Each beam has its own row of the encoder's outputs, where
    ours share one row per sentence (`transformer.model.cache`): simpler, the same numbers.
    """

    def __init__(self, directory: str | Path, threads: int = 0, overrides: Sequence[str] = ()) -> None:
        """``threads``: onnxruntime's intra-op threads (0: its default); ``overrides`` are decode.key=value."""
        directory = Path(directory)
        super().__init__(directory, "an ONNX model folder", [ENCODER, DECODER_STEP], overrides)
        self.precision = "fp32"
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        self.encoder, self.step = (_session(directory / name, options) for name in (ENCODER, DECODER_STEP))
        model = self.cfg.model
        self.encoder_outputs = ["src_mask", *layer_names("cross", model.n_decoder_layers)]  # what the step needs
        self.cache_names = layer_names("self", model.n_decoder_layers)
        self.head_shape = (model.n_heads, model.d_model // model.n_heads)

    def translate_nbest(self, sentences: list[str], progress: bool = False,
                        **overrides: Any) -> list[list[tuple[str, float]]]:
        """The ``nbest`` best translations of each sentence with their GNMT-normalised scores, best first."""
        decode = self.settings(**overrides)
        results: list[list[tuple[str, float]]] = [[("", 0.0)] for _ in sentences]
        todo = [i for i, sentence in enumerate(sentences) if sentence.strip()]
        ids = source_ids(self.tokenizer, [sentences[i] for i in todo], self.max_source_length)
        budget = max(decode.batch_tokens // decode.beam_size, 1)  # source tokens x beams, as `Translator`
        bar = tqdm(total=len(todo), disable=not progress, unit="sent", desc="translating", leave=False)
        for indices, src in eval_batches(ids, budget, self.tokenizer.pad_id):
            for index, hypotheses in zip(indices, self.search_batch(src, decode)):
                results[todo[index]] = [(self.tokenizer.decode_tgt([h.tokens])[0], h.score) for h in hypotheses]
            bar.update(len(indices))
        bar.close()
        return results

    def score(self, sources: list[str], targets: list[str]) -> list[list[float]]:
        """Teacher-forced log P(y_t | y_<t, x) of each target token and of the final eos."""
        tok = self.tokenizer
        src = pad_sequences(source_ids(tok, sources, self.max_source_length), tok.pad_id).numpy()
        outputs = [ids + [tok.eos_id] for ids in tok.encode_tgt(targets)]
        tgt_out = pad_sequences(outputs, tok.pad_id).numpy()  # (B, T)
        tgt_in = np.concatenate([np.full_like(tgt_out[:, :1], tok.bos_id), tgt_out[:, :-1]], axis=1)
        self._check_positions(src.shape[1], tgt_in.shape[1])
        fixed, cache, columns = self._encode(src), self._empty_cache(len(src)), []
        for step in range(tgt_in.shape[1]):
            log_probs, cache = self._step(tgt_in[:, step:step + 1], fixed, cache)
            columns.append(np.take_along_axis(log_probs, tgt_out[:, step:step + 1], axis=1))
        scores = np.concatenate(columns, axis=1)  # (B, T)
        return [scores[i, :len(ids)].tolist() for i, ids in enumerate(outputs)]

    def search_batch(self, src: Tensor, decode: DecodeConfig) -> list[list[Hypothesis]]:
        """The ``decode.nbest`` best hypotheses of each sentence of src (B, S), right-padded, ending with eos."""
        k, eos = decode.beam_size, self.tokenizer.eos_id
        max_lens = max_output_lengths(src, self.tokenizer.pad_id, decode.max_len_a, decode.max_len_b).numpy()
        self._check_positions(src.size(1), int(max_lens.max()) + 1)
        fixed = {name: value.repeat(k, axis=0) for name, value in self._encode(src.numpy()).items()}  # (B*K, ...)
        cache = self._empty_cache(len(src) * k)
        sentence = np.arange(len(src))  # original index of each sentence still searching
        prefix = np.full((len(src) * k, 1), self.tokenizer.bos_id)  # (N*K, T), beams of a sentence adjacent
        beam_log_probs = np.full((len(src), k), -np.inf, dtype=np.float32)  # (N, K)
        beam_log_probs[:, 0] = 0.0  # the K beams start out identical: expand only the first
        finished: list[list[Hypothesis]] = [[] for _ in range(len(src))]
        for step in range(int(max_lens.max()) + 1):
            log_probs, cache = self._step(prefix[:, -1:], fixed, cache)  # (N*K, V)
            forced = np.repeat(step >= max_lens, k)
            log_probs[forced] = np.where(np.arange(log_probs.shape[1]) == eos, log_probs[forced], -np.inf)
            scores = (beam_log_probs.reshape(-1, 1) + log_probs).reshape(len(sentence), -1)  # (N, K*V)
            candidates = best_candidates(scores, 2 * k)  # (N, 2K) indices into the K*V scores
            cand_log_probs = np.take_along_axis(scores, candidates, axis=1)
            beam, token = np.divmod(candidates, log_probs.shape[1])
            parent = k * np.arange(len(sentence))[:, None] + beam  # row of prefix
            is_eos = token == eos

            for n, j in zip(*np.nonzero(is_eos[:, :k] & np.isfinite(cand_log_probs[:, :k]))):
                tokens, log_prob = prefix[parent[n, j], 1:].tolist(), float(cand_log_probs[n, j])
                finished[sentence[n]].append(
                    Hypothesis(tokens, normalized_score(log_prob, len(tokens) + 1, decode.length_penalty), log_prob))
            enough = np.array([len(finished[i]) >= decode.nbest for i in sentence])
            keep = np.flatnonzero(~((is_eos[:, 0] & enough) | (step >= max_lens)))
            if len(keep) == 0:
                break
            # each beam has one eos continuation, so at least K of the 2K candidates are not eos
            active = np.argsort(is_eos, axis=1, kind="stable")[keep, :k]  # (N', K)
            rows = np.take_along_axis(parent[keep], active, axis=1).ravel()  # (N'*K,)
            prefix = np.concatenate([prefix[rows], np.take_along_axis(token[keep], active, axis=1).reshape(-1, 1)], 1)
            beam_log_probs = np.take_along_axis(cand_log_probs[keep], active, axis=1)
            cache = {name: value[rows] for name, value in cache.items()}
            if len(keep) < len(sentence):  # the beams of a sentence share the encoder's outputs
                fixed = {name: value[rows] for name, value in fixed.items()}
            sentence, max_lens = sentence[keep], max_lens[keep]
        return [sorted(hypotheses, key=lambda h: h.score, reverse=True)[:decode.nbest] for hypotheses in finished]

    def _encode(self, src: np.ndarray) -> dict[str, np.ndarray]:
        """The step's inputs that come from the encoder: src_mask and the memory's keys and values."""
        return dict(zip(self.encoder_outputs, self.encoder.run(self.encoder_outputs, {"src": src})))

    def _empty_cache(self, rows: int) -> dict[str, np.ndarray]:
        """The self-attention cache before the first step: no positions, (rows, H, 0, d_head)."""
        heads, d_head = self.head_shape
        return {name: np.zeros((rows, heads, 0, d_head), dtype=np.float32) for name in self.cache_names}

    def _step(self, tokens: np.ndarray, fixed: dict[str, np.ndarray],
              cache: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """log P(next token) (N, V) after ``tokens`` (N, 1), and the cache grown by their keys and values."""
        log_probs, *grown = self.step.run(None, {"tokens": tokens, **fixed, **cache})
        return log_probs, dict(zip(self.cache_names, grown))

    def _check_positions(self, source_length: int, target_positions: int) -> None:
        """The graphs' positional table has ``model.max_positions`` rows; longer inputs cannot run."""
        positions, needed = self.cfg.model.max_positions, max(source_length, target_positions)
        if needed > positions:
            raise InputError(f"the ONNX graphs hold {positions} positions (model.max_positions) and this batch "
                             f"needs {needed}: lower decode.max_len_a or decode.max_len_b")


def best_candidates(scores: np.ndarray, count: int) -> np.ndarray:
    """Columns of the ``count`` highest scores of each row, best first, equal scores by lower index (as ours).

    Shapes: scores (N, M) -> (N, count).
    """
    top = np.sort(np.argpartition(-scores, count - 1, axis=1)[:, :count], axis=1)  # by index: ties go low
    order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1, kind="stable")
    return np.take_along_axis(top, order, axis=1)


def _session(path: Path, options: onnxruntime.SessionOptions) -> onnxruntime.InferenceSession:
    """An onnxruntime session on the CPU; an unreadable graph is a one-line CheckpointError naming the file."""
    try:
        return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime's own exception types (InvalidProtobuf, Fail, ...)
        raise CheckpointError(f"{path}: not a readable ONNX graph ({str(error).splitlines()[0]})") from None
