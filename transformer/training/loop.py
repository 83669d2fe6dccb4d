"""The training loop (§5): `train()` reads top to bottom: set up the run, then per update gather
batches, forward, backward, clip, step, schedule, log, validate, checkpoint; it stops on max
steps/epochs/time, early stopping, or a signal (Ctrl-C, SIGTERM), always leaving a checkpoint to
resume from.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from transformer.atomic_file import cannot_write_into
from transformer.checkpoint import BEST, LAST, step_checkpoint_path
from transformer.config import Config, ConfigError
from transformer.config_loading import save_config
from transformer.data.corpus import check_splits
from transformer.data.loading import check_held_out
from transformer.data.prepare import corpus_cache, prepare_data
from transformer.data.tokenizer import install_tokenizer
from transformer.model.transformer import count_parameters
from transformer.runtime.device import select_device
from transformer.runtime.distributed import init_distributed, shutdown_distributed
from transformer.runtime.machine import describe_machine
from transformer.runtime.precision import select_precision
from transformer.runtime.rng import seed_everything
from transformer.runtime.threads import set_threads
from transformer.training import checkpoints, finetune
from transformer.training.metrics import MetricsLogger
from transformer.training.progress import TrainingBar, log_window
from transformer.training.run_dir import prepare_run_dir
from transformer.training.settings import check_cuda_graphs, warn_about_settings
from transformer.training.trainer import Trainer

log = logging.getLogger(__name__)


@dataclass
class TrainSummary:
    step: int
    best_score: float | None
    best_metric: str
    checkpoint: Path | None  # the best checkpoint, else the last; None when none could be written (non-finite)
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


def train(cfg: Config, resume_from: Path | None = None) -> TrainSummary:
    """Train a model as ``cfg`` says, resuming from the run directory's last checkpoint if there is one."""
    distributed = int(os.environ.get("WORLD_SIZE", 1)) > 1  # started by torchrun with several ranks
    if distributed and cfg.data.streaming and not cfg.train.valid_every:
        raise ConfigError("data.streaming under torchrun needs train.valid_every > 0: streaming ranks end their "
                          "epochs at different steps, and validating at each rank's own epoch end would hang")
    device = select_device(cfg.train.device)
    precision = select_precision(cfg.train.precision, device)
    set_threads(cfg.train.threads)
    if cfg.train.cuda_graphs:
        check_cuda_graphs(cfg, device, distributed)
    ctx = init_distributed(device)
    if ctx.is_main:
        warn_about_settings(cfg, device, precision)
    run_dir = Path(cfg.train.run_dir)
    lock = None
    try:
        cfg, point, parent = _starting_point(cfg, resume_from, say=ctx.is_main)
        check_splits(cfg.data)  # before a tokenizer is trained
        if ctx.is_main:
            lock = prepare_run_dir(run_dir)  # held to the end of the run
            _check_run_dir_and_write_config(cfg, run_dir, point, parent)
        seed_everything(cfg.train.seed)
        data = prepare_data(cfg, run_dir, ctx)
        seed_everything(cfg.train.seed)
        trainer = Trainer(cfg, ctx, data, device, precision)
        if parent:
            finetune.start_from_parent(trainer, parent)
        elif point:
            checkpoints.restore(trainer, point)
        point = parent = None  # their tensors, copied into the trainer: not held in memory for the whole run
        try:
            summary = _train_loop(trainer)
        except BaseException:  # a checkpoint being written is finished before the run directory is let go
            trainer.checkpoint_writer.close(raise_errors=False)  # the loop's error is the one to raise
            raise
        trainer.checkpoint_writer.close()
        ctx.barrier()  # no rank tears the process group down while another still writes or talks
        return summary
    finally:
        # the Trainer sits in reference cycles, and its DDP reducer holds the process group: left to the garbage
        # collector, gloo's group outlives destroy_process_group until the interpreter shuts down, where a rank
        # aborts now and then ("terminate called without an active exception"); freed here, before the group goes
        trainer = None
        if lock is not None:  # first: a failure below must not keep the run directory held
            os.close(lock)
        gc.collect()
        shutdown_distributed()


