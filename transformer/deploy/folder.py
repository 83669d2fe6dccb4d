"""What every engine folder holds besides the engine's own files, and the translator part that needs only that.

    spm.model / spm.{lang}.model     the SentencePiece model(s), to turn text into ids and back
    config.yaml                      this toolkit's config (decoding settings, maximum length, model sizes)
    SHA256SUMS                       the sha256 of the engine's weights and vocabularies and of the tokenizer
                                     models, checked when the folder loads (and by ``sha256sum -c SHA256SUMS``)

`transformer.deploy.ctranslate2_export` and `transformer.deploy.onnx_export` write such folders; their translators
are `FolderTranslator` engines (`transformer.engine`), which read them. Every export (those and
`transformer.deploy.release`) checks its output folder first (`check_export_folder`), and writes into a new
folder that takes the place of what the output held when done (`transformer.atomic_file.replacing_folder`):
a failed export leaves nothing, two exports never mix.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar

from transformer.atomic_file import PARTIAL_FOLDER, being_written, cannot_write_into, is_probe, replacing_folder
from transformer.checkpoint import CheckpointError, load_checkpoint
from transformer.config import Config, ModelConfig, TrainConfig
from transformer.config_loading import apply_overrides, config_from_dict, load_config, save_config
from transformer.data.tokenizer import Tokenizer
from transformer.decoding.inputs import encode
from transformer.decoding.loading import build_model
from transformer.engine import Engine
from transformer.errors import InputError, first_line
from transformer.model.transformer import Transformer
from transformer.release_format import CONFIG, WEIGHTS

CHECKSUMS = "SHA256SUMS"  # an engine folder's, in sha256sum's format
# what SHA256SUMS lists: what the folder's weights must be read with, where another file of the same name translated
# garbage or failed deep inside the engine (config.yaml and config.json are the user's to edit, and parsed)
CHECKED_FILES = ("*.model", "model.bin", "*_vocabulary.json", "*.onnx", "*.onnx.data")
# what the exports write (release, CTranslate2, ONNX): --force replaces a folder of these alone
EXPORT_FILES = (CONFIG, "README.md", CHECKSUMS, "*.model", WEIGHTS, "model.bin", "config.json", "*_vocabulary.json",
                "*.onnx", "*.onnx.data")


def load_for_export(checkpoint: Path) -> tuple[Transformer, Config, Tokenizer]:
    """The float32 model of ``checkpoint`` on the CPU, as trained (no inference speed paths swapped in), its
    config and its tokenizer (found beside it)."""
    state = load_checkpoint(checkpoint)
    cfg = config_from_dict(state["config"], where=str(checkpoint))
    tokenizer = Tokenizer.beside(checkpoint, state, cfg.data)
    model = build_model(cfg.model, tokenizer, state["model"], checkpoint).eval()
    return model, Config(model=cfg.model, data=cfg.data, decode=cfg.decode), tokenizer


def check_export_folder(checkpoint: Path, output: Path, force: bool = False) -> None:
    """Refuse, before anything is written, an output folder that holds ``checkpoint`` (its run directory, or
    a folder above it: the export would write over the run's config and tokenizer, and replacing it would
    delete the checkpoint), a file, or a folder that holds anything unless ``force`` (as CTranslate2's converters
    do: files of two exports would mix; and then only a folder of the files an export writes, `EXPORT_FILES`), and
    never the current folder or one above it that holds anything (replacing it would delete what the user works
    on; an empty current folder takes an export); nor a folder that cannot be written (read-only, no permission)."""
    if Path(checkpoint).resolve().is_relative_to(output.resolve()):
        raise InputError(f"{output}: holds the checkpoint {checkpoint}; export into another folder")
    if output.exists() and not output.is_dir():
        raise InputError(f"{output}: exists and is not a folder")
    if output.is_dir() and any(_is_partial(path) and being_written(path) for path in output.iterdir()):
        raise InputError(f"{output}: another export is writing into it; wait for it to end, or give another --output")
    # a folder that holds only what a killed export left (hidden from ls) is empty to its user; the export replaces it
    held = [path for path in output.iterdir() if not _is_partial(path)] if output.is_dir() else []
    if held and Path.cwd().resolve().is_relative_to(output.resolve()):  # `--output . --force` deleted all there
        raise InputError(f"{output}: the current folder, or one that holds it, and not empty; export into a "
                         f"folder of its own")
    if held and not force:
        raise InputError(f"{output}: exists and is not empty; give --force to replace it, or another --output")
    foreign = [path.name for path in held if not (path.is_file() and any(map(path.match, EXPORT_FILES)))]
    if foreign:  # --output "$HOME/$UNSET" --force deleted the user's home folder
        raise InputError(f"{output}: holds {foreign[0]}, which no export writes: --force replaces an export's "
                         f"folder only; give another --output")
    reason = cannot_write_into(output)
    if reason:  # said before the model is converted, not by the first file written after it
        raise InputError(f"{output}: cannot write into it ({reason})")


def _is_partial(path: Path) -> bool:
    """Whether ``path`` is the unfinished folder of an export (`replacing_folder`'s), or a probe of
    `cannot_write_into` that a kill left behind."""
    return (path.name.startswith(PARTIAL_FOLDER) and path.is_dir() and not path.is_symlink()) or is_probe(path)


@contextmanager
def export_folder(output: Path) -> Iterator[Path]:
    """`replacing_folder` of ``output``, where an OSError that names no file (a full disk, as CTranslate2's and
    safetensors' writers report it) is one line naming ``output``, not a bare "[Errno 28] No space left on device"."""
    try:
        with replacing_folder(output) as folder:
            yield folder
    except OSError as error:
        if error.filename:
            raise
        raise OSError(f"cannot write {output}: {error.strerror or first_line(error)}") from None


def shipped_config(cfg: Config) -> Config:
    """``cfg`` as a shipped folder holds it: without what belongs to the machine that trained it (its run folder,
    its corpus cache, a parent checkpoint's path), so that training from the folder's config.yaml, as its card
    says, starts a run of its own instead of resuming the exporter's."""
    train = dataclasses.replace(cfg.train, run_dir=TrainConfig.run_dir, init_from="", init_keep_optimizer=False)
    return dataclasses.replace(cfg, train=train, data=dataclasses.replace(cfg.data, cache_dir=None))


def write_config_and_tokenizer(cfg: Config, tokenizer: Tokenizer, output: Path) -> None:
    """Put the SentencePiece model(s) and config.yaml into ``output``, so that the folder is self-contained."""
    for name, proto in tokenizer.models.items():
        (output / name).write_bytes(proto)
    save_config(shipped_config(cfg), output / CONFIG)


def write_checksums(folder: Path) -> None:
    """List the sha256 of the folder's `CHECKED_FILES` in its SHA256SUMS: a release folder's safetensors carry the
    checksum of the weights and the tokenizer's fingerprint, the other engines' files have no room for them."""
    listed = sorted(path for path in folder.iterdir() if path.is_file() and any(map(path.match, CHECKED_FILES)))
    (folder / CHECKSUMS).write_text("".join(f"{_sha256(path)}  {path.name}\n" for path in listed))


def verify_checksums(directory: Path) -> None:
    """Refuse, in one line naming the file, a folder whose listed files are not those it was exported with: a
    tokenizer model of another export translated garbage (or failed inside onnxruntime), a truncated model.bin
    failed inside CTranslate2. A folder exported before SHA256SUMS was written has none, and is read as it is."""
    listed = directory / CHECKSUMS
    if not listed.is_file():
        return
    for number, line in enumerate(listed.read_text(errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        # sha256sum's "DIGEST  NAME", or "DIGEST *NAME" in its binary mode (-b); a name may hold spaces
        digest, separator, name = line[:64], line[64:66], line[66:].removesuffix("\r")
        if separator not in ("  ", " *") or not name or Path(name).name != name:
            raise CheckpointError(f"{listed} line {number}: not 'SHA256  FILE' of a file in the folder")
        path = directory / name
        if not path.is_file():
            raise CheckpointError(f"{path}: not found, though {CHECKSUMS} lists it; restore the export's files")
        if _sha256(path) != digest.lower():
            raise CheckpointError(f"{path}: not the file this folder was exported with (its sha256 differs from "
                                  f"{CHECKSUMS}'); restore the export's files, or export again")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class FolderTranslator(Engine):
    """An engine reading such a folder: its settings and tokenizer; subclasses add the search
    (``search_nbest``) and say how many positions their tables hold (``positions``, ``holds``)."""

    holds: ClassVar[str]  # how the position-limit error names the tables, with {} for their rows

    def __init__(self, directory: Path, kind: str, engine_files: Sequence[str], overrides: Sequence[str]) -> None:
        """Check that ``directory`` holds ``engine_files`` (else a one-line error: not ``kind``, naming the first
        file missing) and that its files are those exported (`verify_checksums`), then read its config, with
        ``overrides`` (decode.key=value), and its tokenizer."""
        missing = [name for name in engine_files if not (directory / name).is_file()]
        if missing:
            if not directory.is_dir():
                raise CheckpointError(f"{directory}: {'not a folder' if directory.exists() else 'no such folder'} "
                                      f"(give {kind})")
            if (directory / WEIGHTS).is_file():  # transformer-translate --engine onnx --model RELEASE
                raise CheckpointError(f"{directory}: a release folder, not {kind}; drop --engine (the torch engine "
                                      f"reads it)")
            raise CheckpointError(f"not {kind} (no {missing[0]}): {directory}")
        verify_checksums(directory)
        self.cfg = apply_overrides(load_config(directory / CONFIG), overrides, sections=("decode",))
        self.decode, self.data, self.max_source_length = self.cfg.decode, self.cfg.data, self.cfg.data.max_length
        self.tokenizer = Tokenizer.load(directory, self.cfg.data)
        self.positions = self.cfg.model.max_positions

    @property
    def model_config(self) -> ModelConfig:
        return self.cfg.model

    def check_positions(self, limits: Sequence[int]) -> None:
        """A one-line error, before any search, when an output of ``limits`` tokens (`length_limits`, eos not
        counted: bos then that many tokens, the last of them at position limit) needs more positions than
        the folder's positional tables hold."""
        needed = 1 + max(limits, default=0)
        if needed > self.positions:
            raise InputError(f"{self.holds.format(self.positions)} (model.max_positions) and outputs of up to "
                             f"{needed - 1} tokens need {needed}: lower decode.max_len_a or decode.max_len_b, or "
                             f"shorten the prefix or constraints")

    def translation_ids(self, translations: list[str]) -> list[list[int]]:
        """The ids of translations to score, or a one-line error naming the first that needs more positions than
        the folder's positional tables hold (bos, then its tokens)."""
        found = encode(self.tokenizer, translations, target=True)
        for number, ids in enumerate(found, start=1):
            if len(ids) + 1 > self.positions:
                raise InputError(f"translation {number} has {len(ids)} tokens: {self.holds.format(self.positions)} "
                                 f"(model.max_positions), and it needs {len(ids) + 1}")
        return found
