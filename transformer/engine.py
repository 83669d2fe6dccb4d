"""What translates: one interface for the torch `Translator` (a checkpoint or release folder) and the exported
folders' `CTranslate2Translator` and `OnnxTranslator`, so that the commands and the service ask no engine
what it is. What an engine cannot do it says in its capability flags, checked before any work, and its
method refuses with a one-line error.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

from torch import Tensor

from transformer.checkpoint import CheckpointError
from transformer.config import DataConfig, DecodeConfig, ModelConfig
from transformer.config_loading import decode_with_overrides
from transformer.data.languages import tag_sources
from transformer.data.tokenizer import Tokenizer
from transformer.decoding.inputs import too_long
from transformer.decoding.search import normalized_score
from transformer.errors import InputError


@dataclasses.dataclass
class AttentionMap:
    """Encoder-decoder attention of one translation: weights (layers, heads, target, source)."""

    source_pieces: list[str]
    target_pieces: list[str]
    weights: Tensor


class Engine(ABC):
    """Text in, text out with a model's tokenizer and decoding settings; subclasses search (`translate_nbest`)."""

    name: ClassVar[str]  # what --engine calls it
    supports_attention: ClassVar[bool] = False  # `attention`: cross-attention weights for a heatmap
    supports_attention_choice: ClassVar[bool] = True  # those of any decoder layer and head, not one mean alone
    supports_alignment: ClassVar[bool] = False  # `align`: word alignments from the cross-attention
    supports_constraints: ClassVar[bool] = True  # lexically constrained search (translate's ``constraints``)
    supports_sampling: ClassVar[bool] = True  # decode.sampling, reproducible with decode.seed

    tokenizer: Tokenizer
    decode: DecodeConfig
    data: DataConfig | None
    max_source_length: int
    precision: str
    training_data: str | None = None  # the corpus as the training run named it (a checkpoint's record), if known

    @property
    @abstractmethod
    def model_config(self) -> ModelConfig:
        """The model's settings (an ensemble's first member's)."""

    @abstractmethod
    def search_nbest(self, sources: list[str], progress: bool = False, prefixes: Sequence[str] | None = None,
                     constraints: Sequence[Sequence[str]] | None = None,
                     **overrides: Any) -> list[list[tuple[str, float]]]:
        """`translate_nbest` of sources as the model reads them (`model_inputs`)."""

    def translate_nbest(self, sentences: list[str], progress: bool = False, prefixes: Sequence[str] | None = None,
                        constraints: Sequence[Sequence[str]] | None = None, tgt_lang: str | None = None,
                        **overrides: Any) -> list[list[tuple[str, float]]]:
        """The ``nbest`` best translations (or samples) of each sentence into ``tgt_lang`` (a multilingual
        model's target language) with their GNMT-normalised scores, best first; each starts with its prefix
        and holds its constraints. An empty sentence gives its prefix."""
        sentences = sentence_list(sentences)
        prefixes, constraints = prefix_and_constraint_lists(prefixes, constraints)
        return self.search_nbest(self.model_inputs(sentences, tgt_lang), progress, prefixes, constraints, **overrides)

    def translate(self, sentences: list[str], progress: bool = False, prefixes: Sequence[str] | None = None,
                  constraints: Sequence[Sequence[str]] | None = None, tgt_lang: str | None = None,
                  **overrides: Any) -> list[str]:
        """Detokenized best translation of each sentence; an empty sentence gives an empty line (or its prefix).

        Per sentence, ``prefixes`` give the start its translation must have ("" for none), ``constraints``
        the phrases it must contain (none: []); ``tgt_lang`` is the language a multilingual model translates into.
        """
        found = self.translate_nbest(sentences, progress, prefixes, constraints, tgt_lang, **overrides)
        return [hypotheses[0][0] for hypotheses in found]

    def score(self, sentences: list[str], translations: list[str], tgt_lang: str | None = None,
              progress: bool = False, **overrides: Any) -> list[float]:
        """Forced decoding: the score the model gives each given translation of each sentence (into ``tgt_lang``, as
        `translate`), as `translate_nbest` scores its own: log P(translation + eos | sentence) over the GNMT length
        penalty of ``decode.length_penalty`` (0: the log-probability itself); higher is likelier. The search's other
        settings play no part. An empty sentence is scored too (`translate` gives it an empty translation)."""
        sentences, translations = sentence_pairs(sentences, translations)
        decode = self.settings(**overrides)
        found = self.forced_log_probs(self.model_inputs(sentences, tgt_lang), translations, decode, progress)
        return [normalized_score(log_prob, length, decode.length_penalty) for log_prob, length in found]

    @abstractmethod
    def forced_log_probs(self, sentences: list[str], translations: list[str], decode: DecodeConfig,
                         progress: bool = False) -> list[tuple[float, int]]:
        """log P(translation + eos | sentence) of each pair, and the tokens it counts (eos included), for sentences
        as the model reads them (`model_inputs`); ``decode`` holds the batch size."""

    def model_inputs(self, sentences: Sequence[str], tgt_lang: str | None = None,
                     names: Sequence[str] | None = None) -> list[str]:
        """The sentences as the model reads them: a multilingual model's lead with the tag of ``tgt_lang``
        (`transformer.data.languages`); a language the model does not translate into is a one-line error, which
        names a sentence by its ``names`` (default "sentence N")."""
        if self.data is None:  # a model handed over without its data settings (validation during training)
            if tgt_lang is not None:
                raise InputError(f"target language {tgt_lang!r}: this translator has no language settings")
            return list(sentences)
        return tag_sources(sentences, self.data, tgt_lang, names)

    def settings(self, **overrides: Any) -> DecodeConfig:
        """The decoding settings with ``overrides`` of `DecodeConfig` fields, checked."""
        return decode_with_overrides(self.decode, **overrides)

    def data_config(self, dataset: str | None = None) -> DataConfig:
        """The training data settings, optionally pointing at another corpus."""
        if self.data is None:
            raise CheckpointError("this translator was not loaded from a checkpoint or folder; no data settings")
        return dataclasses.replace(self.data, dataset=dataset) if dataset else self.data

    def too_long(self, sentences: list[str], tgt_lang: str | None = None) -> list[int]:
        """Positions of the sentences whose source is cut to ``max_source_length`` tokens to be translated."""
        sentences = sentence_list(sentences)
        return too_long(self.tokenizer, self.model_inputs(sentences, tgt_lang), self.max_source_length)

    def attention_size(self) -> tuple[int, int]:
        """(layers, heads) of the weights `attention` returns."""
        return self.model_config.n_decoder_layers, self.model_config.n_heads

    def check_attention_choice(self, layer: int | None, head: int | None,
                               names: tuple[str, str] = ("layer", "head")) -> None:
        """A one-line error naming ``layer`` or ``head`` (0-based, negative from the end) where the model's attention
        has no such decoder layer or head; ``names`` are what the caller calls them (a command's flags)."""
        check_attention_choice(layer, head, *self.attention_size(), names)

    def attention(self, sentence: str, tgt_lang: str | None = None, **overrides: Any) -> AttentionMap:
        """Translate one sentence (into ``tgt_lang``, as `translate`) and return its encoder-decoder attention for
        plotting."""
        raise InputError(f"the {self.name} engine gives no attention weights")

    def align(self, sentences: list[str], translations: list[str], layer: int | None = None,
              batch_size: int = 64, tgt_lang: str | None = None) -> list[list[tuple[int, int]]]:
        """Word alignments (source word, target word) of each sentence with its translation (into ``tgt_lang``)."""
        raise InputError(f"the {self.name} engine gives no word alignments (the torch engine does)")


