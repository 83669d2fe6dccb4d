"""``transformer-export``: a checkpoint as a release folder (`transformer.deploy.release`)."""

from __future__ import annotations

import argparse
from pathlib import Path


def export_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="transformer-export",
                                     description="Write a release folder: safetensors weights, config, tokenizer, "
                                                 "model card; the layout of a hub model repository.")
    parser.add_argument("--checkpoint", required=True, help="checkpoint file; its tokenizer sits beside it")
    parser.add_argument("--output", required=True, metavar="DIR", help="folder to write (created if missing)")
    parser.add_argument("--report", help="transformer-evaluate --report JSON for the model card "
                                         "(default: the newest report of this checkpoint beside it)")
    return parser


def export_main(args: argparse.Namespace) -> int:
    from transformer.deploy.release import export_release  # safetensors: the `export` extra

    print(export_release(Path(args.checkpoint), Path(args.output), Path(args.report) if args.report else None))
    return 0
