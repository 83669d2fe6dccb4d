"""Parallel corpora -> (src, tgt) text pairs through HuggingFace `datasets`; cleaning and encoding.

``data.dataset`` names one of:

- a local directory of line-aligned files per split and language, ``{split}.{lang}`` or
  ``{split}.{lang}.gz`` (e.g. ``../shared/data/multi30k`` with splits train, val, test2016), or a
  split cut into shards ``{split}-00000-of-00008.{lang}.gz``, ... (each torchrun rank streams its own);
- a local ``{split}.tsv`` whose first line names the language of each column (``de<TAB>en``), or
  ``{split}.jsonl`` with one object per line, ``{"de": ..., "en": ...}`` or
  ``{"translation": {"de": ..., "en": ...}}``; in such a directory, or one such file (the train split only);
- a HuggingFace hub dataset (with ``data.dataset_config``) that has a ``translation`` column, such
  as ``wmt/wmt14`` (config ``de-en``), or one column per language, such as ``bentrevett/multi30k``;
  or a local folder laid out like a hub repository (parquet files), loaded the same way.

Split names are resolved through `files.SPLIT_ALIASES`, so one config reads the local Multi30k (val,
test2016) and the hub's copy (validation, test). A split may be a slice of one, as `datasets` writes it
(`files.SplitSlice`: ``train[:-1000]`` to train on and ``train[-1000:]`` to validate on, which is how a corpus
of one file holds pairs out); a validation slice that shares pairs with the training split is refused.

Normalisation is conservative and the same for every split: Unicode NFC and no surrounding
whitespace. Nothing is lowercased, and whitespace inside a sentence (double spaces, tabs, no-break
spaces) is kept: the tokenizer reproduces it exactly. Only the training split is cleaned
(`clean_training_pairs`); validation and test keep every line, so every test line gets a
translation, even an empty one.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import datasets
import numpy as np
from datasets import Dataset, Features, IterableDataset, Value
from datasets.distributed import split_dataset_by_node
from datasets.exceptions import DatasetGenerationError

from transformer.config import DataConfig
from transformer.data.corpus import is_local, reads_own_files, source_paths
from transformer.data.files import DataError, SplitSlice, local_source, normalize, resolve_split
from transformer.data.held_out import check_shared_pairs, cut_from_training
from transformer.data.languages import directions_split
from transformer.data.textio import first_line

if TYPE_CHECKING:
    from transformer.data.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

TEXT_FEATURES = Features({"src": Value("string"), "tgt": Value("string")})
ENCODED_FEATURES = Features({**TEXT_FEATURES, "src_ids": datasets.List(Value("int32")),
                             "tgt_ids": datasets.List(Value("int32")), "src_len": Value("int32"),
                             "tgt_len": Value("int32")})
READER_VERSION = "1"  # bump when reading or normalising changes, to invalidate cached corpora


def _fingerprint(*parts: Any) -> str:
    """A short stable hash of JSON-able parts, for cache keys."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _load_local(cfg: DataConfig, split: str, cache_dir: str | None) -> Dataset:
    """Read a local split once into memory-mapped Arrow; later runs reuse it while the files are unchanged."""
    reader, kwargs = local_source(cfg, split)
    paths = source_paths(kwargs)
    stats = [(path, Path(path).stat().st_size, Path(path).stat().st_mtime_ns) for path in paths]
    fingerprint = _fingerprint(READER_VERSION, reader.__name__, kwargs, stats)
    try:
        return Dataset.from_generator(reader, features=TEXT_FEATURES, gen_kwargs=kwargs, cache_dir=cache_dir,
                                      fingerprint=fingerprint)
    except DatasetGenerationError as error:
        if isinstance(error.__cause__, DataError):
            raise error.__cause__ from None
        raise
    except ValueError as error:  # datasets: 'Instruction "train" corresponds to no data!'
        if "corresponds to no data" not in str(error):
            raise
        raise DataError(f"{', '.join(paths)}: split {split!r} has no pairs") from None


def _local_stream(cfg: DataConfig, split: str) -> IterableDataset:
    """A local split as a stream with one shard per file (pair), so that ranks can read disjoint files."""
    reader, kwargs = local_source(cfg, split)
    return IterableDataset.from_generator(reader, features=TEXT_FEATURES, gen_kwargs=kwargs)


# -- hub datasets ------------------------------------------------------------------------------

