"""Linear layers for CPU inference with their weights in oneDNN's blocked layout, in fp32 and bf16.

Reordered once at load time instead of at every product. Measured on decoding's 64-320 rows, one
thread, against ``F.linear`` on the plain weight:
- bf16 (2-core Xeon with AMX, torch 2.13): 1.3-1.8x faster per layer; a bf16 beam search over
  Multi30k test2016 ~10% faster, same outputs;
- fp32 (2-core AMD EPYC, family 26 (Zen 5), AVX-512, torch 2.13): 1.6-2.5x faster per layer, where
  ``F.linear`` goes to MKL, which takes its AVX2 paths on AMD CPUs; a fp32 beam search (beam 5) over
  test2016 1.64x faster, same translations. Results differ from ``F.linear``'s in the last bits.
The one place that uses torch's private oneDNN linear ops (torch.compile's CPU backend uses them too);
`transformer.fast.for_inference` swaps them in where this torch has them.
"""

from __future__ import annotations

import torch


class PackedLinear(torch.nn.Module):
    """A Linear layer for CPU inference, its weight reordered once into oneDNN's blocked layout."""

    def __init__(self, linear: torch.nn.Linear, rows: int = 320) -> None:  # rows: the layout's batch hint
        super().__init__()
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), rows)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")


def can_pack_linear_weights(dtype: torch.dtype) -> bool:
    """Whether this torch has oneDNN's linear ops and this CPU runs them in ``dtype`` (fp32 or bf16)."""
    mkldnn = torch.ops.mkldnn
    ops = ("_reorder_linear_weight", "_linear_pointwise", "_is_mkldnn_bf16_supported")
    if not (torch.backends.mkldnn.is_available() and all(hasattr(mkldnn, op) for op in ops)):
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and bool(mkldnn._is_mkldnn_bf16_supported()))
