"""Local corpus files: line-aligned ``{split}.{lang}`` pairs, TSV and JSONL, whole or cut into shards.

Readers take lists of files, one per shard, so that `datasets` can give each torchrun rank its own
files of a stream. Errors name the file and line; nothing but Unicode NFC and surrounding whitespace
is changed in the text.
"""

from __future__ import annotations

import gzip
import json
import logging
import re
import unicodedata
import zlib
from collections.abc import Iterator
from itertools import zip_longest
from pathlib import Path
from typing import Any, Callable

from transformer.config import DataConfig
from transformer.data.splits import SPLIT_ALIASES, SplitSlice, held_out_slices, resolve_split
from transformer.errors import DataError

logger = logging.getLogger(__name__)


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
                                    f"at column {error.start + 1}){_encoding_hint(path, raw, number)}") from None
    except (OSError, EOFError, zlib.error) as error:
        raise DataError(f"cannot read {path}: {getattr(error, 'strerror', None) or error}") from None


def _encoding_hint(path: str, raw: bytes, number: int) -> str:
    """What a first line that is no UTF-8 says the file is: gzip without its name saying so, or UTF-16 (as Windows
    editors save "Unicode")."""
    if number == 1 and raw.startswith(b"\x1f\x8b"):
        return f": the file is gzip-compressed, and only a name ending in .gz is read as such (rename it {path}.gz)"
    if number == 1 and raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        return ": the file is UTF-16; convert it to UTF-8 (iconv -f UTF-16 -t UTF-8)"
    return ""


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
                raise DataError(f"{path}: no column for language {lang!r}: the first line must name the language "
                                f"of each column (such as {src_lang}<TAB>{tgt_lang}), and it reads {columns}")
        src, tgt = columns.index(src_lang), columns.index(tgt_lang)
        for number, line in enumerate(lines, start=2):
            if not line.strip("\r\n"):  # a blank line (an editor's last one, files joined by cat) holds no pair,
                continue  # as in a JSONL file; one with tabs or spaces in it is still counted and checked
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
                record = json.loads(line.rstrip("\r\n"))  # its newline: an unclosed string "control character"
            except json.JSONDecodeError as error:  # json's messages end in " at", for ": line 1 column 8" to follow
                raise DataError(f"{path} line {number}, column {error.colno}: invalid JSON "
                                f"({error.msg.removesuffix(' at')})") from None
            pair = record.get("translation", record) if isinstance(record, dict) else None
            if not isinstance(pair, dict):
                raise DataError(f"{path} line {number}: expected an object like "
                                f"{{{src_lang!r}: ..., {tgt_lang!r}: ...}}")
            for lang in (src_lang, tgt_lang):
                if not isinstance(pair.get(lang), str):
                    found = (f"its value is {json.dumps(pair[lang])}, not a string" if lang in pair
                             else f"keys: {sorted(pair)}")
                    raise DataError(f"{path} line {number}: no text for language {lang!r} ({found})")
            yield {"src": normalize(pair[src_lang]), "tgt": normalize(pair[tgt_lang])}


_WARNED: set[Path] = set()  # files read in place of a gzip copy beside them, already said


def _shard_files(root: Path, split: str, suffix: str) -> list[Path]:
    """``{split}{suffix}`` or its shards ``{split}-*{suffix}`` (e.g. ``train-00003-of-00008.de.gz``), gzip or
    not, in name order."""
    whole = [p for p in (root / f"{split}{suffix}", root / f"{split}{suffix}.gz") if p.is_file()]
    patterns = (f"{split}-*{suffix}", f"{split}-*{suffix}.gz")
    sharded = sorted(p for pattern in patterns for p in root.glob(pattern) if p.is_file())
    if whole and sharded and sharded[0] not in _WARNED:  # the shards were left out without a word
        _WARNED.add(sharded[0])
        logger.warning("%s: both %s and %d shard(s) of the split (%s, ...) are there; reading %s", root,
                       whole[0].name, len(sharded), sharded[0].name, whole[0].name)
    shards = whole or sharded
    plain = {p.name for p in shards}
    doubled = [p for p in shards if p.name.endswith(".gz") and p.name.removesuffix(".gz") in plain]
    if doubled and doubled[0] not in _WARNED:  # say which is read: they may differ (one an old copy)
        _WARNED.add(doubled[0])  # once, though the files are looked up several times a run
        name, more = doubled[0].name.removesuffix(".gz"), f" (and {len(doubled) - 1} more such)" * (len(doubled) > 1)
        logger.warning("%s: both %s and %s are there%s; reading %s", root, name, doubled[0].name, more, name)
    shards = [p for p in shards if p not in doubled]  # counted twice, a shard makes "2 de file(s) but 1 en file(s)"
    numbered = [re.match(rf"{re.escape(split)}-(\d+)-of-(\d+)\.", p.name) for p in shards]
    if shards and all(numbered):  # the names say how many there are: a missing one is an error, not skipped
        count = int(numbered[0].group(2))
        missing = sorted(set(range(count)) - {int(match.group(1)) for match in numbered})
        if missing:
            width = len(numbered[0].group(1))
            raise DataError(f"{root}: split {split!r} is cut into {count} shards ({suffix.lstrip('.')}), and "
                            f"{split}-{missing[0]:0{width}d}-of-{numbered[0].group(2)}{suffix} is missing")
    return shards


