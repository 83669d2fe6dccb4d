"""Fine-tuning: a run that starts from a trained model (``train.init_from``) instead of random weights.

As fairseq's ``--finetune-from-model`` and OpenNMT-py's ``-train_from`` with ``-reset_optim all``, the run
takes the parent's weights and tokenizer and starts a fresh optimizer, learning-rate schedule and step
counter; ``train.init_keep_optimizer=true`` continues the parent's instead (a training checkpoint only).
The parent is a training checkpoint or a release folder (`transformer.deploy.release`). Its model and
vocabulary must be the config's: a difference is a one-line error naming it. Once the fine-tuning run has
a checkpoint of its own, it resumes from that, never from the parent again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from transformer.checkpoint import (
    VOCABULARY_SETTINGS,
    CheckpointError,
    load_checkpoint,
    load_weights,
    model_difference,
    run_checkpoint,
    weights_difference,
)
from transformer.config import Config, ConfigError, TrainConfig
from transformer.config_loading import config_from_dict, config_to_dict
from transformer.data.corpus import dataset_name
from transformer.data.languages import directions, target_languages, target_tag
from transformer.data.tokenizer import MissingTagsError, Tokenizer, TokenizerError, check_trained_with, tokenizer_files
from transformer.model.transformer import Transformer
from transformer.release_format import ENGINE_WEIGHTS, WEIGHTS, read_release
from transformer.training import checkpoints
from transformer.training.schedule import SCHEDULE_SETTINGS, load_optimizer_state
from transformer.training.trainer import Trainer, TrainState

log = logging.getLogger(__name__)
FINE_TUNING_SETTINGS = ("init_from", "init_keep_optimizer")  # read at a run's first start only


@dataclass
class ParentModel:
    """What a fine-tuning run takes from the model it starts from."""

    cfg: Config
    weights: dict[str, Tensor]
    tokenizer: dict[str, bytes]  # file name -> SentencePiece model
    checkpoint: dict[str, Any] | None  # the whole training checkpoint (optimizer, schedule); None for a release
    record: dict[str, Any]  # how run records and model cards name it: no path of this machine


def load_parent(path: Path) -> ParentModel:
    """The model at ``path``: a training checkpoint (its tokenizer beside it) or a release folder."""
    if not path.exists():
        raise ConfigError(f"train.init_from: {path} not found (a checkpoint or a release folder)")
    if path.is_dir():
        if not (path / WEIGHTS).is_file():  # a run directory, a CTranslate2 or ONNX folder
            raise ConfigError(f"train.init_from: {path} is {_folder_kind(path)}")

        try:
            cfg, weights, recorded, step = read_release(path)
        except CheckpointError as error:  # as the other errors about the parent: which setting it came from
            raise CheckpointError(f"train.init_from: {error}") from None
        checkpoint, folder, name = None, path, path.resolve().name  # `.` names its folder
    elif path.suffix == ".safetensors":  # a release folder's weights: the config and tokenizer lie beside them
        raise ConfigError(f"train.init_from: {path} is a weights file; give the release folder that holds it "
                          f"({path.parent})")
    else:
        try:
            checkpoint = load_checkpoint(path)
        except CheckpointError as error:  # as the other errors about the parent: which setting it came from
            raise CheckpointError(f"train.init_from: {error}") from None
        cfg = config_from_dict(checkpoint["config"], where=str(path))
        weights, folder, name = checkpoint["model"], path.parent, "/".join(path.resolve().parts[-2:])
        recorded, step = checkpoint.get("dataset"), checkpoint.get("step")
    tokenizer = {}
    for file in tokenizer_files(cfg.data):
        try:
            tokenizer[file] = (folder / file).read_bytes()
        except OSError as error:
            raise CheckpointError(f"train.init_from: cannot read the parent's tokenizer {folder / file} "
                                  f"({error.strerror})") from None
    if checkpoint is not None:
        check_trained_with(tokenizer, checkpoint, path, folder)
    # the corpus as the parent's run named it (older checkpoints and releases: as named from here, which a relative
    # path misleads)
    record = {"name": name, "step": step,
              "dataset": recorded or dataset_name(cfg.data),
              "languages": ", ".join(f"{source}-{target}" for source, target in directions(cfg.data))}
    return ParentModel(cfg, weights, tokenizer, checkpoint, record)


def _folder_kind(folder: Path) -> str:
    """What a folder without release weights is, and what to give instead: a run directory's checkpoint, or the
    model that an inference engine's folder (no trainable weights) was exported from."""
    trained = run_checkpoint(folder)
    if trained:
        return f"a run directory, not a model: give one of its checkpoints, such as {trained}"
    if any((folder / name).is_file() for name in ENGINE_WEIGHTS):
        return ("a CTranslate2 or ONNX folder, which cannot be fine-tuned: give the checkpoint or release folder it "
                "was exported from")
    return f"a folder without {WEIGHTS}: give a checkpoint file or a release folder (transformer-export)"


