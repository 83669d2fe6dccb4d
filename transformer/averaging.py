"""Checkpoint averaging (§6.1: "averaging the last 5 checkpoints"): the parameters of several checkpoints of one
model and corpus, averaged into one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from transformer.checkpoint import (
    CheckpointError,
    corpus_difference,
    load_checkpoint,
    model_difference,
    tensor_checksum,
)


def _difference(first: dict[str, Any], other: dict[str, Any]) -> str | None:
    """How ``other`` differs from ``first`` as a model to average with it, as ``section.key=other's, not first's``:
    any model setting (dropout too: two runs, not one), a corpus setting, or the corpus."""
    config, other_config = first.get("config") or {}, other.get("config") or {}
    difference = model_difference(config.get("model") or {}, other_config.get("model") or {}, free=())
    section = "model"
    if difference is None:
        difference, section = corpus_difference(config.get("data") or {}, other_config.get("data") or {}), "data"
    for key in ("corpus", "tokenizer_fingerprint"):  # recorded by this version's checkpoints
        if difference is None and None not in (first.get(key), other.get(key)) and first[key] != other[key]:
            difference, section = (key, first[key], other[key]), "training"
    if difference is None:
        return None
    key, mine, theirs = difference
    return f"{section}.{key}={theirs!r}, not {mine!r}"


def average_checkpoints(paths: list[Path]) -> dict[str, Any]:
    """Average the model parameters of several checkpoints (Vaswani et al. §6.1 average the last 5 or 20).

    Only checkpoints of one model and corpus average to a model: the same model and corpus settings and corpus
    (`_difference`) and parameters; anything else is refused (and the tokenizers beside them: `tokenizer_beside`).
    Returns the newest checkpoint's entries with the averaged model and no optimizer state.
    """
    if not paths:
        raise CheckpointError("no checkpoints to average")
    states = [load_checkpoint(p) for p in paths]
    first, seen = states[0], {}
    for path, state in zip(paths, states):
        difference = _difference(first, state)
        if difference:
            raise CheckpointError(f"{path}: another model or corpus than {paths[0]} ({difference}); cannot average")
        shapes = {key: tuple(tensor.shape) for key, tensor in state["model"].items()}
        if shapes != {key: tuple(tensor.shape) for key, tensor in first["model"].items()}:
            raise CheckpointError(f"{path}: parameters differ from {paths[0]}'s (names or shapes); cannot average")
        weights = tensor_checksum(state["model"])
        if weights in seen:  # it would count double in the mean
            raise CheckpointError(f"{path}: the same weights as {seen[weights]} (checkpoint_last.pt and "
                                  f"checkpoint_best.pt are copies of numbered ones); give each checkpoint once")
        seen[weights] = path
    averaged: dict[str, Any] = {}
    tied: dict[tuple, torch.Tensor] = {}  # tied matrices (embeddings, output projection) are one tensor: averaged once,
    for key, tensor in first["model"].items():  # and kept one, so that a release stores and counts them once
        place = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.stride())
        if place in tied:
            averaged[key] = tied[place]
            continue
        tensors = [s["model"][key] for s in states]
        if tensors[0].is_floating_point():
            averaged[key] = (sum(t.double() for t in tensors) / len(tensors)).to(tensors[0].dtype)
        else:
            averaged[key] = tensors[-1]
        tied[place] = averaged[key]
    newest = max(states, key=lambda s: s.get("step", 0))
    kept_keys = ("config", "tokenizer_files", "tokenizer_fingerprint", "corpus", "dataset", "parent", "step",
                 "epoch")
    kept = {k: v for k, v in newest.items() if k in kept_keys}
    return {**kept, "model": averaged, "averaged_from": [str(p) for p in paths]}
