"""Plain beam search of this checkout against another commit's, in one run: did a change slow it down?

    python -m scripts.benchmarks.search_versions --base 19bda02 --checkpoint runs/.../checkpoint_best.pt \
        --sentences 300 --rounds 5

The other commit is checked out into a temporary git worktree; so is ``--this COMMIT``, timed instead
of the checkout (whose uncommitted edits, others' too, would be timed with it; versions.py). Each round times
both versions, in alternating order, in fresh processes on one thread: the same checkpoint (fp32, or int8 layers
with ``--quantize int8``), the first ``--sentences`` sentences of the checkpoint's test split,
`Translator.translate` with beam 5 and the default decoding settings (the checkpoint is copied
without its decode section, which either version may not know all of; its tokenizer beside it).
It prints each version's median seconds, wall and CPU (the steadier one on a busy machine), the
ratios this/base, and whether the translations are identical.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from transformer.checkpoint import load_checkpoint, save_checkpoint

from .versions import alternate, checkouts, print_medians, run_fresh

TIMED = """
import json, sys, time, torch
from transformer.data.prepare import load_texts
from transformer.decoding.translator import Translator
torch.set_num_threads(1)
checkpoint, split, count, quantize = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] or None
translator = Translator.from_checkpoint(checkpoint, device="cpu", quantize=quantize)
sources, _ = load_texts(translator.data_config(), split, None)
sources = sources[:count]
translator.translate(sources[:8], beam_size=5)  # warm-up
start, cpu = time.perf_counter(), time.process_time()
found = translator.translate(sources, beam_size=5)
print(json.dumps({"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu,
                  "translations": found}))
"""


def without_decode_settings(checkpoint: Path, directory: Path) -> Path:
    """A copy of ``checkpoint`` and its tokenizer in ``directory``, its config's decode section dropped and a
    local dataset's path made absolute (the other version runs in its own worktree)."""
    directory.mkdir()
    state = load_checkpoint(checkpoint)
    state["config"].pop("decode", None)
    data = state["config"]["data"]
    if Path(data["dataset"]).exists():
        data["dataset"] = str(Path(data["dataset"]).resolve())
    for model in checkpoint.parent.glob("spm*.model"):
        shutil.copy(model, directory / model.name)
    save_checkpoint(state, directory / checkpoint.name)
    return directory / checkpoint.name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit to compare with")
    parser.add_argument("--this", default="", help="a commit to time instead of this checkout")
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument("--split", default="test2016")
    parser.add_argument("--sentences", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quantize", choices=["int8"], default="", help="decode with int8 Linear layers")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = without_decode_settings(args.checkpoint, Path(tmp) / "model")
        with checkouts(args.base, args.this, Path(tmp)) as versions:
            results = alternate(versions, args.rounds, lambda code: run_fresh(
                code, TIMED, str(checkpoint), args.split, str(args.sentences), args.quantize))
    print(f"beam 5, {args.quantize or 'fp32'}, {args.sentences} sentences of {args.split}, 1 thread, "
          f"median of {args.rounds}, this {args.this or 'checkout'} against base {args.base}:")
    # on a busy machine the process's CPU time is the steadier figure: waiting for a core is not in it
    print_medians(results, {"wall": "seconds", "CPU": "cpu_seconds"})
    print(f"translations identical: {results['this'][-1]['translations'] == results['base'][-1]['translations']}")


if __name__ == "__main__":
    main()