def _starting_point(cfg: Config, resume_from: Path | None,
                    say: bool) -> tuple[Config, checkpoints.ResumePoint | None, finetune.ParentModel | None]:
    """Where the run starts, read and checked before any work is done: the checkpoint it resumes from (with the
    fine-tuning settings it keeps), or the model it fine-tunes (a fine-tuning run starts from its parent until it
    has a checkpoint of its own), or neither; ``say`` its warnings (once, not once a rank)."""
    point = checkpoints.find_resume_point(cfg, resume_from)
    if point:
        return finetune.keep_fine_tuning_settings(cfg, point, say=say), point, None
    if not cfg.train.init_from:
        return cfg, None, None
    parent = finetune.load_parent(Path(cfg.train.init_from))
    finetune.check_fits(parent, cfg)
    if say:
        finetune.warn_about_fine_tuning(parent, cfg)
    return cfg, None, parent


def _check_run_dir_and_write_config(cfg: Config, run_dir: Path, point: checkpoints.ResumePoint | None,
                                    parent: finetune.ParentModel | None) -> None:
    """Check the corpus cache's folder, the validation pairs and the tokenizer against the run directory, then
    write the run's config.yaml."""
    if cfg.data.cache_dir:  # the run directory, the cache's default home, has been proven writable
        reason = cannot_write_into(Path(cfg.data.cache_dir))
        if reason:  # found after the tokenizer had trained, and named no setting
            raise ConfigError(f"data.cache_dir={cfg.data.cache_dir}: cannot write into it ({reason})")
    # validation pairs not trained on: before the tokenizer and config.yaml (the corpus's cache is kept)
    check_held_out(cfg.data, corpus_cache(cfg.data, run_dir))
    if parent:  # its tokenizer, whatever a failed first start left in config.yaml
        install_tokenizer(parent.tokenizer, run_dir, "the parent's (train.init_from)")
    else:
        checkpoints.check_run_tokenizer(cfg, run_dir)
    if point:
        checkpoints.take_tokenizer(point, cfg, run_dir)
    save_config(cfg, run_dir / "config.yaml")  # the checks passed: this is the run's config now


def _train_loop(trainer: Trainer) -> TrainSummary:
    cfg, ctx, state = trainer.cfg, trainer.ctx, trainer.state
    budget = cfg.train.max_time_seconds
    logger = MetricsLogger(trainer.run_dir, resume_step=state.step) if ctx.is_main else None
    if logger:
        parameters = count_parameters(trainer.model)
        log.info("model: %s parameters; device %s, precision %s, %d rank(s)", f"{parameters:,}",
                 trainer.device, trainer.precision, ctx.world_size)
        # each start or resume: where the figures came from
        logger.note("session", state.step, device=str(trainer.device), precision=trainer.precision,
                    ranks=ctx.world_size, parameters=parameters, **describe_machine(),
                    **({"parent": trainer.parent} if trainer.parent else {}))
        epoch_batches = trainer.epoch_batches  # None for a stream's first epoch
        if epoch_batches and cfg.train.accumulate > epoch_batches:  # a tiny corpus, or a setting meant for a big one
            log.warning("train.accumulate=%d exceeds the %d batches of an epoch: each update spans %.1f epochs",
                        cfg.train.accumulate, epoch_batches, cfg.train.accumulate / epoch_batches)
    session_start = time.monotonic() - state.elapsed
    stop_reason = _limit_reached(trainer, budget, None)  # a finished run started again trains no further
    speed = {"tokens": 0.0, "start": time.monotonic()}  # this session's, for tokens/s (the window may be older)
    # the bar is closed however the loop ends: an error (out of memory, a full disk) is said on a line of its own
    with StopSignal() as stop_signal, TrainingBar(cfg.train, state.step, enabled=ctx.is_main) as bar:
        while not stop_reason:
            trainer.checkpoint_writer.raise_if_failed()  # a checkpoint that could not be written stops the run now
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
                state.log_window[key] += stats[key] * (stats["tokens"] if key != "tokens" else 1)
            speed["tokens"] += stats["tokens"]
            bar.advance(state.step, state.elapsed, trainer.steps_until_max_epochs())
            if log_step:
                log_window(logger, bar, state.step, state.log_window, speed, stats)
            epoch_done = trainer.epochs_done > epochs_before
            if (cfg.train.valid_every and state.step % cfg.train.valid_every == 0) or (
                    not cfg.train.valid_every and epoch_done):
                stop_reason = _validate_and_save(trainer, logger)
            elif cfg.train.save_every and state.step % cfg.train.save_every == 0:
                if logger:
                    logger.flush()
                checkpoints.save(trainer, [LAST, step_checkpoint_path(trainer.run_dir, state.step).name])
            stop_reason = stop_reason or _limit_reached(trainer, budget, stop_signal.received)
    if logger:
        logger.flush()
    checkpoints.save(trainer, [LAST], in_background=False)  # nothing trains meanwhile: no copy to make
    if logger:  # how far the run got and why it ended, for the results table (scripts/results_table.py)
        logger.note("stop", state.step, elapsed=round(state.elapsed, 1), reason=stop_reason)
        logger.close()
    # none of them when the weights were never finite at a save (a diverged run): name no file that is not there
    best = next((path for path in (trainer.run_dir / BEST, trainer.run_dir / LAST) if path.exists()), None)
    return TrainSummary(state.step, state.best_score, cfg.train.best_metric, best, state.elapsed, stop_reason,
                        stop_signal.received)


