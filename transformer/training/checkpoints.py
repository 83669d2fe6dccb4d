"""Training checkpoints: what one holds (weights, optimizer, schedule, every rank's RNG state and
batch position), writing them from rank 0, and resuming a run from the newest intact one."""

from __future__ import annotations

import logging
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from transformer.atomic_file import atomic_copy
from transformer.checkpoint import (
    BEST,
    LAST,
    VOCABULARY_SETTINGS,
    CheckpointError,
    corpus_difference,
    load_checkpoint,
    load_weights,
    model_difference,
    prune_step_checkpoints,
    save_checkpoint,
    step_checkpoints,
    tokenizer_beside,
)
from transformer.config import Config, ConfigError, TrainConfig
from transformer.config_loading import config_to_dict
from transformer.data.corpus import corpus_identity
from transformer.data.tokenizer import check_trained_with, install_tokenizer, read_models, tokenizer_files
from transformer.errors import first_line
from transformer.runtime.rng import rng_state, set_rng_state
from transformer.training.schedule import load_optimizer_state
from transformer.training.trainer import Trainer, TrainState

log = logging.getLogger(__name__)


def rank_states(trainer: Trainer) -> dict[str, list]:
    """What differs between ranks, of every rank in rank order: the RNG state (dropout) and the
    batch position (a stream's epochs can end a batch apart). A collective: every rank calls it."""
    rng, batches = zip(*trainer.ctx.all_gather_object((rng_state(), trainer.batches.state_dict())))
    return {"rng": list(rng), "batches": list(batches)}


def rank_entry(entries: Any, rank: int, world_size: int) -> Any:
    """This rank's item of a per-rank checkpoint entry (a list in rank order).

    A checkpoint written before entries were per rank holds rank 0's alone, and one written by
    another number of ranks has no item of this rank's: rank 0's stands in for it (a new run, too,
    starts every rank from the same seed).
    """
    if not isinstance(entries, list):
        return entries
    return entries[rank] if len(entries) == world_size else entries[0]


def checkpoint_state(trainer: Trainer, rank_states: dict[str, list]) -> dict:
    """Everything a run resumes from, in types that `torch.load(weights_only=True)` accepts."""
    return {
        "model": trainer.model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "scheduler": trainer.scheduler.state_dict(),
        "scaler": trainer.scaler.state_dict(),
        "step": trainer.state.step,
        "epoch": trainer.epochs_done,
        "batches": rank_states["batches"],
        "train_state": asdict(trainer.state),
        "rng": rank_states["rng"],
        "config": config_to_dict(trainer.cfg),
        "tokenizer_files": trainer.data.tokenizer.files,
        "tokenizer_fingerprint": trainer.data.tokenizer.fingerprint,  # the run's own, checked on resume
        "corpus": trainer.corpus,  # `corpus_identity`: the corpus, wherever it lies, checked on resume
        "dataset": trainer.training_data,  # `dataset_name`, for the records of a fine-tuning and the model card
        "parent": trainer.parent or {},  # the model a fine-tuning run started from (`training.finetune`)
    }


def save(trainer: Trainer, names: list[str], in_background: bool = True) -> None:
    """Write the current state under each name in the run directory: rank 0 writes, and every
    rank must call this, as each sends its own RNG state and batch position. The files are written on
    `Trainer.checkpoint_writer`'s thread from a copy of the state, while training goes on; not ``in_background``
    (the run's last save), before this returns."""
    states = rank_states(trainer)
    if not trainer.ctx.is_main:
        return
    if not torch.stack([p.isfinite().all() for p in trainer.model.parameters()]).all():  # one wait for a GPU
        log.error("parameters are not finite at step %d: checkpoint not written, the last good one is kept",
                  trainer.state.step)
        return
    run_dir, step, keep_last = trainer.run_dir, trainer.state.step, trainer.cfg.train.keep_last

    def write(state: dict) -> None:
        for position, name in enumerate(names):
            try:
                if position == 0:
                    save_checkpoint(state, run_dir / name)
                else:  # the same bytes: serialised and checksummed once, 0.3-0.4 s a name for a 91 MB checkpoint
                    atomic_copy(run_dir / names[0], run_dir / name)
            except Exception as error:  # a full disk is an OSError, or torch.save's RuntimeError ("unexpected pos")
                kept = (f"{names[0]} of this step is written" if position else  # a copy of it failed
                        "the previous one is intact" if (run_dir / name).exists() else "no earlier one was written")
                raise CheckpointError(f"cannot write checkpoint {run_dir / name} at step {step} "
                                      f"({_write_failure(error, run_dir)}); {kept}") from None
        prune_step_checkpoints(run_dir, keep_last)

    trainer.checkpoint_writer.write(checkpoint_state(trainer, states), write, in_background)


def resumable(run_dir: Path) -> bool:
    """Whether the run directory holds a checkpoint that `resume` would start from."""
    return (run_dir / LAST).exists() or bool(step_checkpoints(run_dir)) or (run_dir / BEST).exists()


