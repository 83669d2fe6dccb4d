"""Plain beam search of this checkout against another commit's, in one run: did a change slow it down?

    python -m scripts.benchmarks.search_versions --base 19bda02 --checkpoint runs/.../checkpoint_best.pt \
        --sentences 300 --rounds 5

The other commit is checked out into a temporary git worktree; so is ``--this COMMIT``, timed instead
of the checkout (whose uncommitted edits, others' too, would be timed with it). Each round times both versions,
in alternating order, in fresh processes on one thread: the same checkpoint (fp32, or int8 layers
with ``--quantize int8``), the first ``--sentences`` sentences of the checkpoint's test split,
`Translator.translate` with beam 5 and the default decoding settings (the checkpoint is copied
without its decode section, which either version may not know all of; its tokenizer beside it).
It prints each version's median seconds, wall and CPU (the steadier one on a busy machine), the
ratios this/base, and whether the translations are identical.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from transformer.checkpoint import load_checkpoint, save_checkpoint

ROOT = Path(__file__).resolve().parents[2]

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


def timed_run(code: Path, checkpoint: Path, split: str, sentences: int, quantize: str) -> dict:
    """One timed translation in a fresh process that imports the package from ``code``."""
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", TIMED, str(checkpoint), split, str(sentences), quantize], env=env,
                         cwd=code, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"the timed run of {code} failed: {run.stderr.strip().splitlines()[-1]}")
    return json.loads(run.stdout.splitlines()[-1])


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


def worktree(commit: str, directory: Path) -> Path:
    """``commit`` checked out in ``directory``, a temporary git worktree."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(directory), commit], check=True,
                   capture_output=True)
    return directory


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
        versions = {"this": worktree(args.this, Path(tmp) / "this") if args.this else ROOT,
                    "base": worktree(args.base, Path(tmp) / "base")}
        try:
            seconds: dict[str, list[float]] = {"this": [], "base": []}
            cpu_seconds: dict[str, list[float]] = {"this": [], "base": []}
            outputs: dict[str, list[str]] = {}
            for round_ in range(args.rounds):
                order = list(versions.items())[:: 1 if round_ % 2 == 0 else -1]
                for name, code in order:
                    found = timed_run(code, checkpoint, args.split, args.sentences, args.quantize)
                    seconds[name].append(found["seconds"])
                    cpu_seconds[name].append(found["cpu_seconds"])
                    outputs[name] = found["translations"]
                    print(f"round {round_ + 1} {name}: {found['seconds']:.2f} s, CPU {found['cpu_seconds']:.2f} s",
                          flush=True)
        finally:
            for code in versions.values():
                if code != ROOT:
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(code)], check=True)
    print(f"beam 5, {args.quantize or 'fp32'}, {args.sentences} sentences of {args.split}, 1 thread, "
          f"median of {args.rounds}, this {args.this or 'checkout'} against base {args.base}:")
    # on a busy machine the process's CPU time is the steadier figure: waiting for a core is not in it
    for name, figures in (("wall", seconds), ("CPU", cpu_seconds)):
        this, before = statistics.median(figures["this"]), statistics.median(figures["base"])
        print(f"  {name}: this {this:.2f} s, base {before:.2f} s, ratio this/base {this / before:.3f}")
    print(f"translations identical: {outputs['this'] == outputs['base']}")


if __name__ == "__main__":
    main()
