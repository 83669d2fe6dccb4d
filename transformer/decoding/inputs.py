"""What the search is given besides the model: source ids cut to the model's length, and target ids that
translations must start with (prefixes) or contain (constraint phrases), encoded as the model's own outputs.

Both engines (`transformer.decoding.translator`, `transformer.deploy.ctranslate2`) encode their inputs here.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformer.data.textio import InputError
from transformer.data.tokenizer import Tokenizer


def source_ids(tokenizer: Tokenizer, sentences: list[str], max_length: int) -> list[list[int]]:
    """Source ids ending with eos, cut to ``max_length`` tokens (eos included), as the model reads them."""
    return [ids[: max_length - 1] + [tokenizer.eos_id] for ids in tokenizer.encode_src(sentences)]


def too_long(tokenizer: Tokenizer, sentences: list[str], max_length: int) -> list[int]:
    """Positions of the sentences that `source_ids` cuts."""
    lengths = [len(ids) + 1 for ids in tokenizer.encode_src(sentences)]  # + eos
    return [i for i, length in enumerate(lengths) if length > max_length]


def forced_ids(tokenizer: Tokenizer, texts: Sequence[str] | None, sentences: int, max_length: int,
               what: str) -> list[list[int]]:
    """Target ids of the texts to force into the translations of ``sentences`` sentences, one each (prefixes),
    encoded as the model's own outputs; none: empty ones, and blank ones (whose spaces the tokenizer would
    keep as tokens to force). A wrong count, or one longer than ``max_length`` tokens, is a one-line
    InputError naming ``what`` and its position."""
    if texts is None:
        return [[] for _ in range(sentences)]
    if len(texts) != sentences:
        raise InputError(f"{len(texts)} {what}es for {sentences} sentences: give one per sentence")
    ids = tokenizer.encode_tgt([text if text.strip() else "" for text in texts]) if texts else []
    for position, tokens in enumerate(ids):
        if len(tokens) > max_length:
            raise InputError(f"{what} {position + 1} has {len(tokens)} tokens; at most {max_length} "
                             f"(data.max_length) can be forced")
    return ids
