"""``transformer-export``: a checkpoint as a release folder (`transformer.deploy.release`), a CTranslate2 model
(`transformer.deploy.ctranslate2_export`) or two ONNX graphs (`transformer.deploy.onnx_export`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from transformer.cli.paths import GivenOnce, path_argument
from transformer.errors import InputError

QUANTIZATIONS = ["int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16"]


def export_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="transformer-export",
                                     description="Write a release folder: safetensors weights, config, tokenizer, "
                                                 "model card; the layout of a hub model repository.")
    parser.add_argument("--checkpoint", required=True, type=path_argument, action=GivenOnce,
                        help="checkpoint file; its tokenizer sits beside it")
    parser.add_argument("--output", required=True, metavar="DIR", type=path_argument, action=GivenOnce,
                        help="folder to write (created if missing; not the checkpoint's own folder)")
    parser.add_argument("--force", action="store_true",
                        help="replace --output and all it holds if it exists and is not empty (else refused)")
    parser.add_argument("--format", choices=["release", "ctranslate2", "onnx"], default="release",
                        help="release: safetensors folder (default); ctranslate2: a CTranslate2 model folder; "
                             "onnx: encoder.onnx and decoder_step.onnx (the decoder's cache as explicit tensors)")
    parser.add_argument("--quantization", choices=QUANTIZATIONS,
                        help="CTranslate2 weight type (default: float32)")
    parser.add_argument("--report", action="append", type=path_argument,
                        help="transformer-evaluate --report JSON for the model card (default: the newest report of "
                             "this checkpoint beside it; of a multilingual model, of its default direction if any)")
    return parser


def export_main(args: argparse.Namespace) -> int:
    if args.report and len(args.report) > 1:  # argparse would keep the last one and drop the others unsaid
        raise InputError(f"--report given {len(args.report)} times: a model card holds the scores of one report")
    if args.report and args.format != "release":
        raise InputError(f"--report is for the model card of --format release; {args.format} folders have none")
    if args.format == "ctranslate2":
        from transformer.deploy.ctranslate2_export import export_ctranslate2  # ctranslate2: the `export` extra

        print(export_ctranslate2(Path(args.checkpoint), Path(args.output), args.quantization, args.force))
        return 0
    if args.quantization:
        raise InputError("--quantization is for --format ctranslate2")
    if args.format == "onnx":
        from transformer.deploy.onnx_export import export_onnx  # onnx, onnxscript, onnxruntime: the `export` extra

        print(export_onnx(Path(args.checkpoint), Path(args.output), args.force))
        return 0
    from transformer.deploy.release import export_release

    print(export_release(Path(args.checkpoint), Path(args.output), Path(args.report[0]) if args.report else None,
                         args.force))
    return 0
