"""Pictures a person would rather look at than read: training curves and attention heatmaps."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.backend_bases import FigureCanvasBase  # noqa: E402

from transformer.atomic_file import atomic_write  # noqa: E402
from transformer.engine import AttentionMap  # noqa: E402
from transformer.engine import check_attention_choice  # noqa: E402
from transformer.errors import InputError  # noqa: E402
from transformer.training.metrics import METRICS_FILE, read_metrics  # noqa: E402

CURVES_FILE = "training_curves.png"


def picture_path(output: Path | None, run_dir: Path) -> Path:
    """Where a picture goes: ``output``, inside it if it is a folder, with ".png" if it names no format (as
    matplotlib would add it, so the path reported is the file written); a format matplotlib cannot write is a
    one-line error before any work, not its traceback after."""
    if output is None:
        return Path(run_dir) / CURVES_FILE
    output = Path(output)
    if output.is_dir():
        return output / CURVES_FILE
    if not output.suffix:
        return output.with_name(output.name + ".png")
    formats = FigureCanvasBase.get_supported_filetypes()
    if output.suffix[1:].lower() not in formats:
        raise InputError(f"{output}: cannot draw a picture as {output.suffix} (the formats are "
                         f"{', '.join(sorted(formats))}); name a .png, .svg or .pdf file")
    return output


def plot_training_curves(run_dir: Path, output: Path | None = None) -> Path:
    """Draw loss, learning rate and validation BLEU against step into a PNG (or the format ``output`` names);
    returns the path written."""
    output = picture_path(output, run_dir)
    records = read_metrics(run_dir)
    train = [r for r in records if r["kind"] == "train"]
    valid = [r for r in records if r["kind"] == "valid"]
    if not train and not valid:  # a run that has just started has its session record only: an empty figure
        raise InputError(f"{Path(run_dir) / METRICS_FILE}: no training records to plot")
    figure, (loss_axis, lr_axis, bleu_axis) = plt.subplots(1, 3, figsize=(15, 4))
    loss_axis.plot([r["step"] for r in train], [r["loss"] for r in train], label="train")
    loss_axis.plot([r["step"] for r in valid], [r["loss"] for r in valid], "o-", label="validation")
    loss_axis.set(title="loss (label-smoothed for train)", xlabel="step")
    loss_axis.legend()
    lr_axis.plot([r["step"] for r in train], [r["lr"] for r in train])
    lr_axis.set(title="learning rate", xlabel="step")
    bleu_axis.plot([r["step"] for r in valid if "bleu" in r], [r["bleu"] for r in valid if "bleu" in r], "o-")
    bleu_axis.set(title="validation BLEU", xlabel="step")
    if not valid:  # not an empty axis around 0 and a legend entry without points
        loss_axis.get_lines()[1].set_label("_no validation")
        loss_axis.legend()
        bleu_axis.text(0.5, 0.5, "no validation yet", ha="center", va="center", transform=bleu_axis.transAxes)
        bleu_axis.set(yticks=[])
    figure.tight_layout()
    try:  # whole or not at all: a crash leaves no half-written picture over the previous one
        with atomic_write(output) as partial:
            figure.savefig(partial, dpi=100, format=output.suffix[1:].lower())
    except OSError as error:
        raise InputError(f"cannot write {output} ({error.strerror or error})") from None
    finally:
        plt.close(figure)
    return output


def plot_attention(attention: AttentionMap, output: Path, layer: int | None = None, head: int | None = None) -> Path:
    """Heatmap of encoder-decoder attention: target subwords down, source subwords across.

    Averaged over the heads of the last layer unless ``layer`` (0-based) or ``head`` is given
    (``layer=None`` with a head picks that head of the last layer).
    """
    weights = attention.weights  # (layers, heads, T, S)
    check_attention_choice(layer, head, *weights.shape[:2])
    weights = weights[-1 if layer is None else layer]
    weights = weights.mean(dim=0) if head is None else weights[head]
    height = 1.5 + 0.3 * len(attention.target_pieces)
    width = 1.5 + 0.3 * len(attention.source_pieces)
    figure, axis = plt.subplots(figsize=(max(width, 4), max(height, 3)))
    axis.imshow(weights.numpy(), cmap="viridis", vmin=0.0, aspect="auto")
    axis.set_xticks(range(len(attention.source_pieces)), attention.source_pieces, rotation=90)
    axis.set_yticks(range(len(attention.target_pieces)), attention.target_pieces)
    axis.set(xlabel="source", ylabel="target")
    figure.tight_layout()
    figure.savefig(output, dpi=100)
    plt.close(figure)
    return output
