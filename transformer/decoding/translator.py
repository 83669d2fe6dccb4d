"""Text in, text out: a trained model with its tokenizer, searching in token-budget batches.

    from transformer import Translator
    translator = Translator.from_checkpoint("runs/multi30k_de_en/checkpoint_best.pt")
    translator.translate(["Ein Mann fährt Fahrrad."], beam_size=5)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor
from tqdm import tqdm

from transformer.checkpoint import CheckpointError, load_checkpoint
from transformer.config import DataConfig, DecodeConfig, config_from_dict
from transformer.data.batching import eval_batches
from transformer.data.tokenizer import Tokenizer
from transformer.decoding.search import Hypothesis, beam_search, greedy_search
from transformer.fast.packed_linear import pack_linear_weights
from transformer.model.attention import padding_mask
from transformer.model.transformer import Transformer
from transformer.runtime.device import select_device
from transformer.runtime.precision import autocast, quantize_int8
from transformer.runtime.threads import parallel_map

log = logging.getLogger(__name__)


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
        self.truncated: list[int] = []  # inputs of the last call cut to max_source_length

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str | None = None, dtype: str = "fp32",
                        quantize: str | None = None, workers: int = 1) -> Translator:
        """Load model, config and tokenizer (found next to the checkpoint) for translation."""
        path = Path(path)
        state = load_checkpoint(path)
        cfg = config_from_dict(state["config"], where=str(path))
        tokenizer = Tokenizer.load(path.parent, cfg.data)
        target = select_device(device or "auto")
        model = Transformer(cfg.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.pad_id,
                            tokenizer.bos_id, tokenizer.eos_id)
        try:
            model.load_state_dict(state["model"])
        except RuntimeError as error:
            raise CheckpointError(f"{path}: weights do not fit the model of its config "
                                  f"({str(error).splitlines()[0]})") from None
        model.eval()
        if quantize == "int8":
            model, target = quantize_int8(model), torch.device("cpu")
        elif dtype == "bf16":  # weights in bf16 too: autocast would cast activations around every layer
            model = model.to(torch.bfloat16).to(target)
            if target.type == "cpu":
                model = pack_linear_weights(model)
        return cls(model.to(target), tokenizer, cfg.decode, target, dtype, cfg.data.max_length, cfg.data, workers)

    def data_config(self, dataset: str | None = None) -> DataConfig:
        """The training data settings, optionally pointing at another corpus."""
        if self.data is None:
            raise CheckpointError("this translator was not loaded from a checkpoint; no data settings")
        return replace(self.data, dataset=dataset) if dataset else self.data

    def decoding_settings(self, beam_size: int | None = None, length_penalty: float | None = None) -> dict:
        return {"beam_size": beam_size or self.decode.beam_size,
                "length_penalty": self.decode.length_penalty if length_penalty is None else length_penalty,
                "max_len_a": self.decode.max_len_a, "max_len_b": self.decode.max_len_b,
                "precision": self.precision}

    def translate(self, sentences: list[str], beam_size: int | None = None, length_penalty: float | None = None,
                  progress: bool = False) -> list[str]:
        """Detokenized best translation of each sentence; an empty sentence gives an empty line."""
        best = self.translate_nbest(sentences, 1, beam_size, length_penalty, progress)
        return [hypotheses[0][0] for hypotheses in best]

    def translate_nbest(self, sentences: list[str], nbest: int, beam_size: int | None = None,
                        length_penalty: float | None = None,
                        progress: bool = False) -> list[list[tuple[str, float]]]:
        """The ``nbest`` best translations of each sentence with their length-normalised scores."""
        results = self._search(sentences, max(nbest, beam_size or self.decode.beam_size), nbest, length_penalty,
                               progress)
        return [[(self.tokenizer.decode_tgt([h.tokens])[0], h.score) for h in hypotheses] for hypotheses in results]

    def _encode(self, sentences: list[str]) -> list[list[int]]:
        """Source ids ending with eos, cut to the model's maximum length (recorded in ``truncated``)."""
        ids = self.tokenizer.encode_src(sentences)
        self.truncated = [i for i, x in enumerate(ids) if len(x) + 1 > self.max_source_length]
        return [x[: self.max_source_length - 1] + [self.tokenizer.eos_id] for x in ids]

    @torch.no_grad()
    def _search(self, sentences: list[str], beam_size: int, nbest: int, length_penalty: float | None,
                progress: bool) -> list[list[Hypothesis]]:
        empty = [Hypothesis([], 0.0, 0.0)]
        results: list[list[Hypothesis]] = [empty] * len(sentences)
        todo = [i for i, s in enumerate(sentences) if s.strip()]
        src_ids = self._encode([sentences[i] for i in todo])
        budget = max(self.decode.batch_tokens // beam_size, 1)
        bar = tqdm(total=len(todo), disable=not progress, unit="sent", desc="translating", leave=False)

        def search(batch: tuple[list[int], Tensor]) -> tuple[list[int], list[list[Hypothesis]]]:
            indices, src = batch
            return indices, self.search_batch(src, beam_size, length_penalty, nbest)

        batches = eval_batches(src_ids, budget, self.tokenizer.pad_id)
        for indices, found in parallel_map(search, batches, self.workers):
            for index, hypotheses in zip(indices, found):
                results[todo[index]] = hypotheses
            bar.update(len(indices))
        bar.close()
        self.truncated = [todo[i] for i in self.truncated]
        return results

    @torch.no_grad()
    def search_batch(self, src: Tensor, beam_size: int, length_penalty: float | None = None, nbest: int = 1,
                     use_cache: bool = True) -> list[list[Hypothesis]]:
        """Greedy (beam_size 1, scores 0) or beam search over one batch of source ids (B, S), in
        this translator's precision; ``use_cache=False`` recomputes every prefix (the benchmark)."""
        src = src.to(self.device)
        with autocast(self.device, self.precision):  # thread-local, like no_grad: set in the worker
            if beam_size == 1:
                return [[Hypothesis(tokens, 0.0, 0.0)] for tokens in greedy_search(
                    self.model, src, self.decode.max_len_a, self.decode.max_len_b, use_cache)]
            return beam_search(self.model, src, beam_size,
                               self.decode.length_penalty if length_penalty is None else length_penalty,
                               self.decode.max_len_a, self.decode.max_len_b, nbest, use_cache)

    @torch.no_grad()
    def attention(self, sentence: str, beam_size: int | None = None) -> AttentionMap:
        """Translate one sentence and return its encoder-decoder attention for plotting."""
        (src_ids,) = self._encode([sentence])
        (best,) = self._search([sentence], beam_size or self.decode.beam_size, 1, None, False)
        src = torch.tensor([src_ids], device=self.device)
        tgt_in = torch.tensor([[self.tokenizer.bos_id] + best[0].tokens + [self.tokenizer.eos_id]],
                              device=self.device)
        src_mask = padding_mask(src, self.tokenizer.pad_id)
        _, weights = self.model.decode_with_attention(tgt_in[:, :-1], self.model.encode(src, src_mask), src_mask)
        return AttentionMap(self.tokenizer.src_pieces(src_ids), self.tokenizer.tgt_pieces(tgt_in[0, 1:].tolist()),
                            torch.stack([w[0] for w in weights]).float().cpu())
