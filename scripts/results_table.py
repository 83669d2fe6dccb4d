"""The results tables, regenerated from the run directories that `run_recipe.sh` (or `demo.sh`) filled.

Every figure comes from the run's own records, never from a checkpoint, so that the small files
can be kept in docs/runs/ after the checkpoints are gone: scores, signatures, the search and the
chosen checkpoint's step from the test report, its rivals from the validation reports, the CPU or
GPU, its flags, precision, threads and parameter count from the ``session`` records training writes
at each start or resume, steps and training time from its ``stop`` record, the command from
``command.txt``. Nothing is typed in by hand.

The README's table reads at a glance: direction and test set, BLEU / chrF, the search that scored
them, the training budget, the machine in a few words, and the command as a user runs it (without
the run folder and corpus paths of the machine that trained it: the config's defaults find them).
``--detail`` prints the full table of docs/results.md instead: run, TER, parameters, steps, every
CPU flag, the checkpoint validation chose, and the command as it was recorded. A folder of
`run_ensemble_recipe.sh` (members in seed_K) is one row: its members' records, and the ensemble's.

Usage: python scripts/results_table.py RUN_DIR [RUN_DIR ...] [--detail] [--curves DIR]
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from recipe_settings import ensemble_members

from transformer.cli import USER_ERRORS
from transformer.config import Config
from transformer.config_loading import load_config
from transformer.deploy.reports import read_report
from transformer.errors import InputError
from transformer.plots import plot_training_curves
from transformer.runtime.machine import machine_brief, machine_text
from transformer.training.metrics import read_metrics

HEADER = ["direction, test set", "BLEU / chrF", "beam, length penalty", "training", "machine", "command"]
DETAIL_HEADER = ["run", "BLEU", "chrF2", "TER", "params", "training", "machine", "checkpoint", "command"]
MACHINE_PATHS = ("train.run_dir=", "data.dataset=/")  # where the run was written, an absolute corpus path


class RecordError(Exception):
    """A run's records are missing, damaged or not a recipe's: one line, exit status 2 (the user's to mend)."""


@dataclass
class Run:
    """What a finished run's records say."""

    name: str
    cfg: Config
    test: dict  # the test split's report
    valid: dict[str, dict]  # the validation reports of the recipe's candidates: by checkpoint name (an ensemble's:
    # "ensemble", then each member's choice by its folder's name)
    sessions: list[dict]
    stop: dict
    command: str
    curves: Path  # the folder whose metrics.jsonl the curves are drawn from (an ensemble's first member)
    member_steps: list[int] = field(default_factory=list)  # an ensemble's members' steps; empty for one model

    @property
    def test_is_validation(self) -> bool:
        """A corpus without a test split (Tatoeba here) is scored on the split that chose its checkpoint."""
        return self.cfg.data.test_split == self.cfg.data.valid_split


# what the tables read of a test report, and of a validation one
REPORT_KEYS = ("scores.bleu.score", "scores.chrf.score", "checkpoint", "step", "decoding.beam_size",
               "decoding.length_penalty")
VALID_KEYS = ("scores.bleu.score",)


def read_json(path: Path, keys: tuple[str, ...] = VALID_KEYS, ensemble: bool = False) -> dict:
    """A report of transformer-evaluate with the entries ``keys`` (dotted: ``scores.bleu.score``); one that is cut
    short, edited, or was not written for a checkpoint (scored files, a release folder), is one line naming it, not
    a traceback. With ``ensemble``, the checkpoint may be a list (then the report has no step)."""
    if not path.is_file():
        raise RecordError(f"{path} is missing: run the recipe (scripts/run_recipe.sh) or scripts/demo.sh first")
    try:
        report = read_report(path)  # a JSON report with scores, as the model card reads it
    except InputError as error:
        raise RecordError(f"{error}; score the run again") from None
    for key in keys:
        value = report
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if ensemble and key in ("checkpoint", "step") and isinstance(report.get("checkpoint"), list):
            continue
        wanted = str if key == "checkpoint" else int if key == "step" else (int, float)
        if not isinstance(value, wanted) or isinstance(value, bool):  # an ensemble's checkpoint is a list
            found = "no" if value is None else f"a {type(value).__name__} for"
            raise RecordError(f"{path}: {found} {key!r} in it; not a report of transformer-evaluate "
                              f"--checkpoint with one checkpoint: score the run again as the recipe does")
    return report


def read_run(run_dir: Path) -> Run:
    members = ensemble_members(run_dir)
    if members and not (run_dir / "config.yaml").is_file():
        return read_ensemble(run_dir, members)
    if not (run_dir / "config.yaml").is_file():  # said here: load_config's error would be a traceback
        raise RecordError(f"{run_dir}: no config.yaml; give the run directory of a finished recipe")
    try:
        cfg = load_config(run_dir / "config.yaml")
        records = read_metrics(run_dir)
    except USER_ERRORS as error:
        raise RecordError(str(error)) from None
    test = read_json(run_dir / f"{cfg.data.test_split}.json", REPORT_KEYS)
    # the recipe's three candidates (older recipes scored no last checkpoint; demo.sh scores none)
    reports = {name: run_dir / f"{cfg.data.valid_split}.{name}.json" for name in ("best", "averaged", "last")}
    valid = {name: read_json(path) for name, path in reports.items() if path.is_file()}
    sessions = [r for r in records if r["kind"] == "session"]
    stops = [r for r in records if r["kind"] == "stop"]
    if not sessions or not stops:
        raise RecordError(f"{run_dir}/metrics.jsonl has no {'stop' if sessions else 'session'} record: "
                          f"training has not finished, or ran on a version that did not write them")
    return Run(run_dir.name, cfg, test, valid, sessions, stops[-1], read_command(run_dir), run_dir)


def read_command(run_dir: Path) -> str:
    """The recipe's command as command.txt records it; a damaged one (not UTF-8, or not a shell command line, which
    `portable_command` splits) is a RecordError naming it."""
    path = run_dir / "command.txt"
    if not path.is_file():
        return "not recorded"
    try:
        command = path.read_text(encoding="utf-8").strip()
        shlex.split(command)
    except (UnicodeDecodeError, ValueError) as error:
        raise RecordError(f"{path}: damaged ({error}); the recipe writes it again when it is re-run") from None
    return command


def read_ensemble(run_dir: Path, member_dirs: list[Path]) -> Run:
    """A `run_ensemble_recipe.sh` folder: its members' runs, and the report of the test split scored by what
    validation chose (the ensemble, or a member); the candidates are the ensemble and each member's choice. The
    members are those the ensemble's report names: a re-run with fewer MEMBERS leaves the others' seed_K folders."""
    first_dir = member_dirs[0]
    first = read_run(first_dir)  # seed_1: a member of every run
    path = run_dir / f"{first.cfg.data.valid_split}.ensemble.json"
    ensemble = read_json(path)
    if not isinstance(ensemble.get("checkpoint"), list):
        raise RecordError(f"{path}: no list of checkpoints in it; not the report of an ensemble: score the run again "
                          f"as the recipe does")
    scored = {Path(checkpoint).parent.name for checkpoint in ensemble["checkpoint"]}
    member_dirs = [member for member in member_dirs if member.name in scored]
    members = [first if member == first_dir else read_run(member) for member in member_dirs]
    cfg, valid = first.cfg, {"ensemble": ensemble}
    for member_dir, member in zip(member_dirs, members):
        chosen = Path(member.test["checkpoint"]).stem.removeprefix("checkpoint_")
        if chosen not in member.valid:  # a KeyError's traceback before
            raise RecordError(f"{member_dir / f'{cfg.data.valid_split}.{chosen}.json'} is missing: the validation "
                              f"report of the checkpoint its test report names")
        valid[member.name] = member.valid[chosen]
    test = read_json(run_dir / f"{cfg.data.test_split}.json", REPORT_KEYS, ensemble=True)
    longest = max(members, key=lambda member: member.stop["elapsed"])
    return Run(run_dir.name, cfg, test, valid, [s for member in members for s in member.sessions], longest.stop,
               read_command(run_dir), members[0].curves, [member.stop["step"] for member in members])


def portable_command(command: str) -> str:
    """The recorded command without this machine's run folder and absolute corpus path."""
    return shlex.join(word for word in shlex.split(command) if not word.startswith(MACHINE_PATHS))


def duration(seconds: float) -> str:
    """``90 s`` for a budget of seconds (a GPU recipe's), ``2 h`` for whole hours, else ``45 min`` (``3 min``)."""
    minutes = seconds / 60
    if minutes < 5 and round(seconds) % 60:
        return f"{seconds:.0f} s"
    return f"{minutes / 60:.0f} h" if minutes >= 90 and round(minutes) % 60 == 0 else f"{minutes:.0f} min"


def budget(run: Run) -> str:
    """The limit that ended training (``2 h``, ``45 min``, ``90 s``, ``4,000 steps``), else its time and steps; an
    ensemble's, and how many models trained at once."""
    time, models = duration(run.stop["elapsed"]), f", {len(run.member_steps)} models at once" * bool(run.member_steps)
    if "max_time" in run.stop.get("reason", ""):
        return time + models
    if "max_steps" in run.stop.get("reason", ""):
        return f"{run.stop['step']:,} steps{models}"
    return f"{time}, {run.stop['step']:,} steps{models}"


def test_set(run: Run) -> str:
    data = run.cfg.data
    split = f"{data.test_split} (no test split)" if run.test_is_validation else data.test_split
    return f"{Path(data.dataset).name} {split}"


def search(run: Run) -> tuple[int, float]:
    """The beam and length penalty that scored the test split."""
    return run.test["decoding"]["beam_size"], run.test["decoding"]["length_penalty"]


def brief_row(run: Run) -> list[str]:
    scores, data = run.test["scores"], run.cfg.data
    machines = " / ".join(sorted({machine_brief(s) for s in run.sessions}))
    return [f"{data.src_lang}→{data.tgt_lang}, {test_set(run)}",
            f"{scores['bleu']['score']:.2f} / {scores['chrf']['score']:.2f}",
            "{}, {}".format(*search(run)), budget(run), machines, f"`{portable_command(run.command)}`"]


def describe_sessions(sessions: list[dict], models: int = 1) -> tuple[str, str]:
    """(training conditions, machine) of the ``session`` records of a run (or of an ensemble's ``models`` runs); each
    distinct machine is named."""
    conditions = sorted({f"{s['precision']}, {s['threads']} thread{'s' * (s['threads'] > 1)}" for s in sessions})
    machines = sorted({machine_text(s) for s in sessions})
    resumed = f", {len(sessions)} sessions" if len(sessions) > models else ""
    return "; ".join(conditions) + resumed, " / ".join(machines)


def detail_row(run: Run) -> list[str]:
    cfg, scores = run.cfg, run.test["scores"]
    conditions, machine = describe_sessions(run.sessions, max(1, len(run.member_steps)))
    valid_bleu = ", ".join(f"{name} {report['scores']['bleu']['score']:.2f}" for name, report in run.valid.items())
    searched = "beam {}, length penalty {}".format(*search(run))
    choice = (f"validation BLEU, {searched}: {valid_bleu}" if run.valid else
              f"best on validation during training, {cfg.train.best_metric}; test: {searched}")
    checkpoint = run.test["checkpoint"]
    if isinstance(checkpoint, list):
        chosen = f"the ensemble of the {len(checkpoint)} members' choices"
    else:
        member = f"{Path(checkpoint).parent.name}'s " if run.member_steps else ""
        chosen = f"{member}{Path(checkpoint).stem.removeprefix('checkpoint_')}, step {run.test['step']:,}"
    same_split = "; chosen on the split it is scored on" if run.test_is_validation else ""
    data = cfg.data
    steps = (f"{len(run.member_steps)} members at once, {' / '.join(f'{n:,}' for n in run.member_steps)} steps"
             if run.member_steps else f"{run.stop['step']:,} steps")
    size = f"{len(run.member_steps)} × " if run.member_steps else ""
    return [f"{run.name}: {Path(data.dataset).name} {data.src_lang}→{data.tgt_lang} ({data.test_split})",
            f"{scores['bleu']['score']:.2f}", f"{scores['chrf']['score']:.2f}", f"{scores['ter']['score']:.2f}",
            f"{size}{parameter_count(run.sessions[-1]['parameters'])} (d {cfg.model.d_model}, "
            f"{cfg.model.n_encoder_layers}+{cfg.model.n_decoder_layers} layers, {data.vocab_size / 1000:g}k "
            f"{'joint' if data.joint_vocab else 'separate'} vocab)",
            f"{duration(run.stop['elapsed'])}, {steps}, {conditions}",
            machine,
            f"{chosen} ({choice}){same_split}",
            f"`{run.command}`"]


def parameter_count(parameters: int) -> str:
    """60.5M, or 34k for a model under 100k parameters (which 0.0M would hide)."""
    return f"{parameters / 1e6:.1f}M" if parameters >= 100_000 else f"{parameters / 1e3:.0f}k"


def curve_names(run_dirs: list[Path]) -> list[str]:
    """Each run's plot name: its folder's name, with as many parent folders as tell it from another run's
    (runs/a/run and runs/b/run draw a_run.png and b_run.png; the second overwrote the first before)."""
    parts = [run_dir.resolve().parts for run_dir in run_dirs]
    depths = [1] * len(parts)
    while True:
        names = ["_".join(p[-depth:]).lstrip("/") for p, depth in zip(parts, depths)]
        clashing = [i for i, name in enumerate(names)
                    if names.count(name) > 1 and depths[i] < len(parts[i]) and parts.count(parts[i]) == 1]
        if not clashing:  # the same folder given twice draws one plot
            return names
        for i in clashing:
            depths[i] += 1


def draw_curves(runs: list[Run], names: list[str], folder: Path) -> None:
    """Each run's training curves as folder/<name>.png."""
    if folder.exists() and not folder.is_dir():  # mkdir said "[Errno 17] File exists"
        raise RecordError(f"--curves {folder}: a file, not a folder; give the folder the plots go to")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for run, name in zip(runs, names):
            print(f"curves: {plot_training_curves(run.curves, folder / f'{name}.png')}", file=sys.stderr)
    except USER_ERRORS as error:  # a folder that cannot be written (a traceback before)
        raise RecordError(f"--curves: {error}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories of finished recipes")
    parser.add_argument("--detail", action="store_true", help="the full table of docs/results.md")
    parser.add_argument("--curves", type=Path, help="also draw each run's training curves as DIR/<run>.png "
                        "(with its parents' names where two runs share a name)")
    args = parser.parse_args(argv)
    try:
        runs = [read_run(run_dir) for run_dir in args.runs]
        if args.curves:
            draw_curves(runs, curve_names(args.runs), args.curves)
    except RecordError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    header, row = (DETAIL_HEADER, detail_row) if args.detail else (HEADER, brief_row)
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for run in runs:
        print("| " + " | ".join(row(run)) + " |")
    signatures = [run.test["scores"] for run in runs]
    for name in ("bleu", "chrf", "ter") if args.detail else ("bleu", "chrf"):  # the scores the table shows
        print(f"\n{name}: " + " / ".join(sorted({f'`{scores[name]["signature"]}`' for scores in signatures})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
