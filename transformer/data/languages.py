"""Multilingual models (Johnson et al., 2017): one model, several directions, a target-language tag.

Each source sentence starts with the tag of the language to translate into, ``<2fr> A man ...``; the
tags are pieces of their own in the joint SentencePiece vocabulary (user-defined symbols), so the
encoder sees exactly one tag token. Since the tag is part of the source text, every engine (PyTorch,
CTranslate2, ONNX) and every cache of encoded text carries it without knowing about it.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformer.config import DataConfig
from transformer.data.textio import InputError


def target_tag(lang: str) -> str:
    """The source prefix that asks for a translation into ``lang``."""
    return f"<2{lang}>"


def directions(cfg: DataConfig) -> list[tuple[str, str]]:
    """The (source, target) language pairs a model of ``cfg`` translates: ``data.pairs``, or its one pair."""
    return [tuple(pair.split("-")) for pair in cfg.pairs] if cfg.pairs else [(cfg.src_lang, cfg.tgt_lang)]


def target_languages(cfg: DataConfig) -> list[str]:
    """The languages a model of ``cfg`` translates into, in the order of ``data.pairs``."""
    return list(dict.fromkeys(target for _, target in directions(cfg)))


def source_languages(cfg: DataConfig) -> list[str]:
    """The languages a model of ``cfg`` translates from, in the order of ``data.pairs``."""
    return list(dict.fromkeys(source for source, _ in directions(cfg)))


def tags(cfg: DataConfig) -> list[str]:
    """The target-language tags of a multilingual ``cfg`` (none for a bilingual one)."""
    return [target_tag(lang) for lang in target_languages(cfg)] if cfg.pairs else []


def tag_sources(sentences: Sequence[str], cfg: DataConfig, tgt_lang: str | None) -> list[str]:
    """The sentences as the model reads them when asked to translate into ``tgt_lang``.

    A multilingual model needs the target language and gets its tag; a bilingual one translates into its
    own target language only (``tgt_lang`` None or that language). Any other is a one-line InputError.
    """
    languages = target_languages(cfg)
    if tgt_lang is not None and tgt_lang not in languages:
        raise InputError(f"target language {tgt_lang!r}: this model translates into {', '.join(languages)} only")
    if not cfg.pairs:
        return list(sentences)
    if tgt_lang is None:
        raise InputError(f"this multilingual model translates into {', '.join(languages)}: say which (--tgt-lang, "
                         f"tgt_lang)")
    return with_tag(sentences, target_tag(tgt_lang))


def with_tag(sentences: Sequence[str], tag: str) -> list[str]:
    """Each sentence led by ``tag``; an empty one stays empty (its translation is empty, and training drops it)."""
    return [f"{tag} {sentence}" if sentence.strip() else sentence for sentence in sentences]
