"""transformer-evaluate: translate a split with a model (any engine, as `transformer.cli.model_options` loads it) and
score it with sacreBLEU, or score translation files; ``--report`` writes the scores as JSON."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformer.cli.model_options import (
    DECODE_ALIASES,
    OVERRIDE,
    add_decode_aliases,
    add_model_options,
    add_runtime_options,
    decode_overrides,
    load_translator,
    model_files,
)
from transformer.cli.output import EXIT_BROKEN_PIPE, check_output, silence_stdout, unwritable, write_stdout
from transformer.cli.paths import GivenOnce, path_argument
from transformer.data.textio import STDIN
from transformer.errors import DataError, InputError

if TYPE_CHECKING:  # imported lazily below: the command starts faster
    from transformer.evaluate import Score


def evaluate_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="transformer-evaluate",
                                     description="Score translations with sacreBLEU (BLEU, chrF, TER).")
    parser.add_argument("--hypotheses", type=path_argument, action=GivenOnce,
                        help="file of translations, one per line ('-': standard input)")
    parser.add_argument("--references", nargs="+", type=path_argument, action="extend",  # given twice: both
                        help="reference files, line-aligned with the hypotheses")
    add_model_options(parser)  # translate a split with it, then score that
    parser.add_argument("--split", help="split to translate with the model (default: the config's data.test_split)")
    parser.add_argument("--dataset", type=path_argument, action=GivenOnce,
                        help="corpus to take the split from (default: the config's data.dataset)")
    parser.add_argument("--src-lang", help="with --tgt-lang, the direction of a multilingual model to score "
                                           "(default: the config's data.src_lang and data.tgt_lang)")
    parser.add_argument("--tgt-lang", help="see --src-lang")
    parser.add_argument("overrides", nargs="*", default=[], help="decode.key=value settings, e.g. decode.beam_size=5")
    add_decode_aliases(parser)
    add_runtime_options(parser)
    parser.add_argument("--output", type=path_argument, action=GivenOnce,
                        help="also write the translations to this file")
    parser.add_argument("--report", type=path_argument, action=GivenOnce,
                        help="write scores, signatures and settings as JSON")
    return parser


def _refuse_model_options(args: argparse.Namespace) -> None:
    """Scoring files, a setting of the translation it does not make would be dropped without a word (a --split or
    --beam-size given to score another split or search): one line naming it, as for decode.key=value."""
    names = (*DECODE_ALIASES, "split", "dataset", "src_lang", "tgt_lang", "output", "quantize", "device")
    given = [f"--{name.replace('_', '-')}" for name in names if getattr(args, name) is not None]
    given += [option for option, default in (("--dtype", "fp32"), ("--engine", "torch"), ("--threads", 0),
                                             ("--workers", 1)) if getattr(args, option[2:]) != default]
    if given:
        raise InputError(f"{given[0]} is for translating a split with --checkpoint or --model; --hypotheses and "
                         f"--references score translations already made")


def evaluate_main(args: argparse.Namespace) -> int:
    from transformer.evaluate import format_scores, write_report

    # --references takes several files, and with them a decode.key=value that follows: a setting, not a file
    settings = [item for item in args.references or [] if OVERRIDE.match(item)]
    args.references = args.references and [item for item in args.references if item not in settings]
    args.overrides = [*args.overrides, *settings]
    if (args.checkpoint or args.model) and (args.hypotheses or args.references):
        raise InputError("--hypotheses and --references score translations already made: give them without "
                         "--checkpoint or --model, which translate a split to score")
    # a write that fails (a full disk) loses no scores: they are printed all the same, then the error
    unwritten: list[InputError] = []
    if args.checkpoint or args.model:
        scores, details = _score_split(args, unwritten)
    elif args.overrides:
        raise InputError(f"decoding settings ({args.overrides[0]}) need --checkpoint or --model")
    elif args.hypotheses and args.references:
        scores, details = _score_files(args)
    else:
        raise InputError("give --hypotheses and --references, or --checkpoint or --model (and --split)")
    if args.report:  # before printing: a reader that closes stdout early (| head -1) loses no report
        try:
            write_report(args.report, scores, **details)
        except OSError as error:
            unwritten.append(unwritable("--report", args.report, error))
    try:
        write_stdout(format_scores(scores) + "\n", "the scores")
    except BrokenPipeError:  # the reader's choice, as for transformer-translate: no "error: [Errno 32]"
        silence_stdout()
        if not unwritten:
            return EXIT_BROKEN_PIPE
    if unwritten:  # on stderr, which the reader did not close
        raise InputError("; ".join(str(error) for error in unwritten))
    return 0


def _score_split(args: argparse.Namespace, unwritten: list[InputError]) -> tuple[dict[str, Score], dict[str, Any]]:
    """Translate a split with the model of ``args`` (written to --output, or the failure kept in ``unwritten``) and
    score it: the scores, and what the report says scored them."""
    from transformer.atomic_file import write_output
    from transformer.checkpoint import load_checkpoint, tensor_checksum
    from transformer.data.corpus import corpus_files
    from transformer.data.languages import one_direction
    from transformer.data.loading import HubError
    from transformer.data.prepare import load_texts
    from transformer.evaluate import score_translations

    if STDIN in (args.output, args.report):  # before the model loads
        raise InputError(f"{'--output' if args.output == STDIN else '--report'} -: standard output holds the scores; "
                         f"give a file")
    overrides = decode_overrides(args, args.overrides)
    nbest = [item for item in overrides if item.startswith("decode.nbest=") and item != "decode.nbest=1"]
    if nbest:  # else translated and recorded in the report, and unused
        raise InputError(f"{nbest[0]}: evaluate scores the best translation of each sentence; drop it "
                         f"(transformer-translate --nbest writes n-best lists)")
    translator = load_translator(args, overrides)
    data_cfg = one_direction(translator.data_config(args.dataset), args.src_lang, args.tgt_lang)
    split = data_cfg.test_split if args.split is None else args.split  # --split "": an unknown split, said so
    if args.output or args.report:
        reads = [*model_files(args), *corpus_files(data_cfg, split)]
        check_output(args.output, "--output", reads)
        check_output(args.report, "--report", [*reads, *filter(None, [args.output])])
    # a release folder stays as shipped
    cache = Path(args.checkpoint[0]).parent / "cache" if args.checkpoint else None
    try:
        sources, references = load_texts(data_cfg, split, cache)
    except HubError as error:
        if args.dataset:
            raise
        # the model's own corpus: a relative data.dataset leads elsewhere from another folder, and here it is an option
        raise DataError(f"cannot load the model's corpus, data.dataset={data_cfg.dataset!r} in its config "
                        f"({error.reason}): give it with --dataset DIR") from None
    if translator.data_config().pairs:  # which of its directions is scored (the config's default one, unless told)
        print(f"scoring {data_cfg.src_lang}→{data_cfg.tgt_lang} on split {split}", file=sys.stderr)
    hypotheses = translator.translate(sources, progress=True, tgt_lang=data_cfg.tgt_lang)
    if args.output:  # at once: what goes wrong after it loses no translations
        try:
            write_output(args.output, "".join(h + "\n" for h in hypotheses))
        except OSError as error:
            unwritten.append(unwritable("--output", args.output, error))
    scores = score_translations(hypotheses, [references])
    checkpoints = args.checkpoint[0] if args.checkpoint and len(args.checkpoint) == 1 else args.checkpoint
    source = {"checkpoint": checkpoints} if args.checkpoint else {"model": args.model}
    if isinstance(checkpoints, str):  # which model scored this: for scripts/results_table.py, the model card
        state = load_checkpoint(checkpoints)
        source.update(step=state["step"], weights=tensor_checksum(state["model"]))
    details = {**source, "engine": translator.name, "data": data_cfg.dataset, "split": split,
               "src_lang": data_cfg.src_lang, "tgt_lang": data_cfg.tgt_lang,
               "decoding": {**asdict(translator.decode), "precision": translator.precision,
                            "quantize": args.quantize}}
    return scores, details


def _score_files(args: argparse.Namespace) -> tuple[dict[str, Score], dict[str, Any]]:
    """Score the translations of ``--hypotheses`` against ``--references``: the scores, and what the report says."""
    from transformer.evaluate import score_files

    _refuse_model_options(args)
    check_output(args.report, "--report", [args.hypotheses, *args.references])
    return score_files(args.hypotheses, args.references), {"hypotheses": args.hypotheses, "references": args.references}
