"""The model card of a release folder (README.md): prose for a reader, YAML front matter for tools.

The front matter holds the scores in the hub's ``model-index`` format, which the hub shows as an
evaluation table and ``GET /model`` reads back (`card_scores`), so rewording the prose loses nothing:

    model-index:
    - name: multi30k_de_en
      results:
      - task: {type: translation, name: Translation de→en}
        dataset: {name: "multi30k (local files: train, val, test2016)", type: multi30k, split: test2016}
        metrics:
        - {type: bleu, value: 40.24, name: BLEU, args: {signature: "nrefs:1|case:mixed|..."}}

The dataset is named as a user knows it (`dataset_name`: a hub id, or a local corpus folder's own
name), never by a path of the machine that exported the model.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import Any

import yaml

from transformer.config import Config, DataConfig
from transformer.data.corpus import dataset_name, is_local
from transformer.data.languages import direction_names, directions, tags
from transformer.data.tokenizer import Tokenizer
from transformer.deploy.reports import scored_direction

SCORE_NAMES = {"bleu": "BLEU", "chrf": "chrF", "ter": "TER"}


def model_card(cfg: Config, name: str, source: str, n_params: int, tokenizer: Tokenizer, step: int | None,
               report: dict[str, Any] | None, files: list[str], parent: dict[str, Any] | None = None,
               dataset: str | None = None, averaged_from: list[str] | None = None) -> str:
    """README.md of the release folder ``name`` exported from the checkpoint file ``source``, holding ``files``;
    ``parent`` is the model it was fine-tuned from (`transformer.training.finetune`), if any; ``dataset`` the corpus
    as its training run named it (default: `dataset_name` of the config, from here); ``averaged_from``, the
    checkpoints ``source`` is the average of (`transformer-average`), if it is one."""
    data, model, decode = cfg.data, cfg.model, cfg.decode
    dataset = dataset or dataset_name(data)
    pairs = ", ".join(direction_names(data))
    tgt_lang = f', tgt_lang="{data.tgt_lang}"' if data.pairs else ""
    tgt_flag = f" --tgt-lang {data.tgt_lang}" if data.pairs else ""
    vocab = (f"{tokenizer.src_vocab_size} joint SentencePiece pieces" if data.joint_vocab else
             f"{tokenizer.src_vocab_size} + {tokenizer.tgt_vocab_size} SentencePiece pieces")
    trained = _steps(step, source, parent if cfg.train.init_keep_optimizer else None)
    if averaged_from:
        trained = trained[:-1] + (f", the average of {len(averaged_from)} checkpoints: "
                                  f"{', '.join(Path(path).name for path in averaged_from)})")
    return f"""---
{yaml.safe_dump(front_matter(cfg, name, report), allow_unicode=True, sort_keys=False)}---

# {pairs} Transformer

Translates {pairs}{_multilingual(data)}. An encoder-decoder Transformer ("Attention Is All You Need",
Vaswani et al., 2017) trained with the transformer-nmt toolkit on {dataset}{trained}.{_fine_tuned(parent)}

- parameters: {n_params:,} ({model.n_encoder_layers}+{model.n_decoder_layers} layers, d_model {model.d_model}, \
d_ff {model.d_ff}, {model.n_heads} heads, {"pre" if model.norm_first else "post"}-norm)
- vocabulary: {vocab}; embeddings {"shared and " if model.share_embeddings else ""}\
{"tied to the output projection" if model.tie_output else "not tied"}
- decoding defaults: beam {decode.beam_size}, length penalty {decode.length_penalty}

## Scores

{_scores(data, report)}

## Usage

```python
from transformer import Translator

translator = Translator.from_pretrained("{name}")
translator.translate(["..."]{tgt_lang})
```

```bash
transformer-translate --model {name}{tgt_flag} "..."
{_evaluate_command(cfg, name, report)}
```
{_dataset_note(data, report)}
## Training

```bash
transformer-train config.yaml{_init_from(parent, cfg.train.init_keep_optimizer)}
```

with the `config.yaml` of this folder (data: {dataset}, {pairs}; set
`data.dataset` to where your copy of it is).