def check_fits(parent: ParentModel, cfg: Config) -> None:
    """Refuse a parent whose model or vocabulary is not the config's, naming the first difference."""
    if parent.checkpoint is None and Path(cfg.train.run_dir).resolve() == Path(cfg.train.init_from).resolve():
        raise ConfigError(f"train.run_dir {cfg.train.run_dir} is the parent's release folder (train.init_from): the "
                          f"run would write over its config.yaml; give the fine-tuning run a train.run_dir of its own")
    difference = model_difference(config_to_dict(parent.cfg)["model"], config_to_dict(cfg)["model"])
    if difference:
        key, theirs, ours = difference
        raise ConfigError(f"train.init_from: the parent model has model.{key}={theirs}, the config says {ours}; "
                          f"set model.{key}={theirs} to fine-tune it")
    for key in VOCABULARY_SETTINGS:
        theirs, ours = getattr(parent.cfg.data, key), getattr(cfg.data, key)
        if theirs != ours:
            raise ConfigError(f"train.init_from: the parent's vocabulary has data.{key}={theirs}, the config says "
                              f"{ours}; set data.{key}={theirs} to fine-tune it")
    try:  # the config's special ids and tags, in the parent's vocabulary itself (not in its config's pairs: a parent
        # fine-tuned on fewer directions keeps the tags of the others)
        tokenizer = Tokenizer(parent.tokenizer, cfg.data)
    except MissingTagsError as error:  # the tokenizer's advice, to train one, is no fine-tuning's
        languages = [language for language in target_languages(cfg.data) if target_tag(language) in error.tags]
        if not parent.cfg.data.pairs:  # no tag at all: taking the directions out would leave none
            raise ConfigError("train.init_from: the parent is a bilingual model, its vocabulary has no language tags: "
                              "drop data.pairs to fine-tune it on one direction, or train a new multilingual "
                              "model") from None
        raise ConfigError(f"train.init_from: the parent's vocabulary has no tag for {', '.join(languages)}, and a "
                          f"fine-tuning run keeps it: take the directions into {', '.join(languages)} out of "
                          f"data.pairs, or train a new model") from None
    except TokenizerError as error:
        raise ConfigError(f"train.init_from: the parent's tokenizer does not fit: {error}") from None
    with torch.device("meta"):  # the shapes of the run's model, no memory: checked before anything is written
        model = Transformer(cfg.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size)
    difference = weights_difference(model.state_dict(), parent.weights)
    if difference:
        raise CheckpointError(f"train.init_from: {cfg.train.init_from}: weights do not fit the model of its config: "
                              f"{difference}")
    if tokenizer_files(parent.cfg.data) != tokenizer_files(cfg.data):
        raise ConfigError(f"train.init_from: the parent's tokenizer is {', '.join(tokenizer_files(parent.cfg.data))}, "
                          f"the config's {', '.join(tokenizer_files(cfg.data))}: set data.src_lang/tgt_lang as the "
                          f"parent's")  # data.joint_vocab is compared above
    if cfg.train.init_keep_optimizer and (parent.checkpoint is None or not all(
            key in parent.checkpoint for key in ("optimizer", "scheduler", "step"))):
        raise ConfigError("train.init_keep_optimizer=true needs a training checkpoint with its optimizer state, "
                          "schedule and step (not a release folder or an averaged checkpoint)")
    if cfg.train.init_keep_optimizer and cfg.train.max_steps <= parent.checkpoint["step"]:
        raise ConfigError(f"train.max_steps={cfg.train.max_steps} is not past the parent's step "
                          f"{parent.checkpoint['step']}: with train.init_keep_optimizer=true the steps go on from the "
                          f"parent's, so set train.max_steps above it")


