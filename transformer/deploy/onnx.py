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
tested with torch 2.13, onnxscript 0.7, onnxruntime 1.32). They run the model's own modules: `DecoderStep`
wraps the given tensors in the `KeyValueCache` and `CrossAttentionCache` that the decoder layers take
in incremental decoding, so the step computes what `Transformer.decode` computes with a cache.
`OnnxTranslator` runs our own greedy and beam search on them through `OnnxModel`.
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

from transformer.checkpoint import CheckpointError
from transformer.config import Config
from transformer.data.batch import pad_sequences
from transformer.data.textio import first_line
from transformer.data.tokenizer import Tokenizer
from transformer.decoding.inputs import encode, forced_ids, source_ids
from transformer.decoding.limits import length_limits
from transformer.decoding.translator import Translator
from transformer.deploy.folder import (
    CONFIG,
    FolderTranslator,
    check_export_folder,
    export_folder,
    load_for_export,
    write_config_and_tokenizer,
)
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


class EncoderOutputs:
    """What encoder.onnx gave for a batch: the memory's keys and values of every decoder layer, one row
    per sentence. The searches index it as they index the memory when sentences leave the batch."""

    def __init__(self, cross: list[np.ndarray]) -> None:
        self.cross = cross

    def __getitem__(self, rows: Tensor) -> EncoderOutputs:
        return EncoderOutputs([array[rows.cpu().numpy()] for array in self.cross])

    def __len__(self) -> int:
        return len(self.cross[0])


class OnnxCache:
    """The self-attention keys and values that decoder_step.onnx takes and returns, reordered with the beams."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays

    @property
    def length(self) -> int:
        return next(iter(self.arrays.values())).shape[2]

    def reorder(self, index: Tensor, source_index: Tensor | None = None) -> None:
        """Keep the rows ``index`` (the memory's rows are `EncoderOutputs`', reordered by the search)."""
        self.arrays = {name: array[index.cpu().numpy()] for name, array in self.arrays.items()}


class OnnxModel:
    """The two graphs in the place of a `Transformer` for `transformer.decoding.search`: the same greedy and
    beam search run on onnxruntime, one decoder step per call, the cache in `OnnxCache`."""

    def __init__(self, encoder: onnxruntime.InferenceSession, step: onnxruntime.InferenceSession, cfg: Config) -> None:
        self.encoder, self.step, model, data = encoder, step, cfg.model, cfg.data
        self.pad_id, self.bos_id, self.eos_id = data.pad_id, data.bos_id, data.eos_id
        self.cross_names = layer_names("cross", model.n_decoder_layers)
        self.self_names = layer_names("self", model.n_decoder_layers)
        self.head_shape = (model.n_heads, model.d_model // model.n_heads)

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> EncoderOutputs:
        """The memory's keys and values of every decoder layer for src (B, S)."""
        return EncoderOutputs(self.encoder.run(self.cross_names, {"src": src.cpu().numpy()}))

    def new_cache(self, incremental: bool = True) -> OnnxCache:
        if not incremental:
            raise ValueError("the ONNX decoder step always decodes with its cache")
        heads, d_head = self.head_shape
        return OnnxCache({name: np.zeros((0, heads, 0, d_head), dtype=np.float32) for name in self.self_names})

    def decode(self, tgt_in: Tensor, memory: EncoderOutputs, src_mask: Tensor, cache: OnnxCache) -> Tensor:
        """log P(next token) (N, T', V) after each token of the prefixes tgt_in (N, T) that the cache has not seen
        (T' of them: one step of the graph each); memory and src_mask hold one row for every G = N / len(memory)
        consecutive prefixes (a sentence's beams)."""
        rows, group = tgt_in.size(0), tgt_in.size(0) // len(memory)
        fixed = {"src_mask": src_mask.cpu().numpy().repeat(group, axis=0),
                 **{name: array.repeat(group, axis=0) for name, array in zip(self.cross_names, memory.cross)}}
        steps = []
        for position in range(cache.length, tgt_in.size(1)):
            past = cache.arrays if cache.length else {  # before the first step: no positions for any of the rows
                name: np.zeros((rows, *array.shape[1:]), np.float32) for name, array in cache.arrays.items()}
            log_probs, *grown = self.step.run(None, {"tokens": tgt_in[:, position:position + 1].cpu().numpy(),
                                                     **fixed, **past})
            cache.arrays = dict(zip(self.self_names, grown))
            steps.append(torch.from_numpy(log_probs))
        return torch.stack(steps, dim=1)


