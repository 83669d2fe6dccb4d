"""A release folder: what a user ships, laid out as a hub model repository and uploadable as is: the weights
in safetensors, the config, the tokenizer and a model card (`transformer.deploy.card`: languages, data, sizes,
and the scores with their sacreBLEU signatures, also in its front matter as the hub's model-index). Its files
and how they are read: `transformer.release_format`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from transformer.checkpoint import load_checkpoint, tensor_checksum
from transformer.config_loading import config_from_dict, save_config
from transformer.data.tokenizer import Tokenizer
from transformer.deploy.card import model_card
from transformer.deploy.folder import check_export_folder, export_folder, shipped_config
from transformer.deploy.reports import find_report, read_report_of
from transformer.release_format import CONFIG, WEIGHTS, safetensors_module, write_weights

CARD = "README.md"


def export_release(checkpoint: Path, output: Path, report: Path | None = None, force: bool = False) -> Path:
    """Write the release folder of ``checkpoint`` as ``output`` (replacing a folder that holds anything only with
    ``force``: `check_export_folder`); ``report`` is a ``transformer-evaluate --report`` JSON of this checkpoint for the
    model card (default: `find_report`, the newest report of this checkpoint beside it)."""
    checkpoint, output = Path(checkpoint), Path(output)
    safetensors_module()  # installed, before a checkpoint of gigabytes is read
    check_export_folder(checkpoint, output, force)  # all checked before anything is written
    state = load_checkpoint(checkpoint)
    cfg = config_from_dict(state["config"], where=str(checkpoint))
    tokenizer = Tokenizer.beside(checkpoint, state, cfg.data)
    step = state.get("step")
    weights = tensor_checksum(state["model"])
    scores = (read_report_of(Path(report), checkpoint, step, weights) if report else
              find_report(checkpoint, step, weights, cfg.data))
    with export_folder(output) as folder:
        n_params = write_weights(state["model"], folder / WEIGHTS, cfg.model, tokenizer.fingerprint,
                                 state.get("dataset"), step)
        save_config(shipped_config(cfg), folder / CONFIG)  # the card names the parent
        for name in tokenizer.files:
            shutil.copyfile(checkpoint.parent / name, folder / name)
        files = [WEIGHTS, CONFIG, *tokenizer.files, CARD]
        card = model_card(cfg, output.resolve().name, checkpoint.name, n_params, tokenizer, step, scores, files,
                          state.get("parent"), state.get("dataset"), state.get("averaged_from"))
        (folder / CARD).write_text(card, encoding="utf-8")
    return output
