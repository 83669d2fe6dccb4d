"""Word alignments from the cross-attention, as Moses ``i-j`` pairs (source word i, target word j).

The model attends from each target subword to the source subwords (§3.2.3). Averaged over the
heads of one decoder layer, that is a soft alignment of subwords; words are those ``str.split``
finds, each a run of pieces from one after a space ("▁", or a space kept inside a piece or as a
byte) to the next. A target word's attention is the mean of its pieces'
rows, a source word's share of it the sum of its pieces' columns, and each target word is aligned
to the source word it attends to most (as fairseq's and Marian's attention-based alignments).
The sentences' eos tokens are left out: they are no word.
"""

from __future__ import annotations

import re

import torch
from torch import Tensor

WORD_START = "\u2581"  # SentencePiece's mark of a piece that begins a word
BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # a byte of a character the vocabulary lacks (byte fallback)


def _piece_texts(pieces: list[str]) -> list[str | None]:
    """The text of each piece: a byte piece of SentencePiece's byte fallback (``<0x09>``, a character the vocabulary
    lacks) as the character it completes, None while the character's next bytes are still to come."""
    texts, pending = [], b""
    for piece in pieces:
        byte = BYTE_PIECE.fullmatch(piece)
        if byte is None:
            texts.append(piece)
            pending = b""
            continue
        pending += bytes([int(byte.group(1), 16)])
        try:
            texts.append(pending.decode("utf-8"))
            pending = b""
        except UnicodeDecodeError:
            texts.append(None)
    return texts


def word_index(pieces: list[str]) -> list[int]:
    """The word each piece belongs to, words being those ``str.split`` finds in the text, as Moses pairs count
    them: a character after a space ("▁", or a space SentencePiece keeps inside a piece or as a byte, such as the
    no-break space French puts before "!" or a tab) begins a new word (the first always does), and a piece belongs
    to the word of its first character that is no space. A piece that is only spaces (a double space, a tab) is no
    word (counted as one, it would number every word after it one too high): it gets the next word's index (the
    last's at the end; -1: no words)."""
    words: list[int] = []
    index, space, waiting = -1, True, []  # waiting: the pieces of a character its next bytes complete
    for text in _piece_texts(pieces):
        if text is None:
            waiting.append(len(words))
            words.append(-1)
            continue
        first = None
        for char in text:
            if char == WORD_START or char.isspace():
                space = True
                continue
            if space:
                index, space = index + 1, False
            first = index if first is None else first
        word = index + 1 if first is None else first
        for position in waiting:
            words[position] = word
        words.append(word)
        waiting = []
    return [min(word, index) if word >= 0 else index for word in words]  # -1: a character cut short at the end


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