class OnnxTranslator(FolderTranslator):
    """Translate and score with a folder of `convert_to_onnx` on onnxruntime, as `Translator` does with a checkpoint:
    the same searches (`transformer.decoding.search`) run the graphs through `OnnxModel`."""

    name, holds = "onnx", "the ONNX graphs hold {} positions"

    def __init__(self, directory: str | Path, threads: int = 0, overrides: Sequence[str] = ()) -> None:
        """``threads``: onnxruntime's intra-op threads (0: its default); ``overrides`` are decode.key=value."""
        directory = Path(directory)
        super().__init__(directory, "an ONNX model folder", [ENCODER, DECODER_STEP], overrides)
        if self.max_source_length > self.positions:
            raise CheckpointError(f"{directory}: data.max_length {self.max_source_length} is more than the "
                                  f"{self.positions} positions of the graphs (model.max_positions)")
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        self.precision = "fp32"
        self.model = OnnxModel(*(_session(directory / name, options) for name in (ENCODER, DECODER_STEP)), self.cfg)
        _check_fits(directory, self.model)
        self.translator = Translator(self.model, self.tokenizer, self.decode, torch.device("cpu"),
                                     max_source_length=self.max_source_length, data=self.data)

    def search_nbest(self, sentences: list[str], progress: bool = False, prefixes: Sequence[str] | None = None,
                     constraints: Sequence[Sequence[str]] | None = None,
                     **overrides: Any) -> list[list[tuple[str, float]]]:
        """The ``nbest`` best translations of each sentence with their GNMT-normalised scores, best first,
        searched (or sampled) by `Translator` on the graphs. A length limit beyond the graphs' positions is
        refused before searching."""
        decode = self.settings(**overrides)
        forced = forced_ids(self.tokenizer, prefixes, len(sentences), self.max_source_length, "prefix")
        phrases = self.translator.constraint_ids(constraints, len(sentences))
        # sources are cut to max_source_length: only when the longest possible one could need too many positions
        # are they encoded here (`Translator` encodes them again) to find each one's limit
        lengths = [self.max_source_length] * len(sentences)
        if 1 + max(length_limits(lengths, decode, forced, phrases), default=0) > self.positions:
            lengths = [len(ids) for ids in source_ids(self.tokenizer, sentences, self.max_source_length)]
        self.check_positions(length_limits(lengths, decode, forced, phrases))
        return self.translator.search_nbest(sentences, progress, prefixes, constraints, **overrides)

    def score(self, sources: list[str], targets: list[str]) -> list[list[float]]:
        """Teacher-forced log P(y_t | y_<t, x) of each target token and of the final eos."""
        tok = self.tokenizer
        src = pad_sequences(source_ids(tok, sources, self.max_source_length), tok.pad_id)
        outputs = [ids + [tok.eos_id] for ids in encode(tok, targets, target=True)]
        self.check_positions([len(ids) - 1 for ids in outputs])  # bos, then the target's tokens but eos
        tgt_out = pad_sequences(outputs, tok.pad_id)  # (B, T)
        tgt_in = torch.cat([torch.full_like(tgt_out[:, :1], tok.bos_id), tgt_out[:, :-1]], dim=1)
        memory, cache, src_mask = self.model.encode(src), self.model.new_cache(), padding_mask(src, tok.pad_id)
        log_probs = self.model.decode(tgt_in, memory, src_mask, cache)  # (B, T, V)
        scores = log_probs.gather(2, tgt_out[..., None])[..., 0]
        return [scores[i, :len(ids)].tolist() for i, ids in enumerate(outputs)]


def _check_fits(directory: Path, model: OnnxModel) -> None:
    """A one-line CheckpointError unless the model settings of the folder's config.yaml (layers, heads, d_model)
    fit the inputs of decoder_step.onnx: else the first search step would fail in onnxruntime."""
    inputs = {graph_input.name: graph_input.shape for graph_input in model.step.get_inputs()}
    caches = [*model.cross_names, *model.self_names]  # (B, H, S or T, d_head) each
    fits = set(inputs) == {"tokens", "src_mask", *caches} and all(
        inputs[name][1::2] == list(model.head_shape) for name in caches)
    if not fits:
        raise CheckpointError(f"{directory / CONFIG}: its model settings (n_decoder_layers, n_heads, d_model) do "
                              f"not fit {DECODER_STEP}")


def _session(path: Path, options: onnxruntime.SessionOptions) -> onnxruntime.InferenceSession:
    """An onnxruntime session on the CPU; an unreadable graph is a one-line CheckpointError naming the file."""
    try:
        return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime's own exception types (InvalidProtobuf, Fail, ...)
        raise CheckpointError(f"{path}: not a readable ONNX graph ({first_line(error)})") from None
