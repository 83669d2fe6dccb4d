"""The options of the commands that load a model (transformer-translate, -evaluate and -serve): a checkpoint
(``--checkpoint FILE``) or a release folder (``--model DIR``, written by ``transformer-export``; with ``--engine
ctranslate2|onnx``, that engine's folder), where and how it runs, and ``decode.key=value`` overrides of its decoding
settings with short aliases (``--beam-size`` for ``decode.beam_size``, ...); and the files a model is read from,
which no output may overwrite.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import TYPE_CHECKING

from transformer.cli.paths import GivenOnce, path_argument
from transformer.errors import InputError

if TYPE_CHECKING:  # imported lazily below: the commands start faster
    from transformer.engine import Engine


DECODE_ALIASES = {"beam_size": int, "length_penalty": float, "nbest": int, "batch_tokens": int}
OVERRIDE = re.compile(r"^[a-z_]+\.[a-z_0-9]+=")  # section.key=value
SETTING_WITHOUT_VALUE = re.compile(r"^(model|data|train|decode)\.[a-z_0-9]+$")  # decode.beam_size 5: a slip


def add_decode_aliases(parser: argparse.ArgumentParser) -> None:
    """--beam-size and friends: short names for decode.beam_size=... (default: the checkpoint's)."""
    for key, kind in DECODE_ALIASES.items():
        parser.add_argument(f"--{key.replace('_', '-')}", type=kind, metavar=key.upper(), help=f"decode.{key}")


def decode_overrides(args: argparse.Namespace, positional: list[str]) -> list[str]:
    """The decode.key=value settings among the positional arguments, then those of the short aliases."""
    aliases = [f"decode.{key}={getattr(args, key)}" for key in DECODE_ALIASES if getattr(args, key) is not None]
    return [item for item in positional if OVERRIDE.match(item)] + aliases


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """--checkpoint or --model: checked in `load_translator`, for a one-line error instead of argparse's usage."""
    parser.add_argument("--checkpoint", action="append", metavar="FILE", type=path_argument,
                        help="checkpoint file; its tokenizer sits beside it (given again: an ensemble of models "
                             "that share a vocabulary, averaging their log-probabilities)")
    parser.add_argument("--model", metavar="DIR", type=path_argument, action=GivenOnce,
                        help="release folder written by transformer-export (instead of --checkpoint); with --engine, "
                             "that engine's folder")
    parser.add_argument("--engine", choices=list(ENGINES), default="torch",
                        help="ctranslate2: run a --model folder of transformer-export --format ctranslate2 "
                             "(--dtype bf16 and --quantize int8 become its compute type, --workers its inter_threads); "
                             "onnx: one of --format onnx, on onnxruntime (float32, CPU, --threads)")


def add_runtime_options(parser: argparse.ArgumentParser) -> None:
    """Where and how a checkpoint runs: shared by translate and evaluate."""
    parser.add_argument("--device", help="cpu, cuda, cuda:N (default: cuda if available)")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="weights and activations")
    parser.add_argument("--quantize", choices=["int8"],
                        help="int8 Linear layers: weights per output channel, activations per row (CPU)")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (default: torch's choice)")
    parser.add_argument("--workers", type=int, default=1,
                        help="batches translated at once, sharing the threads (default 1; on a 2-core CPU "
                             "2 gave more sentences/s than one batch on both threads)")


def load_translator(args: argparse.Namespace, overrides: list[str]) -> Engine:
    """The engine that ``--engine`` names, loaded with the runtime options mapped onto its own."""
    if args.threads < 0:
        raise InputError(f"--threads must be >= 0, got {args.threads}")
    if args.workers < 1:
        raise InputError(f"--workers must be >= 1, got {args.workers}")
    if bool(args.checkpoint) == bool(args.model):
        raise InputError("give exactly one of --checkpoint FILE and --model DIR")
    if args.engine != "torch" and not args.model:
        raise InputError(f"--engine {args.engine} needs --model DIR (transformer-export --format {args.engine})")
    return ENGINES[args.engine](args, overrides)


def _load_torch(args: argparse.Namespace, overrides: list[str]) -> Engine:
    from transformer.decoding.translator import Translator
    from transformer.runtime.threads import set_threads

    set_threads(args.threads)
    load = Translator.from_pretrained if args.model else Translator.from_checkpoint
    return load(args.model or args.checkpoint, device=args.device, dtype=args.dtype, quantize=args.quantize,
                workers=args.workers, overrides=overrides)


def _load_ctranslate2(args: argparse.Namespace, overrides: list[str]) -> Engine:
    from transformer.deploy.ctranslate2 import CTranslate2Translator

    compute_type = "int8" if args.quantize else "bfloat16" if args.dtype == "bf16" else "default"
    return CTranslate2Translator(args.model, device=args.device or "cpu", compute_type=compute_type,
                                 threads=args.threads, workers=args.workers, overrides=overrides)


def _load_onnx(args: argparse.Namespace, overrides: list[str]) -> Engine:
    unsupported = [option for option, given in (("--device", args.device not in (None, "cpu")),
                                                ("--dtype", args.dtype != "fp32"), ("--quantize", args.quantize),
                                                ("--workers", args.workers > 1)) if given]
    if unsupported:
        raise InputError(f"--engine onnx runs the float32 graphs on the CPU, one batch at a time: "
                         f"drop {unsupported[0]}")
    from transformer.deploy.onnx import OnnxTranslator

    return OnnxTranslator(args.model, threads=args.threads, overrides=overrides)


ENGINES = {"torch": _load_torch, "ctranslate2": _load_ctranslate2, "onnx": _load_onnx}  # --engine's choices


def model_files(args: argparse.Namespace) -> list[Path]:
    """The files the model is read from, which no output may overwrite: each --checkpoint and the tokenizer
    beside it, or those an export wrote into the --model folder (`EXPORT_FILES`: weights, graphs and their external
    data, configs, vocabularies, SentencePiece models, the model card; a report or translations written there before
    may be written again)."""
    if args.model:
        from transformer.deploy.folder import EXPORT_FILES  # imports torch: not before a command runs

        return [path for pattern in EXPORT_FILES for path in Path(args.model).glob(pattern)]
    return [path for checkpoint in args.checkpoint or ()
            for path in (Path(checkpoint), *Path(checkpoint).parent.glob("spm*.model"))]
