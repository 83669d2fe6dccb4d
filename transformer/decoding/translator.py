"""Text in, text out: a trained model with its tokenizer, searching in token-budget batches.

    from transformer import Translator
    translator = Translator.from_checkpoint("runs/multi30k_de_en/checkpoint_best.pt")
    translator.translate(["Ein Mann fährt Fahrrad."], beam_size=5)
    translator = Translator.from_pretrained("multi30k_de_en")  # a folder of transformer-export
    translator.translate(["Ein Mann fährt Fahrrad."], prefixes=["A man"], constraints=[["bicycle"]])
    translator.translate_nbest(["Ein Mann fährt Fahrrad."], sampling=True, nbest=5, seed=1)
    ensemble = Translator.from_checkpoint(["run1/checkpoint_best.pt", "run2/checkpoint_best.pt"])

Decoding settings are the checkpoint's ``decode`` section; keyword arguments of the calls (and
``decode.key=value`` overrides of `from_checkpoint`) replace fields of it, resolved once per call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm

from transformer import fast
from transformer.config import DataConfig, DecodeConfig, ModelConfig
from transformer.config_loading import apply_overrides
from transformer.data.batch import pad_sequences
from transformer.data.batching import eval_batches
from transformer.data.languages import tag_pieces
from transformer.data.tokenizer import Tokenizer
from transformer.decoding.alignment import word_alignment
from transformer.decoding.inputs import SOURCE_LENGTH_MULTIPLE, encode, forced_ids, source_ids
from transformer.decoding.loading import (
    StoredModel,
    check_load_options,
    prepare_model,
    read_checkpoints,
    read_release_folder,
)
from transformer.decoding.sampling import Sampler, sample_seeds
from transformer.decoding.search import PLAIN_STEPS, DecodingModel, Hypothesis, beam_search, greedy_search
from transformer.engine import AttentionMap, Engine, sentence_list, sentence_pairs
from transformer.errors import InputError
from transformer.model.attention import padding_mask
from transformer.runtime.precision import autocast
from transformer.runtime.threads import parallel_map


class Translator(Engine):
    """Translate sentences with ``model``; the output order is the input order whatever the batching."""

    name, supports_attention, supports_alignment = "torch", True, True

    def __init__(self, model: DecodingModel, tokenizer: Tokenizer, decode: DecodeConfig, device: torch.device,
                 precision: str = "fp32", max_source_length: int = DataConfig.max_length,
                 data: DataConfig | None = None, workers: int = 1) -> None:
        if workers < 1:
            raise InputError(f"workers must be >= 1, got {workers}")
        self.model, self.tokenizer, self.decode = model, tokenizer, decode
        self.device, self.precision, self.max_source_length, self.data = device, precision, max_source_length, data
        self.workers = workers  # batches translated at once, sharing the CPU threads (see parallel_map)
        self.steps = fast.FAST_STEPS if decode.fast_paths else PLAIN_STEPS

    @classmethod
    def from_checkpoint(cls, path: str | Path | Sequence[str | Path], device: str | None = None, dtype: str = "fp32",
                        quantize: str | None = None, workers: int = 1, overrides: Sequence[str] = (),
                        fast_paths: bool | None = None) -> Translator:
        """Load model, config and tokenizer (found next to the checkpoint) for translation.

        Several paths make an ensemble (`transformer.decoding.ensemble`) of models that share a vocabulary;
        the first one's config and decoding settings are used. ``overrides`` are ``decode.key=value``
        settings that replace the checkpoint's. ``fast_paths`` (default: the config's decode.fast_paths)
        switches `transformer.fast`'s packed weights and search steps on or off, for all calls: set here,
        as it changes the loaded model, and not per call.
        """
        check_load_options(overrides, dtype, quantize)
        return cls._load(read_checkpoints(path), device, dtype, quantize, workers, overrides, fast_paths)

    @classmethod
    def from_pretrained(cls, directory: str | Path, device: str | None = None, dtype: str = "fp32",
                        quantize: str | None = None, workers: int = 1, overrides: Sequence[str] = (),
                        fast_paths: bool | None = None) -> Translator:
        """Load a release folder written by ``transformer-export`` (`transformer.deploy.release`);
        it translates exactly as the checkpoint it came from. Arguments as for `from_checkpoint`."""
        check_load_options(overrides, dtype, quantize)
        return cls._load(read_release_folder(Path(directory)), device, dtype, quantize, workers, overrides,
                         fast_paths)

    @classmethod
    def _load(cls, stored: StoredModel, device: str | None, dtype: str, quantize: str | None, workers: int,
              overrides: Sequence[str], fast_paths: bool | None) -> Translator:
        """The translator of a stored model, with the load options and ``decode.*`` overrides given."""
        cfg = stored.cfg
        if fast_paths is not None:  # the load option wins over the config's decode.fast_paths
            overrides = [*overrides, f"decode.fast_paths={fast_paths}"]
        cfg = apply_overrides(cfg, overrides, sections=("decode",))
        model, target = prepare_model(stored, device, dtype, quantize, cfg.decode.fast_paths)
        translator = cls(model, stored.tokenizer, cfg.decode, target, dtype, cfg.data.max_length, cfg.data, workers)
        translator.training_data = stored.training_data  # named where it trained: a relative path leads elsewhere
        return translator

    @property
    def model_config(self) -> ModelConfig:
        return self.model.cfg

    def search_nbest(self, sentences: list[str], progress: bool = False, prefixes: Sequence[str] | None = None,
                     constraints: Sequence[Sequence[str]] | None = None,
                     **overrides: Any) -> list[list[tuple[str, float]]]:
        """The ``nbest`` best translations (or samples) of each sentence with their length-normalised scores."""
        results = self.search(sentences, self.settings(**overrides), progress, prefixes, constraints)
        return [[(self.tokenizer.decode_tgt([h.tokens])[0], h.score) for h in hypotheses] for hypotheses in results]

    def _encode(self, sentences: list[str]) -> list[list[int]]:
        return source_ids(self.tokenizer, sentences, self.max_source_length)

    @torch.no_grad()
    def search(self, sentences: list[str], decode: DecodeConfig, progress: bool = False,
               prefixes: Sequence[str] | None = None,
               constraints: Sequence[Sequence[str]] | None = None) -> list[list[Hypothesis]]:
        """The ``decode.nbest`` best hypotheses (or samples) of each sentence, searched in token-budget batches.

        ``prefixes`` (one per sentence, "" for none) are target texts each translation must start with:
        encoded like the targets, their tokens are part of the hypotheses and count in their scores.
        ``constraints`` (one list per sentence) are target phrases each translation must contain
        (`transformer.decoding.constraints`). An empty sentence gives its prefix, unsearched.
        """
        prefix_ids = forced_ids(self.tokenizer, prefixes, len(sentences), self.max_source_length, "prefix")
        phrase_ids = self.constraint_ids(constraints, len(sentences))
        if decode.sampling and any(phrase_ids):
            raise InputError("constraints need beam search: drop decode.sampling")
        todo = [i for i, s in enumerate(sentences) if s.strip()]
        return self._search_ids(sentences, todo, decode, progress, prefix_ids, phrase_ids)

    def _search_ids(self, sentences: list[str], todo: list[int], decode: DecodeConfig, progress: bool,
                    prefix_ids: list[list[int]], phrase_ids: list[list[list[int]]],
                    desc: str = "translating") -> list[list[Hypothesis]]:
        """`search` of the sentences at positions ``todo`` with their prefixes' and phrases' ids; the others get
        their prefix, unsearched."""
        results = [[Hypothesis(prefix_ids[i], 0.0, 0.0)] for i in range(len(sentences))]
        budget = max(decode.batch_tokens // (decode.nbest if decode.sampling else decode.beam_size), 1)

        def search(batch: tuple[list[int], Tensor]) -> tuple[list[int], list[list[Hypothesis]]]:
            indices, src = batch
            return indices, self.search_batch(src, decode, prefixes=[prefix_ids[todo[i]] for i in indices],
                                              constraints=[phrase_ids[todo[i]] for i in indices])

        batches = eval_batches(self._encode([sentences[i] for i in todo]), budget, self.tokenizer.pad_id,
                               multiple=SOURCE_LENGTH_MULTIPLE, longest=self.max_source_length)
        # closed however the search ends, so that "interrupted" after a Ctrl-C is printed on a line of its own
        with tqdm(total=len(todo), disable=not progress, unit="sent", desc=desc, leave=False) as bar:
            for indices, found in parallel_map(search, batches, self.workers):
                for index, hypotheses in zip(indices, found):
                    results[todo[index]] = hypotheses
                bar.update(len(indices))
        return results

    def forced_log_probs(self, sentences: list[str], translations: list[str], decode: DecodeConfig,
                         progress: bool = False) -> list[tuple[float, int]]:
        """Greedy search made to emit each translation, then eos (its prefix, at a length limit of its own length):
        the search's own steps, so that a translation it found gets the log-probability it gave it, to the bit
        for a greedy one, and a pair's score does not depend on its batch. An empty sentence is scored too."""
        forced = forced_ids(self.tokenizer, translations, len(sentences), self.max_source_length, "translation")
        decode = dataclasses.replace(decode, beam_size=1, nbest=1, sampling=False, max_len_a=0.0, max_len_b=0)
        found = self._search_ids(sentences, list(range(len(sentences))), decode, progress, forced,
                                 [[] for _ in sentences], desc="scoring")
        return [(best.log_prob, len(best.tokens) + 1) for best, *_ in found]

    def constraint_ids(self, constraints: Sequence[Sequence[str]] | None, sentences: int) -> list[list[list[int]]]:
        """The target ids of each sentence's constraint phrases (empty phrases dropped), checked as `forced_ids`."""
        if constraints is None:
            return [[] for _ in range(sentences)]
        if len(constraints) != sentences:
            raise InputError(f"{len(constraints)} constraint lists for {sentences} sentences: give one per sentence")
        return [[ids for ids in forced_ids(self.tokenizer, phrases, len(phrases), self.max_source_length,
                                           f"sentence {number}: constraint") if ids]
                for number, phrases in enumerate(constraints, start=1)]

    @torch.no_grad()
    def search_batch(self, src: Tensor, decode: DecodeConfig, use_cache: bool = True,
                     prefixes: list[list[int]] | None = None,
                     constraints: list[list[list[int]]] | None = None) -> list[list[Hypothesis]]:
        """Sampling, greedy (beam_size 1) or beam search over one batch of source ids (B, S), in this
        translator's precision, each row starting its translation with its ``prefixes`` entry and containing
        its ``constraints`` phrases; ``use_cache=False`` recomputes every prefix (the benchmark).

        A translation must not depend on its batch: beside sentences with constraints, one without gets
        beam search's hypotheses (`beam_search` gives it them), but at beam 1 it must get greedy search's,
        which a one-beam beam search is not once the length penalty is above 0: at beam 1, the sentences
        without constraints are searched apart."""
        constrained = [i for i, phrases in enumerate(constraints or []) if phrases]
        if decode.beam_size == 1 and 0 < len(constrained) < len(src):
            found = {}
            for rows in (constrained, [i for i, phrases in enumerate(constraints) if not phrases]):
                found.update(zip(rows, self.search_batch(src[rows], decode, use_cache,
                                                         prefixes and [prefixes[i] for i in rows],
                                                         [constraints[i] for i in rows])))
            return [found[i] for i in range(len(src))]
        src = src.to(self.device)
        with autocast(self.device, self.precision):  # thread-local, like no_grad: set in the worker
            if decode.sampling and not constrained:
                return self.sample(src, decode, prefixes)
            if decode.beam_size == 1 and not constrained:
                return [[h] for h in greedy_search(self.model, src, decode, use_cache, self.steps, prefixes)]
            return beam_search(self.model, src, decode, use_cache, self.steps, prefixes, constraints)

    def sample(self, src: Tensor, decode: DecodeConfig, prefixes: list[list[int]] | None) -> list[list[Hypothesis]]:
        """``decode.nbest`` samples of each sentence of src (B, S), in the order they were drawn."""
        n = decode.nbest
        sources = [[token for token in row if token != self.tokenizer.pad_id] for row in src.tolist()]
        sampler = Sampler(decode, sample_seeds(decode.seed, sources, n))
        rows = [p for p in prefixes for _ in range(n)] if prefixes is not None else None
        found = greedy_search(self.model, src.repeat_interleave(n, dim=0), decode, True, self.steps, rows, sampler)
        return [found[i: i + n] for i in range(0, len(found), n)]

    @torch.no_grad()
    def attention(self, sentence: str, tgt_lang: str | None = None, **overrides: Any) -> AttentionMap:
        """Translate one sentence (into ``tgt_lang``: a multilingual model's needs one, or a tag, as `translate`)
        and return its encoder-decoder attention for plotting."""
        if not isinstance(sentence, str):
            raise InputError(f"sentence: give one string, not {type(sentence).__name__}")
        if "nbest" in overrides:
            raise InputError("nbest: the attention is that of the one best translation; leave nbest out")
        (sentence,) = self.model_inputs(sentence_list([sentence]), tgt_lang)
        (src_ids,) = self._encode([sentence])
        (best,) = self.search([sentence], self.settings(**overrides, nbest=1))
        src = torch.tensor([src_ids], device=self.device)
        tgt_in = torch.tensor([[self.tokenizer.bos_id] + best[0].tokens + [self.tokenizer.eos_id]],
                              device=self.device)
        src_mask = padding_mask(src, self.tokenizer.pad_id)
        _, weights = self.model.decode_with_attention(tgt_in[:, :-1], self.model.encode(src, src_mask), src_mask)
        return AttentionMap(self.tokenizer.src_pieces(src_ids), self.tokenizer.tgt_pieces(tgt_in[0, 1:].tolist()),
                            torch.stack([w[0] for w in weights]).float().cpu())

    @torch.no_grad()
    def align(self, sentences: list[str], translations: list[str], layer: int | None = None,
              batch_size: int = 64, tgt_lang: str | None = None) -> list[list[tuple[int, int]]]:
        """Word alignments (source word, target word) of each sentence with its translation (into ``tgt_lang``, as
        `translate`), from the cross-attention of decoder ``layer`` (default: the last), mean over heads,
        teacher-forced (`transformer.decoding.alignment`)."""
        sentences, translations = sentence_pairs(sentences, translations)
        sentences = self.model_inputs(sentences, tgt_lang)  # a multilingual model's: led by their tag
        self.check_attention_choice(layer, None)
        if batch_size < 1:
            raise InputError(f"batch_size must be >= 1, got {batch_size}")
        tok, found = self.tokenizer, []
        for start in range(0, len(sentences), batch_size):
            src_ids = self._encode(sentences[start: start + batch_size])
            tgt_ids = encode(tok, translations[start: start + batch_size], target=True)
            src = pad_sequences(src_ids, tok.pad_id).to(self.device)
            tgt_in = pad_sequences([[tok.bos_id, *ids] for ids in tgt_ids], tok.pad_id).to(self.device)
            src_mask = padding_mask(src, tok.pad_id)
            with autocast(self.device, self.precision):
                _, weights = self.model.decode_with_attention(tgt_in, self.model.encode(src, src_mask), src_mask)
            mean = weights[-1 if layer is None else layer].float().mean(dim=1).cpu()  # (B, T, S)
            # row t is the step that emits target token t; the eos row and column are left out
            for i, (source, target) in enumerate(zip(src_ids, tgt_ids)):
                pieces = tok.src_pieces(source[:-1])
                tag = tag_pieces(pieces)  # a multilingual model's target-language tag is no word of the source
                found.append(word_alignment(pieces[tag:], tok.tgt_pieces(target),
                                            mean[i, : len(target), tag: len(source) - 1]))
        return found
