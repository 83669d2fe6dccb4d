"""transformer-translate: sentences from the command line, a file or stdin (or an interactive session) translated
with a model (`transformer.cli.model_options` loads it), printed or written (`transformer.atomic_file.write_output`)
as the best translation of each, an n-best list, or with word alignments; or, with --score, the model's score of
translations given in a file.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from transformer.atomic_file import cannot_write_into, write_output
from transformer.cli.model_options import (
    OVERRIDE,
    SETTING_WITHOUT_VALUE,
    add_decode_aliases,
    add_model_options,
    add_runtime_options,
    decode_overrides,
    load_translator,
    model_files,
)
from transformer.cli.output import EXIT_BROKEN_PIPE, check_output, silence_stdout, unwritable, write_stdout
from transformer.cli.paths import GivenOnce, path_argument
from transformer.data.textio import BOM, STDIN, decode_line, read_lines, split_lines
from transformer.errors import InputError

if TYPE_CHECKING:  # imported lazily below: the commands start faster
    from transformer.engine import Engine

HEATMAP_NAME = "attention_{:04d}.png"  # --plot-attention's file of sentence N
HEATMAP = re.compile(r"attention_\d{4,}\.png")


def translate_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="transformer-translate",
                                     description="Translate sentences with a checkpoint or a release folder.")
    parser.add_argument("sentences", nargs="*", default=[],  # a default: argparse would call it required
                        help="sentences to translate (default: --input or stdin), and decode.key=value settings, e.g. "
                             "decode.beam_size=5")
    add_model_options(parser)
    parser.add_argument("--input", type=path_argument, action=GivenOnce,
                        help="UTF-8 file, one sentence per line ('-': standard input, as without it)")
    parser.add_argument("--output", type=path_argument, action=GivenOnce,
                        help="write translations here instead of stdout ('-': stdout)")
    parser.add_argument("--interactive", action="store_true", help="translate each line as it is typed")
    parser.add_argument("--prefixes", metavar="FILE", type=path_argument, action=GivenOnce,
                        help="UTF-8 file, line-aligned with the input: the start each translation must have "
                             "(an empty line: none)")
    parser.add_argument("--prefix-column", action="store_true",
                        help="each input line is SOURCE<tab>PREFIX: the start its translation must have")
    parser.add_argument("--tgt-lang", help="the language to translate into: one of a multilingual model's target "
                                           "languages (data.pairs of its config)")
    parser.add_argument("--constraints", action="store_true",
                        help="each input line is SOURCE<tab>PHRASE<tab>PHRASE...: phrases its translation must "
                             "contain (lexically constrained beam search)")
    add_decode_aliases(parser)
    add_runtime_options(parser)
    parser.add_argument("--score", metavar="FILE", type=path_argument, action=GivenOnce,
                        help="UTF-8 file of translations, line-aligned with the input: print the model's score of "
                             "each instead of translating (forced decoding: log P over the length penalty, as "
                             "--nbest scores its own; decode.length_penalty=0: log P)")
    parser.add_argument("--plot-attention", metavar="DIR", type=path_argument, action=GivenOnce,
                        help="write one cross-attention heatmap PNG per sentence")
    parser.add_argument("--alignments", action="store_true",
                        help="append ' ||| ' and the word alignment of each translation, Moses-style source-target "
                             "pairs (0-0 1-2 ...), from the cross-attention of --attention-layer, mean over heads")
    parser.add_argument("--attention-layer", type=int,
                        help="plot or align with this decoder layer (0-based; default: last)")
    parser.add_argument("--attention-head", type=int, help="plot this head (default: mean over heads)")
    return parser


def _one_line(text: str) -> str:
    return " ".join(text.splitlines()) if text else text


def translate_main(args: argparse.Namespace) -> int:
    """Translate, and stop quietly when the reader of stdout goes away (``| head -1``), as other Unix tools do:
    a closed pipe is the reader's choice, not an error to report."""
    try:
        return _translate_main(args)
    except BrokenPipeError:
        silence_stdout()
        return EXIT_BROKEN_PIPE


