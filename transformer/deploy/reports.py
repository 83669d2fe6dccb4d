"""Evaluation reports (``transformer-evaluate --report``) as a release reads them: checked, and matched to the
checkpoint they scored, so that another model's scores never go on a model's card or ``GET /model``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformer.config import DataConfig
from transformer.errors import InputError


def read_report(path: Path) -> dict[str, Any]:
    """A ``transformer-evaluate --report`` JSON, or a one-line InputError naming the file."""
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise InputError(f"cannot read report {path}: {error.strerror}") from None
    except ValueError:
        raise InputError(f"{path}: not a JSON file") from None
    if not isinstance(report, dict) or not isinstance(report.get("scores"), dict):
        raise InputError(f"{path}: not a transformer-evaluate report (no 'scores')")
    if not report["scores"]:  # a card would show a Scores section without scores
        raise InputError(f"{path}: its 'scores' are empty")
    for name, value in report["scores"].items():  # a report edited by hand; the card would fail on it
        if not (isinstance(value, dict) and _is_number(value.get("score")) and isinstance(value.get("signature"), str)):
            raise InputError(f"{path}: score {name!r} is not a transformer-evaluate score (a number 'score' and a "
                             f"'signature')")
    if not isinstance(report.get("decoding", {}), dict):
        raise InputError(f"{path}: its 'decoding' is not a mapping of settings")
    return report


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_report_of(report: dict[str, Any], checkpoint: Path, step: int | None, weights: str) -> bool:
    """Whether ``report`` scored ``checkpoint``: a checkpoint alone (not an ensemble it was part of, not a folder or
    files of translations) with its ``weights`` (`tensor_checksum` of them), whatever the file was called
    (checkpoint_best.pt and checkpoint_last.pt are copies of numbered ones); a report without them (an older
    one), that file's name at its training ``step`` where both are known (a checkpoint_best.pt saved again
    since is another model)."""
    scored = report.get("checkpoint")
    if not isinstance(scored, str):
        return False
    if "weights" in report:  # runs of one sweep save files of the same name at the same step: the weights tell
        return report["weights"] == weights
    return Path(scored).name == Path(checkpoint).name and (step is None or report.get("step", step) == step)


def read_report_of(path: Path, checkpoint: Path, step: int | None, weights: str) -> dict[str, Any]:
    """The report at ``path``, refused with a one-line InputError unless it scored ``checkpoint`` (`is_report_of`):
    another model's scores must not go on this one's card."""
    report = read_report(path)
    if not is_report_of(report, checkpoint, step, weights):
        raise InputError(f"{path}: scores {_scored(report)}, not {checkpoint} at step {step}; give a "
                         f"transformer-evaluate --report of this checkpoint")
    return report


def _scored(report: dict[str, Any]) -> str:
    """What a report scored, in words: a checkpoint at a step, an ensemble, a model folder or translation files."""
    scored = report.get("checkpoint")
    if isinstance(scored, str):
        return f"{scored} at step {report.get('step')}"
    if scored:
        return "an ensemble"
    return f"the folder {report['model']}" if report.get("model") else "translation files"


def find_report(checkpoint: Path, step: int | None, weights: str, data: DataConfig) -> dict[str, Any] | None:
    """The evaluation report beside ``checkpoint`` that scored it (`is_report_of`), if any: of the model's
    default direction (``data.src_lang``→``data.tgt_lang``) where a multilingual model has reports of several,
    not whichever direction, zero-shot perhaps, was scored last; the newest of them."""
    reports = []
    for path in sorted(checkpoint.parent.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            report = read_report(path)
        except InputError:
            continue  # other JSON files are no reports
        if is_report_of(report, checkpoint, step, weights):
            reports.append(report)
    default = f"{data.src_lang}→{data.tgt_lang}"
    return next((r for r in reports if scored_direction(r, data) == default), reports[0] if reports else None)


def scored_direction(report: dict[str, Any], data: DataConfig) -> str:
    """The direction a report scored, such as "de→en" (older reports: the model's default one)."""
    return f"{report.get('src_lang', data.src_lang)}→{report.get('tgt_lang', data.tgt_lang)}"
