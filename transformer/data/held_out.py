"""Validation and test pairs held out of training when they are cut from the training split (`splits.SplitSlice`:
``train[:1000]`` to validate on, ``train[1000:]`` to train on): a validation split sharing pairs with what training
reads is refused (checkpoints would be chosen on pairs the model learnt), a test split warned of (its scores would
be of them), each naming slices that keep them apart."""

from __future__ import annotations

import logging

from transformer.config import DataConfig
from transformer.data.splits import SplitSlice, held_out_slices, split_aliases
from transformer.errors import DataError

logger = logging.getLogger(__name__)


def cut_from_training(cfg: DataConfig, split: str) -> bool:
    """Whether ``split`` and the training split are slices of one split (either may be the whole of it)."""
    train, held = SplitSlice.parse(cfg.train_split), SplitSlice.parse(split)
    return held.name in split_aliases(train.name) and (held.sliced or train.sliced)


_ANY_LENGTH = 2 ** 62  # the length of a split whose slices count from its start: any length gives the same rows


def check_shared_pairs(cfg: DataConfig, split: str, count: int | None) -> None:
    """Refuse a validation split that shares pairs with the training split it is cut from (or cut out of): checkpoints
    would be chosen on pairs the model learnt; warn of such a test split, whose scores would be of them (training
    never reads it, and a scored run must stay scorable). ``count``: the pairs of the split they are cut from; None
    for a stream's, whose slices count from its start."""
    train, held = SplitSlice.parse(cfg.train_split), SplitSlice.parse(split)
    setting = "data.valid_split" if split == cfg.valid_split else "data.test_split" if split == cfg.test_split else ""
    if not setting or held == train or not cut_from_training(cfg, split):
        return  # the same pairs for both is a choice (to overfit on purpose), not a slice gone wrong
    if count is None and not train.counts_from_start:
        return  # a training stream refuses such a slice itself
    trained = train.rows(count or _ANY_LENGTH)[:cfg.max_train_samples]
    rows = held.rows(count or _ANY_LENGTH)
    shared = range(max(trained.start, rows.start), min(trained.stop, rows.stop))
    if not shared:
        return
    amount = (f"{len(shared):,} of the {count:,} pairs" if count is not None else
              f"{len(shared):,} pair" + "s" * (len(shared) > 1) if shared.stop < _ANY_LENGTH else
              f"every pair from pair {shared.start:,} on")
    problem = (f"{setting} {split!r} shares {amount} of {held.name!r} with data.train_split {cfg.train_split!r}: "
               f"{_hold_out(train, held, setting)}")
    if setting == "data.test_split":
        logger.warning("%s; its scores are of pairs the model trained on", problem)
        return
    raise DataError(problem)


def _hold_out(train: SplitSlice, held: SplitSlice, setting: str) -> str:
    """How to keep a held-out split and the training split apart, in settings where a slice at one end says it:
    the held-out split, or else (a validation split's) the training split."""
    name, end = held.name, lambda bound: bound is not None
    if end(train.stop) != end(train.start):  # training reads one end of the split: hold out the other
        left = f"{name}[{train.stop}:]" if train.stop else f"{name}[:{train.start}]"
        return f"hold out the pairs training leaves ({setting}='{left}')"
    if setting == "data.valid_split" and held.sliced and end(held.stop) != end(held.start):
        rest = f"{name}[{held.stop}:]" if held.stop else f"{name}[:{held.start}]"
        return f"train on the rest (data.train_split='{rest}')"
    return f"cut slices that do not overlap, such as {held_out_slices(name)}"