def _translate_main(args: argparse.Namespace) -> int:
    # the bytes given: Python reads a byte that is no UTF-8 as a lone surrogate, which was said as one
    sentences = [decode_line(os.fsencode(item), f"argument line {number}") for number, item in
                 enumerate((item for item in args.sentences if not OVERRIDE.match(item)), start=1)]
    slips = [item for item in sentences if SETTING_WITHOUT_VALUE.match(item)]
    if slips:
        raise InputError(f"{slips[0]}: a setting without its value; write {slips[0]}=VALUE (a sentence that reads "
                         f"like a setting goes through --input or stdin)")
    if args.interactive:
        if args.prefixes:
            raise InputError("--prefixes FILE goes with --input or stdin; with --interactive, use --prefix-column")
        # refused, not ignored: the session reads stdin and writes stdout whatever they say
        for given, what in ((sentences, f"sentence {sentences[0]!r}" if sentences else ""),
                            (args.input, f"--input {args.input}"),
                            (args.output, f"--output {args.output} (redirect stdout instead)")):
            if given:
                raise InputError(f"--interactive reads stdin and writes stdout: drop {what}")
    _check_score_options(args)
    if sentences and args.input:  # the file was never read, unsaid
        raise InputError(f"give sentences or --input, not both: sentence {sentences[0]!r} and --input {args.input}")
    # "-" is standard input or output, as for fairseq, Marian and transformer-evaluate --hypotheses: as without them
    args.input, args.output = (None if value == STDIN else value for value in (args.input, args.output))
    check_output(args.output, "--output", [*model_files(args), *filter(None, (args.input, args.prefixes, args.score))])
    # the input files are read before the model loads (seconds, or minutes for a large one): a typo is said at once
    read = read_lines(args.input) if args.input else None
    translations = read_lines(args.score) if args.score else None
    if translations is not None and (sentences or read is not None):
        _check_count(translations, sentences or read, args.score)
    translator = load_translator(args, decode_overrides(args, args.sentences))
    _check_engine_options(translator, args)
    translator.model_inputs([], args.tgt_lang)  # a language the model does not translate into: before any input
    if args.interactive:
        return _translate_interactively(translator, args)
    if sentences:
        lines, name = sentences, "argument"
    elif read is not None:
        lines, name = read, args.input
    else:
        lines, name = split_lines(sys.stdin.buffer.read(), "stdin"), "stdin"
    names = [f"{name} line {number}" for number in range(1, len(lines) + 1)]
    lines, prefixes, constraints = _columns(lines, args, names)
    lines = translator.model_inputs(lines, args.tgt_lang, names)  # a multilingual model's: led by the target's tag
    for index in translator.too_long(lines):
        print(f"warning: {names[index]}: longer than {translator.max_source_length} tokens, truncated",
              file=sys.stderr)
    if translations is not None:
        _check_count(translations, lines, args.score)
        output = [f"{score:.4f}" for score in translator.score(lines, translations, progress=bool(args.input))]
    else:
        nbest = translator.translate_nbest(lines, progress=bool(args.input), prefixes=prefixes,
                                           constraints=constraints)
        output = _output_lines(translator, lines, nbest, args)
    text = "".join(line + "\n" for line in output)
    if args.output:
        try:
            write_output(args.output, text)
        except OSError as error:
            raise unwritable("--output", args.output, error) from None
    else:  # flushed here, where a closed pipe is caught, not at exit
        write_stdout(text, "the scores" if translations is not None else "the translations")
    if args.plot_attention:
        _plot_attention(translator, lines, Path(args.plot_attention), args)
    return 0