@dataclass
class ResumePoint:
    """The checkpoint a run continues from, read and checked against the config before any work is done."""

    path: Path
    state: dict


def find_resume_point(cfg: Config, path: Path | None) -> ResumePoint | None:
    """The checkpoint at ``path``, or else the run's newest intact one (the best one last, which holds an optimizer
    state too); None if the run has none. A run whose checkpoints are all unreadable is an error, not a fresh
    start: that would write over them. So is a checkpoint of another model, corpus or vocabulary."""
    run_dir = Path(cfg.train.run_dir)
    candidates = [path] if path is not None else [run_dir / LAST, *reversed(step_checkpoints(run_dir)), run_dir / BEST]
    unreadable = []
    for candidate in candidates:
        if not candidate.exists():
            continue
        try:
            state = load_checkpoint(candidate)
        except CheckpointError as error:
            if path is not None:
                raise
            log.warning("%s; trying an older checkpoint", error)
            unreadable.append(candidate.name)
            continue
        _check_compatible(cfg, state, candidate)
        if "optimizer" not in state:
            raise CheckpointError(f"{candidate}: no optimizer state to resume from (an averaged checkpoint?); "
                                  f"resume from checkpoint_last.pt or a numbered checkpoint")
        return ResumePoint(candidate, state)
    if path is not None:
        raise CheckpointError(f"checkpoint not found: {path}")
    if unreadable:
        raise CheckpointError(f"{run_dir}: no intact checkpoint to resume from ({', '.join(unreadable)}: "
                              f"unreadable); move them away to start the run over")
    return None


def restore(trainer: Trainer, point: ResumePoint) -> None:
    """Continue the run where ``point`` left it: weights, optimizer, schedule, progress, RNG and batch position."""
    state = point.state
    changed = changed_settings(state["config"], trainer.cfg)
    if changed and trainer.ctx.is_main:  # the same on every rank: said once, not once a rank
        log.warning("the run goes on with settings changed since %s: %s", point.path.name, "; ".join(changed))
    load_weights(trainer.model, state["model"], point.path)
    load_optimizer_state(trainer.optimizer, state["optimizer"])
    trainer.scheduler.load_state_dict(state["scheduler"])
    trainer.scaler.load_state_dict(state["scaler"])
    trainer.state = TrainState(**state["train_state"])
    _forget_a_foreign_best(trainer, state["config"].get("train", {}).get("best_metric", TrainConfig.best_metric))
    trainer.parent = state.get("parent") or None
    _restore_rank_state(trainer, state)
    if trainer.ctx.is_main:  # once, not once a rank
        log.info("resumed from %s at step %d", point.path, trainer.state.step)


def _forget_a_foreign_best(trainer: Trainer, saved_metric: str) -> None:
    """Drop the best score (and the count of validations without a better one) that is not of this run's
    best_metric, or whose checkpoint_best.pt is not in this run directory (another run's checkpoint resumed with
    --resume): validations would be compared with it (a loss with a BLEU score, stopping early for nothing) and
    the summary name a checkpoint that does not have it. The next validation sets it anew."""
    state, metric = trainer.state, trainer.cfg.train.best_metric
    if state.best_score is None:
        return
    reason = (f"train.best_metric was {saved_metric}" if saved_metric != metric else
              f"no {BEST} in {trainer.run_dir}" if not (trainer.run_dir / BEST).is_file() else "")
    if reason:
        if trainer.ctx.is_main:
            log.warning("the best %s so far is not carried over (%s): the next validation sets it", metric, reason)
        state.best_score, state.validations_without_improvement = None, 0


def _write_failure(error: Exception, folder: Path) -> str:
    """Why a checkpoint could not be written: the OSError's reason, or, for torch.save's own errors (a full disk
    gives "[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0"), the space left on the disk."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    free = shutil.disk_usage(folder).free
    return f"torch.save failed: {first_line(error)}; {free / 1e6:.1f} MB free on its disk"


def _restore_rank_state(trainer: Trainer, state: dict) -> None:
    """Continue this rank's RNG and batch stream, from its own entry where the checkpoint has one."""
    rank, world_size = trainer.ctx.rank, trainer.ctx.world_size
    saved_ranks = len(state["rng"]) if isinstance(state["rng"], list) else 1  # older checkpoints: rank 0's
    if saved_ranks != world_size and trainer.ctx.is_main:
        log.warning("the checkpoint holds the random state and batch position of %d rank(s), this run has %d: "
                    "every rank continues from rank 0's, so the run will not replay an uninterrupted one "
                    "exactly", saved_ranks, world_size)
    trainer.batches.load_state_dict(rank_entry(state["batches"], rank, world_size))
    set_rng_state(rank_entry(state["rng"], rank, world_size))


