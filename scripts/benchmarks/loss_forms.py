"""The training loss's two written-out forms (`transformer.fast.loss`), eager and compiled, forward and backward:
which is faster here?

    python -m scripts.benchmarks.loss_forms [--tokens 4096] [--vocabulary 32000] [--repeats 5] [--device cuda]

`FromLogProbs` saves float32 log-probabilities and writes the gradient into them in place (what eager PyTorch
runs); `FromLogSumExp` saves the logits as they come and a log-sum-exp per token, out of place (what
torch.compile runs, as train.compile=true compiles the loss). Each is timed eagerly and compiled (dynamic shapes,
as `compile_training` compiles), on logits in fp32 and bf16 of ``--tokens`` rows (an eighth of them padding) by
``--vocabulary`` columns; each time is the median of ``--repeats`` calls in milliseconds, after two to warm up.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from transformer.fast.loss import FromLogProbs, FromLogSumExp
from transformer.runtime.compile import BACKEND

from .training import wait

FORMS = {"log-probs, in place": FromLogProbs, "log-sum-exp": FromLogSumExp}


def form_times(tokens: int, vocabulary: int, repeats: int, device: torch.device,
               precisions: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)) -> list[dict]:
    """One record per (form, precision): milliseconds of its forward and backward, eager and compiled."""
    generator = torch.Generator().manual_seed(0)
    target = torch.randint(1, vocabulary, (tokens,), generator=generator).to(device)
    target[-tokens // 8:] = 0  # padding
    records = []
    for dtype in precisions:
        logits = (3 * torch.randn(tokens, vocabulary, generator=generator)).to(device, dtype)
        for name, form in FORMS.items():
            record = {"form": name, "precision": str(dtype).removeprefix("torch.")}
            compiled = torch.compile(form.apply, backend=BACKEND, dynamic=True)
            for mode, loss in (("eager", form.apply), ("compiled", compiled)):
                times = []
                for i in range(repeats + 2):
                    x = logits.clone().requires_grad_()
                    start = wait(device)
                    loss(x, target, 0.1, 0)[0].backward()
                    if i >= 2:
                        times.append((wait(device) - start) * 1e3)
                record[f"{mode} ms"] = statistics.median(times)
            records.append(record)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--vocabulary", type=int, default=32000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", type=torch.device, default="cpu")
    args = parser.parse_args()
    print(f"{args.tokens} tokens x {args.vocabulary} vocabulary on {args.device}, torch {torch.__version__}")
    print("form                 precision  eager ms  compiled ms")
    for r in form_times(args.tokens, args.vocabulary, args.repeats, args.device):
        print(f"{r['form']:20s} {r['precision']:9s} {r['eager ms']:9.1f} {r['compiled ms']:12.1f}")


if __name__ == "__main__":
    main()
