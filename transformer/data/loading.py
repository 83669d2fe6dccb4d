"""Parallel corpora -> (src, tgt) text pairs through HuggingFace `datasets` (`cleaning` encodes and cleans them).

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

Split names are resolved through `splits.SPLIT_ALIASES`, so one config reads the local Multi30k (val,
test2016) and the hub's copy (validation, test). A split may be a slice of one, as `datasets` writes it
(`splits.SplitSlice`: ``train[:-1000]`` to train on and ``train[-1000:]`` to validate on, which is how a corpus
of one file holds pairs out); a validation slice that shares pairs with the training split is refused.

Normalisation is conservative and the same for every split: Unicode NFC and no surrounding
whitespace. Nothing is lowercased, and whitespace inside a sentence (double spaces, tabs, no-break
spaces) is kept: the tokenizer reproduces it exactly. Only the training split is cleaned
(`cleaning.clean_training_pairs`); validation and test keep every line, so every test line gets a
translation, even an empty one.
"""

from __future__ import annotations

import errno
import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import datasets
from datasets import Dataset, Features, IterableDataset, Value
from datasets.exceptions import DatasetGenerationError

from transformer.config import DataConfig
from transformer.data.corpus import is_local, reads_own_files, source_paths
from transformer.data.files import local_source, normalize
from transformer.data.held_out import check_shared_pairs, cut_from_training
from transformer.data.languages import directions_split
from transformer.data.splits import SplitSlice, resolve_split
from transformer.errors import DataError, first_line

TEXT_FEATURES = Features({"src": Value("string"), "tgt": Value("string")})
READER_VERSION = "1"  # bump when reading or normalising changes, to invalidate cached corpora
CACHE_WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)  # a full disk, a quota, a read-only file system


def cache_key(*parts: Any) -> str:
    """A short stable hash of JSON-able parts, for cache keys."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


@contextmanager
def writing_cache(cache_dir: str | Path | None) -> Iterator[None]:
    """A full disk, a quota or a read-only file system while the corpus is written into its cache: one line
    naming the cache and data.cache_dir, not datasets' traceback (or a bare "No space left on device")."""
    try:
        yield
    except (OSError, DatasetGenerationError) as error:
        cause = error.__cause__ if isinstance(error, DatasetGenerationError) else error
        if not isinstance(cause, OSError) or cause.errno not in CACHE_WRITE_ERRNOS:
            raise
        where = cache_dir if cache_dir is not None else "datasets' cache (HF_DATASETS_CACHE)"
        raise DataError(f"cannot write the corpus's cache into {where} ({cause.strerror}): free space there, or "
                        f"set data.cache_dir to a folder with room") from None


def _load_local(cfg: DataConfig, split: str, cache_dir: str | None) -> Dataset:
    """Read a local split once into memory-mapped Arrow; later runs reuse it while the files are unchanged."""
    reader, kwargs = local_source(cfg, split)
    paths = source_paths(kwargs)
    stats = [(path, Path(path).stat().st_size, Path(path).stat().st_mtime_ns) for path in paths]
    fingerprint = cache_key(READER_VERSION, reader.__name__, kwargs, stats)
    try:  # into the cache: `load_split` says where it cannot be written
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

class HubError(DataError):
    """A hub dataset, or a name taken for one, that cannot be loaded; ``reason``: why, without the advice."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def _hub_error(cfg: DataConfig, error: Exception) -> HubError:
    """One line for a hub dataset that cannot be loaded, saying what to do about it."""
    local = Path(cfg.dataset).expanduser()
    kind = "dataset folder" if local.exists() else "hub dataset"
    name = f"{kind} {cfg.dataset!r}" + (f" (config {cfg.dataset_config!r})" if cfg.dataset_config else "")
    reason = first_line(error)
    if "scripts are no longer supported" in reason:
        return HubError(f"{name} is script-based, which datasets {datasets.__version__} no longer runs: use a "
                        f"parquet or JSON copy of it on the hub, or download its files and set data.dataset to "
                        f"their local folder", "script-based")
    advice = ": go online, or set data.dataset to a local copy" if isinstance(error, ConnectionError) else ""
    if "/" in cfg.dataset and not local.exists():  # written like a path too: say that it is not one
        return HubError(f"dataset {cfg.dataset!r} is no local directory or file (no {local.resolve()}) and "
                        f"cannot be loaded from the hub ({reason}{advice})", reason)
    return HubError(f"cannot load {name}: {reason}{advice}", reason)


def _load_hub(cfg: DataConfig, split: str, streaming: bool, cache_dir: str | None) -> Dataset | IterableDataset:
    """A split of a hub dataset (or a local folder laid out like one), its name resolved through
    `SPLIT_ALIASES`; failures (offline, script-based, unknown name or split) become one-line DataErrors."""
    try:
        splits = datasets.load_dataset(cfg.dataset, cfg.dataset_config, cache_dir=cache_dir, streaming=streaming)
    except (OSError, ValueError, RuntimeError) as error:
        if isinstance(error, OSError) and error.errno in CACHE_WRITE_ERRNOS:  # the download's cache: `writing_cache`
            raise
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
        load_split(cfg, cfg.valid_split, cache_dir, say=False)  # checks every direction's; cached for the run


def load_split(cfg: DataConfig, split: str, cache_dir: str | Path | None = None, say: bool = True) -> Dataset:
    """The (src, tgt) text pairs of ``split`` in corpus order; only the training split is ever shortened; ``say``
    a multilingual split's pairs of each direction (not where the split is read once more: the tokenizer's).

    The Arrow copy of a local corpus (and a hub download) goes to ``cache_dir``, else
    ``cfg.cache_dir``, else the HuggingFace default cache (``$HF_DATASETS_CACHE``, under ``~``).
    With ``cfg.streaming`` only this split's pairs are read (of a slice: those up to its end), as a stream, and
    kept in memory (for validation and test splits, which are small), not the whole corpus.
    """
    cache = str(cache_dir) if cache_dir is not None else cfg.cache_dir
    if cfg.pairs:  # a multilingual model's: every direction, each source led by its target language's tag
        with writing_cache(cache):  # the tags are written into it
            return directions_split(cfg, split, lambda pair: load_split(pair, split, cache_dir), say)
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
        with writing_cache(cache):
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
