"""How long a translation may grow: the one output-length limit of every search and every engine.

A sentence may emit int(a * source_length + b) tokens of its own before eos (``decode.max_len_a``,
``decode.max_len_b``, as fairseq's), where source_length counts its source ids, eos included, and
never padding, so the batching never changes a translation. Tokens the search is made to emit come
on top: a target prefix's, which start the translation, and the constraint phrases' (`constraints`),
which it must contain. At the limit eos is forced.
"""

from __future__ import annotations

from collections.abc import Sequence, Sized

from transformer.config import DecodeConfig


def length_limits(source_lengths: Sequence[int], decode: DecodeConfig, prefixes: Sequence[Sized] | None = None,
                  constraints: Sequence[Sequence[Sized]] | None = None) -> list[int]:
    """Per sentence, the most tokens its output may have, eos not counted: int(a * source_length + b),
    plus its prefix's tokens, plus its constraint phrases' tokens.

    ``source_lengths``: each source's ids, eos included; ``prefixes``: per sentence its target prefix
    (any sized sequence: ids or pieces); ``constraints``: per sentence its phrases; None: none at all.
    a * n + b is computed in float64, as Python's ``int(a * n + b)`` (float32 makes 1.3 * 90 116).
    """
    prefixes = prefixes if prefixes is not None else [()] * len(source_lengths)
    constraints = constraints if constraints is not None else [()] * len(source_lengths)
    return [int(decode.max_len_a * length + decode.max_len_b) + len(prefix) + sum(map(len, phrases))
            for length, prefix, phrases in zip(source_lengths, prefixes, constraints, strict=True)]