def check_attention_choice(layer: int | None, head: int | None, layers: int, heads: int,
                           names: tuple[str, str] = ("layer", "head")) -> None:
    """A one-line error unless ``layer`` and ``head`` (None: not chosen) index attention of ``layers`` decoder layers
    and ``heads`` heads, as a Python index would (negative from the end)."""
    for name, value, count, what in ((names[0], layer, layers, "decoder layers"), (names[1], head, heads, "heads")):
        if value is not None and not -count <= value < count:
            raise InputError(f"{name} {value}: the model's attention has {count} {what} (0 to {count - 1})")


def sentence_list(sentences: Iterable[str], what: str = "sentences", each: str = "sentence") -> list[str]:
    """``sentences`` as a list, or a one-line error unless they are strings that UTF-8 can encode: one string would be
    translated character by character, a lone surrogate (from a badly decoded file) would be a tokenizer's TypeError.
    Any other iterable is taken: a tuple, a generator, a numpy array or a pandas Series of strings."""
    if isinstance(sentences, (str, bytes)):
        raise InputError(f"{what}: give a list of strings, not one {type(sentences).__name__} ({sentences[:30]!r})")
    if isinstance(sentences, Mapping) or not isinstance(sentences, Iterable):
        raise InputError(f"{what}: give a list of strings, not {type(sentences).__name__}")
    sentences = list(sentences)
    for number, sentence in enumerate(sentences, start=1):
        if not isinstance(sentence, str):
            raise InputError(f"{each} {number}: a string, not {type(sentence).__name__}")
        try:
            sentence.encode("utf-8")
        except UnicodeEncodeError as error:
            raise InputError(f"{each} {number}: character {error.start + 1} is a lone surrogate "
                             f"({sentence[error.start]!r}), no Unicode character") from None
    return sentences


def sentence_pairs(sentences: Iterable[str], translations: Iterable[str]) -> tuple[list[str], list[str]]:
    """Sentences and a translation of each (`score`, `align`), as `sentence_list`s of one length."""
    sentences, translations = sentence_list(sentences), sentence_list(translations, "translations", "translation")
    if len(sentences) != len(translations):
        raise InputError(f"{len(translations)} translations for {len(sentences)} sentences: give one each")
    return sentences, translations


def prefix_and_constraint_lists(prefixes: Iterable[str] | None, constraints: Iterable[Iterable[str]] | None
                                ) -> tuple[list[str] | None, list[list[str]] | None]:
    """``prefixes`` as a list of strings and ``constraints`` as a list of lists of strings (`sentence_list`), or a
    one-line error: a string given for either would be read character by character (constraints=["dog"]: the
    phrases d, o and g)."""
    if prefixes is not None:
        prefixes = sentence_list(prefixes, "prefixes", "prefix")
    if constraints is None:
        return prefixes, None
    if isinstance(constraints, (str, bytes, Mapping)) or not isinstance(constraints, Iterable):
        raise InputError(f"constraints: give a list with a list of phrases per sentence, not {constraints!r}")
    lists = []
    for number, phrases in enumerate(constraints, start=1):
        if isinstance(phrases, (str, bytes)):
            raise InputError(f"constraints {number}: give a list of phrases for the sentence, not one string "
                             f"({phrases[:30]!r}), which would be read letter by letter")
        lists.append(sentence_list(phrases, f"constraints {number}", f"constraints {number}: phrase"))
    return prefixes, lists
