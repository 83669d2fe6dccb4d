"""Command-line entry points: train, translate, evaluate, average, plot.

Each is a console script (``transformer-train`` ...) and a subcommand of ``python -m transformer``.
User mistakes (bad config, data, checkpoint or file) print one line naming the culprit and exit
with status 2; ``--debug`` shows the full traceback instead.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from transformer.checkpoint import CheckpointError
from transformer.config import ConfigError
from transformer.data.files import DataError
from transformer.data.textio import InputError, read_lines, split_lines
from transformer.data.tokenizer import TokenizerError

if TYPE_CHECKING:  # imported lazily below: the commands start faster
    from transformer.decoding.translator import Translator

USER_ERRORS = (ConfigError, DataError, CheckpointError, InputError, TokenizerError, OSError)
EXIT_USAGE = 2


def _run(main: Callable[[argparse.Namespace], int], parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S",
                        stream=sys.stderr)
    from transformer.fast.malloc import keep_freed_memory

    keep_freed_memory()
    try:
        return main(args)
    except USER_ERRORS as error:
        if args.debug:
            raise
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE


# -- train ---------------------------------------------------------------------------------------
def train_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="transformer-train", description="Train a translation model.")
    parser.add_argument("config", help="YAML file with overrides of the defaults")
    parser.add_argument("overrides", nargs="*", help="section.key=value, e.g. train.max_steps=1000")
    parser.add_argument("--resume", nargs="?", const="", default=None, metavar="CHECKPOINT",
                        help="resume from CHECKPOINT (default: the run directory's last checkpoint, "
                             "which is also used automatically when it exists)")
    return parser


def train_main(args: argparse.Namespace) -> int:
    from transformer.config import load_config
    from transformer.training import train

    cfg = load_config(args.config, args.overrides)
    summary = train(cfg, Path(args.resume) if args.resume else None)
    best = "none" if summary.best_score is None else f"{abs(summary.best_score):.2f}"
    print(f"done: {summary.stop_reason}; step {summary.step}; best {summary.best_metric} {best}; "
          f"checkpoint {summary.checkpoint}; {summary.seconds / 60:.1f} min")
    return {"SIGINT": 130, "SIGTERM": 143}.get(summary.signal, 0)  # the shell's codes for these signals


# -- translate -----------------------------------------------------------------------------------
def translate_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="transformer-translate", description="Translate sentences with a checkpoint.")
    parser.add_argument("sentences", nargs="*", help="sentences to translate (default: --input or stdin)")
    parser.add_argument("--checkpoint", required=True, help="checkpoint file; its tokenizer sits beside it")
    parser.add_argument("--input", help="UTF-8 file, one sentence per line")
    parser.add_argument("--output", help="write translations here instead of stdout")
    parser.add_argument("--interactive", action="store_true", help="translate each line as it is typed")
    parser.add_argument("--beam-size", type=int, help="1 = greedy (default: the checkpoint's decode.beam_size)")
    parser.add_argument("--length-penalty", type=float, help="GNMT alpha (default: decode.length_penalty)")
    parser.add_argument("--nbest", type=int, default=1, help="print N hypotheses per line as 'i ||| text ||| score'")
    parser.add_argument("--batch-tokens", type=int, help="source tokens x beam per batch")
    _add_runtime_options(parser)
    parser.add_argument("--plot-attention", metavar="DIR", help="write one cross-attention heatmap PNG per sentence")
    parser.add_argument("--attention-layer", type=int, help="plot this decoder layer (0-based; default: last)")
    parser.add_argument("--attention-head", type=int, help="plot this head (default: mean over heads)")
    return parser


def _add_runtime_options(parser: argparse.ArgumentParser) -> None:
    """Where and how a checkpoint runs: shared by translate and evaluate."""
    parser.add_argument("--device", help="cpu, cuda, cuda:N (default: cuda if available)")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="weights and activations")
    parser.add_argument("--quantize", choices=["int8"], help="dynamic int8 quantization of Linear layers (CPU)")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (default: torch's choice)")
    parser.add_argument("--workers", type=int, default=1,
                        help="batches translated at once, sharing the threads (default 1; on a 2-core CPU "
                             "2 gave more sentences/s than one batch on both threads)")


def _load_translator(args: argparse.Namespace) -> Translator:
    from transformer.decoding.translator import Translator
    from transformer.runtime.threads import set_threads

    if args.threads < 0:
        raise InputError(f"--threads must be >= 0, got {args.threads}")
    if args.workers < 1:
        raise InputError(f"--workers must be >= 1, got {args.workers}")
    set_threads(args.threads)
    return Translator.from_checkpoint(args.checkpoint, device=args.device, dtype=args.dtype, quantize=args.quantize,
                                      workers=args.workers)


def _one_line(text: str) -> str:
    return " ".join(text.splitlines()) if text else text


def translate_main(args: argparse.Namespace) -> int:
    translator = _load_translator(args)
    if args.batch_tokens:
        translator.decode.batch_tokens = args.batch_tokens
    beam = max(args.beam_size or translator.decode.beam_size, args.nbest)
    if args.interactive:
        return _translate_interactively(translator, beam, args.length_penalty)
    if args.sentences:
        lines, name = args.sentences, "argument"
    elif args.input:
        lines, name = read_lines(args.input), args.input
    else:
        lines, name = split_lines(sys.stdin.buffer.read(), "stdin"), "stdin"
    nbest = translator.translate_nbest(lines, args.nbest, beam, args.length_penalty, progress=bool(args.input))
    for index in translator.truncated:
        print(f"warning: {name} line {index + 1}: longer than {translator.max_source_length} tokens, truncated",
              file=sys.stderr)
    if args.nbest > 1:
        out = [f"{i} ||| {_one_line(text)} ||| {score:.4f}" for i, hyps in enumerate(nbest) for text, score in hyps]
    else:
        out = [_one_line(hyps[0][0]) for hyps in nbest]
    text = "".join(line + "\n" for line in out)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    if args.plot_attention:
        _plot_attention(translator, lines, Path(args.plot_attention), beam, args)
    return 0


def _translate_interactively(translator, beam: int, length_penalty: float | None) -> int:
    while True:
        try:
            line = input("> " if sys.stdin.isatty() else "")
        except EOFError:
            return 0
        print(_one_line(translator.translate([line], beam, length_penalty)[0]), flush=True)


def _plot_attention(translator, lines: list[str], directory: Path, beam: int, args: argparse.Namespace) -> None:
    from transformer.plots import plot_attention

    directory.mkdir(parents=True, exist_ok=True)
    for number, line in enumerate(lines, start=1):
        if line.strip():
            attention = translator.attention(line, beam)
            plot_attention(attention, directory / f"attention_{number:04d}.png", args.attention_layer,
                           args.attention_head)


# -- evaluate ------------------------------------------------------------------------------------
def evaluate_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="transformer-evaluate",
                                     description="Score translations with sacreBLEU (BLEU, chrF, TER).")
    parser.add_argument("--hypotheses", help="file of translations, one per line")
    parser.add_argument("--references", nargs="+", help="reference files, line-aligned with the hypotheses")
    parser.add_argument("--checkpoint", help="translate a split with this checkpoint, then score it")
    parser.add_argument("--split", default="test", help="split to translate with --checkpoint (e.g. test2016)")
    parser.add_argument("--dataset", help="corpus to take the split from (default: the checkpoint's data.dataset)")
    parser.add_argument("--beam-size", type=int)
    parser.add_argument("--length-penalty", type=float)
    _add_runtime_options(parser)
    parser.add_argument("--output", help="also write the translations to this file")
    parser.add_argument("--report", help="write scores, signatures and settings as JSON")
    return parser


def evaluate_main(args: argparse.Namespace) -> int:
    from transformer.evaluate import format_scores, score_files, score_translations, write_report

    if args.checkpoint:
        from transformer.data.prepare import load_texts

        translator = _load_translator(args)
        data_cfg = translator.data_config(args.dataset)
        sources, references = load_texts(data_cfg, args.split, Path(args.checkpoint).parent / "cache")
        hypotheses = translator.translate(sources, beam_size=args.beam_size, length_penalty=args.length_penalty,
                                          progress=True)
        if args.output:
            Path(args.output).write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
        scores = score_translations(hypotheses, [references])
        details = {"checkpoint": args.checkpoint, "data": data_cfg.dataset, "split": args.split,
                   "src_lang": data_cfg.src_lang, "tgt_lang": data_cfg.tgt_lang,
                   "decoding": {**translator.decoding_settings(args.beam_size, args.length_penalty),
                                "quantize": args.quantize}}
    elif args.hypotheses and args.references:
        scores = score_files(args.hypotheses, args.references)
        details = {"hypotheses": args.hypotheses, "references": args.references}
    else:
        raise InputError("give --hypotheses and --references, or --checkpoint (and --split)")
    print(format_scores(scores))
    if args.report:
        write_report(args.report, scores, **details)
    return 0


# -- average -------------------------------------------------------------------------------------
def average_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="transformer-average",
                                     description="Average the parameters of several checkpoints.")
    parser.add_argument("checkpoints", nargs="*", help="checkpoint files to average")
    parser.add_argument("--run-dir", help="take the last N numbered checkpoints of this run")
    parser.add_argument("--last", type=int, default=5, help="how many with --run-dir (default 5)")
    parser.add_argument("--output", required=True, help="where to write the averaged checkpoint")
    return parser


def average_main(args: argparse.Namespace) -> int:
    from transformer.checkpoint import average_checkpoints, save_checkpoint, step_checkpoints

    paths = [Path(p) for p in args.checkpoints]
    if args.run_dir:
        paths += step_checkpoints(Path(args.run_dir))[-args.last:]
    state = average_checkpoints(paths)
    save_checkpoint(state, args.output)
    print(f"averaged {len(paths)} checkpoints into {args.output}")
    return 0


# -- plot ----------------------------------------------------------------------------------------
def plot_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="transformer-plot",
                                     description="Draw a run's training curves (loss, learning rate, BLEU) to PNG.")
    parser.add_argument("run_dir")
    parser.add_argument("--output", help="PNG file (default RUN_DIR/training_curves.png)")
    return parser


def plot_main(args: argparse.Namespace) -> int:
    from transformer.plots import plot_training_curves

    print(plot_training_curves(Path(args.run_dir), Path(args.output) if args.output else None))
    return 0


COMMANDS = {
    "train": (train_parser, train_main),
    "translate": (translate_parser, translate_main),
    "evaluate": (evaluate_parser, evaluate_main),
    "average": (average_parser, average_main),
    "plot": (plot_parser, plot_main),
}


def command(name: str) -> Callable[[list[str] | None], int]:
    """The console-script function for ``name``."""
    make_parser, main = COMMANDS[name]
    return lambda argv=None: _run(main, make_parser(), argv)


def train(argv: list[str] | None = None) -> int:
    return command("train")(argv)


def translate(argv: list[str] | None = None) -> int:
    return command("translate")(argv)


def evaluate(argv: list[str] | None = None) -> int:
    return command("evaluate")(argv)


def average(argv: list[str] | None = None) -> int:
    return command("average")(argv)


def plot(argv: list[str] | None = None) -> int:
    return command("plot")(argv)


def main(argv: list[str] | None = None) -> int:
    """``python -m transformer COMMAND ...``"""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m transformer {{{','.join(COMMANDS)}}} ...", file=sys.stderr)
        return EXIT_USAGE
    return command(argv[0])(argv[1:])