def _hub_error(cfg: DataConfig, error: Exception) -> DataError:
    """One line for a hub dataset that cannot be loaded, saying what to do about it."""
    local = Path(cfg.dataset).expanduser()
    kind = "dataset folder" if local.exists() else "hub dataset"
    name = f"{kind} {cfg.dataset!r}" + (f" (config {cfg.dataset_config!r})" if cfg.dataset_config else "")
    reason = first_line(error)
    if "scripts are no longer supported" in reason:
        return DataError(f"{name} is script-based, which datasets {datasets.__version__} no longer runs: use a "
                         f"parquet or JSON copy of it on the hub, or download its files and set data.dataset to "
                         f"their local folder")
    if isinstance(error, ConnectionError):
        reason += ": go online, or set data.dataset to a local copy"
    if "/" in cfg.dataset and not local.exists():  # written like a path too: say that it is not one
        return DataError(f"dataset {cfg.dataset!r} is no local directory or file (no {local.resolve()}) and "
                         f"cannot be loaded from the hub ({reason})")
    return DataError(f"cannot load {name}: {reason}")


def _load_hub(cfg: DataConfig, split: str, streaming: bool, cache_dir: str | None) -> Dataset | IterableDataset:
    """A split of a hub dataset (or a local folder laid out like one), its name resolved through
    `SPLIT_ALIASES`; failures (offline, script-based, unknown name or split) become one-line DataErrors."""
    try:
        splits = datasets.load_dataset(cfg.dataset, cfg.dataset_config, cache_dir=cache_dir, streaming=streaming)
    except (OSError, ValueError, RuntimeError) as error:
        raise _hub_error(cfg, error) from error
    return splits[resolve_split(SplitSlice.parse(split).name, list(splits), cfg.dataset)]


def hub_unreachable(name: str) -> str | None:
    """Why the hub dataset ``name`` cannot be read now (offline, no network), or None when it can."""
    if is_local(name):
        return None if Path(name).expanduser().exists() else f"{name} not found"
    from huggingface_hub import HfApi

    try:
        HfApi().dataset_info(name, timeout=10)
    except Exception as error:  # noqa: BLE001 - any failure means the demo cannot start from the hub
        return first_line(error)
    return None


def _hub_pairs(batch: dict[str, list], src_lang: str, tgt_lang: str) -> dict[str, list[str]]:
    """Normalised src/tgt of a batch in either hub layout; a missing text (None) becomes ""."""
    rows = batch["translation"] if "translation" in batch else [
        {src_lang: x, tgt_lang: y} for x, y in zip(batch[src_lang], batch[tgt_lang])]
    return {"src": [normalize(row[src_lang] or "") for row in rows],
            "tgt": [normalize(row[tgt_lang] or "") for row in rows]}


def select_pair(dataset: Dataset | IterableDataset, src_lang: str, tgt_lang: str,
                where: str) -> Dataset | IterableDataset:
    """Normalised "src"/"tgt" columns from a ``translation`` dict column or one column per language."""
    columns = dataset.column_names or []
    if "translation" in columns:
        feature = dataset.features["translation"]
        languages = list(getattr(feature, "languages", None) or (feature if isinstance(feature, dict) else []))
        for lang in (src_lang, tgt_lang):
            if languages and lang not in languages:
                raise DataError(f"{where}: unknown language code {lang!r}: the translation column has "
                                f"{', '.join(languages)}")
    elif columns:
        for lang in (src_lang, tgt_lang):
            if lang not in columns:
                raise DataError(f"{where}: missing column {lang!r}: no 'translation' column and no column per "
                                f"language (columns: {', '.join(columns)})")
    pairs = dataset.map(_hub_pairs, batched=True, fn_kwargs={"src_lang": src_lang, "tgt_lang": tgt_lang},
                        remove_columns=columns or None)
    return pairs if columns else pairs.select_columns(["src", "tgt"])  # a stream may not list its columns


def stream_split(cfg: DataConfig, split: str) -> IterableDataset:
    """The (src, tgt) pairs of ``split`` as a stream: nothing is read before it is iterated. A stream's length is
    not known before its end, so its slice must count from its start (``train[1000:]``, ``train[:1000]``)."""
    part = SplitSlice.parse(split)
    if not part.counts_from_start:
        raise DataError(f"{cfg.dataset}: split {split!r} of a stream (data.streaming=true) must count its pairs from "
                        f"the start, such as {part.name}[:1000] and {part.name}[1000:]: its length is not known "
                        f"before its end")
    if reads_own_files(cfg):
        stream = _local_stream(cfg, split)
    else:
        stream = select_pair(_load_hub(cfg, split, True, cfg.cache_dir), cfg.src_lang, cfg.tgt_lang,
                             f"{cfg.dataset}:{split}")
    start = int(part.start or 0)
    stream = stream.skip(start) if start else stream
    return stream.take(max(int(part.stop) - start, 0)) if part.stop else stream


