"""Training (§5): the train loop, validation and checkpoints.

`train()` reads top to bottom: set up the run, then per update gather batches, forward,
backward, clip, step, schedule, log, validate, checkpoint; it stops on max steps/epochs/time,
early stopping, or a signal (Ctrl-C, SIGTERM), always leaving a checkpoint to resume from.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import signal
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from transformer.batching import Batch, TrainBatches
from transformer.checkpoint import (
    BEST,
    LAST,
    CheckpointError,
    load_checkpoint,
    prune_step_checkpoints,
    rank_entry,
    save_checkpoint,
    step_checkpoint_path,
    step_checkpoints,
)
from transformer.config import Config, ConfigError, config_to_dict, save_config
from transformer.corpus import PreparedData, prepare_data
from transformer.evaluate import score_translations
from transformer.loss import label_smoothed_cross_entropy
from transformer.metrics import MetricsLogger
from transformer.model import Transformer, count_parameters
from transformer.progress import TrainingBar, epoch_steps_left, log_window
from transformer.runtime import (
    DistributedContext,
    autocast,
    init_distributed,
    rng_state,
    seed_everything,
    select_device,
    select_precision,
    set_rng_state,
    set_threads,
    shutdown_distributed,
)
from transformer.schedule import build_optimizer, build_scheduler, load_optimizer_state
from transformer.translator import Translator

log = logging.getLogger(__name__)


@dataclass
class TrainState:
    """Progress that a checkpoint carries besides weights and optimizer."""

    step: int = 0
    elapsed: float = 0.0  # seconds of training so far, over all sessions of this run
    best_score: float | None = None
    validations_without_improvement: int = 0
    nonfinite_steps: int = 0


@dataclass
class TrainSummary:
    step: int
    best_score: float | None
    best_metric: str
    checkpoint: Path
    seconds: float
    stop_reason: str
    signal: str | None = None  # SIGINT or SIGTERM when training was interrupted


class StopSignal:
    """Turn SIGINT/SIGTERM into a request to stop after the current update (a second one kills)."""

    def __init__(self) -> None:
        self.received: str | None = None
        self.previous = {}

    def __enter__(self) -> StopSignal:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame) -> None:
        self.received = signal.Signals(signum).name
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


class Trainer:
    """Holds what one training run needs; `train()` below drives it."""

    def __init__(self, cfg: Config, ctx: DistributedContext, data: PreparedData, device: torch.device,
                 precision: str) -> None:
        self.cfg, self.ctx, self.data, self.device, self.precision = cfg, ctx, data, device, precision
        self.run_dir = Path(cfg.train.run_dir)
        tok = data.tokenizer
        self.model = Transformer(cfg.model, tok.src_vocab_size, tok.tgt_vocab_size, tok.pad_id, tok.bos_id,
                                 tok.eos_id).to(device)
        self.forward_model: torch.nn.Module = self.model
        if ctx.enabled:
            device_ids = [device] if device.type == "cuda" else None
            self.forward_model = DistributedDataParallel(self.model, device_ids=device_ids)
        if cfg.train.compile:
            self.forward_model = torch.compile(self.forward_model)
        self.optimizer = build_optimizer(self.model.parameters(), cfg.train, device)
        self.scheduler = build_scheduler(self.optimizer, cfg.train, cfg.model.d_model)
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
        self.batches = data.train_batches(cfg.train.seed, ctx.rank, ctx.world_size)
        self.state = TrainState()
        self._stream: Iterator[Batch] | None = None

    def next_batches(self) -> list[Batch]:
        """The batches of the next update (``train.accumulate`` of them), crossing epochs as needed."""
        if self._stream is None:  # created lazily, so that a resumed position is respected
            self._stream = (batch for _ in itertools.count() for batch in self.batches)
        return [next(self._stream) for _ in range(self.cfg.train.accumulate)]

    def steps_until_max_epochs(self) -> int | None:
        """Updates until ``train.max_epochs``; None while an epoch's length is unknown (for the progress bar)."""
        epoch_batches = len(self.batches) if isinstance(self.batches, TrainBatches) else self.batches.last_epoch_length
        return epoch_steps_left(self.cfg.train.max_epochs, self.batches.epoch, self.batches.position, epoch_batches,
                                self.cfg.train.accumulate)

    @property
    def epochs_done(self) -> int:
        """Complete passes over the training data so far."""
        return self.batches.epoch + self.batches.epoch_finished

    # -- checkpoints ---------------------------------------------------------------------------
    def rank_states(self) -> dict[str, list]:
        """What differs between ranks, of every rank in rank order: the RNG state (dropout) and the
        batch position (a stream's epochs can end a batch apart). A collective: every rank calls it."""
        rng, batches = zip(*self.ctx.all_gather_object((rng_state(), self.batches.state_dict())))
        return {"rng": list(rng), "batches": list(batches)}

    def checkpoint_state(self, rank_states: dict[str, list]) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "step": self.state.step,
            "epoch": self.epochs_done,
            "batches": rank_states["batches"],
            "train_state": asdict(self.state),
            "rng": rank_states["rng"],
            "config": config_to_dict(self.cfg),
            "tokenizer_files": self.data.tokenizer.files,
        }

    def save(self, names: list[str]) -> None:
        """Write the current state under each name in the run directory: rank 0 writes, and every
        rank must call this, as each sends its own RNG state and batch position."""
        rank_states = self.rank_states()
        if not self.ctx.is_main:
            return
        if not all(p.isfinite().all() for p in self.model.parameters()):
            log.error("parameters are not finite at step %d: checkpoint not written, the last good one is kept",
                      self.state.step)
            return
        state = self.checkpoint_state(rank_states)
        for name in names:
            try:
                save_checkpoint(state, self.run_dir / name)
            except OSError as error:
                raise CheckpointError(f"cannot write checkpoint {self.run_dir / name} at step {self.state.step} "
                                      f"({error.strerror}); the previous checkpoint is intact") from None
        prune_step_checkpoints(self.run_dir, self.cfg.train.keep_last)

    def resume(self, path: Path | None) -> None:
        """Restore everything from ``path`` or from the newest intact checkpoint of the run."""
        candidates = [path] if path is not None else [self.run_dir / LAST, *reversed(step_checkpoints(self.run_dir))]
        for candidate in candidates:
            if not candidate.exists():
                continue
            try:
                state = load_checkpoint(candidate)
            except CheckpointError as error:
                if path is not None:
                    raise
                log.warning("%s; trying an older checkpoint", error)
                continue
            self._check_compatible(state, candidate)
            self.model.load_state_dict(state["model"])
            load_optimizer_state(self.optimizer, state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            self.scaler.load_state_dict(state["scaler"])
            self.state = TrainState(**state["train_state"])
            self._restore_rank_state(state)
            log.info("resumed from %s at step %d", candidate, self.state.step)
            return
        if path is not None:
            raise CheckpointError(f"checkpoint not found: {path}")

    def _restore_rank_state(self, state: dict) -> None:
        """Continue this rank's RNG and batch stream, from its own entry where the checkpoint has one."""
        rank, world_size = self.ctx.rank, self.ctx.world_size
        saved_ranks = len(state["rng"]) if isinstance(state["rng"], list) else 1  # older checkpoints: rank 0's
        if saved_ranks != world_size and self.ctx.is_main:
            log.warning("the checkpoint holds the random state and batch position of %d rank(s), this run has %d: "
                        "every rank continues from rank 0's, so the run will not replay an uninterrupted one "
                        "exactly", saved_ranks, world_size)
        self.batches.load_state_dict(rank_entry(state["batches"], rank, world_size))
        set_rng_state(rank_entry(state["rng"], rank, world_size))

    def _check_compatible(self, state: dict, path: Path) -> None:
        saved = state["config"]["model"]
        for key, value in config_to_dict(self.cfg)["model"].items():
            if key in ("dropout", "attention_dropout", "activation_dropout", "max_positions"):
                continue
            if saved.get(key) != value:
                raise ConfigError(f"{path}: checkpoint has model.{key}={saved.get(key)}, the config says {value}; "
                                  f"use another train.run_dir or the checkpoint's config")

    # -- one update ----------------------------------------------------------------------------
    def update(self, batches: list[Batch], measure_grad_norm: bool = False) -> dict[str, float] | None:
        """Forward/backward over ``batches`` (gradient accumulation), then clip and step.

        The loss is summed over tokens and divided by the tokens of the whole update over all
        ranks, so N ranks or N accumulated batches make the same update as one big batch.
        Returns the update's statistics (with "grad_norm" when clipping or ``measure_grad_norm``),
        or None when the loss was not finite (update skipped).
        """
        local_tokens = sum(b.n_tgt_tokens for b in batches)
        (total_tokens,) = self.ctx.all_reduce_sum([float(local_tokens)], self.device)
        self.forward_model.train()
        loss_sum = nll_sum = 0.0
        for i, batch in enumerate(batches):
            batch = batch.to(self.device)
            sync = i == len(batches) - 1 or not self.ctx.enabled
            with contextlib.nullcontext() if sync else self.forward_model.no_sync():
                with autocast(self.device, self.precision):
                    logits = self.forward_model(batch.src, batch.tgt_in)
                loss, nll = label_smoothed_cross_entropy(logits, batch.tgt_out, self.cfg.train.label_smoothing,
                                                         self.model.pad_id)
                self.scaler.scale(loss * (self.ctx.world_size / total_tokens)).backward()
            loss_sum, nll_sum = loss_sum + loss.item(), nll_sum + nll.item()
        loss_sum, nll_sum = self.ctx.all_reduce_sum([loss_sum, nll_sum], self.device)
        if not math.isfinite(loss_sum):
            self.optimizer.zero_grad(set_to_none=True)
            if self.scaler.is_enabled():  # fp16 overflow: go on with a smaller loss scale
                self.scaler.update(self.scaler.get_scale() / 2)
            return None
        stats = {"loss": loss_sum / total_tokens, "nll": nll_sum / total_tokens,
                 "lr": self.optimizer.param_groups[0]["lr"], "tokens": total_tokens}
        if self.cfg.train.clip_norm > 0 or measure_grad_norm:  # the norm costs a pass over all gradients
            self.scaler.unscale_(self.optimizer)
            clip = self.cfg.train.clip_norm if self.cfg.train.clip_norm > 0 else float("inf")
            stats["grad_norm"] = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip).item()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return stats

    # -- validation ----------------------------------------------------------------------------
    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Loss and perplexity by teacher forcing, then BLEU/chrF of decoded validation sentences."""
        self.model.eval()
        nll_sum = tokens = 0.0
        for batch in self.data.valid_batches():
            batch = batch.to(self.device)
            with autocast(self.device, self.precision):
                logits = self.model(batch.src, batch.tgt_in)
            nll_sum += label_smoothed_cross_entropy(logits, batch.tgt_out, 0.0, self.model.pad_id)[1].item()
            tokens += batch.n_tgt_tokens
        limit = self.cfg.train.valid_max_sentences or None
        sources, references = self.data.valid_texts(limit)
        translator = Translator(self.model, self.data.tokenizer, self.cfg.decode, self.device, self.precision,
                                self.cfg.data.max_length)
        hypotheses = translator.translate(sources, beam_size=self.cfg.train.valid_beam_size)
        scores = score_translations(hypotheses, [references])
        return {"loss": nll_sum / tokens, "ppl": math.exp(min(nll_sum / tokens, 50.0)),
                "bleu": scores["bleu"].score, "chrf": scores["chrf"].score}

    def improved(self, metrics: dict[str, float]) -> bool:
        """Record ``metrics`` against the best so far; True if this is a new best."""
        name = self.cfg.train.best_metric
        score = -metrics["loss"] if name == "loss" else metrics[name]
        if self.state.best_score is None or score > self.state.best_score:
            self.state.best_score, self.state.validations_without_improvement = score, 0
            return True
        self.state.validations_without_improvement += 1
        return False


def prepare_run_dir(run_dir: Path) -> None:
    """Create the run directory and prove it is writable before any work is done."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write_test"
        probe.write_bytes(b"ok")
        probe.unlink()
        for stale in run_dir.glob(".checkpoint_*.tmp"):  # left by a crash while writing a checkpoint
            stale.unlink()
    except OSError as error:
        raise ConfigError(f"train.run_dir: cannot write to {run_dir} ({error.strerror})") from None


