"""A model read for translation: from checkpoints (one, or several for an ensemble) or a release folder, checked,
and prepared for its device, precision and speed paths; `Translator.from_checkpoint` and ``from_pretrained``
build on it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor, nn

from transformer import fast
from transformer.checkpoint import CheckpointError, load_checkpoint, load_weights
from transformer.config import Config, DataConfig, ModelConfig
from transformer.config_loading import config_from_dict
from transformer.data.languages import direction_names, directions
from transformer.data.tokenizer import Tokenizer
from transformer.decoding.ensemble import Ensemble
from transformer.errors import InputError
from transformer.model.transformer import Transformer
from transformer.release_format import WEIGHTS, read_release
from transformer.runtime.device import select_device
from transformer.runtime.int8 import quantize_int8


class StoredModel(NamedTuple):
    """What a checkpoint or release folder holds for translation."""

    cfg: Config  # the first model's, for an ensemble
    tokenizer: Tokenizer
    members: list[tuple[ModelConfig, dict[str, Tensor], Path]]  # each model's config, weights and file
    training_data: str | None  # the corpus as the training run named it, if recorded


def build_model(cfg: ModelConfig, tokenizer: Tokenizer, weights: dict[str, Tensor], where: Path) -> Transformer:
    """The model of ``cfg`` and ``tokenizer``'s vocabularies holding ``weights`` (read from ``where``, named in
    the one-line error when they do not fit: `load_weights`)."""
    model = Transformer(cfg, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.pad_id,
                        tokenizer.bos_id, tokenizer.eos_id)
    load_weights(model, weights, where)
    return model


def check_load_options(overrides: Sequence[str], dtype: str, quantize: str | None) -> None:
    """One-line errors for the load options, before any file is read: ``overrides`` must be a list of
    "decode.key=value" strings (one string would be read character by character: "override 'd' must look like
    section.key=value"), ``dtype`` fp32 or bf16, ``quantize`` None or int8 (in fp32)."""
    if isinstance(overrides, (str, bytes)) or not all(isinstance(item, str) for item in overrides):
        raise InputError(f"overrides: give a list of 'decode.key=value' strings, not {overrides!r}")
    if dtype not in ("fp32", "bf16"):
        raise InputError(f"dtype {dtype!r}: give 'fp32' or 'bf16'")
    if quantize not in (None, "int8"):
        raise InputError(f"quantize {quantize!r}: give None or 'int8'")
    if quantize and dtype != "fp32":  # int8 layers compute in fp32: the dtype would be ignored
        raise InputError(f"quantize='int8' computes in fp32 (int8 weights, dynamic int8 products): not with "
                         f"dtype={dtype!r}")


def read_checkpoints(path: str | Path | Sequence[str | Path]) -> StoredModel:
    """The model of a checkpoint, or the ensemble of several, each with the tokenizer found beside it: one
    vocabulary, and the same directions (with language tags or without), or a one-line error."""
    paths = [Path(path)] if isinstance(path, (str, Path)) else [Path(p) for p in path]
    if not paths:  # an IndexError deep in the loading
        raise InputError("from_checkpoint: give a checkpoint path, or a list of one or more (an ensemble)")
    states = [load_checkpoint(p) for p in paths]
    configs = [config_from_dict(state["config"], where=str(p)) for p, state in zip(paths, states)]
    tokenizer = Tokenizer.beside(paths[0], states[0], configs[0].data)
    for other, cfg, state in zip(paths[1:], configs[1:], states[1:]):
        if Tokenizer.beside(other, state, cfg.data).models != tokenizer.models:
            raise CheckpointError(f"{other}: its tokenizer differs from {paths[0]}'s; an ensemble needs one "
                                  f"vocabulary")
        if _directions(cfg.data) != _directions(configs[0].data):  # each must read the same tags, or none
            raise CheckpointError(f"{other}: translates {', '.join(direction_names(cfg.data))}, {paths[0]} "
                                  f"{', '.join(direction_names(configs[0].data))}; an ensemble's models translate "
                                  f"alike, with language tags or without")
    members = [(cfg.model, state["model"], p) for cfg, state, p in zip(configs, states, paths)]
    return StoredModel(configs[0], tokenizer, members, states[0].get("dataset"))


def read_release_folder(directory: Path) -> StoredModel:
    """The model of a release folder written by ``transformer-export`` (`transformer.release_format`)."""
    cfg, weights, dataset, _ = read_release(directory)
    return StoredModel(cfg, Tokenizer.load(directory, cfg.data), [(cfg.model, weights, directory / WEIGHTS)], dataset)


def prepare_model(stored: StoredModel, device: str | None, dtype: str, quantize: str | None,
                  fast_paths: bool) -> tuple[nn.Module, torch.device]:
    """The stored model (an `Ensemble` of several) in eval mode on its device, in ``dtype`` or int8, with
    `transformer.fast`'s inference paths where ``fast_paths``; and that device."""
    target = select_device(device or "auto", setting="device")
    models = [build_model(model_cfg, stored.tokenizer, weights, where) for model_cfg, weights, where in stored.members]
    model = models[0] if len(models) == 1 else Ensemble(models)
    model.eval()
    if quantize == "int8":
        model, target = quantize_int8(model), torch.device("cpu")
    elif dtype == "bf16":  # weights in bf16 too: autocast would cast activations around every layer
        model = model.to(torch.bfloat16)
    if fast_paths:
        fast.for_inference(model, target)
    return model.to(target), target


def _directions(data: DataConfig) -> tuple[set[tuple[str, str]], bool]:
    """The directions a model translates, in any order, and whether it reads language tags (multilingual)."""
    return set(directions(data)), bool(data.pairs)
