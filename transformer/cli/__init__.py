"""Command-line entry points: train, translate, evaluate, average, plot, export, serve.

Each is a console script (``transformer-train`` ...) and a subcommand of ``python -m transformer``.
User mistakes (bad options, config, data, checkpoint or file) print one line naming the culprit and exit
with status 2; running out of memory prints one line naming the setting to lower and exits with
status 1; ``--debug`` shows the full traceback instead.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import torch

from transformer.checkpoint import CheckpointError
from transformer.cli.evaluate import evaluate_main, evaluate_parser
from transformer.cli.export import export_main, export_parser
from transformer.cli.serve import serve_main, serve_parser
from transformer.cli.training import average_main, average_parser, plot_main, plot_parser, train_main, train_parser
from transformer.cli.translate import translate_main, translate_parser
from transformer.config import ConfigError
from transformer.console import interrupted
from transformer.data.tokenizer import TokenizerError
from transformer.errors import DataError, InputError
from transformer.runtime.distributed import RankLost

USER_ERRORS = (ConfigError, DataError, CheckpointError, InputError, TokenizerError, OSError)
EXIT_USAGE = 2
EXIT_OUT_OF_MEMORY = 1
# the settings that bound a command's memory use, said when it runs out of memory
DECODING_MEMORY = "lower --batch-tokens (decode.batch_tokens: source tokens times beam size in one batch)"
OUT_OF_MEMORY_ADVICE = {
    "train": "lower data.batch_tokens (tokens in one training batch), or decode.batch_tokens for the validation "
             "translations",
    "translate": DECODING_MEMORY,
    "evaluate": DECODING_MEMORY,
    "serve": DECODING_MEMORY,
}
_ALLOCATION = re.compile(r"[Tt]ried to allocate ([\d.]+ ?\w+)")  # CUDA's "2.00 GiB", the CPU's "8000000 bytes"


def _run(main: Callable[[argparse.Namespace], int], parser: argparse.ArgumentParser, argv: list[str] | None,
         memory_advice: str | None = None) -> int:
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")
    parser.error = _one_line_error(parser)
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
        say_error(f"error: {error}", cause=not isinstance(error, RankLost))
        return EXIT_USAGE
    except RuntimeError as error:
        if args.debug or not out_of_memory(error):
            raise
        say_error(out_of_memory_message(error, memory_advice))
        return EXIT_OUT_OF_MEMORY
    except KeyboardInterrupt:  # Ctrl-C outside the training loop (which saves a checkpoint and returns): before it
        if args.debug:
            raise
        return interrupted()


def _one_line_error(parser: argparse.ArgumentParser) -> Callable[[str], NoReturn]:
    """argparse's error as the commands' other errors: one line naming the option, exit 2 (its usage text came first,
    five lines or more, with the line that matters last)."""
    def error(message: str) -> NoReturn:
        parser.exit(EXIT_USAGE, f"{parser.prog}: error: {message} (see {parser.prog} --help)\n")

    return error


def say_error(line: str, cause: bool = True) -> None:
    """Print a command's one-line error. Under torchrun, with the rank that says it (each rank says its own), and,
    where it may be the job's ``cause`` (not a rank that lost another), into the error file torchrun gives each
    worker: its report of a failed job then shows this line as the failure's, where it said "To enable traceback
    see: https://pytorch.org/docs/stable/elastic/errors.html". The report names the earliest error file's rank the
    root cause (a rank without one, as of its report): a lost rank's line there would name itself."""
    ranks = int(os.environ.get("WORLD_SIZE", 1))
    said = f"rank {os.environ.get('RANK', '?')}: {line}" if ranks > 1 else line
    sys.stderr.write(said + "\n")  # one write, newline included: the ranks' lines were interleaved (print writes twice)
    sys.stderr.flush()
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file and cause:  # the format of torch.distributed.elastic.multiprocessing.errors.ProcessFailure
        with contextlib.suppress(OSError):  # the line is printed: a report without it is no reason to fail again
            Path(error_file).write_text(json.dumps({"message": line, "timestamp": int(time.time())}))


def out_of_memory(error: RuntimeError) -> bool:
    """Whether ``error`` is an allocation that failed: torch.OutOfMemoryError on a GPU, a plain RuntimeError
    of the CPU's allocator."""
    return isinstance(error, torch.OutOfMemoryError) or "DefaultCPUAllocator" in str(error)


def out_of_memory_message(error: RuntimeError, advice: str | None) -> str:
    """The line said instead of torch's traceback: how much did not fit, and the setting that lowers it."""
    allocation = _ALLOCATION.search(str(error))
    tried = f" (allocating {allocation.group(1)} more failed)" if allocation else ""
    return f"error: out of memory{tried}" + (f": {advice}" if advice else "")


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
    """The command ``name`` as a function of its arguments (the console scripts': `transformer.console`)."""
    make_parser, main = COMMANDS[name]
    return lambda argv=None: _run(main, make_parser(), argv, OUT_OF_MEMORY_ADVICE.get(name))


def main(argv: list[str] | None = None) -> int:
    """``python -m transformer COMMAND ...``"""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m transformer {{{','.join(COMMANDS)}}} ...", file=sys.stderr)
        return EXIT_USAGE
    return command(argv[0])(argv[1:])
