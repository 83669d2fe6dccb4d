"""Translating with a CTranslate2 model folder (written by `transformer.deploy.ctranslate2_export`) at
CTranslate2's own speed: its batches, its threads, its beam scores.

Nothing of ours makes it slower than a plain ``translate_batch``: our GNMT score comes from
CTranslate2's beam score, and only the hypotheses it cannot give a score for are scored again with
``score_batch`` (scoring every hypothesis again costs +70 % on test2016 with beam 5); CTranslate2 cuts
the sentences into batches by its own rule, not into our token-budget batches; and ``threads=0`` is the
CPU's cores, not CTranslate2's default of 4 threads whatever the CPU.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from transformer.checkpoint import CheckpointError
from transformer.config import DecodeConfig
from transformer.decoding.inputs import forced_ids, source_ids
from transformer.decoding.limits import length_limits
from transformer.decoding.search import normalized_score
from transformer.deploy.ctranslate2_export import ctranslate2, stored_positions
from transformer.deploy.folder import FolderTranslator
from transformer.engine import AttentionMap, sentence_list
from transformer.errors import InputError, first_line

# sentences per CTranslate2 batch, as the plain translate_batch we compare with: on test2016 (beam 5, int8, 2-core
# Zen 5) 16 to 128 sentences or 2,048 tokens were within 10 % of each other (scripts/benchmarks/engines.py sweeps)
BATCH_SIZE = 64


class CTranslate2Translator(FolderTranslator):
    """Translate and score with a folder of `convert_to_ctranslate2`, like `Translator` does with a checkpoint.

    Our decoding settings map onto CTranslate2's ``translate_batch`` options as follows (its
    documentation: the docstring of ``ctranslate2.Translator.translate_batch`` and the
    ``TranslationOptions`` struct of ``include/ctranslate2/translation.h``):

    - ``beam_size`` -> ``beam_size`` (1 is greedy search in both); ``num_hypotheses`` is the whole beam, whose
      hypotheses are ranked by our score (below) and cut to ``nbest``: CTranslate2's best by its own
      normalisation is not always ours, and the 1-best would otherwise depend on ``nbest``.
    - ``length_penalty``: ours is GNMT's, log P(Y) / ((5 + |Y|) / 6)^alpha with |Y| counting eos;
      CTranslate2's "exponential penalty applied to the length during beam search", normalises
      ``hypothesis_score /= (hypothesis_length ** length_penalty)``. No CTranslate2 setting gives
      GNMT's formula, so the beam searches with CTranslate2's normalisation and the same alpha
      (both are 0 = raw log-probabilities), and our score of each hypothesis it returns is computed
      from its own (`_gnmt_scores`). Greedy search ignores the penalty in both, so it is exactly ours.
    - ``max_len_a``/``max_len_b``: ours allow `length_limits` tokens before eos, per sentence;
      ``translate_batch`` has only absolute limits, ``max_decoding_length`` ("Maximum prediction
      length", default 256) and ``min_decoding_length``, one number per call, and no relative
      limit; so sentences are grouped by their limit and each group is one call, which CTranslate2
      cuts into batches of `BATCH_SIZE` sentences of similar length. (A group holds sentences of one
      source length: no padding, and on the 1,000 sentences of test2016 these calls were no slower
      than one call of all.) At the limit CTranslate2 stops the hypothesis where ours forces eos:
      the tokens are the same (the tests compare greedy outputs that end both ways), only the beam
      score lacks the eos term. ``min_decoding_length`` (default 1: eos may not come first) is set
      to 0: ours allows an empty output.
    - ``max_input_length`` (default 1024: "truncate inputs after this many tokens") is set to 0:
      sources are cut here as `Translator` cuts them, to ``data.max_length`` tokens with eos.
    - End of sentence: CTranslate2 stops on the model's ``eos_token`` (``end_token``), kept in the
      hypothesis (``return_end_token``) to tell it from a stop at the limit; the decoder starts from
      ``decoder_start_token`` = bos, as ours.
    """

    name, supports_attention, supports_constraints, supports_sampling = "ctranslate2", True, False, False
    supports_attention_choice = False  # its last layer's mean over heads alone
    holds = "this CTranslate2 model holds {} target positions"

    def __init__(self, directory: str | Path, device: str = "cpu", compute_type: str = "default",
                 threads: int = 0, workers: int = 1, overrides: Sequence[str] = ()) -> None:
        """``threads`` per batch (CTranslate2's intra_threads; 0: the CPU's cores shared among the workers,
        where CTranslate2's own default is 4 whatever the CPU) and ``workers`` batches at once
        (inter_threads), as `Translator`'s threads and workers; ``overrides`` are decode.key=value."""
        directory = Path(directory)
        super().__init__(directory, "a CTranslate2 model folder", ["model.bin", "config.json"], overrides)
        self.positions = stored_positions(self.cfg)
        self.batch_type, self.batch_size = "examples", BATCH_SIZE  # translate_batch's batch_type, max_batch_size
        threads = threads or max(1, len(os.sched_getaffinity(0)) // workers)
        for path in sorted(directory.glob("*.json")):  # config and vocabularies: CTranslate2's error names no file
            try:
                json.loads(path.read_bytes())
            except ValueError as error:
                raise CheckpointError(f"{path}: not valid JSON ({error})") from None
        try:
            self.translator = ctranslate2.Translator(str(directory), device=device, compute_type=compute_type,
                                                     intra_threads=threads, inter_threads=workers)
        except (RuntimeError, ValueError) as error:  # model.bin truncated ("invalid payload size"), ...
            reason = first_line(error)
            raise CheckpointError(f"{directory}: cannot load this CTranslate2 model ({reason})") from None
        # what it computes in ("int8_float32" for an int8 folder), not what was asked ("default"): for reports and
        # GET /model
        self.precision = self.translator.compute_type
        self._tgt_ids = {piece: i for i, piece in
                         enumerate(self.tokenizer.tgt_pieces(range(self.tokenizer.tgt_vocab_size)))}
        self._eos = self.tokenizer.tgt_pieces([self.tokenizer.eos_id])[0]

    def attention_size(self) -> tuple[int, int]:
        """One layer, one head: the last layer's mean over its heads (the export's ``alignment_heads``)."""
        return 1, 1

    def search_nbest(self, sentences: list[str], progress: bool = False, prefixes: Sequence[str] | None = None,
                     constraints: Sequence[Sequence[str]] | None = None,
                     **overrides: Any) -> list[list[tuple[str, float]]]:
        """The ``nbest`` best translations of each sentence with our GNMT-normalised scores, best first.
        Sentences of one length limit go to CTranslate2 in one asynchronous call (so that its
        inter_threads translate several batches at once), which batches them itself."""
        decode = self.settings(**overrides)
        if decode.sampling:  # its generators are seeded once per thread: the same seed would not give the same samples
            raise InputError("decode.sampling runs on the torch and onnx engines: CTranslate2's samples cannot be "
                             "reproduced with a seed")
        if constraints is not None and any(constraints):
            raise InputError("constraints run on the torch and onnx engines: CTranslate2 has no lexically "
                             "constrained search")
        sources = self._source_pieces(sentences)
        forced = [self.tokenizer.tgt_pieces(ids) for ids in
                  forced_ids(self.tokenizer, prefixes, len(sentences), self.max_source_length, "prefix")]
        limits = length_limits([len(source) + 1 for source in sources], decode, forced)
        groups: dict[int, list[int]] = {}
        for i, sentence in enumerate(sentences):
            if sentence.strip():
                groups.setdefault(limits[i], []).append(i)
        self.check_positions(list(groups))
        pending: list[tuple[int, Any]] = []  # (sentence, its ctranslate2.AsyncTranslationResult)
        for limit, indices in groups.items():
            pending += zip(indices, self._translate_batch(
                [sources[i] for i in indices], decode, limit, target_prefix=[forced[i] or None for i in indices],
                asynchronous=True, return_scores=True, return_end_token=True, batch_type=self.batch_type,
                max_batch_size=self.batch_size))
        results: list[Any] = [None] * len(sentences)
        for i, result in tqdm(pending, disable=not progress, unit="sent", desc="translating", leave=False):
            results[i] = result.result()
        found = self._gnmt_scores(sources, forced, results, decode)
        return [sorted(zip(self._detokenize([tokens for tokens, _ in hypotheses]),
                           [score for _, score in hypotheses]), key=lambda pair: -pair[1])[:decode.nbest]
                for hypotheses in found]

    def attention(self, sentence: str, tgt_lang: str | None = None, **overrides: Any) -> AttentionMap:
        """Translate one sentence (into ``tgt_lang``, as `translate`) and return CTranslate2's attention of it: the
        last decoder layer's cross-attention, mean over its heads (the export's ``alignment_heads``), as weights
        (1, 1, target, source). Unlike `Translator.attention`, the source's eos is not among the columns."""
        decode = self.settings(**overrides, nbest=1)
        (sentence,) = self.model_inputs(sentence_list([sentence]), tgt_lang)
        (source,) = self._source_pieces([sentence])
        (limit,) = length_limits([len(source) + 1], decode)
        self.check_positions([limit])
        (result,) = self._translate_batch([source], decode, limit, return_attention=True, return_end_token=True,
                                          return_scores=True)
        (scored,) = self._gnmt_scores([source], [[]], [result], decode)
        best = max(range(len(scored)), key=lambda k: scored[k][1])  # the hypothesis `translate` gives
        return AttentionMap(source, result.hypotheses[best], torch.tensor([[result.attention[best]]]))

    def _translate_batch(self, sources: list[list[str]], decode: DecodeConfig, limit: int,
                         **options: Any) -> list:
        """``translate_batch`` with our settings mapped as the class says (the whole beam back, for our score to rank),
        and ``options`` of its own."""
        return self.translator.translate_batch(sources, beam_size=decode.beam_size,
                                               num_hypotheses=max(decode.nbest, decode.beam_size),
                                               length_penalty=decode.length_penalty, max_decoding_length=limit,
                                               min_decoding_length=0, max_input_length=0, **options)

    def _gnmt_scores(self, sources: list[list[str]], forced: list[list[str]], results: list[Any],
                     decode: DecodeConfig) -> list[list[tuple[list[str], float]]]:
        """Each sentence's hypotheses without eos, with our `normalized_score`: log P(Y + eos | X) /
        ((5 + |Y| + 1) / 6)^alpha (a sentence not translated: its prefix, scored 0). CTranslate2's score (of
        beam and greedy search) is that log-probability divided by its own normalisation, (|Y| + 1)^alpha
        (``return_end_token``: eos counts); but where the length limit ended a hypothesis its score lacks
        the eos term, and where a prefix was forced it lacks the prefix's terms: those hypotheses are
        scored again, in one ``score_batch`` call."""
        found: list[list[tuple[list[str], float]]] = []
        again: list[tuple[int, int]] = []  # (sentence, hypothesis) to score again
        for i, result in enumerate(results):
            if result is None:
                found.append([(forced[i], 0.0)])
                continue
            found.append([])
            for tokens, score in zip(result.hypotheses, result.scores):
                ended = bool(tokens) and tokens[-1] == self._eos
                tokens = tokens[:-1] if ended else tokens
                found[i].append((tokens, score * (len(tokens) + 1) ** decode.length_penalty))
                if not ended or forced[i]:
                    again.append((i, len(found[i]) - 1))
        scored = self.translator.score_batch([sources[i] for i, _ in again], [found[i][k][0] for i, k in again],
                                             max_input_length=0, max_batch_size=BATCH_SIZE)
        for (i, k), result in zip(again, scored):
            found[i][k] = (found[i][k][0], sum(result.log_probs))
        return [[(tokens, normalized_score(log_prob, len(tokens) + 1, decode.length_penalty))
                 for tokens, log_prob in hypotheses] for hypotheses in found]

    def forced_log_probs(self, sentences: list[str], translations: list[str], decode: DecodeConfig,
                         progress: bool = False) -> list[tuple[float, int]]:
        """CTranslate2's ``score_batch``: log P of each translation's tokens and its eos, teacher-forced in batches
        that CTranslate2 pads (a score may differ from the pair's alone in its last bits: about 1e-6)."""
        pieces = [self.tokenizer.tgt_pieces(ids) for ids in self.translation_ids(translations)]
        found = self.translator.score_batch(self._source_pieces(sentences), pieces, max_input_length=0,
                                            max_batch_size=BATCH_SIZE)
        return [(sum(result.log_probs), len(result.log_probs)) for result in found]

    def _source_pieces(self, sentences: Sequence[str]) -> list[list[str]]:
        """Source pieces cut as `Translator` cuts them, without the eos that CTranslate2 appends."""
        return [self.tokenizer.src_pieces(ids[:-1])
                for ids in source_ids(self.tokenizer, list(sentences), self.max_source_length)]

    def _detokenize(self, hypotheses: list[list[str]]) -> list[str]:
        return self.tokenizer.decode_tgt([[self._tgt_ids[piece] for piece in pieces] for pieces in hypotheses])
