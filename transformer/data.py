"""Parallel corpora -> (src, tgt) text pairs through HuggingFace `datasets`; cleaning and encoding.

``data.dataset`` names one of:

- a local directory of line-aligned files per split and language, ``{split}.{lang}`` or
  ``{split}.{lang}.gz`` (e.g. ``../shared/data/multi30k`` with splits train, val, test2016), or a
  split cut into shards ``{split}-00000-of-00008.{lang}.gz``, ... (each torchrun rank streams its own);
- a local ``{split}.tsv`` whose first line names the language of each column (``de<TAB>en``), or
  ``{split}.jsonl`` with one object per line, ``{"de": ..., "en": ...}`` or
  ``{"translation": {"de": ..., "en": ...}}``; in such a directory, or one file serving every split;
- a HuggingFace hub dataset (with ``data.dataset_config``) that has a ``translation`` column, such
  as ``wmt/wmt14`` (config ``de-en``), or one column per language, such as ``bentrevett/multi30k``;
  or a local folder laid out like a hub repository (parquet files), loaded the same way.

Split names are resolved through `SPLIT_ALIASES`, so one config reads the local Multi30k (val,
test2016) and the hub's copy (validation, test).

Normalisation is conservative and the same for every split: Unicode NFC and no surrounding
whitespace. Nothing is lowercased, and whitespace inside a sentence (double spaces, tabs, no-break
spaces) is kept: the tokenizer reproduces it exactly. Only the training split is cleaned
(`clean_training_pairs`); validation and test keep every line, so every test line gets a
translation, even an empty one.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import unicodedata
import zlib
from collections.abc import Iterator
from itertools import zip_longest
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import datasets
import numpy as np
from datasets import Dataset, Features, IterableDataset, Value
from datasets.distributed import split_dataset_by_node
from datasets.exceptions import DatasetGenerationError

from transformer.config import DataConfig
from transformer.textio import InputError

if TYPE_CHECKING:
    from transformer.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

TEXT_FEATURES = Features({"src": Value("string"), "tgt": Value("string")})
ENCODED_FEATURES = Features({**TEXT_FEATURES, "src_ids": datasets.List(Value("int32")),
                             "tgt_ids": datasets.List(Value("int32")), "src_len": Value("int32"),
                             "tgt_len": Value("int32")})
READER_VERSION = "1"  # bump when reading or normalising changes, to invalidate cached corpora


class DataError(InputError):
    """A corpus cannot be read: missing file or column, misaligned files, invalid UTF-8, unknown language."""


def normalize(text: str) -> str:
    """Unicode NFC without surrounding whitespace: the only change made to corpus text."""
    return unicodedata.normalize("NFC", text).strip()


# -- local files -------------------------------------------------------------------------------

def _lines(path: str) -> Iterator[str]:
    """Lines of a plain or gzip UTF-8 file, split on "\\n" only; errors name the file and line."""
    try:
        with (gzip.open if path.endswith(".gz") else open)(path, "rb") as file:
            for number, raw in enumerate(file, start=1):
                try:
                    yield raw.decode("utf-8-sig" if number == 1 else "utf-8")
                except UnicodeDecodeError as error:
                    raise DataError(f"{path} line {number}: invalid UTF-8 (byte {raw[error.start]:#04x} "
                                    f"at column {error.start + 1})") from None
    except (OSError, EOFError, zlib.error) as error:
        raise DataError(f"cannot read {path}: {getattr(error, 'strerror', None) or error}") from None


def _read_text_pairs(src_paths: list[str], tgt_paths: list[str]) -> Iterator[dict[str, str]]:
    """Pairs from line-aligned file pairs (one per shard); different line counts are an error giving both."""
    for src_path, tgt_path in zip(src_paths, tgt_paths):
        src_lines, tgt_lines = _lines(src_path), _lines(tgt_path)
        for count, (x, y) in enumerate(zip_longest(src_lines, tgt_lines), start=1):
            if x is None or y is None:
                rest = 1 + sum(1 for _ in (src_lines if y is None else tgt_lines))
                n_src, n_tgt = (count - 1 + rest, count - 1) if y is None else (count - 1, count - 1 + rest)
                raise DataError(f"{src_path} has {n_src} lines but {tgt_path} has {n_tgt}: the files of a split "
                                f"must be line-aligned")
            yield {"src": normalize(x), "tgt": normalize(y)}


def _read_tsv(paths: list[str], src_lang: str, tgt_lang: str) -> Iterator[dict[str, str]]:
    """Pairs from TSV files whose header line names the language of each column."""
    for path in paths:
        lines = _lines(path)
        columns = [name.strip() for name in next(lines, "").rstrip("\r\n").split("\t")]
        for lang in (src_lang, tgt_lang):
            if lang not in columns:
                raise DataError(f"{path}: unknown language code {lang!r}: the header line names columns {columns}")
        src, tgt = columns.index(src_lang), columns.index(tgt_lang)
        for number, line in enumerate(lines, start=2):
            fields = line.rstrip("\r\n").split("\t")
            if len(fields) != len(columns):
                raise DataError(f"{path} line {number}: {len(fields)} tab-separated fields, expected "
                                f"{len(columns)} ({', '.join(columns)})")
            yield {"src": normalize(fields[src]), "tgt": normalize(fields[tgt])}


def _read_jsonl(paths: list[str], src_lang: str, tgt_lang: str) -> Iterator[dict[str, str]]:
    """Pairs from JSON lines, each ``{lang: text}`` or ``{"translation": {lang: text}}``."""
    for path in paths:
        for number, line in enumerate(_lines(path), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataError(f"{path} line {number}: invalid JSON ({error.msg})") from None
            pair = record.get("translation", record) if isinstance(record, dict) else None
            if not isinstance(pair, dict):
                raise DataError(f"{path} line {number}: expected an object like "
                                f"{{{src_lang!r}: ..., {tgt_lang!r}: ...}}")
            for lang in (src_lang, tgt_lang):
                if not isinstance(pair.get(lang), str):
                    raise DataError(f"{path} line {number}: no text for language {lang!r} (keys: {sorted(pair)})")
            yield {"src": normalize(pair[src_lang]), "tgt": normalize(pair[tgt_lang])}


# Split names that mean the same split in different layouts (the local Multi30k folder says val and
# test2016, the hub's bentrevett/multi30k validation and test): a split that is not there under the
# name asked for is looked up under the other names of its group.
SPLIT_ALIASES = (("train", "training"), ("validation", "val", "valid", "dev"), ("test", "test2016"))


def resolve_split(split: str, available: list[str], where: str) -> str:
    """The name under which ``split`` exists in ``available``, through `SPLIT_ALIASES`, or a DataError."""
    if split in available:
        return split
    group = next((names for names in SPLIT_ALIASES if split in names), ())
    matches = [name for name in available if name in group]
    if len(matches) == 1:
        logger.info("%s: split %r is called %r here", where, split, matches[0])
        return matches[0]
    raise DataError(f"{where}: unknown split {split!r}; the splits are {', '.join(sorted(available)) or 'none'}")


def _shard_files(root: Path, split: str, suffix: str) -> list[Path]:
    """``{split}{suffix}`` or its shards ``{split}-*{suffix}`` (e.g. ``train-00003-of-00008.de.gz``), gzip or
    not, in name order."""
    whole = [p for p in (root / f"{split}{suffix}", root / f"{split}{suffix}.gz") if p.is_file()]
    patterns = (f"{split}-*{suffix}", f"{split}-*{suffix}.gz")
    return whole[:1] or sorted(p for pattern in patterns for p in root.glob(pattern) if p.is_file())


def _split_of(name: str) -> str:
    """The split a local file belongs to: ``train`` for ``train.de.gz`` and ``train-00001-of-00004.de``."""
    return name.split(".")[0].split("-")[0]


def is_line_corpus(root: Path, cfg: DataConfig) -> bool:
    """Whether a local file or directory is in this toolkit's own layouts (``{split}.{lang}``, ``.tsv``,
    ``.jsonl``) rather than a hub repository's (parquet, csv: read by `datasets.load_dataset`)."""
    own = (cfg.src_lang, cfg.tgt_lang, "tsv", "jsonl")
    return not root.is_dir() or any(p.is_file() and p.name.removesuffix(".gz").rsplit(".", 1)[-1] in own
                                    for p in root.iterdir())


