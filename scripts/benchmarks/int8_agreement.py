"""How far int8 decoding strays: int8 translations against fp32's, and against int8's own at another batch size.

    python -m scripts.benchmarks.int8_agreement --checkpoint runs/.../checkpoint_best.pt --sentences 400

The first ``--sentences`` sentences of the checkpoint's test split, beam 5 and the checkpoint's other
decoding settings, one thread. It prints how many int8 translations equal the fp32 ones, and how many
change when the batches hold a quarter of the tokens (a translation should not depend on its batch).
The package is imported from PYTHONPATH, so another commit's int8 can be measured with this script.
"""

from __future__ import annotations

import argparse

import torch

from transformer.data.prepare import load_texts
from transformer.decoding.translator import Translator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--split", default="test2016")
    parser.add_argument("--sentences", type=int, default=400)
    args = parser.parse_args()
    torch.set_num_threads(1)
    fp32 = Translator.from_checkpoint(args.checkpoint, device="cpu")
    int8 = Translator.from_checkpoint(args.checkpoint, device="cpu", quantize="int8")
    sources = load_texts(fp32.data_config(), args.split, None)[0][: args.sentences]
    batch_tokens = int8.decode.batch_tokens
    reference = fp32.translate(sources, beam_size=5)
    found = int8.translate(sources, beam_size=5)
    smaller_batches = int8.translate(sources, beam_size=5, batch_tokens=batch_tokens // 4)
    print(f"{len(sources)} sentences of {args.split}, beam 5: int8 equals fp32 in "
          f"{sum(a == b for a, b in zip(found, reference))}; int8 at batch_tokens {batch_tokens} and "
          f"{batch_tokens // 4} differ in {sum(a != b for a, b in zip(found, smaller_batches))}")


if __name__ == "__main__":
    main()
