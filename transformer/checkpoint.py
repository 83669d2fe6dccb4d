"""Checkpoints: written atomically, loaded without running code, kept and pruned (averaged: `transformer.averaging`).

A checkpoint is a dict of tensors and plain values, loadable with
``torch.load(path, weights_only=True)``, so a crafted file cannot execute code when opened.
"""

from __future__ import annotations

import hashlib
import pickle
import re
import struct
import zipfile
from pathlib import Path
from typing import Any

import torch

from transformer.atomic_file import atomic_write
from transformer.errors import first_line

LAST, BEST = "checkpoint_last.pt", "checkpoint_best.pt"
_STEP_NAME = re.compile(r"checkpoint_step(\d+)\.pt$")
# model settings a checkpoint may be loaded with other values of: no parameter depends on them
FREE_MODEL_SETTINGS = ("dropout", "attention_dropout", "activation_dropout", "max_positions")
# the data settings that make a vocabulary (a fine-tuned model keeps its parent's)
VOCABULARY_SETTINGS = ("vocab_size", "joint_vocab", "spm_model_type", "pad_id", "unk_id", "bos_id", "eos_id")
# and, with the corpus itself (`corpus_identity`), those of the corpus a run's tokenizer and batch position belong
# to: checkpoints that differ in one embed other tokens, and a run does not resume on another
CORPUS_SETTINGS = ("train_split", "src_lang", "tgt_lang", "pairs", "character_coverage", *VOCABULARY_SETTINGS)
_ZIP_MAGIC, _PICKLE_PROTOCOL = b"PK\x03\x04", b"\x80"  # how torch.save's files begin: a zip, or (legacy) a pickle
_IMPORTED = re.compile(r"GLOBAL ([\w.]+)")  # what weights_only's unpickler refused to import


class CheckpointError(RuntimeError):
    """A checkpoint is missing, truncated, corrupt or unsafe."""


def tensor_checksum(value: Any, digest: Any = None) -> str:
    """Hash of every tensor in a nested checkpoint, in a fixed order, to detect corrupted bytes."""
    digest = digest if digest is not None else hashlib.blake2b(digest_size=16)
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        digest.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
        digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    elif isinstance(value, dict):
        for key in sorted(value, key=str):
            digest.update(str(key).encode())
            tensor_checksum(value[key], digest)
    elif isinstance(value, (list, tuple)):
        for item in value:
            tensor_checksum(item, digest)
    return digest.hexdigest()