def _output_lines(translator: Engine, lines: list[str], nbest: list[list[tuple[str, float]]],
                  args: argparse.Namespace, first: int = 0) -> list[str]:
    """What is printed for the translations ``nbest`` of ``lines`` (numbered from ``first``): the best one, or
    with decode.nbest above 1, or given (--nbest 1 too: the 1-best's score), each as ``i ||| text ||| score``; with
    --alignments, ``||| 0-0 1-2 ...`` after each. One function for files and --interactive, so that both print the
    same (--nbest and --alignments too)."""
    from transformer.decoding.alignment import moses_format

    if translator.decode.nbest > 1 or _nbest_given(args):
        out = [f"{i} ||| {_one_line(text)} ||| {score:.4f}"
               for i, hyps in enumerate(nbest, start=first) for text, score in hyps]
    else:
        out = [_one_line(hyps[0][0]) for hyps in nbest]
    if args.alignments:
        pairs = translator.align([line for line, hyps in zip(lines, nbest) for _ in hyps],
                                 [text for hyps in nbest for text, _ in hyps], args.attention_layer)
        out = [f"{line} ||| {moses_format(found)}" for line, found in zip(out, pairs)]
    return out


def _check_score_options(args: argparse.Namespace) -> None:
    """--score reads the translations it is given from a file: options for a search's output are refused, not
    ignored."""
    if not args.score:
        return
    if args.score == STDIN:
        raise InputError("--score -: give the translations in a file (the sentences come from stdin, --input or "
                         "the command line)")
    for flag, given in (("--interactive", args.interactive), ("--prefixes", args.prefixes),
                        ("--prefix-column", args.prefix_column), ("--constraints", args.constraints),
                        ("--alignments", args.alignments), ("--plot-attention", args.plot_attention),
                        ("--nbest", _nbest_given(args))):
        if given:
            raise InputError(f"--score scores the translations in {args.score}, it searches none: drop {flag}")


def _check_count(translations: list[str], lines: list[str], path: str) -> None:
    if len(translations) != len(lines):
        raise InputError(f"--score {path}: {len(translations)} translations for {len(lines)} input lines: give one "
                         f"line per input line")


def _nbest_given(args: argparse.Namespace) -> bool:
    """decode.nbest (or --nbest) given on the command line, whatever its value."""
    return any(item.startswith("decode.nbest=") for item in decode_overrides(args, args.sentences))


def _check_engine_options(translator: Engine, args: argparse.Namespace) -> None:
    """--alignments and --plot-attention need an engine with attention weights (and the latter a directory to
    write to), --attention-layer and --attention-head must name a layer and head of them, --constraints
    needs an engine with constrained search, and decode.sampling one that samples: checked before any input is
    read (an interactive session would otherwise say so at every line), not after."""
    if args.alignments and not translator.supports_alignment:
        raise InputError(f"--alignments needs the torch engine (--checkpoint, or --model with a release folder), "
                         f"not {translator.name}")
    if args.plot_attention and not translator.supports_attention:
        raise InputError(f"--plot-attention: the {translator.name} engine gives no attention weights (the torch "
                         f"and ctranslate2 ones do)")
    if args.plot_attention and Path(args.plot_attention).exists() and not Path(args.plot_attention).is_dir():
        raise InputError(f"--plot-attention {args.plot_attention}: a file, not a directory")
    output = Path(args.output) if args.output and args.output != STDIN else None
    if (args.plot_attention and output and HEATMAP.fullmatch(output.name)
            and output.absolute().parent.resolve() == Path(args.plot_attention).resolve()):
        raise InputError(f"--output {args.output}: a heatmap of --plot-attention {args.plot_attention} would be "
                         f"written over it; name it otherwise")
    reason = args.plot_attention and cannot_write_into(Path(args.plot_attention))
    if reason:
        raise InputError(f"--plot-attention {args.plot_attention}: cannot write into it ({reason})")
    if args.prefix_column and (args.prefixes or args.constraints):
        raise InputError("--prefix-column takes the second column: with --prefixes FILE or --constraints, "
                         "give the prefixes in a file")
    if translator.decode.sampling and not translator.supports_sampling:
        raise InputError(f"decode.sampling: the {translator.name} engine cannot sample reproducibly (the torch "
                         f"and onnx ones can)")
    if args.constraints and not translator.supports_constraints:
        raise InputError(f"--constraints: the {translator.name} engine has no lexically constrained search (the "
                         f"torch and onnx ones do)")
    chosen = [flag for flag, value in (("--attention-layer", args.attention_layer),
                                       ("--attention-head", args.attention_head)) if value is not None]
    if chosen and not (args.alignments or args.plot_attention):  # else ignored, unsaid
        raise InputError(f"{chosen[0]} goes with --plot-attention or --alignments")
    if chosen and not translator.supports_attention_choice:
        raise InputError(f"{chosen[0]}: the {translator.name} engine gives its last decoder layer's attention, mean "
                         f"over heads, alone")
    translator.check_attention_choice(args.attention_layer, args.attention_head,
                                      ("--attention-layer", "--attention-head"))


