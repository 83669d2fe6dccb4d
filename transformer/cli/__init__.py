"""Command-line entry points: train, translate, evaluate, average, plot, export, serve.

Each is a console script (``transformer-train`` ...) and a subcommand of ``python -m transformer``.
User mistakes (bad config, data, checkpoint or file) print one line naming the culprit and exit
with status 2; ``--debug`` shows the full traceback instead.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

from transformer.checkpoint import CheckpointError
from transformer.cli.evaluate import evaluate_main, evaluate_parser
from transformer.cli.export import export_main, export_parser
from transformer.cli.run_dir import average_main, average_parser, plot_main, plot_parser, train_main, train_parser
from transformer.cli.serve import serve_main, serve_parser
from transformer.cli.translate import translate_main, translate_parser
from transformer.config import ConfigError
from transformer.data.files import DataError
from transformer.data.textio import InputError
from transformer.data.tokenizer import TokenizerError

USER_ERRORS = (ConfigError, DataError, CheckpointError, InputError, TokenizerError, OSError)
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process ended by Ctrl-C


def _run(main: Callable[[argparse.Namespace], int], parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")
    argv = sys.argv[1:] if argv is None else argv
    # sentences and settings before, between and after the options; after "--", sentences that start with "-"
    # (which the intermixed parser would take for options)
    args = parser.parse_args(argv) if "--" in argv else parser.parse_intermixed_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S",
                        stream=sys.stderr)
    from transformer.fast.malloc import keep_freed_memory  # the commands' one process-wide speed path

    keep_freed_memory()
    try:
        return main(args)
    except USER_ERRORS as error:
        if args.debug:
            raise
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:  # Ctrl-C outside the training loop (which saves a checkpoint and returns): before it
        if args.debug:
            raise
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


COMMANDS = {
    "train": (train_parser, train_main),
    "translate": (translate_parser, translate_main),
    "evaluate": (evaluate_parser, evaluate_main),
    "average": (average_parser, average_main),
    "plot": (plot_parser, plot_main),
    "export": (export_parser, export_main),
    "serve": (serve_parser, serve_main),
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


def export(argv: list[str] | None = None) -> int:
    return command("export")(argv)


def serve(argv: list[str] | None = None) -> int:
    return command("serve")(argv)


def main(argv: list[str] | None = None) -> int:
    """``python -m transformer COMMAND ...``"""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m transformer {{{','.join(COMMANDS)}}} ...", file=sys.stderr)
        return EXIT_USAGE
    return command(argv[0])(argv[1:])
