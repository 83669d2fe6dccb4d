"""Multilingual models (Johnson et al., 2017): one model, several directions, a target-language tag.

Each source sentence starts with the tag of the language to translate into, ``<2fr> A man ...``; the
tags are pieces of their own in the joint SentencePiece vocabulary (user-defined symbols), so the
encoder sees the tag as one token, after SentencePiece's word start "▁" (`tag_pieces`). Since the tag is part
of the source text, every engine (PyTorch, CTranslate2, ONNX) and every cache of encoded text carries it without
knowing about it.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from transformer.config import DataConfig
from transformer.errors import InputError

if TYPE_CHECKING:  # imported where a split is read: translating needs no datasets, which takes 0.8 s to import
    from datasets import Dataset

log = logging.getLogger(__name__)
TAG_PIECE = re.compile(r"<2[^>\s]+>")  # a `target_tag`
LEADING_TAG = re.compile(TAG_PIECE.pattern + r"(?= |$)")  # what a sentence that leads with a `target_tag` starts with


def target_tag(lang: str) -> str:
    """The source prefix that asks for a translation into ``lang``."""
    return f"<2{lang}>"


def directions(cfg: DataConfig) -> list[tuple[str, str]]:
    """The (source, target) language pairs a model of ``cfg`` translates: ``data.pairs``, or its one pair."""
    return [tuple(pair.split("-")) for pair in cfg.pairs] if cfg.pairs else [(cfg.src_lang, cfg.tgt_lang)]


def direction_names(cfg: DataConfig) -> list[str]:
    """The directions a model of ``cfg`` translates, as a user reads them: "de→en"."""
    return [f"{source}→{target}" for source, target in directions(cfg)]


def target_languages(cfg: DataConfig) -> list[str]:
    """The languages a model of ``cfg`` translates into, in the order of ``data.pairs``."""
    return list(dict.fromkeys(target for _, target in directions(cfg)))


def tags(cfg: DataConfig) -> list[str]:
    """The target-language tags of a multilingual ``cfg`` (none for a bilingual one)."""
    return [target_tag(lang) for lang in target_languages(cfg)] if cfg.pairs else []


def one_direction(cfg: DataConfig, src_lang: str | None, tgt_lang: str | None) -> DataConfig:
    """The data settings that read the pairs of one direction (default: ``data.src_lang``-``data.tgt_lang``): any
    language the model has seen into one of its target languages (a direction it never saw is zero-shot)."""
    source, target = src_lang or cfg.src_lang, tgt_lang or cfg.tgt_lang
    if not cfg.pairs and (source, target) != (cfg.src_lang, cfg.tgt_lang):
        raise InputError(f"{source}→{target}: this model translates {cfg.src_lang}→{cfg.tgt_lang} only")
    seen = {lang for pair in directions(cfg) for lang in pair}
    if source not in seen or target not in target_languages(cfg):
        raise InputError(f"{source}→{target}: this model translates from {', '.join(sorted(seen))} into "
                         f"{', '.join(target_languages(cfg))}")
    if source == target:  # say, a source language given alone, which the default target language is
        raise InputError(f"{source}→{target}: the source and target language are the same; give both languages "
                         f"of a direction (this model translates from {', '.join(sorted(seen))} into "
                         f"{', '.join(target_languages(cfg))})")
    return dataclasses.replace(cfg, src_lang=source, tgt_lang=target, pairs=[])


def tag_sources(sentences: Sequence[str], cfg: DataConfig, tgt_lang: str | None,
                names: Sequence[str] | None = None) -> list[str]:
    """The sentences as the model reads them when asked to translate into ``tgt_lang``.

    A multilingual model needs the target language and gets its tag (sentences that all lead with a tag
    already are left as they are; one that translates into one language alone needs none); a bilingual one
    translates into its own target language only (``tgt_lang`` None or that language). Any other is a one-line
    InputError naming the sentence by its ``names`` (default "sentence N"), such as "input.txt line 3".
    """
    languages = target_languages(cfg)
    if tgt_lang is not None and tgt_lang not in languages:
        raise InputError(f"target language {tgt_lang!r}: this model translates into {', '.join(languages)} only")
    if not cfg.pairs:
        return list(sentences)
    known = tags(cfg)
    leads = [leading_tag(sentence, known) for sentence in sentences]
    for number, lead in enumerate(leads, start=1):
        name = names[number - 1] if names else f"sentence {number}"
        if tgt_lang is not None and lead:
            raise InputError(f"{name} leads with the tag {lead}, and target language {tgt_lang!r} "
                             f"is asked for as well: give one of them")
        if tgt_lang is None and lead and lead not in known:
            raise InputError(f"{name} leads with {lead}, the tag of no language this model "
                             f"translates into ({', '.join(languages)})")
    if tgt_lang is None:
        untagged = next((number for number, (sentence, lead) in enumerate(zip(sentences, leads), start=1)
                         if sentence.strip() and not lead), None)
        if untagged is None or len(languages) == 1:  # every sentence leads with a known tag (as checked), or the
            # model translates into one language (a multilingual parent fine-tuned on one pair): an untagged one gets it
            return [_as_tagged(sentence, lead) if lead else with_tag([sentence], target_tag(languages[0]))[0]
                    for sentence, lead in zip(sentences, leads)]
        name = names[untagged - 1] if names else f"sentence {untagged}"  # in a long file, which line
        raise InputError(f"{name} has no target-language tag: this multilingual model translates into "
                         f"{', '.join(languages)}: say which (--tgt-lang, tgt_lang), or lead each sentence with its "
                         f"tag ({target_tag(languages[0])} ...)")
    return with_tag(sentences, target_tag(tgt_lang))


def leading_tag(sentence: str, known: Sequence[str]) -> str | None:
    """The tag ``sentence`` leads with, after any spaces: a ``<2xx>`` followed by a space or the end, or one of the
    model's own tags ``known`` followed by anything, since SentencePiece cuts those out of any text ("<2fr>Bonjour"
    reads as tagged: with a target language as well, the model would get two tags)."""
    text = sentence.lstrip()
    lead = LEADING_TAG.match(text)
    return lead.group() if lead else next((tag for tag in known if text.startswith(tag)), None)


def _as_tagged(sentence: str, tag: str) -> str:
    """A sentence that leads with ``tag`` as `with_tag` writes it: "tag text" (spaces before the tag, or none after
    it, changed the model's input); a tag alone (`sed 's/^/<2fr> /'` on a blank line) has nothing to translate:
    blank, as `with_tag` leaves a blank line, not a tag the model would translate into invented words."""
    rest = sentence.lstrip()[len(tag):].removeprefix(" ")
    return f"{tag} {rest.strip()}" if rest.strip() else ""


def with_tag(sentences: Sequence[str], tag: str) -> list[str]:
    """Each sentence led by ``tag``; an empty one stays empty (its translation is empty, and training drops it)."""
    return [f"{tag} {sentence.strip()}" if sentence.strip() else sentence for sentence in sentences]


def tag_pieces(pieces: Sequence[str]) -> int:
    """How many leading pieces of an encoded source are its target-language tag: SentencePiece's word start
    "▁" and the tag, or none (word alignments leave them out: they are no word of the user's sentence)."""
    is_tag = [piece.startswith("<2") and piece.endswith(">") for piece in pieces[:2]]
    return 2 if is_tag == [False, True] and pieces[0] == "▁" else 1 if is_tag[:1] == [True] else 0


def direction_configs(cfg: DataConfig) -> list[DataConfig]:
    """The data settings of each direction a model of ``cfg`` translates, each read as a bilingual corpus."""
    return [dataclasses.replace(cfg, src_lang=source, tgt_lang=target, pairs=[]) for source, target in directions(cfg)]


def directions_split(cfg: DataConfig, split: str, read: Callable[[DataConfig], Dataset], say: bool = True) -> Dataset:
    """A multilingual split: the pairs of every direction of ``data.pairs`` (each read by ``read`` from the
    settings of that direction alone), each source led by its target language's tag, taken in turns (the first
    pair of each direction, then the second of each...), so that the first N pairs (``train.valid_max_sentences``)
    cover every direction alike. Training batches draw from the whole mix: each direction's share of a batch is
    its share of the pairs. ``say``: log how many pairs each direction has."""
    parts = [read(pair).map(_tag_batch, batched=True, fn_kwargs={"tag": target_tag(pair.tgt_lang)},
                            desc=f"Tagging {pair.src_lang}-{pair.tgt_lang}")
             for pair in direction_configs(cfg)]
    if say:
        log.info("%s: %s", split, ", ".join(f"{pair} {len(part)} pairs" for pair, part in zip(cfg.pairs, parts)))
    starts = np.cumsum([0] + [len(part) for part in parts])
    turns = [start + i for i in range(max(map(len, parts))) for start, part in zip(starts, parts) if i < len(part)]
    import datasets

    return datasets.concatenate_datasets(parts).select(turns)


def _tag_batch(batch: dict[str, list[str]], tag: str) -> dict[str, list[str]]:
    return {"src": with_tag(batch["src"], tag), "tgt": batch["tgt"]}