def train(cfg: Config, resume_from: Path | None = None) -> TrainSummary:
    """Train a model as ``cfg`` says, resuming from the run directory's last checkpoint if there is one."""
    device = select_device(cfg.train.device)
    precision = select_precision(cfg.train.precision, device)
    set_threads(cfg.train.threads)
    ctx = init_distributed(device)
    run_dir = Path(cfg.train.run_dir)
    try:
        if ctx.is_main:
            prepare_run_dir(run_dir)
            save_config(cfg, run_dir / "config.yaml")
        seed_everything(cfg.train.seed)
        data = prepare_data(cfg, run_dir, ctx)
        seed_everything(cfg.train.seed)
        trainer = Trainer(cfg, ctx, data, device, precision)
        trainer.resume(resume_from)
        summary = _train_loop(trainer)
        ctx.barrier()  # no rank tears the process group down while another still writes or talks
        return summary
    finally:
        shutdown_distributed()


def _train_loop(trainer: Trainer) -> TrainSummary:
    cfg, ctx, state = trainer.cfg, trainer.ctx, trainer.state
    budget = cfg.train.max_time_seconds
    logger = MetricsLogger(trainer.run_dir, resume_step=state.step) if ctx.is_main else None
    if ctx.is_main:
        log.info("model: %s parameters; device %s, precision %s, %d rank(s)", f"{count_parameters(trainer.model):,}",
                 trainer.device, trainer.precision, ctx.world_size)
    bar = TrainingBar(cfg.train, state.step, enabled=ctx.is_main)
    session_start, stop_reason = time.monotonic() - state.elapsed, ""
    window = {"loss": 0.0, "nll": 0.0, "tokens": 0.0, "start": time.monotonic()}
    with StopSignal() as stop_signal:
        while not stop_reason:
            epochs_before = trainer.epochs_done
            log_step = (state.step + 1) % cfg.train.log_every == 0
            stats = trainer.update(trainer.next_batches(), measure_grad_norm=log_step)
            if stats is None:
                state.nonfinite_steps += 1
                log.warning("non-finite loss at step %d: update skipped (%d in a row)", state.step + 1,
                            state.nonfinite_steps)
                if state.nonfinite_steps >= cfg.train.max_nonfinite_steps:
                    stop_reason = (f"stopped after {state.nonfinite_steps} consecutive non-finite losses "
                                   f"(train.max_nonfinite_steps); lower train.lr or use train.precision=fp32")
                continue
            state.step, state.nonfinite_steps = state.step + 1, 0
            state.elapsed = time.monotonic() - session_start
            for key in ("loss", "nll", "tokens"):
                window[key] += stats[key] * (stats["tokens"] if key != "tokens" else 1)
            bar.advance(state.step, state.elapsed, trainer.steps_until_max_epochs())
            if log_step:
                log_window(logger, bar, state.step, window, stats)
            epoch_done = trainer.epochs_done > epochs_before
            if (cfg.train.valid_every and state.step % cfg.train.valid_every == 0) or (
                    not cfg.train.valid_every and epoch_done):
                stop_reason = _validate_and_save(trainer, logger)
            elif cfg.train.save_every and state.step % cfg.train.save_every == 0:
                trainer.save([LAST, step_checkpoint_path(trainer.run_dir, state.step).name])
            stop_reason = stop_reason or _limit_reached(trainer, budget, stop_signal.received)
    bar.close()
    trainer.save([LAST])
    if logger:
        logger.close()
    best = trainer.run_dir / BEST if (trainer.run_dir / BEST).exists() else trainer.run_dir / LAST
    return TrainSummary(state.step, state.best_score, cfg.train.best_metric, best, state.elapsed, stop_reason,
                        stop_signal.received)


