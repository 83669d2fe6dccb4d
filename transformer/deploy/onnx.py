"""`OnnxTranslator`: translate and score with an ONNX model folder (`transformer.deploy.onnx_export` writes it)
on onnxruntime. Our own greedy and beam search (`transformer.decoding.search`) run on the two graphs through
`OnnxModel`, which stands in for a `Transformer`: the encoder graph once per batch, the decoder-step graph
once per position, with the self-attention cache as arrays (`OnnxCache`) that the searches reorder.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from transformer.checkpoint import CheckpointError
from transformer.config import Config, DecodeConfig
from transformer.decoding.inputs import forced_ids, source_ids
from transformer.decoding.limits import length_limits
from transformer.decoding.translator import Translator
from transformer.deploy.folder import CONFIG, FolderTranslator
from transformer.errors import first_line

try:  # translating needs onnxruntime alone; exporting (the `export` extra) onnx and onnxscript too
    import onnxruntime
except ImportError:
    raise CheckpointError('ONNX models run on onnxruntime, which is not installed: pip install onnxruntime '
                          '(or pip install -e ".[export]")') from None

ENCODER, DECODER_STEP = "encoder.onnx", "decoder_step.onnx"  # an ONNX model folder's two graphs


def layer_names(prefix: str, n_layers: int) -> list[str]:
    """The graphs' names of the cached keys and values: ``{prefix}_key_i``, ``{prefix}_value_i`` for every layer i."""
    return [f"{prefix}_{kind}_{i}" for i in range(n_layers) for kind in ("key", "value")]


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

    def forced_log_probs(self, sentences: list[str], translations: list[str], decode: DecodeConfig,
                         progress: bool = False) -> list[tuple[float, int]]:
        self.translation_ids(translations)
        return self.translator.forced_log_probs(sentences, translations, decode, progress)


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
