"""Speed paths: each module here replaces one plain-PyTorch piece of the model, the loss or the
search by a faster one with the same results, and says in its docstring what it gained where it
was measured (docs/performance.md tells how each was found):

- `dropout`: dropout from one random byte per element, for CPU training;
- `attention`: the explicit attention formula for CPU training instead of torch's fused kernel;
- `loss`: the label-smoothed cross-entropy with its gradient written out (in place eagerly, out of place for
  inductor to fuse under train.compile);
- `packed_linear`: fp32 and bf16 Linear weights in oneDNN's blocked layout, for CPU inference;
- `search`: the beam's top-k in blocks, and finished rows leaving the batch in groups;
- `malloc`: glibc keeps freed memory (set by the commands, `transformer.cli`).

The paths of this package are switched on here and only here, by `for_training` (the Trainer, unless
``train.fast_paths=false``), `for_inference` (a Translator that loaded its model, unless
``decode.fast_paths=false``) and `FAST_STEPS` (every Translator's search, unless ``decode.fast_paths=false``).
Without them the model runs on plain torch: `nn.Dropout`, `F.scaled_dot_product_attention`,
`F.cross_entropy(label_smoothing=...)`, `torch.topk`. tests/test_fast.py holds each pair equal.

The GPU's paths are settings of a run, each switched on in one place of the `Trainer`: ``train.compile``
(`runtime/compile.py`), ``train.cuda_graphs`` (`runtime/cuda_graphs.py`), ``train.float32_residual=false``
(`runtime/precision.py`) and ``train.attention_row_length`` (`model/row_groups.py`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from transformer.fast.attention import FormulaTrainingAttention
from transformer.fast.dropout import ByteDropout
from transformer.fast.loss import label_smoothed_cross_entropy
from transformer.fast.packed_linear import PackedLinear, can_pack_linear_weights
from transformer.fast.search import FAST_STEPS  # noqa: F401 (a switch, see above)
from transformer.model.attention import ScaledDotProductAttention

LossFunction = Callable[[Tensor, Tensor, float, int], tuple[Tensor, Tensor]]


def replace_modules(model: nn.Module, kind: type[nn.Module], make: Callable[[nn.Module], nn.Module]) -> None:
    """Replace every submodule of exactly type ``kind`` by ``make(submodule)``, in the submodule's mode: a new
    module starts in training mode, and a dropout swapped into a model in evaluation would drop out."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is kind:
                setattr(module, name, make(child).train(child.training))


def for_training(model: nn.Module) -> LossFunction:
    """Swap the CPU training paths into ``model`` (on other devices they run torch's) and return the loss to use."""
    replace_modules(model, ScaledDotProductAttention, lambda module: FormulaTrainingAttention(module.dropout.p))
    replace_modules(model, nn.Dropout, lambda module: ByteDropout(module.p))
    return label_smoothed_cross_entropy


def for_inference(model: nn.Module, device: torch.device) -> None:
    """Pack the Linear weights of a fp32 or bf16 model on the CPU (int8 layers are left as they are).

    Only for a model loaded to translate (`Translator.from_checkpoint`): one in training, which the
    Trainer's validation decodes with the same search steps, keeps its Linear layers."""
    if device.type == "cpu" and can_pack_linear_weights(next(model.parameters()).dtype):
        replace_modules(model, nn.Linear, PackedLinear)