def _validate_and_save(trainer: Trainer, logger: MetricsLogger | None) -> str:
    """Validate on rank 0, keep the best checkpoint, and decide on early stopping (all ranks agree)."""
    state, cfg = trainer.state, trainer.cfg
    names, metrics, patience_over = [LAST, step_checkpoint_path(trainer.run_dir, state.step).name], None, 0.0
    if trainer.ctx.is_main:
        metrics = trainer.validate()
        if trainer.improved(metrics):
            names.append(BEST)
    trainer.save(names)
    if metrics is not None:
        logger.log("valid", state.step, **metrics, best=state.best_score)
        tqdm.write(f"step {state.step}: valid loss {metrics['loss']:.3f} ppl {metrics['ppl']:.2f} "
                   f"BLEU {metrics['bleu']:.2f} chrF {metrics['chrf']:.2f}")
        patience_over = float(0 < cfg.train.patience <= state.validations_without_improvement)
    (patience_over,) = trainer.ctx.all_reduce_sum([patience_over], trainer.device)
    if patience_over:
        return f"early stopping: no better {cfg.train.best_metric} in {cfg.train.patience} validations"
    return ""


def _limit_reached(trainer: Trainer, budget: float, signal_name: str | None) -> str:
    """Why training must stop now, or "" (the same answer on every rank)."""
    cfg, state = trainer.cfg, trainer.state
    reasons = [
        (signal_name is not None, f"interrupted by {signal_name}"),
        (state.step >= cfg.train.max_steps, f"reached train.max_steps={cfg.train.max_steps}"),
        (cfg.train.max_epochs > 0 and trainer.epochs_done >= cfg.train.max_epochs,
         f"reached train.max_epochs={cfg.train.max_epochs}"),
        (budget > 0 and state.elapsed >= budget, f"reached train.max_time={cfg.train.max_time}"),
    ]
    flags = trainer.ctx.all_reduce_sum([float(hit) for hit, _ in reasons], trainer.device)
    return next((reason for flag, (_, reason) in zip(flags, reasons) if flag), "")