def _local_source(cfg: DataConfig, split: str) -> tuple[Callable[..., Iterator[dict[str, str]]], dict[str, Any]]:
    """The reader and its arguments (lists of files: one per shard) for ``split`` of a local corpus."""
    root = Path(cfg.dataset).expanduser()
    langs = {"src_lang": cfg.src_lang, "tgt_lang": cfg.tgt_lang}
    if root.is_file():
        reader = _read_jsonl if root.name.endswith(".jsonl") else _read_tsv
        return reader, {"paths": [str(root)], **langs}
    if not root.is_dir():
        raise DataError(f"dataset {cfg.dataset} not found (no such file or directory)")
    files = [p.name.removesuffix(".gz") for p in root.iterdir() if p.is_file()]
    split = resolve_split(split, sorted({_split_of(name) for name in files}), str(root))
    texts = [_shard_files(root, split, f".{lang}") for lang in (cfg.src_lang, cfg.tgt_lang)]
    if texts[0] and texts[1]:
        if len(texts[0]) != len(texts[1]):
            raise DataError(f"{root}: split {split!r} has {len(texts[0])} {cfg.src_lang} file(s) but "
                            f"{len(texts[1])} {cfg.tgt_lang} file(s): every shard needs both languages")
        return _read_text_pairs, {"src_paths": list(map(str, texts[0])), "tgt_paths": list(map(str, texts[1]))}
    for suffix, reader in ((".tsv", _read_tsv), (".jsonl", _read_jsonl)):
        if shards := _shard_files(root, split, suffix):
            return reader, {"paths": list(map(str, shards)), **langs}
    split_langs = sorted({name.rsplit(".", 1)[-1] for name in files if _split_of(name) == split})
    lang = cfg.src_lang if not texts[0] else cfg.tgt_lang
    raise DataError(f"unknown language code {lang!r}: {root} has split {split!r} in {', '.join(split_langs)}")