def save_checkpoint(state: dict[str, Any], path: str | Path) -> None:
    """Write ``state`` with its checksum to ``path`` atomically (`atomic_write`): a crash or a full disk while
    writing leaves the previous file at ``path`` untouched, and the file is readable as any other the user writes."""
    state = {**state, "checksum": tensor_checksum(state)}
    with atomic_write(path) as partial, partial.open("wb") as file:
        torch.save(state, file)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint to the CPU with ``weights_only=True``; raise CheckpointError with the path on any failure,
    and on a checkpoint without the 'model' and 'config' entries that every reader of one needs."""
    path = Path(path)
    if path.is_dir():  # a run directory, or an exported folder: named as such ("not found" would suggest a typo)
        best = f" (such as {BEST} in it)" if (path / BEST).is_file() else ""
        raise CheckpointError(f"{path}: a folder, not a checkpoint file: give a .pt file{best}")
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    with path.open("rb") as file:
        head = file.read(len(_ZIP_MAGIC))
    if head and not head.startswith((_ZIP_MAGIC, _PICKLE_PROTOCOL)):  # text, JSON, YAML, ...: torch's error misleads
        raise CheckpointError(f"{path}: not a checkpoint (not a file written by torch.save)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        imported = _IMPORTED.search(str(error))  # torch's advice, to load it with weights_only=False, is unsafe
        if imported:
            raise CheckpointError(f"{path}: refused to load: it would import {imported.group(1).rstrip('.')}, "
                                  f"and opening it could run code (a checkpoint holds tensors and plain values "
                                  f"only)") from None
        raise CheckpointError(f"{path}: truncated or corrupt checkpoint (unreadable pickle)") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError, LookupError, struct.error) as error:
        # a damaged file fails anywhere in torch's readers: an index or key out of range, a short struct, ...
        # without what torch adds to a damaged zip's reason: 300 characters of guesses why (a file not saved
        # properly, transferred incorrectly or modified), which "truncated or corrupt" says already
        reason = first_line(error).split(". This is an internal miniz error")[0]
        raise CheckpointError(f"{path}: truncated or corrupt checkpoint ({reason})") from error
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path}: not a checkpoint of this toolkit (no 'model' entry)")
    expected = state.pop("checksum", None)
    if expected is not None and tensor_checksum(state) != expected:
        raise CheckpointError(f"{path}: corrupt checkpoint (checksum mismatch)")
    if not isinstance(state.get("config"), dict):  # a bare state dict, as other training scripts save one
        raise CheckpointError(f"{path}: not a checkpoint of this toolkit (no 'config' entry, which holds its model "
                              f"settings): give one written by transformer-train or transformer-average")
    return state


def weights_difference(expected: dict[str, torch.Tensor], weights: dict[str, torch.Tensor]) -> str | None:
    """The first weight missing, unexpected or of another shape, in words: torch's own error names it only past
    its first line, and a one-line error needs it."""
    for key, value in expected.items():
        if key not in weights:
            return f"it has no {key}"
        if tuple(weights[key].shape) != tuple(value.shape):
            return f"its {key} has shape {tuple(weights[key].shape)}, the model's {tuple(value.shape)}"
    unexpected = [key for key in weights if key not in expected]
    return f"it has {unexpected[0]}, which the model has not" if unexpected else None


def load_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor], where: str | Path) -> None:
    """Copy ``weights`` (read from ``where``) into ``model``, or raise CheckpointError naming ``where`` and the first
    weight that does not fit (`weights_difference`)."""
    difference = weights_difference(model.state_dict(), weights)
    if difference:
        raise CheckpointError(f"{where}: weights do not fit the model of its config: {difference}")
    model.load_state_dict(weights)


def step_checkpoint_path(run_dir: Path, step: int) -> Path:
    return run_dir / f"checkpoint_step{step}.pt"


def run_checkpoint(folder: Path) -> Path | None:
    """The checkpoint to name where a training run's folder was given for a model: its best, else its last; None
    for a folder that holds neither."""
    return next((folder / name for name in (BEST, LAST) if (folder / name).is_file()), None)


def step_checkpoints(run_dir: Path) -> list[Path]:
    """The numbered checkpoints of a run, oldest first."""
    found = [(int(m.group(1)), p) for p in run_dir.glob("checkpoint_step*.pt") if (m := _STEP_NAME.search(p.name))]
    return [p for _, p in sorted(found)]


def prune_step_checkpoints(run_dir: Path, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` numbered checkpoints."""
    for path in step_checkpoints(run_dir)[:-keep_last]:
        path.unlink(missing_ok=True)


def written_by_training(name: str) -> bool:
    """Whether training writes (and a resume reads) a checkpoint of this file name: last, best or numbered."""
    return name in (LAST, BEST) or _STEP_NAME.fullmatch(name) is not None


def tokenizer_beside(paths: list[Path], names: list[str]) -> dict[str, Path]:
    """The tokenizer model file of each of ``names`` beside the checkpoints (the first checkpoint's folder first),
    which translating an averaged checkpoint needs beside it. Checkpoints beside different files of one name
    come from runs with different vocabularies: refused."""
    found: dict[str, Path] = {}
    for folder in dict.fromkeys(path.parent for path in paths):
        for name in names:
            if not (folder / name).is_file():
                continue
            if name not in found:
                found[name] = folder / name
            elif (folder / name).read_bytes() != found[name].read_bytes():
                raise CheckpointError(f"{folder / name} differs from {found[name]}: the checkpoints come from runs "
                                      f"with different tokenizers; cannot average")
    return found


def model_difference(saved: dict, current: dict, free: tuple[str, ...] = FREE_MODEL_SETTINGS,
                     ) -> tuple[str, Any, Any] | None:
    """The first model setting (key, saved value, current value) in which two configs' model sections differ, or
    None; the ``free`` settings may differ."""
    for key, value in current.items():
        if key not in free and saved.get(key) != value:
            return key, saved.get(key), value
    return None


def corpus_difference(saved: dict, current: dict) -> tuple[str, Any, Any] | None:
    """The first of `CORPUS_SETTINGS` (key, saved value, current value) in which two configs' data sections differ,
    or None. A setting one of them lacks (an older version's) is not compared, nor, between two multilingual
    configs, src_lang and tgt_lang, which then only choose the direction scored by default."""
    multilingual = bool(saved.get("pairs")) and bool(current.get("pairs"))
    for key in CORPUS_SETTINGS:
        if key in saved and key in current and saved[key] != current[key] and not (
                multilingual and key in ("src_lang", "tgt_lang")):
            return key, saved[key], current[key]
    return None