def _split_of(name: str) -> str:
    """The split a local file (its name without .gz) belongs to: ``train`` for ``train.de`` and
    ``train-00001-of-00004.de``, ``train.tok`` for ``train.tok.de`` (as Moses and fairseq name their steps' files)."""
    return name.rsplit(".", 1)[0].split("-")[0]


LANGUAGE_SUFFIX = re.compile(r"[A-Za-z]{2,3}([_-][A-Za-z0-9]+)?")  # de, deu, EN, zh_Hans, pt-BR
HUB_FILE_TYPES = {"csv", "json", "txt", "py", "md", "arrow", "parquet", "orc", "yaml", "yml", "xml", "pkl", "npy",
                  "zip", "tar", "tgz", "xz", "bz2", "zst", "lz4"}  # what datasets reads, and compressions of them


def is_line_corpus(root: Path, cfg: DataConfig) -> bool:
    """Whether a local file or directory is in this toolkit's own layouts (``{split}.{lang}``, ``.tsv``,
    ``.jsonl``) rather than a hub repository's (parquet, csv: read by `datasets.load_dataset`).

    A ``train.de`` / ``val.en`` file makes a folder ours whatever the configured languages are, so that
    ``data.pairs=EN-DE`` on one is "unknown language code 'EN'", not a hub loader's "no data files found".
    """
    own = (cfg.src_lang, cfg.tgt_lang, "tsv", "jsonl")
    splits = {name for names in SPLIT_ALIASES for name in names}

    def ours(name: str) -> bool:
        return name.rsplit(".", 1)[-1] in own or _is_corpus_file(name) and _split_of(name) in splits

    return not root.is_dir() or any(p.is_file() and ours(p.name.removesuffix(".gz")) for p in root.iterdir())


NOT_LANGUAGES = {"bak", "old", "tmp", "log", "swp"}  # suffixes of files left beside a corpus (a language named is kept)


def _is_corpus_file(name: str) -> bool:
    """Whether a file's name (without .gz) is one of a split, ``{split}.{lang}``, ``.tsv`` or ``.jsonl``: not a
    config, README, licence, checksum, backup or hidden file beside the corpus (errors listed them as splits)."""
    stem, dot, suffix = name.rpartition(".")
    return bool(dot and stem) and not name.startswith(".") and (suffix in ("tsv", "jsonl") or (
        LANGUAGE_SUFFIX.fullmatch(suffix) is not None and suffix.lower() not in HUB_FILE_TYPES | NOT_LANGUAGES))


def _single_file_source(path: Path, split: str,
                        langs: dict[str, str]) -> tuple[Callable[..., Iterator[dict[str, str]]], dict[str, Any]]:
    """A lone TSV or JSONL file as the "train" split and no other, as `datasets.load_dataset("csv"/"json",
    data_files=FILE)` reads it: were it every split, runs would validate and test on their training pairs."""
    jsonl = path.name.removesuffix(".gz").endswith(".jsonl")
    if not path.name.removesuffix(".gz").endswith((".tsv", ".jsonl")):  # read as a TSV: "no column for 'de'"
        raise DataError(f"{path}: a single file must be TSV (.tsv) or JSON lines (.jsonl), gzip allowed (.tsv.gz); "
                        f"for {{split}}.{{lang}} files such as train.de and train.en, or other kinds of file (csv, "
                        f"parquet), set data.dataset to their folder")
    if split not in SPLIT_ALIASES[0]:
        suffix = ".jsonl" if jsonl else ".tsv"
        raise DataError(f"{path}: a single file is the 'train' split only, so it has no split {split!r}: hold "
                        f"pairs out of it with slices ({held_out_slices('train')}), or set "
                        f"data.dataset to a folder holding a file per split, such as train{suffix}, "
                        f"validation{suffix} and test{suffix}")
    return _read_jsonl if jsonl else _read_tsv, {"paths": [str(path)], **langs}


def local_source(cfg: DataConfig, split: str) -> tuple[Callable[..., Iterator[dict[str, str]]], dict[str, Any]]:
    """The reader and its arguments (lists of files: one per shard) for ``split`` of a local corpus (all of
    its pairs: a slice is taken where they are read)."""
    root, split = Path(cfg.dataset).expanduser(), SplitSlice.parse(split).name
    langs = {"src_lang": cfg.src_lang, "tgt_lang": cfg.tgt_lang}
    if root.is_file():
        return _single_file_source(root, split, langs)
    if not root.is_dir():
        raise DataError(f"dataset {cfg.dataset} not found (no such file or directory)")
    files = [name for name in (p.name.removesuffix(".gz") for p in root.iterdir() if p.is_file())
             if _is_corpus_file(name) or name.rsplit(".", 1)[-1] in (cfg.src_lang, cfg.tgt_lang)]
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
