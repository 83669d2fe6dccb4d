"""What ``GET /model`` says: languages, the model's and the decoding settings, the training data's name, and the
scores reported for the model. What a client needs, and no path of the server's disk: the files the model
was loaded from and the corpus's folder are the server's business."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from torch import nn

from transformer.checkpoint import load_checkpoint, tensor_checksum
from transformer.config import DataConfig
from transformer.data.corpus import dataset_name
from transformer.data.languages import direction_names, directions, target_languages
from transformer.deploy.card import card_scores
from transformer.deploy.reports import find_report, scored_direction
from transformer.engine import Engine
from transformer.runtime.int8 import Int8Linear


def describe(translator: Engine, engine: str, checkpoints: list[str] | None = None,
             model: str | None = None) -> dict[str, Any]:
    """The description of an engine (``engine``: its --engine name) loaded from
    ``checkpoints`` (several: an ensemble, described by its first model) or from the folder ``model``."""
    data = translator.data_config()
    checkpoint = checkpoints[0] if checkpoints and len(checkpoints) == 1 else None
    scores, scored = reported_scores(checkpoint, model, data)
    source, target = source_and_target(data)
    return {"source_language": source, "target_language": target,
            "directions": direction_names(data),
            "target_languages": target_languages(data) if data.pairs else [], "engine": engine,
            "precision": translator.precision, "quantize": quantized(translator),
            "training_data": translator.training_data or (dataset_name(data) if data.dataset else None),
            "max_source_length": translator.max_source_length, "model": asdict(translator.model_config),
            "decode": asdict(translator.decode), "scores": scores, "scores_direction": scored}


def source_and_target(data: DataConfig) -> tuple[str | None, str | None]:
    """The model's source and target language, each None where a multilingual model has several: a request then
    names its target language (tgt_lang), or is refused."""
    sources, targets = (list(dict.fromkeys(languages)) for languages in zip(*directions(data)))
    return sources[0] if len(sources) == 1 else None, targets[0] if len(targets) == 1 else None


def quantized(translator: Engine) -> str | None:
    """"int8" for a torch model quantized by --quantize int8, else None: its precision says "fp32" (the
    activations'), and a client comparing its scores with a report's must know its weights are int8."""
    model = getattr(translator, "model", None)
    if isinstance(model, nn.Module) and any(isinstance(module, Int8Linear) for module in model.modules()):
        return "int8"
    return None


def reported_scores(checkpoint: str | None, model: str | None,
                    data: DataConfig) -> tuple[dict[str, dict[str, Any]], str | None]:
    """The scores of the ``transformer-evaluate --report`` beside a checkpoint that scored it at its training step
    (`find_report`, as the model card's), or in the front matter of a release folder's model card:
    {"bleu": {"score": ..., "signature": ...}, ...}, and the direction they were measured in ("de→en": a
    multilingual model's may be any of its directions); ({}, None) when none is known."""
    if checkpoint:
        state = load_checkpoint(checkpoint)
        report = find_report(Path(checkpoint), state.get("step"), tensor_checksum(state["model"]), data)
        return (report["scores"], scored_direction(report, data)) if report else ({}, None)
    return card_scores(Path(model)) if model else ({}, None)