def _columns(lines: list[str], args: argparse.Namespace,
             names: list[str]) -> tuple[list[str], list[str] | None, list[list[str]] | None]:
    """The sources; with --prefix-column or --prefixes, the target prefix of each; with --constraints,
    the phrases each translation must contain (None: not given). ``names`` name the lines in errors."""
    prefixes = _read_prefixes(args.prefixes, len(lines)) if args.prefixes else None
    if not (args.prefix_column or args.constraints):
        return lines, prefixes, None
    columns = [line.split("\t") for line in lines]
    if not args.prefix_column:
        return [c[0] for c in columns], prefixes, [c[1:] for c in columns]
    for name, line_columns in zip(names, columns):
        if len(line_columns) > 2:  # a third column went into the prefix, tab and all
            raise InputError(f"{name}: {len(line_columns)} tab-separated columns; --prefix-column reads "
                             f"SOURCE<tab>PREFIX")
    return [c[0] for c in columns], [c[1] if len(c) > 1 else "" for c in columns], None


def _read_prefixes(path: str, count: int) -> list[str]:
    """The lines of --prefixes FILE, one per sentence: a count that differs is said naming the file, which the
    translator's own error (\"2 prefixes for 3 sentences\") did not."""
    prefixes = read_lines(path)
    if len(prefixes) != count:
        raise InputError(f"--prefixes {path}: {len(prefixes)} prefixes for {count} sentences: give one line per "
                         f"input line (an empty line: no prefix)")
    return prefixes


def _translate_interactively(translator: Engine, args: argparse.Namespace) -> int:
    """Read stdin's bytes a line at a time, decoded here: a text stream decodes ahead, in chunks, and its
    error would neither come at its line nor name it. A line in error is said on stderr and left blank on
    stdout (one output line per input line), and the session goes on; the exit status then is 2."""
    failed = False
    for number in itertools.count(1):
        if sys.stdin.isatty():  # on stderr, as Python's own prompt: stdout redirected to a file gets translations only
            print("> ", end="", file=sys.stderr, flush=True)
        data = sys.stdin.buffer.readline()
        if not data:
            if sys.stdin.isatty():  # Ctrl+D: the shell's prompt on a line of its own, not after "> "
                print(file=sys.stderr)
            return 2 if failed else 0
        try:
            line = decode_line((data.removeprefix(BOM) if number == 1 else data).removesuffix(b"\n"),
                               f"stdin line {number}")
            sources, prefixes, constraints = _columns([line], args, [f"stdin line {number}"])
            sources = translator.model_inputs(sources, args.tgt_lang, [f"stdin line {number}"])
            try:
                nbest = translator.translate_nbest(sources, prefixes=prefixes, constraints=constraints)
            except InputError as error:  # its prefix or constraints: named as the first of a batch of one
                raise InputError(f"stdin line {number}: {error}") from None
            for output in _output_lines(translator, sources, nbest, args, first=number - 1):
                print(output)
            sys.stdout.flush()
            if args.plot_attention:
                _plot_attention(translator, sources, Path(args.plot_attention), args, first=number)
        except InputError as error:
            print(f"error: {error}", file=sys.stderr, flush=True)
            print(flush=True)
            failed = True


def _plot_attention(translator: Engine, lines: list[str], directory: Path, args: argparse.Namespace,
                    first: int = 1) -> None:
    from transformer.plots import plot_attention

    directory.mkdir(parents=True, exist_ok=True)
    for number, line in enumerate(lines, start=first):
        if line.strip():
            plot_attention(translator.attention(line), directory / HEATMAP_NAME.format(number),
                           args.attention_layer, args.attention_head)