def _validate_and_save(trainer: Trainer, logger: MetricsLogger | None) -> str:
    """Validate on rank 0, keep the best checkpoint, and decide on early stopping (all ranks agree)."""
    state, cfg = trainer.state, trainer.cfg
    names, patience_over = [LAST, step_checkpoint_path(trainer.run_dir, state.step).name], 0.0
    if trainer.ctx.is_main:
        metrics = trainer.validate()
        if trainer.improved(metrics):
            names.append(BEST)
        # logged before the checkpoint, not after: a run killed between the two resumes from the previous
        # checkpoint and validates again (the record is dropped and written anew); logged after it, a run killed
        # between them would resume past this validation without its record in metrics.jsonl and TensorBoard
        logger.log("valid", state.step, **metrics, best=state.best_score)
        logger.flush()
        tqdm.write(f"step {state.step}: valid loss {metrics['loss']:.3f} ppl {metrics['ppl']:.2f} "
                   f"BLEU {metrics['bleu']:.2f} chrF {metrics['chrf']:.2f}")
        patience_over = float(0 < cfg.train.patience <= state.validations_without_improvement)
    checkpoints.save(trainer, names)
    (patience_over,) = trainer.ctx.all_reduce_sum([patience_over], trainer.device)
    if patience_over:
        return f"early stopping: no better {cfg.train.best_metric} in {cfg.train.patience} validations"
    return ""


def _limit_reached(trainer: Trainer, budget: float, signal_name: str | None) -> str:
    """Why training must stop now, or "" (the same answer on every rank); records the share of max_time used."""
    cfg, state = trainer.cfg, trainer.state
    reasons = [
        (signal_name is not None, f"interrupted by {signal_name}"),
        (state.step >= cfg.train.max_steps, f"reached train.max_steps={cfg.train.max_steps}"),
        (cfg.train.max_epochs > 0 and trainer.epochs_done >= cfg.train.max_epochs,
         f"reached train.max_epochs={cfg.train.max_epochs}"),
        (budget > 0 and state.elapsed >= budget, f"reached train.max_time={cfg.train.max_time}"),
        (0 < cfg.train.patience <= state.validations_without_improvement,  # a stopped run started again
         f"early stopping: no better {cfg.train.best_metric} in {cfg.train.patience} validations"),
    ]
    *flags, elapsed = trainer.ctx.all_reduce_sum([float(hit) for hit, _ in reasons] + [state.elapsed], trainer.device)
    # the ranks' mean clock, so that a cooldown gives every rank the same learning rate
    state.max_time_used = elapsed / trainer.ctx.world_size / budget if budget else 0.0
    return next((reason for flag, (_, reason) in zip(flags, reasons) if flag), "")
