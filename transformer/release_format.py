"""A release folder's files, as `transformer.deploy.release` writes them and the commands read them:

    model.safetensors   the weights only: no pickle, so opening the file cannot run code
    config.yaml         the run's resolved config (model sizes, data, decoding settings)
    spm.model           the SentencePiece model (spm.{lang}.model per language without a joint vocabulary)
    README.md           the model card (`transformer.deploy.card`)

Here and not in `deploy/` because translating (`Translator.from_pretrained`) and fine-tuning
(``train.init_from``) read them. safetensors refuses tensors that share memory, and the model ties its
embeddings and output projection (§3.4): the file stores each tied matrix once, lists its other names in
the metadata, and `read_weights` gives them back, so loading into the model keeps the tie. The metadata
also carries the checkpoints' checksum of the tensors, so a flipped byte is reported instead of
translating with it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

from torch import Tensor

from transformer.atomic_file import atomic_write
from transformer.checkpoint import (
    FREE_MODEL_SETTINGS,
    CheckpointError,
    model_difference,
    run_checkpoint,
    tensor_checksum,
)
from transformer.config import Config, ModelConfig
from transformer.config_loading import load_config
from transformer.data.tokenizer import fingerprint, tokenizer_files
from transformer.errors import first_line

CONFIG = "config.yaml"
WEIGHTS = "model.safetensors"
# the files of the other engines' folders, to say which --engine reads a folder given to --model without one
OTHER_ENGINES = {"config.json": "ctranslate2", "model.bin": "ctranslate2", "encoder.onnx": "onnx"}
ENGINE_WEIGHTS = ("model.bin", "encoder.onnx")  # what the CTranslate2 and ONNX folders translate with


def safetensors_module() -> ModuleType:
    """safetensors, the `export` extra's, or a one-line error saying to install it (imported here, not with the
    module: the names above serve every export; `export_release` asks first, before reading the checkpoint)."""
    try:
        import safetensors.torch
    except ImportError:
        raise CheckpointError('release folders need safetensors: pip install -e ".[export]"') from None
    return safetensors


def write_weights(state: dict[str, Tensor], path: Path, model: ModelConfig | None = None,
                  tokenizer: str | None = None, dataset: str | None = None, step: int | None = None) -> int:
    """Write a state dict with each shared tensor once, and the ``model`` settings it was trained with (all but
    `FREE_MODEL_SETTINGS`: what its shapes do not fix, or fix only in a message that names no setting), so that a
    config.yaml edited since (n_heads 4 -> 8 would load and translate otherwise) is refused by `read_weights`, and the
    fingerprint of its ``tokenizer``, so that another spm.model put beside it is refused too, and the ``dataset`` as
    the training run named it (`dataset_name`: config.yaml's relative path would lead elsewhere from another
    folder), and the training ``step`` of the weights (a fine-tuning of the folder records its parent's step);
    returns the number of values stored."""
    stored: dict[str, Tensor] = {}
    tied: dict[str, str] = {}  # other name -> stored name
    seen: dict[tuple, str] = {}
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.stride())
        if tensor.numel() and key in seen:
            tied[name] = seen[key]
        else:
            seen[key], stored[name] = name, tensor.detach().cpu().contiguous()
    metadata = {"format": "pt", "tied": json.dumps(tied), "checksum": tensor_checksum(stored)}
    if model is not None:
        metadata["model"] = json.dumps({key: value for key, value in dataclasses.asdict(model).items()
                                        if key not in FREE_MODEL_SETTINGS})
    if tokenizer is not None:
        metadata["tokenizer"] = tokenizer
    if dataset is not None:
        metadata["dataset"] = dataset
    if step is not None:
        metadata["step"] = str(step)  # safetensors' metadata holds strings
    safetensors = safetensors_module()
    with atomic_write(path) as partial:  # save_file leaves a file only its owner can read
        try:
            safetensors.torch.save_file(stored, str(partial), metadata=metadata)
        except safetensors.SafetensorError as error:  # a full disk: not an OSError, and a traceback without this
            raise OSError(first_line(error)) from None
    return sum(t.numel() for t in stored.values())


def read_weights(path: Path, model: ModelConfig | None = None,
                 tokenizer: dict[str, bytes] | None = None) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The state dict of a `write_weights` file, tied names included, and the file's metadata; CheckpointError naming
    the file, also when ``model`` (the folder's config) differs from the settings the weights were written with, or
    the ``tokenizer`` models beside them (file name -> bytes) from those they were trained with."""
    if not path.is_file():
        engine = next((engine for name, engine in OTHER_ENGINES.items() if (path.parent / name).is_file()), None)
        if engine:  # transformer-translate --model DIR without --engine
            raise CheckpointError(f"{path.parent}: a folder of the {engine} engine, not a release folder; give "
                                  f"--engine {engine}")
        trained = run_checkpoint(path.parent)
        if trained:  # --model RUN_DIR
            raise CheckpointError(f"{path.parent}: a training run's folder, not a release folder; give --checkpoint "
                                  f"{trained} (or export it: transformer-export)")
        raise CheckpointError(f"weights not found: {path}")
    safetensors = safetensors_module()
    try:
        with safetensors.safe_open(str(path), framework="pt") as file:
            metadata = file.metadata() or {}
            state = {name: file.get_tensor(name) for name in file.keys()}
        tied = json.loads(metadata.get("tied", "{}"))
        written = json.loads(metadata.get("model", "{}"))  # none in folders exported before it was recorded
    except (safetensors.SafetensorError, OSError, ValueError) as error:
        reason = first_line(error)
        raise CheckpointError(f"{path}: not a readable safetensors file ({reason})") from None
    if "checksum" in metadata and tensor_checksum(state) != metadata["checksum"]:
        raise CheckpointError(f"{path}: corrupt weights (checksum mismatch)")
    settings = dataclasses.asdict(model) if model is not None and isinstance(written, dict) else {}
    changed = model_difference(written, {key: value for key, value in settings.items() if key in written})
    if changed:
        key, recorded, configured = changed
        raise CheckpointError(f"{path.parent / CONFIG}: model.{key} is {configured}, but {path.name} was "
                              f"written with {recorded}; restore it")
    if tokenizer and "tokenizer" in metadata and fingerprint(tokenizer) != metadata["tokenizer"]:
        raise CheckpointError(f"{', '.join(str(path.parent / name) for name in tokenizer)}: not the tokenizer "
                              f"{path.name} was exported with (one of them was replaced since); restore the files "
                              f"of the export")
    missing = sorted(set(tied.values()) - set(state))
    if missing:
        raise CheckpointError(f"{path}: tied weight {missing[0]} is not in the file")
    return {**state, **{name: state[stored] for name, stored in tied.items()}}, metadata


class Release(NamedTuple):
    cfg: Config
    weights: dict[str, Tensor]
    dataset: str | None  # the corpus as its training run named it; None in folders exported before it was recorded
    step: int | None  # the training step of the weights; None likewise


def read_release(directory: Path) -> Release:
    """The config, state dict, training corpus's name and training step of a release folder; the tokenizer files sit
    in the same folder."""
    directory = Path(directory)
    if directory.is_file():  # a checkpoint, or the folder's weights, given to --model
        raise CheckpointError(f"{directory}: a file, not a release folder" + (
            f"; give --checkpoint {directory} (--model takes an exported folder)" if directory.suffix == ".pt" else
            f"; give its folder, --model {directory.parent}" if directory.name == WEIGHTS else ""))
    if not directory.is_dir():
        raise CheckpointError(f"release folder not found: {directory}")
    cfg = load_config(directory / CONFIG)
    paths = [directory / name for name in tokenizer_files(cfg.data)]
    tokenizer = {path.name: path.read_bytes() for path in paths} if all(path.is_file() for path in paths) else None
    # a missing tokenizer: said when it loads
    weights, metadata = read_weights(directory / WEIGHTS, cfg.model, tokenizer)
    step = metadata.get("step", "")
    return Release(cfg, weights, metadata.get("dataset"), int(step) if step.isdigit() else None)
