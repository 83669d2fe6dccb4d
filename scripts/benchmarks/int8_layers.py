"""One Linear layer of a decoding step in fp32 and in each int8 kernel, on one thread: which is faster here?

    python -m scripts.benchmarks.int8_layers [--rows 64 320] [--repeats 50]

The shapes are the Multi30k model's (d_model 256, d_ff 1024, 8000 subwords): the fused query/key/value
projection, the feed-forward layers and the output projection, on decoding's row counts (beams x
sentences). fp32 is the packed oneDNN layer that decoding uses where this torch has it; int8 is
`Int8Linear` with each kernel this CPU sums exactly (`int8_kernels`: oneDNN's with AVX512-VNNI,
fbgemm's everywhere; `kernel_for` picks per layer). Each time is the median of ``--repeats`` calls in milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from transformer.fast.malloc import keep_freed_memory
from transformer.fast.packed_linear import PackedLinear, can_pack_linear_weights
from transformer.runtime.int8 import Int8Linear, int8_kernels, kernel_for

SHAPES = [(256, 768), (256, 1024), (1024, 256), (256, 8000)]  # (in, out)


def median_ms(layer: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, repeats: int) -> float:
    """The median milliseconds of ``layer(x)`` over ``repeats`` calls, after three to warm up."""
    times = []
    for i in range(repeats + 3):
        start = time.perf_counter()
        layer(x)
        if i >= 3:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


@torch.no_grad()
def layer_times(rows: list[int], repeats: int, shapes: list[tuple[int, int]] = SHAPES) -> list[dict]:
    """One record per (rows, shape): milliseconds of fp32 and of each int8 kernel of this CPU."""
    records = []
    for n_rows in rows:
        for n_in, n_out in shapes:
            linear = torch.nn.Linear(n_in, n_out)
            x = torch.randn(n_rows, n_in)
            fp32 = PackedLinear(linear) if can_pack_linear_weights(torch.float32) else linear
            records.append({"rows": n_rows, "in": n_in, "out": n_out, "fp32": median_ms(fp32, x, repeats),
                            **{f"int8 {kernel}": median_ms(Int8Linear(linear, kernel), x, repeats)
                               for kernel in int8_kernels()}})
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 320])
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(1)
    keep_freed_memory()  # as the commands run
    kernels = int8_kernels()
    print("rows  in -> out   fp32 ms" + "".join(f"  int8 {kernel} ms" for kernel in kernels))
    for r in layer_times(args.rows, args.repeats):
        print(f"{r['rows']:4d} {r['in']:4d} -> {r['out']:4d} {r['fp32']:8.3f}"
              + "".join(f"  {r[f'int8 {kernel}']:{len(kernel) + 8}.3f}" for kernel in kernels))
    print(f"decoding uses {kernel_for(8000)} for the 8000-wide output projection and {kernel_for(1024)} for the others")


if __name__ == "__main__":
    main()