def check_held_out(cfg: DataConfig, cache_dir: str | Path | None = None) -> None:
    """Refuse a validation split sharing pairs with the training split (`held_out.check_shared_pairs`) before the run
    starts: before the tokenizer is trained on that training split, which the corrected command would find in its
    run directory and refuse."""
    if not cut_from_training(cfg, cfg.valid_split):
        return  # another split: nothing to read for this check
    if cfg.streaming:
        stream_split(cfg, cfg.valid_split)  # a slice not counted from the start is refused; nothing is read
        check_shared_pairs(cfg, cfg.valid_split, None)
    else:
        load_split(cfg, cfg.valid_split, cache_dir)  # checks every direction's; the split is cached for the run


def load_split(cfg: DataConfig, split: str, cache_dir: str | Path | None = None) -> Dataset:
    """The (src, tgt) text pairs of ``split`` in corpus order; only the training split is ever shortened.

    The Arrow copy of a local corpus (and a hub download) goes to ``cache_dir``, else
    ``cfg.cache_dir``, else the HuggingFace default cache (``$HF_DATASETS_CACHE``, under ``~``).
    With ``cfg.streaming`` only this split's pairs are read (of a slice: those up to its end), as a stream, and
    kept in memory (for validation and test splits, which are small), not the whole corpus.
    """
    if cfg.pairs:  # a multilingual model's: every direction, each source led by its target language's tag
        return directions_split(cfg, split, lambda pair: load_split(pair, split, cache_dir))
    cache = str(cache_dir) if cache_dir is not None else cfg.cache_dir
    part = SplitSlice.parse(split)
    if cfg.streaming:
        stream = stream_split(cfg, split)
        check_shared_pairs(cfg, split, None)
        rows = list(stream)
        if not rows:  # else datasets' "Keys mismatch" of an empty list
            raise DataError(f"{cfg.dataset}: split {split!r} " + (f"selects none of the pairs of {part.name!r}"
                                                                  if part.sliced else "has no pairs"))
        dataset = Dataset.from_list(rows, features=TEXT_FEATURES)
    else:
        dataset = (_load_local(cfg, split, cache) if reads_own_files(cfg) else
                   select_pair(_load_hub(cfg, split, False, cache), cfg.src_lang, cfg.tgt_lang,
                               f"{cfg.dataset}:{split}"))
        check_shared_pairs(cfg, split, len(dataset))
        if part.sliced:
            rows = part.rows(len(dataset))
            if not rows:
                raise DataError(f"{cfg.dataset}: split {split!r} selects none of the {len(dataset):,} pairs of "
                                f"{part.name!r}")
            dataset = dataset.select(rows)
    if split == cfg.train_split and cfg.max_train_samples is not None:
        dataset = dataset.select(range(min(cfg.max_train_samples, len(dataset))))
    return dataset


# -- encoding and cleaning ---------------------------------------------------------------------

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
    fingerprint = _fingerprint("encode", dataset._fingerprint, tokenizer.fingerprint)
    cache_file = None
    if cache_dir is not None:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        cache_file = str(Path(cache_dir) / f"encoded-{fingerprint}.arrow")
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


# -- streaming ---------------------------------------------------------------------------------

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
        if world_size > 1 and stream.num_shards % world_size:
            logger.warning("%s has %d shard(s), not a multiple of %d ranks: every rank reads all of it and keeps 1 "
                           "pair in %d; split the training files into shards to read less", cfg.dataset,
                           stream.num_shards, world_size, world_size)
        stream = split_dataset_by_node(stream.shuffle(seed=seed, buffer_size=cfg.shuffle_buffer), rank=rank,
                                       world_size=world_size)
    stream = stream.map(_encode, batched=True, fn_kwargs={"tokenizer": tokenizer}, features=ENCODED_FEATURES)
    return stream.filter(_keep_batch, batched=True, fn_kwargs={"cfg": cfg})
