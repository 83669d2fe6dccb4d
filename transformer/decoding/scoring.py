"""Forced decoding: the log-probabilities a model gives translations that are given, not searched (fairseq's
``--score-reference``, Marian's scorer, CTranslate2's ``score_batch``), for `Engine.score`: to rank a system's
outputs, filter a corpus, or check an export against its model.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from transformer.data.batch import pad_sequences, round_up
from transformer.decoding.inputs import SOURCE_LENGTH_MULTIPLE
from transformer.decoding.search import DecodingModel
from transformer.model.attention import padding_mask


def pair_batches(sources: list[list[int]], outputs: list[list[int]], rows: int) -> list[list[int]]:
    """The positions of the pairs in batches of at most ``rows``, each batch's sources and outputs of one padded width
    (their lengths rounded up to `SOURCE_LENGTH_MULTIPLE`): a pair's scores then do not depend on the pairs beside it,
    as a translation does not depend on its batch."""
    widths = defaultdict(list)
    for i, (source, output) in enumerate(zip(sources, outputs)):
        widths[round_up(len(source), SOURCE_LENGTH_MULTIPLE), round_up(len(output), SOURCE_LENGTH_MULTIPLE)].append(i)
    return [group[start: start + rows] for _, group in sorted(widths.items()) for start in range(0, len(group), rows)]


@torch.no_grad()
def forced_log_probs(model: DecodingModel, sources: list[list[int]], outputs: list[list[int]],
                     device: torch.device | str = "cpu", rows: int = 64) -> list[list[float]]:
    """log P(y_t | y_<t, x) of each token of each output (a translation's ids, then eos) given its source's ids
    (eos included), teacher-forced through ``model`` in batches of at most ``rows`` pairs (`pair_batches`)."""
    found: list[list[float]] = [[] for _ in sources]
    for batch in pair_batches(sources, outputs, rows):
        src = pad_sequences([sources[i] for i in batch], model.pad_id, SOURCE_LENGTH_MULTIPLE).to(device)
        tgt_out = pad_sequences([outputs[i] for i in batch], model.pad_id, SOURCE_LENGTH_MULTIPLE).to(device)
        tgt_in = torch.cat([torch.full_like(tgt_out[:, :1], model.bos_id), tgt_out[:, :-1]], dim=1)
        src_mask = padding_mask(src, model.pad_id)
        scores = model.decode(tgt_in, model.encode(src, src_mask), src_mask, model.new_cache())
        log_probs = scores.log_softmax(dim=-1, dtype=torch.float32).gather(2, tgt_out[..., None])[..., 0].cpu()
        for row, i in enumerate(batch):
            found[i] = log_probs[row, : len(outputs[i])].tolist()
    return found