def _check_compatible(cfg: Config, state: dict, path: Path) -> None:
    """Refuse a checkpoint whose model, corpus, vocabulary or seed differs from the config's: its weights would not
    load, or its batch position and tokenizer would belong to another corpus or batch order (dropout and the
    positional table may differ; so may the schedule and batching, which `changed_settings` reports)."""
    saved, current = state["config"], config_to_dict(cfg)
    difference = model_difference(saved["model"], current["model"])
    if difference:
        key, saved_value, value = difference
        raise ConfigError(f"{path}: checkpoint has model.{key}={saved_value}, the config says {value}; "
                          f"use another train.run_dir or the checkpoint's config")
    difference = corpus_difference(saved.get("data", {}), current["data"])
    if difference:
        key, saved_value, value = difference
        other = "" if key in VOCABULARY_SETTINGS else " (train.init_from fine-tunes a model on another corpus)"
        raise ConfigError(f"{path}: checkpoint was trained with data.{key}={saved_value}, the config says {value}; "
                          f"a run keeps its corpus and vocabulary: set it back, or start a new train.run_dir{other}")
    seed = saved.get("train", {}).get("seed", cfg.train.seed)
    if seed != cfg.train.seed:  # checked here, before config.yaml is written, not when the batches' position loads
        raise ConfigError(f"{path}: checkpoint's batch order comes from train.seed={seed}, the config says "
                          f"{cfg.train.seed}: resume with train.seed={seed}, or start a new train.run_dir")
    if state.get("corpus") is not None and state["corpus"] != corpus_identity(cfg.data):  # older ones: not recorded
        raise ConfigError(f"{path}: checkpoint was trained on another corpus than data.dataset={cfg.data.dataset} "
                          f"(other training files, or other sizes); a run keeps its corpus: point data.dataset at "
                          f"it, or fine-tune the checkpoint on this one in a new train.run_dir (train.init_from; "
                          f"train.init_keep_optimizer=true goes on with its optimizer and schedule)")


def take_tokenizer(point: ResumePoint, cfg: Config, run_dir: Path) -> None:
    """Have the checkpoint's own tokenizer in the run directory, or refuse to resume: a new one would be trained
    (from another sample, for another run's checkpoint) and the weights would read other tokens. Another run's
    checkpoint brings the tokenizer beside it, checked before it is copied."""
    names = tokenizer_files(cfg.data)
    if point.path.parent.resolve() != run_dir.resolve():  # another run's checkpoint goes on here
        beside = {name: path.read_bytes() for name, path in tokenizer_beside([point.path], names).items()}
        if len(beside) == len(names):  # else the one in the run directory, or what is missing, is named below
            check_trained_with(beside, point.state, point.path, point.path.parent)
            install_tokenizer(beside, run_dir, f"the one beside {point.path}")
            return
    missing = [name for name in names if not (run_dir / name).exists()]
    if missing:
        raise CheckpointError(f"{point.path}: its tokenizer ({', '.join(missing)}) is neither in {run_dir} nor "
                              f"beside the checkpoint; copy it there from the run that wrote the checkpoint")
    check_trained_with(read_models(run_dir, cfg.data), point.state, point.path, run_dir)  # before its own checks


def check_run_tokenizer(cfg: Config, run_dir: Path) -> None:
    """Refuse a config whose languages or vocabulary are not those the run directory's tokenizer was trained for,
    as its config.yaml records: the tokenizer is reused as it is, so the run would not be what the config says; and
    one without the train.init_from of a fine-tuning whose parent's tokenizer it is (stopped before a checkpoint)."""
    files = [name for name in tokenizer_files(cfg.data) if (run_dir / name).exists()]
    if not files or not (run_dir / "config.yaml").exists():
        return
    try:
        saved = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return  # not written by this toolkit: nothing to compare with
    saved = saved if isinstance(saved, dict) else {}
    parent = saved["train"].get("init_from") if isinstance(saved.get("train"), dict) else None
    if parent and not cfg.train.init_from:  # a fine-tuning stopped before its first checkpoint, started again without
        raise ConfigError(f"{run_dir}: a fine-tuning of train.init_from={parent} (its config.yaml) that has no "
                          f"checkpoint yet; without train.init_from this run would train from random weights on "
                          f"the parent's tokenizer: give train.init_from={parent} again, or another train.run_dir")
    difference = corpus_difference(saved.get("data") or {}, config_to_dict(cfg)["data"])
    if difference:
        key, saved_value, value = difference
        raise ConfigError(f"{run_dir}: its tokenizer was trained with data.{key}={saved_value} (its config.yaml), "
                          f"the config says {value}; use another train.run_dir, or remove {', '.join(files)} "
                          f"there to train a new one")


def changed_settings(saved: dict, cfg: Config) -> list[str]:
    """The settings of ``cfg`` that differ from a saved config's, as "section.key old -> new": a resumed run with
    them does not replay an uninterrupted one, which is allowed (a longer run, a smaller batch) but said."""
    changed = []
    for section, values in config_to_dict(cfg).items():
        for key, value in values.items():
            old = saved.get(section, {}).get(key, value)
            if old != value and f"{section}.{key}" not in ("train.run_dir", "data.cache_dir"):
                changed.append(f"{section}.{key} {old} -> {value}")
    return changed