def _fingerprint(*parts: Any) -> str:
    """A short stable hash of JSON-able parts, for cache keys."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _load_local(cfg: DataConfig, split: str, cache_dir: str | None) -> Dataset:
    """Read a local split once into memory-mapped Arrow; later runs reuse it while the files are unchanged."""
    reader, kwargs = _local_source(cfg, split)
    paths = [path for key, value in kwargs.items() if key.endswith("paths") for path in value]
    stats = [(path, Path(path).stat().st_size, Path(path).stat().st_mtime_ns) for path in paths]
    fingerprint = _fingerprint(READER_VERSION, reader.__name__, kwargs, stats)
    try:
        return Dataset.from_generator(reader, features=TEXT_FEATURES, gen_kwargs=kwargs, cache_dir=cache_dir,
                                      fingerprint=fingerprint)
    except DatasetGenerationError as error:
        if isinstance(error.__cause__, DataError):
            raise error.__cause__ from None
        raise


def _local_stream(cfg: DataConfig, split: str) -> IterableDataset:
    """A local split as a stream with one shard per file (pair), so that ranks can read disjoint files."""
    reader, kwargs = _local_source(cfg, split)
    return IterableDataset.from_generator(reader, features=TEXT_FEATURES, gen_kwargs=kwargs)


# -- hub datasets ------------------------------------------------------------------------------

def _is_local(name: str) -> bool:
    """Whether ``data.dataset`` names a local path (existing, or written like a path) or a hub dataset."""
    if not name:
        raise DataError("data.dataset is empty: give a local directory or file, or a HuggingFace hub dataset name")
    return Path(name).expanduser().exists() or name.startswith((".", "/", "~")) or name.endswith(
        (".tsv", ".jsonl", ".gz"))


def _hub_error(cfg: DataConfig, error: Exception) -> DataError:
    """One line for a hub dataset that cannot be loaded, saying what to do about it."""
    local = Path(cfg.dataset).expanduser()
    kind = "dataset folder" if local.exists() else "hub dataset"
    name = f"{kind} {cfg.dataset!r}" + (f" (config {cfg.dataset_config!r})" if cfg.dataset_config else "")
    reason = str(error).splitlines()[0] if str(error) else type(error).__name__
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
    return splits[resolve_split(split, list(splits), cfg.dataset)]


def hub_unreachable(name: str) -> str | None:
    """Why the hub dataset ``name`` cannot be read now (offline, no network), or None when it can."""
    if _is_local(name):
        return None if Path(name).expanduser().exists() else f"{name} not found"
    from huggingface_hub import HfApi

    try:
        HfApi().dataset_info(name, timeout=10)
    except Exception as error:  # noqa: BLE001 - any failure means the demo cannot start from the hub
        return str(error).splitlines()[0] if str(error) else type(error).__name__
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


def _reads_own_files(cfg: DataConfig) -> bool:
    """Whether ``data.dataset`` is read by this module's readers rather than `datasets.load_dataset`."""
    return _is_local(cfg.dataset) and is_line_corpus(Path(cfg.dataset).expanduser(), cfg)


