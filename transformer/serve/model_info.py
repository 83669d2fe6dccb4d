"""What ``GET /model`` says: languages, the model's and the decoding settings, and the scores reported for it."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from transformer.checkpoint import CheckpointError


def describe(translator: Any, engine: str, checkpoints: list[str] | None = None,
             model: str | None = None) -> dict[str, Any]:
    """The description of a `Translator` (``engine`` torch) or `CTranslate2Translator` loaded from
    ``checkpoints`` (several: an ensemble, described by its first model) or from the folder ``model``."""
    data = translator.data_config()
    model_config = translator.model.cfg if engine == "torch" else translator.cfg.model
    checkpoint = checkpoints[0] if checkpoints and len(checkpoints) == 1 else None
    return {"source_language": data.src_lang, "target_language": data.tgt_lang, "engine": engine,
            "precision": translator.precision, "loaded_from": checkpoint or checkpoints or model,
            "training_data": data.dataset, "max_source_length": translator.max_source_length,
            "model": asdict(model_config), "decode": asdict(translator.decode),
            "scores": reported_scores(checkpoint, model)}


def reported_scores(checkpoint: str | None, model: str | None) -> dict[str, dict[str, Any]]:
    """The scores of the newest ``transformer-evaluate --report`` beside a checkpoint, or of a release
    folder's model card: {"bleu": {"score": ..., "signature": ...}, ...}; {} when none is known."""
    try:
        from transformer.deploy.release import card_scores, find_report
    except CheckpointError:  # safetensors (the export extra) is missing: no release folders, no reports
        return {}
    if checkpoint:
        report = find_report(Path(checkpoint))
        return report["scores"] if report else {}
    return card_scores(Path(model)) if model else {}
