"""Scoring with sacreBLEU: BLEU, chrF and TER on detokenized text, with signatures (BLEU and chrF cased;
TER, as sacreBLEU's default, ignores case).

One function, `score_translations`, scores both validation during training and the
``transformer-evaluate`` command, so the two never disagree.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from sacrebleu.metrics import BLEU, CHRF, TER

from transformer.atomic_file import write_output
from transformer.data.textio import STDIN, read_lines, split_lines
from transformer.errors import InputError


class EvaluationError(InputError):
    """Hypotheses and references cannot be scored together (different line counts, or none to score)."""


@dataclass
class Score:
    name: str
    score: float
    signature: str
    text: str  # sacreBLEU's one-line rendering, e.g. "BLEU = 38.2 70.1/45.3/..."

    def as_dict(self) -> dict:
        return {"score": round(self.score, 4), "signature": self.signature, "text": self.text}


def score_translations(hypotheses: list[str], references: list[list[str]]) -> dict[str, Score]:
    """Corpus BLEU, chrF and TER of ``hypotheses`` against one or more reference streams."""
    if not hypotheses:
        raise EvaluationError("nothing to score: no hypotheses")
    for i, stream in enumerate(references):
        if len(stream) != len(hypotheses):
            raise EvaluationError(f"reference set {i + 1} has {len(stream)} lines but there are "
                                  f"{len(hypotheses)} hypotheses")
    scores = {}
    for name, metric in (("bleu", BLEU()), ("chrf", CHRF()), ("ter", TER())):
        result = metric.corpus_score(hypotheses, references)
        scores[name] = Score(name, result.score, str(metric.get_signature()), str(result))
    return scores


def score_files(hypothesis_file: str | Path, reference_files: list[str | Path]) -> dict[str, Score]:
    """Score a hypothesis file against reference files, each line-aligned with it; "-" is standard input, as
    sacreBLEU reads translations piped into it (one of the files at most)."""
    if [str(path) for path in (hypothesis_file, *reference_files)].count(STDIN) > 1:
        raise EvaluationError("standard input ('-') can be one of the files, not several")
    names = {path: "stdin" if str(path) == STDIN else path for path in (hypothesis_file, *reference_files)}
    hypotheses = _read(hypothesis_file)
    if not hypotheses:
        raise EvaluationError(f"{names[hypothesis_file]}: empty, nothing to score")
    references = []
    for path in reference_files:
        lines = _read(path)
        if len(lines) != len(hypotheses):
            raise EvaluationError(f"{names[hypothesis_file]} has {len(hypotheses)} lines but {names[path]} has "
                                  f"{len(lines)}")
        references.append(lines)
    return score_translations(hypotheses, references)


def _read(path: str | Path) -> list[str]:
    """The lines of ``path``, or of standard input for "-"."""
    return split_lines(sys.stdin.buffer.read(), "stdin") if str(path) == STDIN else read_lines(path)


def write_report(path: str | Path, scores: dict[str, Score], **details) -> None:
    """Write scores, signatures and the settings that produced them as JSON."""
    report = {"scores": {name: score.as_dict() for name, score in scores.items()}, **details}
    write_output(path, json.dumps(report, indent=2, ensure_ascii=False) + "\n")  # whole or not at all


def format_scores(scores: dict[str, Score]) -> str:
    """One line per metric: score and signature."""
    return "\n".join(f"{s.text}\n  signature: {s.signature}" for s in scores.values())