def stream_split(cfg: DataConfig, split: str) -> IterableDataset:
    """The (src, tgt) pairs of ``split`` as a stream: nothing is read before it is iterated."""
    if _reads_own_files(cfg):
        return _local_stream(cfg, split)
    return select_pair(_load_hub(cfg, split, True, cfg.cache_dir), cfg.src_lang, cfg.tgt_lang,
                       f"{cfg.dataset}:{split}")


def load_split(cfg: DataConfig, split: str, cache_dir: str | Path | None = None) -> Dataset:
    """The (src, tgt) text pairs of ``split`` in corpus order; only the training split is ever shortened.

    The Arrow copy of a local corpus (and a hub download) goes to ``cache_dir``, else
    ``cfg.cache_dir``, else the HuggingFace default cache (``$HF_DATASETS_CACHE``, under ``~``).
    With ``cfg.streaming`` a hub split is streamed and only this split kept (for validation and test
    splits, which are small), instead of downloading the whole dataset.
    """
    cache = str(cache_dir) if cache_dir is not None else cfg.cache_dir
    if _reads_own_files(cfg):
        dataset = _load_local(cfg, split, cache)
    elif cfg.streaming:
        dataset = Dataset.from_list(list(stream_split(cfg, split)), features=TEXT_FEATURES)
    else:
        dataset = select_pair(_load_hub(cfg, split, False, cache), cfg.src_lang, cfg.tgt_lang, f"{cfg.dataset}:{split}")
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


def clean_training_pairs(dataset: Dataset, cfg: DataConfig, tokenizer: Tokenizer,
                         cache_dir: str | Path | None = None) -> tuple[Dataset, dict[str, int]]:
    """Encode the training split and drop empty, over-long and length-ratio outlier pairs; log the counts.

    Returns the encoded, cleaned dataset (columns of `encode_dataset`) and the counts. Never use it
    on validation or test splits: every line of those must be translated.
    """
    encoded = encode_dataset(dataset, tokenizer, cache_dir)
    lengths = encoded.with_format("arrow", columns=["src_len", "tgt_len"])[:]
    reasons = _drop_reasons(lengths["src_len"].to_numpy(), lengths["tgt_len"].to_numpy(), cfg)
    keep = ~np.logical_or.reduce(list(reasons.values()))
    counts = {"pairs": len(encoded), **{name: int(mask.sum()) for name, mask in reasons.items()},
              "kept": int(keep.sum())}
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
    ``world_size`` (a warning says so). Pairs are encoded and cleaned as they are read. Feed the
    result to `batching.stream_batches`. Ranks can differ by a batch at the end of an epoch: stop by steps.
    """
    stream = stream_split(cfg, cfg.train_split)
    if world_size > 1 and stream.num_shards % world_size:
        logger.warning("%s has %d shard(s), not a multiple of %d ranks: every rank reads all of it and keeps 1 "
                       "pair in %d; split the training files into shards to read less", cfg.dataset,
                       stream.num_shards, world_size, world_size)
    if cfg.max_train_samples is not None:
        stream = stream.take(cfg.max_train_samples)
    stream = split_dataset_by_node(stream.shuffle(seed=seed, buffer_size=cfg.shuffle_buffer), rank=rank,
                                   world_size=world_size)
    stream = stream.map(_encode, batched=True, fn_kwargs={"tokenizer": tokenizer}, features=ENCODED_FEATURES)
    return stream.filter(_keep_batch, batched=True, fn_kwargs={"cfg": cfg})
