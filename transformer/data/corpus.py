"""Which corpus ``data.dataset`` names: a local folder or file (read by `transformer.data.files`) or a hub
dataset, the files a split is read from, and the name a user knows it by."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from datasets.data_files import get_data_patterns

from transformer.config import DataConfig
from transformer.data.files import is_line_corpus, local_source
from transformer.data.languages import direction_configs
from transformer.data.splits import SplitSlice, resolve_split
from transformer.errors import DataError

SINGLE_FILE_SUFFIXES = (".tsv", ".jsonl", ".gz")  # how a path names one file of pairs (written like a path)


def source_paths(reader_arguments: dict[str, Any]) -> list[str]:
    """The files among the arguments `local_source` gives its reader."""
    return [path for key, value in reader_arguments.items() if key.endswith("paths") for path in value]


def is_local(name: str) -> bool:
    """Whether ``data.dataset`` names a local path (existing, or written like a path) or a hub dataset."""
    if not name:
        raise DataError("data.dataset is empty: give a local directory or file, or a HuggingFace hub dataset name")
    return Path(name).expanduser().exists() or name.startswith((".", "/", "~")) or name.endswith(SINGLE_FILE_SUFFIXES)


def dataset_name(cfg: DataConfig) -> str:
    """The corpus as a user knows it, for model cards and run records: the hub id (with its configuration),
    or a local folder's or file's own name, never a path of this machine."""
    if is_local(cfg.dataset):
        root = Path(cfg.dataset).expanduser().resolve()
        if root.is_file() or not root.exists() and root.name.endswith(SINGLE_FILE_SUFFIXES):
            return f"{root.name} (a local file: {cfg.train_split})"
        splits = [split for split in dict.fromkeys((cfg.train_split, cfg.valid_split, cfg.test_split))
                  if not root.exists() or _holds(cfg, split)]  # the splits it has; all, for a folder not here
        return f"{root.name} (local files: {', '.join(splits)})" if splits else f"{root.name} (local files)"
    return f"{cfg.dataset} ({cfg.dataset_config})" if cfg.dataset_config else cfg.dataset


def corpus_identity(cfg: DataConfig) -> list[list[Any]]:
    """What tells one training corpus from another wherever it lies (a path may be written in several ways, or
    name another folder from another directory): the names and sizes of a local corpus's training files, of
    every direction, or a hub dataset's id and configuration."""
    if not is_local(cfg.dataset):
        return [[cfg.dataset, cfg.dataset_config]]
    files = dict.fromkeys(path for pair in direction_configs(cfg) for path in corpus_files(pair, cfg.train_split))
    return [[path.name, path.stat().st_size] for path in files]


def check_splits(cfg: DataConfig, settings: Sequence[str] = ("train_split", "valid_split")) -> None:
    """Read the split names of ``settings`` and look their files up in every direction, so that a misspelt slice or a
    split a local corpus lacks is an error at once, not after a tokenizer has been trained (a hub dataset's splits
    are found when it is loaded)."""
    for setting in settings:
        try:
            SplitSlice.parse(getattr(cfg, setting))
        except DataError as error:
            raise DataError(f"data.{setting}: {error}") from None
    for pair in direction_configs(cfg):
        for setting in settings:
            corpus_files(pair, getattr(pair, setting))


def _holds(cfg: DataConfig, split: str) -> bool:
    """Whether the local corpus has ``split``: a folder in a hub repository's layout, where its file names say so
    (all its files are read for any split, so a model card named a test split it lacked)."""
    try:
        if reads_own_files(cfg):
            return bool(corpus_files(cfg, split))
        splits = list(get_data_patterns(str(Path(cfg.dataset).expanduser())))
    except DataError:
        return False
    except (OSError, ValueError):  # no data files, or a layout datasets reads otherwise (a README's configs)
        return True
    try:
        return bool(resolve_split(SplitSlice.parse(split).name, splits, cfg.dataset))
    except DataError:
        return False


def reads_own_files(cfg: DataConfig) -> bool:
    """Whether ``data.dataset`` is read by `transformer.data.files`' readers rather than `datasets.load_dataset`."""
    return is_local(cfg.dataset) and is_line_corpus(Path(cfg.dataset).expanduser(), cfg)


def corpus_files(cfg: DataConfig, split: str) -> list[Path]:
    """The local files ``split`` is read from (a hub dataset's: none here): what no output may overwrite."""
    if not is_local(cfg.dataset):
        return []
    if reads_own_files(cfg):
        return [Path(path) for path in source_paths(local_source(cfg, split)[1])]
    root = Path(cfg.dataset).expanduser()  # a folder in a hub repository's layout: all of it
    return [path for path in root.rglob("*") if path.is_file()]