def warn_about_fine_tuning(parent: ParentModel, cfg: Config) -> list[str]:
    """Say what a valid fine-tuning config will do that its user likely did not mean; returns what was said."""
    said, train = [], cfg.train
    if parent.cfg.data.pairs and not cfg.data.pairs:  # Johnson et al.'s model reads the target from the tag
        keep = (f"set data.pairs={cfg.data.src_lang}-{cfg.data.tgt_lang} to keep it"
                if cfg.data.tgt_lang in target_languages(parent.cfg.data) else
                f"the parent has no tag for {cfg.data.tgt_lang!r}")
        said.append(f"train.init_from: the parent is multilingual ({', '.join(parent.cfg.data.pairs)}) and reads the "
                    f"target language from a tag before each source; this config has no data.pairs, so it trains "
                    f"without the tag: {keep}")
    step = parent.checkpoint["step"] if train.init_keep_optimizer else 0
    if train.init_keep_optimizer and train.valid_every and train.max_steps // train.valid_every == \
            step // train.valid_every:  # the steps go on from the parent's, and validation is at their multiples
        said.append(f"train.valid_every={train.valid_every}: no multiple of it lies between the parent's step {step} "
                    f"and train.max_steps={train.max_steps}, so the run never validates and writes no "
                    f"checkpoint_best.pt (train.init_keep_optimizer=true counts steps from the parent's)")
    for message in said:
        log.warning(message)
    return said


def start_from_parent(trainer: Trainer, parent: ParentModel) -> None:
    """Load the parent's weights into the trainer's model, and its optimizer, schedule and step if kept."""
    load_weights(trainer.model, parent.weights, f"train.init_from: {trainer.cfg.train.init_from}")
    trainer.parent = parent.record
    if trainer.cfg.train.init_keep_optimizer:
        state = parent.checkpoint
        settings = [{key: group[key] for key in ("betas", "eps", "weight_decay")}
                    for group in trainer.optimizer.param_groups]
        load_optimizer_state(trainer.optimizer, state["optimizer"])
        for group, ours in zip(trainer.optimizer.param_groups, settings):
            group.update(ours)  # the moments are the parent's; Adam's settings are this config's
        trainer.scheduler.load_state_dict(state["scheduler"])
        if state["scaler"] and trainer.scaler.is_enabled():  # a bf16 or fp32 parent has no loss scale
            trainer.scaler.load_state_dict(state["scaler"])
        trainer.state = TrainState(step=state["step"])
        changed = [f"train.{key} {getattr(parent.cfg.train, key)} -> {getattr(trainer.cfg.train, key)}"
                   for key in SCHEDULE_SETTINGS if getattr(parent.cfg.train, key) != getattr(trainer.cfg.train, key)]
        if changed:  # as fairseq's restored scheduler: the step is the parent's, the formula this config's
            log.warning("train.init_keep_optimizer: the schedule goes on from the parent's step %d with this config's "
                        "settings, not the parent's (%s): set them as the parent's to continue its learning-rate "
                        "curve", state["step"], "; ".join(changed))
    if trainer.ctx.is_main:  # once, not once a rank
        log.info("fine-tuning %s (%s, trained on %s)%s", parent.record["name"], parent.record["languages"],
                 parent.record["dataset"], ", continuing its optimizer" if trainer.cfg.train.init_keep_optimizer
                 else "")


def keep_fine_tuning_settings(cfg: Config, point: checkpoints.ResumePoint, say: bool = True) -> Config:
    """``cfg`` with the train.init_from and init_keep_optimizer of the run that ``point`` resumes: a resumed run goes
    on from its checkpoint, so others change nothing, yet its config.yaml, checkpoints and model card would have
    named them. ``say``: warn that those given are not used."""
    state = point.state
    saved, train, defaults = state["config"].get("train", {}), cfg.train, TrainConfig()

    def same(key: str, theirs: object, ours: object) -> bool:  # init_from: a path, however it is written
        if key == "init_from" and theirs and ours:
            return Path(str(theirs)).expanduser().resolve() == Path(str(ours)).expanduser().resolve()
        return theirs == ours

    started = {key: saved.get(key, getattr(defaults, key)) for key in FINE_TUNING_SETTINGS}  # older: no such keys
    kept = {key: value for key, value in started.items() if not same(key, value, getattr(train, key))}
    given = "; ".join(f"train.{key}={getattr(train, key)}" for key in kept if getattr(train, key))
    if say and given and state.get("parent"):
        log.warning("%s not used: the run resumes its own fine-tuning of %s; give a new train.run_dir to fine-tune "
                    "again", given, state["parent"].get("name"))
    elif say and given:  # the run directory's own checkpoint, or another one given to resume (--resume)
        log.warning("%s not used: the run resumes %s, which fine-tuned no parent", given, point.path)
    return replace(cfg, train=replace(train, **kept)) if kept else cfg