Files: {", ".join(f"`{file}`" for file in files)}; the weights are safetensors, loadable without running code.
"""


# the decoding settings a report records that change its translations: its command gives those that differ from the
# folder's config (batch_tokens, nbest and fast_paths change none)
SEARCH_SETTINGS = ("beam_size", "length_penalty", "max_len_a", "max_len_b", "sampling", "sampling_topk",
                   "sampling_topp", "sampling_temperature", "seed")
FLAGS = {"beam_size": "--beam-size", "length_penalty": "--length-penalty"}


def _evaluate_command(cfg: Config, name: str, report: dict[str, Any] | None) -> str:
    """The transformer-evaluate command that scores the folder as ``report`` did, so that it reproduces the card's
    scores: the report's split, corpus (`_dataset_note`), direction, search settings where they differ from the
    folder's config, and its precision (--dtype bf16, --quantize int8)."""
    data, decode = cfg.data, cfg.decode
    words = ["transformer-evaluate", "--model", name]
    if report is None or "split" not in report:  # no report of a split: the config's test split (or validation's)
        words += ["--tgt-lang", data.tgt_lang] if data.pairs else []
        return shlex.join([*words, "--split", data.test_split or data.valid_split, "--report", "scores.json"])
    src_lang, tgt_lang = report.get("src_lang", data.src_lang), report.get("tgt_lang", data.tgt_lang)
    if data.pairs:
        words += ["--src-lang", src_lang] if src_lang != data.src_lang else []
        words += ["--tgt-lang", tgt_lang]
    if _report_dataset(data, report) != data.dataset or is_local(data.dataset):
        words += ["--dataset", _dataset_argument(data, report)]
    words += ["--split", str(report["split"])]
    decoding = report.get("decoding", {})
    for key in SEARCH_SETTINGS:
        if key in decoding and decoding[key] != getattr(decode, key):
            value = str(decoding[key]).lower() if isinstance(decoding[key], bool) else str(decoding[key])
            words += [FLAGS[key], value] if key in FLAGS else [f"decode.{key}={value}"]
    words += ["--dtype", "bf16"] if decoding.get("precision") == "bf16" else []
    words += ["--quantize", str(decoding["quantize"])] if decoding.get("quantize") else []
    return shlex.join([*words, "--report", "scores.json"])


def _report_dataset(data: DataConfig, report: dict[str, Any]) -> str:
    """The corpus a report scored (``--dataset`` of transformer-evaluate, else the training one)."""
    return str(report.get("data") or data.dataset)


def _dataset_argument(data: DataConfig, report: dict[str, Any]) -> str:
    """``--dataset`` of the card's command: a hub id as it is, a local corpus by its own name (never a path of the
    exporting machine; `_dataset_note` says what to put there)."""
    scored = _report_dataset(data, report)
    return Path(scored).expanduser().name if is_local(scored) else scored


def _dataset_note(data: DataConfig, report: dict[str, Any] | None) -> str:
    """Where the command's local corpus is to be found: the reader's own copy of it."""
    if report is None or "split" not in report or not is_local(_report_dataset(data, report)):
        return ""
    name = _scored_dataset(data, report)["name"]
    return f"\n`{_dataset_argument(data, report)}`: the path of your copy of {name}.\n"


def front_matter(cfg: Config, name: str, report: dict[str, Any] | None) -> dict[str, Any]:
    """The card's metadata: languages and tags, and the report's scores as the hub's ``model-index``."""
    data = cfg.data
    languages = list(dict.fromkeys(lang for pair in directions(data) for lang in pair))
    front: dict[str, Any] = {"language": languages, "tags": ["translation"],
                             "metrics": ["bleu"]}
    if report is None:
        return front
    metrics = [{"type": key, "value": value["score"], "name": SCORE_NAMES.get(key, key),
                "args": {"signature": value["signature"]}} for key, value in report["scores"].items()]
    task = {"type": "translation", "name": f"Translation {scored_direction(report, data)}"}
    result = {"task": task, "dataset": _scored_dataset(data, report), "metrics": metrics}
    return {**front, "model-index": [{"name": name, "results": [result]}]}


def _multilingual(data: DataConfig) -> str:
    """How a multilingual model is told the target language (Johnson et al., 2017)."""
    if not data.pairs:
        return ""
    return (f" in one model: the target language is a tag that leads the source (`{tags(data)[0]}`), which the "
            "toolkit adds when given the target language (`tgt_lang`, `--tgt-lang`)")


def _steps(step: int | None, source: str, counted_from: dict[str, Any] | None) -> str:
    """How long the model trained, from the checkpoint ``source`` at ``step``; a fine-tuning that kept its parent's
    optimizer (``counted_from``: the parent) counts its steps on from the parent's, which did not train on this data."""
    if step is None:
        return f" (`{source}`)"
    parent_step = counted_from.get("step") if counted_from else None
    if parent_step is not None:
        return f", {step - parent_step} training steps after the parent's {parent_step} (`{source}`)"
    return f", {step} training steps (`{source}`)"


def _fine_tuned(parent: dict[str, Any] | None) -> str:
    """The sentence naming the model this one was fine-tuned from (its name, step and data; no path)."""
    if not parent:
        return ""
    step = f" at step {parent['step']}" if parent.get("step") is not None else ""
    return (f" Fine-tuned from `{parent['name']}`{step}, a {parent['languages']} model trained on "
            f"{parent['dataset']}.")


