"""Text in, text out: a trained model with its tokenizer, searching in token-budget batches.

    from transformer import Translator
    translator = Translator.from_checkpoint("runs/multi30k_de_en/checkpoint_best.pt")
    translator.translate(["Ein Mann fährt Fahrrad."], beam_size=5)
    translator = Translator.from_pretrained("multi30k_de_en")  # a folder of transformer-export

Decoding settings are the checkpoint's ``decode`` section; keyword arguments of the calls (and
``decode.key=value`` overrides of `from_checkpoint`) replace fields of it, resolved once per call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm

from transformer import fast
from transformer.checkpoint import CheckpointError, load_checkpoint
from transformer.config import Config, DataConfig, DecodeConfig
from transformer.config_loading import apply_overrides, config_from_dict
from transformer.data.batching import eval_batches
from transformer.data.tokenizer import Tokenizer
from transformer.decoding.search import PLAIN_STEPS, Hypothesis, beam_search, greedy_search
from transformer.model.attention import padding_mask
from transformer.model.transformer import Transformer
from transformer.runtime.device import select_device
from transformer.runtime.precision import autocast, quantize_int8
from transformer.runtime.threads import parallel_map


def source_ids(tokenizer: Tokenizer, sentences: list[str], max_length: int) -> list[list[int]]:
    """Source ids ending with eos, cut to ``max_length`` tokens (eos included), as the model reads them."""
    return [ids[: max_length - 1] + [tokenizer.eos_id] for ids in tokenizer.encode_src(sentences)]


def too_long(tokenizer: Tokenizer, sentences: list[str], max_length: int) -> list[int]:
    """Positions of the sentences that `source_ids` cuts."""
    lengths = [len(ids) + 1 for ids in tokenizer.encode_src(sentences)]  # + eos
    return [i for i, length in enumerate(lengths) if length > max_length]


@dataclass
class AttentionMap:
    """Encoder-decoder attention of one translation: weights (layers, heads, target, source)."""

    source_pieces: list[str]
    target_pieces: list[str]
    weights: Tensor


class Translator:
    """Translate sentences with ``model``; the output order is the input order whatever the batching."""

    def __init__(self, model: Transformer, tokenizer: Tokenizer, decode: DecodeConfig, device: torch.device,
                 precision: str = "fp32", max_source_length: int = 256, data: DataConfig | None = None,
                 workers: int = 1) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.model, self.tokenizer, self.decode = model, tokenizer, decode
        self.device, self.precision, self.max_source_length = device, precision, max_source_length
        self.data = data
        self.workers = workers  # batches translated at once, sharing the CPU threads (see parallel_map)
        self.steps = fast.for_inference(model, device) if decode.fast_paths else PLAIN_STEPS

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str | None = None, dtype: str = "fp32",
                        quantize: str | None = None, workers: int = 1, overrides: Sequence[str] = ()) -> Translator:
        """Load model, config and tokenizer (found next to the checkpoint) for translation.

        ``overrides`` are ``decode.key=value`` settings that replace the checkpoint's.
        """
        path = Path(path)
        state = load_checkpoint(path)
        cfg = config_from_dict(state["config"], where=str(path))
        return cls._load(cfg, path.parent, state["model"], path, device, dtype, quantize, workers, overrides)

    @classmethod
    def from_pretrained(cls, directory: str | Path, device: str | None = None, dtype: str = "fp32",
                        quantize: str | None = None, workers: int = 1, overrides: Sequence[str] = ()) -> Translator:
        """Load a release folder written by ``transformer-export`` (`transformer.deploy.release`);
        it translates exactly as the checkpoint it came from. Arguments as for `from_checkpoint`."""
        from transformer.deploy.release import WEIGHTS, read_release  # safetensors: the `export` extra

        cfg, weights = read_release(Path(directory))
        return cls._load(cfg, Path(directory), weights, Path(directory) / WEIGHTS, device, dtype, quantize, workers,
                         overrides)

    @classmethod
    def _load(cls, cfg: Config, tokenizer_dir: Path, weights: dict[str, Tensor], where: Path, device: str | None,
              dtype: str, quantize: str | None, workers: int, overrides: Sequence[str]) -> Translator:
        """The translator of a config, the tokenizer in ``tokenizer_dir`` and a state dict read from ``where``."""
        cfg = apply_overrides(cfg, overrides, sections=("decode",))
        tokenizer = Tokenizer.load(tokenizer_dir, cfg.data)
        target = select_device(device or "auto")
        model = Transformer(cfg.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.pad_id,
                            tokenizer.bos_id, tokenizer.eos_id)
        try:
            model.load_state_dict(weights)
        except RuntimeError as error:
            raise CheckpointError(f"{where}: weights do not fit the model of its config "
                                  f"({str(error).splitlines()[0]})") from None
        model.eval()
        if quantize == "int8":
            model, target = quantize_int8(model), torch.device("cpu")
        elif dtype == "bf16":  # weights in bf16 too: autocast would cast activations around every layer
            model = model.to(torch.bfloat16)
        return cls(model.to(target), tokenizer, cfg.decode, target, dtype, cfg.data.max_length, cfg.data, workers)

    def data_config(self, dataset: str | None = None) -> DataConfig:
        """The training data settings, optionally pointing at another corpus."""
        if self.data is None:
            raise CheckpointError("this translator was not loaded from a checkpoint or release; no data settings")
        return dataclasses.replace(self.data, dataset=dataset) if dataset else self.data

    def settings(self, **overrides: Any) -> DecodeConfig:
        """This translator's decoding settings with ``overrides`` of `DecodeConfig` fields, checked."""
        return self.decode.with_overrides(**overrides)

    def translate(self, sentences: list[str], progress: bool = False, **overrides: Any) -> list[str]:
        """Detokenized best translation of each sentence; an empty sentence gives an empty line."""
        return [hypotheses[0][0] for hypotheses in self.translate_nbest(sentences, progress, **overrides)]

    def translate_nbest(self, sentences: list[str], progress: bool = False,
                        **overrides: Any) -> list[list[tuple[str, float]]]:
        """The ``nbest`` best translations of each sentence with their length-normalised scores."""
        results = self.search(sentences, self.settings(**overrides), progress)
        return [[(self.tokenizer.decode_tgt([h.tokens])[0], h.score) for h in hypotheses] for hypotheses in results]

    def too_long(self, sentences: list[str]) -> list[int]:
        """Positions of the sentences whose source is cut to ``max_source_length`` tokens to be translated."""
        return too_long(self.tokenizer, sentences, self.max_source_length)

    def _encode(self, sentences: list[str]) -> list[list[int]]:
        return source_ids(self.tokenizer, sentences, self.max_source_length)

    @torch.no_grad()
    def search(self, sentences: list[str], decode: DecodeConfig, progress: bool = False) -> list[list[Hypothesis]]:
        """The ``decode.nbest`` best hypotheses of each sentence, searched in token-budget batches."""
        results: list[list[Hypothesis]] = [[Hypothesis([], 0.0, 0.0)]] * len(sentences)
        todo = [i for i, s in enumerate(sentences) if s.strip()]
        budget = max(decode.batch_tokens // decode.beam_size, 1)
        bar = tqdm(total=len(todo), disable=not progress, unit="sent", desc="translating", leave=False)

        def search(batch: tuple[list[int], Tensor]) -> tuple[list[int], list[list[Hypothesis]]]:
            indices, src = batch
            return indices, self.search_batch(src, decode)

        batches = eval_batches(self._encode([sentences[i] for i in todo]), budget, self.tokenizer.pad_id)
        for indices, found in parallel_map(search, batches, self.workers):
            for index, hypotheses in zip(indices, found):
                results[todo[index]] = hypotheses
            bar.update(len(indices))
        bar.close()
        return results

    @torch.no_grad()
    def search_batch(self, src: Tensor, decode: DecodeConfig, use_cache: bool = True) -> list[list[Hypothesis]]:
        """Greedy (beam_size 1, scores 0) or beam search over one batch of source ids (B, S), in
        this translator's precision; ``use_cache=False`` recomputes every prefix (the benchmark)."""
        src = src.to(self.device)
        with autocast(self.device, self.precision):  # thread-local, like no_grad: set in the worker
            if decode.beam_size == 1:
                return [[Hypothesis(tokens, 0.0, 0.0)]
                        for tokens in greedy_search(self.model, src, decode, use_cache, self.steps)]
            return beam_search(self.model, src, decode, use_cache, self.steps)

    @torch.no_grad()
    def attention(self, sentence: str, **overrides: Any) -> AttentionMap:
        """Translate one sentence and return its encoder-decoder attention for plotting."""
        (src_ids,) = self._encode([sentence])
        (best,) = self.search([sentence], self.settings(**overrides, nbest=1))
        src = torch.tensor([src_ids], device=self.device)
        tgt_in = torch.tensor([[self.tokenizer.bos_id] + best[0].tokens + [self.tokenizer.eos_id]],
                              device=self.device)
        src_mask = padding_mask(src, self.tokenizer.pad_id)
        _, weights = self.model.decode_with_attention(tgt_in[:, :-1], self.model.encode(src, src_mask), src_mask)
        return AttentionMap(self.tokenizer.src_pieces(src_ids), self.tokenizer.tgt_pieces(tgt_in[0, 1:].tolist()),
                            torch.stack([w[0] for w in weights]).float().cpu())
