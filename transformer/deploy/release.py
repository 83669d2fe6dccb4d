"""A release folder: what a user ships, laid out as a hub model repository and uploadable as is.

    model.safetensors   the weights only: no pickle, so opening the file cannot run code
    config.yaml         the run's resolved config (model sizes, data, decoding settings)
    spm.model           the SentencePiece model (spm.{lang}.model per language without a joint vocabulary)
    README.md           the model card: languages, data, sizes, scores with their sacreBLEU signatures

`Translator.from_pretrained` and ``transformer-translate --model`` read it. safetensors refuses
tensors that share memory, and the model ties its embeddings and output projection (§3.4): the
file stores each tied matrix once, lists its other names in the metadata, and `read_weights` gives
them back, so loading into the model keeps the tie. The metadata also carries the checkpoints'
checksum of the tensors, so a flipped byte is reported instead of translating with it.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import yaml
from torch import Tensor

from transformer.atomic_file import atomic_write
from transformer.checkpoint import CheckpointError, load_checkpoint, tensor_checksum
from transformer.config import Config
from transformer.config_loading import config_from_dict, load_config, save_config
from transformer.data.textio import InputError
from transformer.data.tokenizer import Tokenizer, model_files

try:  # the `export` extra: pip install -e ".[export]"
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import save_file
except ImportError:
    raise CheckpointError('release folders need safetensors: pip install -e ".[export]"') from None

WEIGHTS, CONFIG, CARD = "model.safetensors", "config.yaml", "README.md"


def export_release(checkpoint: Path, output: Path, report: Path | None = None) -> Path:
    """Write the release folder of ``checkpoint`` into ``output``; ``report`` is a ``transformer-evaluate
    --report`` JSON for the model card (default: the newest report of this checkpoint beside it)."""
    checkpoint, output = Path(checkpoint), Path(output)
    state = load_checkpoint(checkpoint)
    cfg = config_from_dict(state["config"], where=str(checkpoint))
    tokenizer = Tokenizer.load(checkpoint.parent, cfg.data)  # checked before anything is written
    scores = read_report(Path(report)) if report else find_report(checkpoint, state.get("step"))
    if output.exists() and not output.is_dir():
        raise InputError(f"{output}: exists and is not a folder")
    output.mkdir(parents=True, exist_ok=True)
    n_params = write_weights(state["model"], output / WEIGHTS)
    save_config(cfg, output / CONFIG)
    for name in tokenizer.files:
        shutil.copyfile(checkpoint.parent / name, output / name)
    card = model_card(cfg, output, checkpoint.name, n_params, tokenizer, state.get("step"), scores)
    (output / CARD).write_text(card, encoding="utf-8")
    return output


def write_weights(state: dict[str, Tensor], path: Path) -> int:
    """Write a state dict with each shared tensor once; returns the number of values stored."""
    stored: dict[str, Tensor] = {}
    tied: dict[str, str] = {}  # other name -> stored name
    seen: dict[tuple, str] = {}
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.stride())
        if tensor.numel() and key in seen:
            tied[name] = seen[key]
        else:
            seen[key], stored[name] = name, tensor.detach().cpu().contiguous()
    metadata = {"format": "pt", "tied": json.dumps(tied), "checksum": tensor_checksum(stored)}
    with atomic_write(path) as partial:  # save_file leaves a file only its owner can read
        save_file(stored, str(partial), metadata=metadata)
    return sum(t.numel() for t in stored.values())


def read_weights(path: Path) -> dict[str, Tensor]:
    """The state dict of a `write_weights` file, tied names included; CheckpointError naming the file."""
    if not path.is_file():
        raise CheckpointError(f"weights not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as file:
            metadata = file.metadata() or {}
            state = {name: file.get_tensor(name) for name in file.keys()}
        tied = json.loads(metadata.get("tied", "{}"))
    except (SafetensorError, OSError, ValueError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"{path}: not a readable safetensors file ({reason})") from None
    if "checksum" in metadata and tensor_checksum(state) != metadata["checksum"]:
        raise CheckpointError(f"{path}: corrupt weights (checksum mismatch)")
    missing = sorted(set(tied.values()) - set(state))
    if missing:
        raise CheckpointError(f"{path}: tied weight {missing[0]} is not in the file")
    return {**state, **{name: state[stored] for name, stored in tied.items()}}


def read_release(directory: Path) -> tuple[Config, dict[str, Tensor]]:
    """The config and state dict of a release folder; the tokenizer files sit in the same folder."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"release folder not found: {directory}")
    return load_config(directory / CONFIG), read_weights(directory / WEIGHTS)


