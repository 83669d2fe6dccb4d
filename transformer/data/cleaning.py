"""Training pairs as the model reads them: encoded to ids with their lengths, and cleaned of empty, over-long
and length-ratio outlier pairs, in memory (`clean_training_pairs`, an Arrow dataset cached by data and
tokenizer) or as a stream for corpora larger than RAM (`stream_training_pairs`). Validation and test splits
are encoded (`encode_dataset`) but never cleaned: every line of those must be translated.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import datasets
import numpy as np
from datasets import Dataset, Features, IterableDataset, Value
from datasets.distributed import split_dataset_by_node

from transformer.config import DataConfig
from transformer.data.loading import TEXT_FEATURES, cache_key, stream_split, writing_cache
from transformer.data.splits import SplitSlice

if TYPE_CHECKING:
    from transformer.data.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

ENCODED_FEATURES = Features({**TEXT_FEATURES, "src_ids": datasets.List(Value("int32")),
                             "tgt_ids": datasets.List(Value("int32")), "src_len": Value("int32"),
                             "tgt_len": Value("int32")})


def _encode(batch: dict[str, list[str]], tokenizer: Tokenizer) -> dict[str, list]:
    """Ids and their lengths for a batch of pairs; the lengths make batching and cleaning cheap."""
    src, tgt = tokenizer.encode_src(batch["src"]), tokenizer.encode_tgt(batch["tgt"])
    return {"src_ids": src, "tgt_ids": tgt, "src_len": [len(x) for x in src], "tgt_len": [len(y) for y in tgt]}


def encode_dataset(dataset: Dataset, tokenizer: Tokenizer, cache_dir: str | Path | None = None) -> Dataset:
    """Add "src_ids"/"tgt_ids" (no specials) and their lengths, cached as Arrow keyed by data + tokenizer.

    With ``cache_dir`` the result is written there and memory-mapped, and a later call with the same
    data and tokenizer files loads it instead of encoding again.
    """
    # datasets' own fingerprint of the data (file stats for local corpora) + the tokenizer files' hash
    fingerprint = cache_key("encode", dataset._fingerprint, tokenizer.fingerprint)
    cache_file = None
    if cache_dir is not None:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        cache_file = str(Path(cache_dir) / f"encoded-{fingerprint}.arrow")
    with writing_cache(cache_dir):
        return dataset.map(_encode, batched=True, batch_size=10_000, fn_kwargs={"tokenizer": tokenizer},
                           features=ENCODED_FEATURES, cache_file_name=cache_file, new_fingerprint=fingerprint,
                           desc="Encoding")


def _drop_reasons(src_len: np.ndarray, tgt_len: np.ndarray, cfg: DataConfig) -> dict[str, np.ndarray]:
    """Masks of training pairs to drop, each pair counted under its first reason."""
    empty = (src_len == 0) | (tgt_len == 0)
    too_long = ~empty & ((src_len > cfg.max_length) | (tgt_len > cfg.max_length))
    ratio = ~empty & ~too_long & (np.maximum(src_len, tgt_len) > cfg.max_length_ratio * np.minimum(src_len, tgt_len))
    return {"empty": empty, "too_long": too_long, "length_ratio": ratio}


def clean_training_pairs(dataset: Dataset, cfg: DataConfig, tokenizer: Tokenizer, cache_dir: str | Path | None = None,
                         say: bool = True) -> tuple[Dataset, dict[str, int]]:
    """Encode the training split and drop empty, over-long and length-ratio outlier pairs; log the counts (``say``:
    once, by rank 0 of a torchrun job).

    Returns the encoded, cleaned dataset (columns of `encode_dataset`) and the counts. Never use it
    on validation or test splits: every line of those must be translated.
    """
    encoded = encode_dataset(dataset, tokenizer, cache_dir)
    lengths = encoded.with_format("arrow", columns=["src_len", "tgt_len"])[:]
    reasons = _drop_reasons(lengths["src_len"].to_numpy(), lengths["tgt_len"].to_numpy(), cfg)
    keep = ~np.logical_or.reduce(list(reasons.values()))
    counts = {"pairs": len(encoded), **{name: int(mask.sum()) for name, mask in reasons.items()},
              "kept": int(keep.sum())}
    if say:
        logger.info("training pairs: kept %d of %d; dropped %d empty, %d longer than %d tokens, %d with length "
                    "ratio above %g", counts["kept"], counts["pairs"], counts["empty"], counts["too_long"],
                    cfg.max_length, counts["length_ratio"], cfg.max_length_ratio)
    if counts["kept"] < len(encoded):
        encoded = encoded.select(np.flatnonzero(keep))
    return encoded, counts


def _keep_batch(batch: dict[str, list], cfg: DataConfig) -> list[bool]:
    """Which pairs of an encoded batch pass the cleaning of `clean_training_pairs` (for streams)."""
    reasons = _drop_reasons(np.asarray(batch["src_len"]), np.asarray(batch["tgt_len"]), cfg)
    return (~np.logical_or.reduce(list(reasons.values()))).tolist()


def stream_training_pairs(cfg: DataConfig, tokenizer: Tokenizer, seed: int, rank: int = 0,
                          world_size: int = 1) -> IterableDataset:
    """The training split as a stream, for corpora larger than RAM: shuffled, sharded, encoded, cleaned.

    Examples are shuffled in a buffer of ``cfg.shuffle_buffer`` pairs (call ``set_epoch(epoch)`` for a
    new order each epoch, which also reorders the shards), and every rank reads only its own shards
    (`split_dataset_by_node`, the same seed on every rank) when their number is a multiple of
    ``world_size``: files of a local corpus (``train-00000-of-00008.de.gz`` ...) or a hub dataset's
    parquet files. With fewer shards every rank reads the whole stream and keeps 1 pair in
    ``world_size`` (a warning says so); with ``cfg.max_train_samples`` or a slice of the split, every rank
    reads the stream's first N pairs (or the slice) and keeps 1 in ``world_size``, so that the ranks share the
    pairs a single process trains on. Pairs are encoded and cleaned as they are read. Feed the result to
    `batching.stream_batches`. Ranks can differ by a batch at the end of an epoch: stop by steps.
    """
    stream = stream_split(cfg, cfg.train_split)
    if cfg.max_train_samples is not None or SplitSlice.parse(cfg.train_split).sliced:  # as one process reads them
        if cfg.max_train_samples is not None:  # the stream's (or its slice's) first N pairs
            stream = stream.take(cfg.max_train_samples)
        stream = stream.shuffle(seed=seed, buffer_size=cfg.shuffle_buffer)
        if world_size > 1:  # each rank keeps 1 of them in world_size: its own shards held other pairs than those
            if rank == 0:
                given = [f"data.train_split={cfg.train_split}"] if SplitSlice.parse(cfg.train_split).sliced else []
                given += [f"data.max_train_samples={cfg.max_train_samples}"] * (cfg.max_train_samples is not None)
                logger.warning("%s: every rank reads the pairs %s select%s and keeps 1 in %d, instead of reading "
                               "shards of its own", cfg.dataset, " and ".join(given), "s" * (len(given) == 1),
                               world_size)
            stream = stream.filter(lambda _, index: index % world_size == rank, with_indices=True)
    else:
        if world_size > 1 and stream.num_shards % world_size and rank == 0:  # said once, not once a rank
            logger.warning("%s has %d shard(s), not a multiple of %d ranks: every rank reads all of it and keeps 1 "
                           "pair in %d; split the training files into shards to read less", cfg.dataset,
                           stream.num_shards, world_size, world_size)
        stream = split_dataset_by_node(stream.shuffle(seed=seed, buffer_size=cfg.shuffle_buffer), rank=rank,
                                       world_size=world_size)
    stream = stream.map(_encode, batched=True, fn_kwargs={"tokenizer": tokenizer}, features=ENCODED_FEATURES)
    return stream.filter(_keep_batch, batched=True, fn_kwargs={"cfg": cfg})