def _init_from(parent: dict[str, Any] | None, keep_optimizer: bool) -> str:
    """What a fine-tuned model's training command adds: its parent (config.yaml ships without that path, and
    without init_keep_optimizer, which needs the parent's training checkpoint)."""
    if not parent:
        return ""
    if keep_optimizer:
        return (f" train.init_from=PARENT train.init_keep_optimizer=true  # PARENT: your copy of the training "
                f"checkpoint {parent['name']}")
    return f" train.init_from=PARENT  # PARENT: your copy of {parent['name']}"


def _scored_dataset(data: DataConfig, report: dict[str, Any]) -> dict[str, Any]:
    """The model-index ``dataset`` a report scored: the corpus and split of ``transformer-evaluate --split``
    (``--dataset`` may have named another corpus than the training one), or translation files."""
    if "split" not in report:
        return {"name": "translation files scored against reference files", "type": "files"}
    scored = dataclasses.replace(data, dataset=report.get("data") or data.dataset)
    name = dataset_name(scored)
    config = {"config": scored.dataset_config} if scored.dataset_config else {}
    # type: the hub id, or the local folder's name (the name without its configuration or splits)
    return {"name": name, "type": name.split(" (")[0], **config, "split": report["split"]}


def _scores(data: DataConfig, report: dict[str, Any] | None) -> str:
    """The report's scores with their signatures, and what they were measured on, in prose."""
    if report is None:
        return "Not evaluated at export: run `transformer-evaluate --report` and export again with `--report`."
    lines = [f"- {SCORE_NAMES.get(key, key)} {value['score']:.2f} (signature `{value['signature']}`)"
             for key, value in report["scores"].items()]
    if "split" not in report:  # scored from files
        return "\n".join(lines)
    decoding = report.get("decoding", {})
    direction = scored_direction(report, data)
    where = (f"On split `{report['split']}` of {_scored_dataset(data, report)['name']}, {direction}, beam "
             f"{decoding.get('beam_size')}, length penalty {decoding.get('length_penalty')}{_precision(decoding)}; "
             "sacreBLEU on detokenized text (BLEU and chrF cased; TER, as its default, ignores case):")
    return "\n".join([where, "", *lines])


def _precision(decoding: dict[str, Any]) -> str:
    """How the scored translations were computed, where not in float32: the card's scores are of that model."""
    if decoding.get("quantize"):
        return f", {decoding['quantize']} weights (`--quantize {decoding['quantize']}`)"
    if decoding.get("precision") not in (None, "fp32"):
        return f", in {decoding['precision']}"
    return ""


def card_scores(folder: Path) -> tuple[dict[str, dict[str, Any]], str | None]:
    """The scores in the model-index of a release folder's model card, as a report's ``scores``
    ({"bleu": {"score": ..., "signature": ...}, ...}), and the direction they were measured in ("de→en");
    ({}, None) without a card, front matter or scores."""
    card = Path(folder) / "README.md"
    front = read_front_matter(card.read_text(encoding="utf-8")) if card.is_file() else {}
    for result in (result for model in _mappings(front, "model-index") for result in _mappings(model, "results")):
        scores = {str(metric["type"]): {"score": metric["value"], "signature": _signature(metric)}
                  for metric in _mappings(result, "metrics")
                  if "type" in metric and isinstance(metric.get("value"), (int, float))}
        if scores:  # the first result with scores, and its own direction (a card edited by hand may list several)
            task = result.get("task") if isinstance(result.get("task"), dict) else {}
            return scores, str(task.get("name", "")).removeprefix("Translation ") or None
    return {}, None


def read_front_matter(card: str) -> dict[str, Any]:
    """The YAML mapping between the ``---`` lines that open a model card; {} when there is none or it is no
    valid YAML mapping (a card written by hand, or by an older version)."""
    lines = card.splitlines()
    if not lines or lines[0].strip() != "---" or "---" not in (line.strip() for line in lines[1:]):
        return {}
    end = [line.strip() for line in lines].index("---", 1)
    try:
        front = yaml.safe_load("\n".join(lines[1:end]))
    except yaml.YAMLError:
        return {}
    return front if isinstance(front, dict) else {}


def _mappings(mapping: Any, key: str) -> list[dict[str, Any]]:
    """The mappings listed under ``key`` of a YAML mapping, anything else left out (a card edited by hand)."""
    found = mapping.get(key) if isinstance(mapping, dict) else None
    return [item for item in found if isinstance(item, dict)] if isinstance(found, list) else []


def _signature(metric: dict[str, Any]) -> str | None:
    args = metric.get("args")
    return args.get("signature") if isinstance(args, dict) else None