# -- the model card --------------------------------------------------------------------------------
def read_report(path: Path) -> dict[str, Any]:
    """A ``transformer-evaluate --report`` JSON, or a one-line InputError naming the file."""
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise InputError(f"cannot read report {path}: {error.strerror}") from None
    except ValueError:
        raise InputError(f"{path}: not a JSON file") from None
    if not isinstance(report, dict) or not isinstance(report.get("scores"), dict):
        raise InputError(f"{path}: not a transformer-evaluate report (no 'scores')")
    return report


def find_report(checkpoint: Path, step: int | None = None) -> dict[str, Any] | None:
    """The newest evaluation report beside ``checkpoint`` that scored this checkpoint, if any: one that names
    it alone (not an ensemble it was part of, not a folder or files of translations) and, where both are
    known, at its training ``step`` (a checkpoint_best.pt saved again since is another model)."""
    for path in sorted(checkpoint.parent.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            report = read_report(path)
        except InputError:
            continue  # other JSON files are no reports
        scored = report.get("checkpoint")
        if (isinstance(scored, str) and Path(scored).name == checkpoint.name
                and (step is None or report.get("step", step) == step)):
            return report
    return None


def model_card(cfg: Config, folder: Path, source: str, n_params: int, tokenizer: Tokenizer, step: int | None,
               report: dict[str, Any] | None) -> str:
    """README.md of a release folder, with the YAML front matter a hub model card starts with."""
    data, model, decode = cfg.data, cfg.model, cfg.decode
    front = yaml.safe_dump({"language": [data.src_lang, data.tgt_lang], "tags": ["translation"], "metrics": ["bleu"]},
                           default_flow_style=None, sort_keys=False)
    name = folder.resolve().name
    vocab = (f"{tokenizer.src_vocab_size} joint SentencePiece pieces" if data.joint_vocab else
             f"{tokenizer.src_vocab_size} + {tokenizer.tgt_vocab_size} SentencePiece pieces")
    trained = f" ({step} training steps, `{source}`)" if step is not None else f" (`{source}`)"
    files = ", ".join(f"`{f}`" for f in [WEIGHTS, CONFIG, *model_files(data), CARD])
    return f"""---
{front}---

# {data.src_lang}→{data.tgt_lang} Transformer

Translates {data.src_lang} into {data.tgt_lang}. An encoder-decoder Transformer ("Attention Is All You Need",
Vaswani et al., 2017) trained with the transformer-nmt toolkit on `{data.dataset}`{trained}.

- parameters: {n_params:,} ({model.n_encoder_layers}+{model.n_decoder_layers} layers, d_model {model.d_model}, \
d_ff {model.d_ff}, {model.n_heads} heads, {"pre" if model.norm_first else "post"}-norm)
- vocabulary: {vocab}; embeddings {"shared and " if model.share_embeddings else ""}\
{"tied to the output projection" if model.tie_output else "not tied"}
- decoding defaults: beam {decode.beam_size}, length penalty {decode.length_penalty}

## Scores

{_scores(report)}

## Usage

```python
from transformer import Translator

translator = Translator.from_pretrained("{name}")
translator.translate(["..."])
```

```bash
transformer-translate --model {name} "..."
transformer-evaluate --model {name} --split {data.test_split} --report scores.json
```

## Training

```bash
transformer-train config.yaml
```

with the `config.yaml` of this folder (data: `{data.dataset}`, {data.src_lang}→{data.tgt_lang}).
Files: {files}; the weights are safetensors, loadable without running code.
"""


SCORE_NAMES = {"bleu": "BLEU", "chrf": "chrF", "ter": "TER"}
SCORE_LINE = re.compile(r"^- (\S+) (-?[\d.]+) \(signature `([^`]*)`\)$", re.MULTILINE)  # as `_scores` writes it


def _scores(report: dict[str, Any] | None) -> str:
    """The report's scores with their signatures, and what they were measured on."""
    if report is None:
        return "Not evaluated at export: run `transformer-evaluate --report` and export again with `--report`."
    lines = [f"- {SCORE_NAMES.get(key, key)} {value['score']:.2f} (signature `{value['signature']}`)"
             for key, value in report["scores"].items()]
    if "split" not in report:  # scored from files
        return "\n".join(lines)
    decoding = report.get("decoding", {})
    where = (f"On split `{report['split']}` of `{report.get('data')}`, beam {decoding.get('beam_size')}, length "
             f"penalty {decoding.get('length_penalty')}; sacreBLEU on detokenized, cased text:")
    return "\n".join([where, "", *lines])


def card_scores(folder: Path) -> dict[str, dict[str, Any]]:
    """The scores in a release folder's model card, as a report's ``scores`` ({} without a card or scores)."""
    card = Path(folder) / CARD
    text = card.read_text(encoding="utf-8") if card.is_file() else ""
    keys = {name: key for key, name in SCORE_NAMES.items()}
    return {keys.get(name, name): {"score": float(score), "signature": signature}
            for name, score, signature in SCORE_LINE.findall(text)}
