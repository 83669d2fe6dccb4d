"""Word alignments from the cross-attention, as Moses ``i-j`` pairs (source word i, target word j).

The model attends from each target subword to the source subwords (§3.2.3). Averaged over the
heads of one decoder layer, that is a soft alignment of subwords; words are the runs of
SentencePiece pieces that start with "▁". A target word's attention is the mean of its pieces'
rows, a source word's share of it the sum of its pieces' columns, and each target word is aligned
to the source word it attends to most (as fairseq's and Marian's attention-based alignments).
The sentences' eos tokens are left out: they are no word.
"""

from __future__ import annotations

import torch
from torch import Tensor

WORD_START = "\u2581"  # SentencePiece's mark of a piece that begins a word


def word_index(pieces: list[str]) -> list[int]:
    """The word each piece belongs to, words being those ``str.split`` finds in the text, as Moses pairs count
    them: a piece after a space ("▁") begins a new word (the first always does). A piece that is only
    spaces (a double space, a space before or after the text) is no word: it was counted as one, and every
    word after it was numbered one too high. It gets the next word's index (the last's at the end; -1: none)."""
    words, index, space = [], -1, True
    for piece in pieces:
        content = piece.lstrip(WORD_START)
        space = space or len(content) < len(piece)
        if content and space:
            index, space = index + 1, False
        words.append(index if content else index + 1)
    return [min(word, index) for word in words]


def word_alignment(source_pieces: list[str], target_pieces: list[str], weights: Tensor) -> list[tuple[int, int]]:
    """Pairs (source word, target word), sorted, one per target word: the source word it attends to most.

    ``weights`` (T, S) is the attention of each target piece over the source pieces, eos excluded.
    """
    source_words, target_words = word_index(source_pieces), word_index(target_pieces)
    if not source_words or not target_words or min(source_words[-1], target_words[-1]) < 0:  # no words
        return []
    to_source = torch.zeros(len(source_pieces), source_words[-1] + 1)  # (S, source words): sums the columns
    to_source[torch.arange(len(source_pieces)), source_words] = 1.0
    to_target = torch.zeros(target_words[-1] + 1, len(target_pieces))  # (target words, T): averages the rows
    to_target[target_words, torch.arange(len(target_pieces))] = 1.0
    to_target /= to_target.sum(dim=1, keepdim=True)
    words = to_target @ weights.float() @ to_source  # (target words, source words)
    return sorted((int(source), target) for target, source in enumerate(words.argmax(dim=1).tolist()))


def moses_format(pairs: list[tuple[int, int]]) -> str:
    """``0-0 1-2 2-1``: Moses' (and fast_align's, Marian's) notation of an alignment."""
    return " ".join(f"{source}-{target}" for source, target in pairs)
