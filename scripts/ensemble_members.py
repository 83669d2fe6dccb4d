"""What scripts/run_ensemble_recipe.sh reads of its members' finished recipes (RUN/seed_K): the checkpoint each chose
on validation (the one its test report scored), that checkpoint's validation BLEU, and the wall time of the trainings
side by side (the first member's start to the last one's end, from their metrics.jsonl); with --best, which scores
highest on validation, the ensemble (RUN/VALID.ensemble.json) or a member.

Usage: python scripts/ensemble_members.py RUN VALID TEST MEMBERS [--best]
Prints the members' validation BLEU, the training's wall time and steps, then each chosen checkpoint, a line each;
with --best, ``ensemble`` or the best member's folder name.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from transformer.training.metrics import read_metrics


def bleu(report: Path) -> float:
    return json.loads(report.read_text())["scores"]["bleu"]["score"]


def chosen_checkpoint(member: Path, test: str) -> Path:
    """The checkpoint the member's recipe chose on validation: the one its test report scored."""
    return Path(json.loads((member / f"{test}.json").read_text())["checkpoint"])


def validation_bleu(member: Path, valid: str, test: str) -> float:
    """The validation BLEU of the member's chosen checkpoint (``checkpoint_NAME.pt`` -> ``VALID.NAME.json``)."""
    name = chosen_checkpoint(member, test).stem.removeprefix("checkpoint_")
    return bleu(member / f"{valid}.{name}.json")


def check_one_tokenizer(members: list[Path]) -> None:
    """The members' tokenizer files are the same bytes (an ensemble reads one vocabulary), else one line naming them."""
    files = sorted(path.name for path in members[0].glob("spm*.model"))
    for member in members[1:]:
        for name in files:
            if (member / name).read_bytes() != (members[0] / name).read_bytes():
                raise SystemExit(f"error: {member / name} differs from {members[0] / name}: the members' tokenizers "
                                 f"were trained on other samples of the corpus, and an ensemble needs one vocabulary; "
                                 f"set data.spm_input_sentence_size to cover the corpus (0: all of it)")


def training_time(members: list[Path]) -> str:
    """Seconds from the first member's start of training to the last one's end, and each member's steps."""
    records = [read_metrics(member) for member in members]
    start = min(r["time"] for run in records for r in run if r["kind"] == "session")
    end = max(r["time"] for run in records for r in run if r["kind"] == "stop")
    steps = [max(r["step"] for r in run if r["kind"] == "stop") for run in records]
    return f"{end - start:.1f} s from the first member's start to the last one's end, {steps} steps"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("valid")
    parser.add_argument("test")
    parser.add_argument("members", type=int)
    parser.add_argument("--best", action="store_true", help="print which scores highest on validation")
    args = parser.parse_args()
    members = [args.run / f"seed_{k}" for k in range(1, args.members + 1)]
    scores = {member.name: validation_bleu(member, args.valid, args.test) for member in members}
    if args.best:
        scores["ensemble"] = bleu(args.run / f"{args.valid}.ensemble.json")
        print(max(scores, key=lambda name: (scores[name], name != "ensemble")))  # a tie: the member (one model)
        return 0
    check_one_tokenizer(members)
    print(", ".join(f"{name} {score:.2f}" for name, score in scores.items()))
    print(training_time(members))
    for member in members:
        print(chosen_checkpoint(member, args.test))
    return 0


if __name__ == "__main__":
    sys.exit(main())
