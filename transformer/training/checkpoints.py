"""Training checkpoints: what one holds (weights, optimizer, schedule, every rank's RNG state and
batch position), writing them from rank 0, and resuming a run from the newest intact one."""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path

from transformer.checkpoint import (
    BEST,
    LAST,
    CheckpointError,
    load_checkpoint,
    prune_step_checkpoints,
    rank_entry,
    save_checkpoint,
    step_checkpoints,
)
from transformer.config import Config, ConfigError
from transformer.config_loading import config_to_dict
from transformer.runtime.rng import rng_state, set_rng_state
from transformer.training.schedule import load_optimizer_state
from transformer.training.trainer import Trainer, TrainState

log = logging.getLogger(__name__)


def rank_states(trainer: Trainer) -> dict[str, list]:
    """What differs between ranks, of every rank in rank order: the RNG state (dropout) and the
    batch position (a stream's epochs can end a batch apart). A collective: every rank calls it."""
    rng, batches = zip(*trainer.ctx.all_gather_object((rng_state(), trainer.batches.state_dict())))
    return {"rng": list(rng), "batches": list(batches)}


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
        "parent": trainer.parent or {},  # the model a fine-tuning run started from (`training.finetune`)
    }


def save(trainer: Trainer, names: list[str]) -> None:
    """Write the current state under each name in the run directory: rank 0 writes, and every
    rank must call this, as each sends its own RNG state and batch position."""
    states = rank_states(trainer)
    if not trainer.ctx.is_main:
        return
    if not all(p.isfinite().all() for p in trainer.model.parameters()):
        log.error("parameters are not finite at step %d: checkpoint not written, the last good one is kept",
                  trainer.state.step)
        return
    state = checkpoint_state(trainer, states)
    for name in names:
        try:
            save_checkpoint(state, trainer.run_dir / name)
        except OSError as error:
            raise CheckpointError(f"cannot write checkpoint {trainer.run_dir / name} at step {trainer.state.step} "
                                  f"({error.strerror}); the previous checkpoint is intact") from None
    prune_step_checkpoints(trainer.run_dir, trainer.cfg.train.keep_last)


def resumable(run_dir: Path) -> bool:
    """Whether the run directory holds a checkpoint that `resume` would start from."""
    return (run_dir / LAST).exists() or bool(step_checkpoints(run_dir)) or (run_dir / BEST).exists()


def resume(trainer: Trainer, path: Path | None) -> bool:
    """Restore everything from ``path`` or from the newest intact checkpoint of the run (the best one last, which
    holds an optimizer state too); False if the run has none. A run whose checkpoints are all unreadable is an
    error, not a fresh start: that would write over them."""
    candidates = [path] if path is not None else [trainer.run_dir / LAST, *reversed(step_checkpoints(trainer.run_dir)),
                                                  trainer.run_dir / BEST]
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
        _check_compatible(trainer, state, candidate)
        if "optimizer" not in state:
            raise CheckpointError(f"{candidate}: no optimizer state to resume from (an averaged checkpoint?); "
                                  f"resume from checkpoint_last.pt or a numbered checkpoint")
        trainer.model.load_state_dict(state["model"])
        load_optimizer_state(trainer.optimizer, state["optimizer"])
        trainer.scheduler.load_state_dict(state["scheduler"])
        trainer.scaler.load_state_dict(state["scaler"])
        trainer.state = TrainState(**state["train_state"])
        trainer.parent = state.get("parent") or None
        _restore_rank_state(trainer, state)
        log.info("resumed from %s at step %d", candidate, trainer.state.step)
        return True
    if path is not None:
        raise CheckpointError(f"checkpoint not found: {path}")
    if unreadable:
        raise CheckpointError(f"{trainer.run_dir}: no intact checkpoint to resume from ({', '.join(unreadable)}: "
                              f"unreadable); move them away to start the run over")
    return False


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


def _check_compatible(trainer: Trainer, state: dict, path: Path) -> None:
    """Refuse a checkpoint whose model differs from the config's (dropout and the positional table may)."""
    difference = model_difference(state["config"]["model"], trainer.cfg)
    if difference:
        key, saved, value = difference
        raise ConfigError(f"{path}: checkpoint has model.{key}={saved}, the config says {value}; "
                          f"use another train.run_dir or the checkpoint's config")


def model_difference(saved: dict, cfg: Config) -> tuple[str, object, object] | None:
    """The first model setting (key, saved value, ``cfg``'s value) in which a saved model's config differs from
    ``cfg``'s, or None; dropout and the positional table's size may differ."""
    for key, value in config_to_dict(cfg)["model"].items():
        if key not in ("dropout", "attention_dropout", "activation_dropout", "max_positions") and \
                saved.get(key) != value:
            return key, saved.get(key), value
    return None
