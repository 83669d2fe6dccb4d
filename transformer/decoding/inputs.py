"""What the search is given besides the model: source ids cut to the model's length, and target ids that
translations must start with (prefixes) or contain (constraint phrases), encoded as the model's own outputs.

Both engines (`transformer.decoding.translator`, `transformer.deploy.ctranslate2`) encode their inputs here.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformer.data.files import normalize
from transformer.data.tokenizer import Tokenizer
from transformer.errors import InputError

SOURCE_LENGTH_MULTIPLE = 16
"""A sentence is padded to its length rounded up to a multiple of this, and batched only with sentences of that
width (`transformer.data.batching.eval_batches`), so that its batch cannot change its translation.

torch's CPU attention sums a row's keys in an order that depends on the padded length (in vectors of 16, then
the rest one by one; in other blocks past about 192 positions): a sentence padded to another length in another
batch got other scores in their last bits (fp32: 92 of 150 Multi30k validation sentences, none of their words),
and in bf16 other words too (7 of 150; de→en demo model, Zen 5). Its own width, whatever its batch, gives the same
bits alone and beside any sentences, with one thread per batch (tests/test_translate.py): with more, torch splits
some sums across threads by the batch's size (fp32: 26 of 60 beam scores in their last bits, no word). Cost,
against mixed-width batches: 2-4 % (300 test2016 sentences, beam 4, one thread, fp32 and bf16, best and median
of 6 alternating rounds in one process; Zen 5).
"""


def encode(tokenizer: Tokenizer, texts: Sequence[str], target: bool = False) -> list[list[int]]:
    """Ids of ``texts`` normalised as the corpus was for training (`normalize`: NFC, no surrounding whitespace):
    a space before or after a sentence, a prefix or a phrase would be a lone "▁" piece the model never saw, and
    would change its translation (" a b c" runs to the length limit repeating one word)."""
    normalized = [normalize(text) for text in texts]
    return tokenizer.encode_tgt(normalized) if target else tokenizer.encode_src(normalized)


def source_ids(tokenizer: Tokenizer, sentences: list[str], max_length: int) -> list[list[int]]:
    """Source ids ending with eos, cut to ``max_length`` tokens (eos included), as the model reads them."""
    return [ids[: max_length - 1] + [tokenizer.eos_id] for ids in encode(tokenizer, sentences)]


def too_long(tokenizer: Tokenizer, sentences: list[str], max_length: int) -> list[int]:
    """Positions of the sentences that `source_ids` cuts."""
    lengths = [len(ids) + 1 for ids in encode(tokenizer, sentences)]  # + eos
    return [i for i, length in enumerate(lengths) if length > max_length]


def forced_ids(tokenizer: Tokenizer, texts: Sequence[str] | None, sentences: int, max_length: int,
               what: str) -> list[list[int]]:
    """Target ids of the texts to force into the translations of ``sentences`` sentences, one each (prefixes),
    encoded as the model's own outputs (`encode`); none: empty ones, and blank ones. A wrong count, or one longer
    than ``max_length`` tokens, is a one-line InputError naming ``what`` and its position."""
    if texts is None:
        return [[] for _ in range(sentences)]
    if len(texts) != sentences:
        raise InputError(f"{len(texts)} {what}es for {sentences} sentences: give one per sentence")
    ids = encode(tokenizer, texts, target=True) if texts else []
    for position, tokens in enumerate(ids):
        if len(tokens) > max_length:
            raise InputError(f"{what} {position + 1} has {len(tokens)} tokens; at most {max_length} "
                             f"(data.max_length) can be forced")
        tag = next((token for token in tokens if token in tokenizer.tag_ids), None)
        if tag is not None:  # it would be forced into the translation, and printed as the text's first word
            raise InputError(f"{what} {position + 1} holds {tokenizer.tgt_pieces([tag])[0]}, a language tag: a tag "
                             f"leads the source, not its translation; give the target language as tgt_lang "
                             f"(--tgt-lang)")
    return ids
