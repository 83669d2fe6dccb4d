"""The Trainer (§5): the model, optimizer and schedule of a run, one update, and validation."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from transformer import fast
from transformer.config import Config
from transformer.data.batch import Batch
from transformer.data.batching import TrainBatches
from transformer.data.corpus import corpus_identity, dataset_name
from transformer.data.prepare import PreparedData
from transformer.decoding.translator import Translator
from transformer.errors import DataError
from transformer.evaluate import score_translations
from transformer.model.transformer import Transformer
from transformer.runtime.compile import compile_training
from transformer.runtime.cuda_graphs import CudaGraphRecorder, GraphedSteps
from transformer.runtime.distributed import DistributedContext
from transformer.runtime.precision import AutocastLayerNorm, autocast
from transformer.training.checkpoint_writer import CheckpointWriter
from transformer.training.loss import label_smoothed_cross_entropy
from transformer.training.progress import epoch_steps_left
from transformer.training.schedule import build_optimizer, build_scheduler

log = logging.getLogger(__name__)


@dataclass
class TrainState:
    """Progress that a checkpoint carries besides weights and optimizer."""

    step: int = 0
    elapsed: float = 0.0  # seconds of training so far, over all sessions of this run
    max_time_used: float = 0.0  # fraction of max_time used (the ranks' mean clock, so the same on every rank)
    best_score: float | None = None
    validations_without_improvement: int = 0
    nonfinite_steps: int = 0
    # token-weighted sums of loss and nll since the last log line, and their tokens: a run resumed between two log
    # lines logs the averages an uninterrupted one does, not those of the steps since the resume only
    log_window: dict[str, float] = field(default_factory=lambda: {"loss": 0.0, "nll": 0.0, "tokens": 0.0})


class Trainer:
    """Holds what one training run needs; `transformer.training.loop.train` drives it."""

    def __init__(self, cfg: Config, ctx: DistributedContext, data: PreparedData, device: torch.device,
                 precision: str) -> None:
        self.cfg, self.ctx, self.data, self.device, self.precision = cfg, ctx, data, device, precision
        self.run_dir = Path(cfg.train.run_dir)
        tok = data.tokenizer
        self.model = Transformer(cfg.model, tok.src_vocab_size, tok.tgt_vocab_size, tok.pad_id, tok.bos_id,
                                 tok.eos_id).to(device)
        if not cfg.train.float32_residual:  # validation's translations too: the model is one
            fast.replace_modules(self.model, nn.LayerNorm, AutocastLayerNorm.sharing)
        self.loss_function = fast.for_training(self.model) if cfg.train.fast_paths else label_smoothed_cross_entropy
        self.forward_model: torch.nn.Module = self.model
        if cfg.train.compile:  # the plain model stays in self.model: checkpoints, validation, decoding
            self.forward_model, self.loss_function = compile_training(self.model, self.loss_function,
                                                                      cfg.train.compile_mode)
        self.graphed_steps = self._graphed_steps() if cfg.train.cuda_graphs else None
        if ctx.enabled:
            device_ids = [device] if device.type == "cuda" else None
            self.forward_model = DistributedDataParallel(self.forward_model, device_ids=device_ids)
        self.state = TrainState()  # before the scheduler, which reads it at once
        self.parent: dict | None = None  # the model a fine-tuning run started from (`training.finetune`)
        self.optimizer = build_optimizer(self.model.parameters(), cfg.train, device)
        self.scheduler = build_scheduler(self.optimizer, cfg.train, cfg.model.d_model, lambda: self.state.max_time_used)
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
        self._clear_gradients()
        self.batches = data.train_batches(cfg.train.seed, ctx.rank, ctx.world_size)
        self.corpus = corpus_identity(cfg.data)  # which corpus the checkpoints' batch positions belong to
        self.training_data = dataset_name(cfg.data)  # the corpus as named where the run reads it (a relative path
        # means nothing elsewhere): what a Translator calls training_data; checkpoints keep it as "dataset"
        self._stream: Iterator[Batch] | None = None
        self.checkpoint_writer = CheckpointWriter()  # `checkpoints.save` writes on its thread; the loop closes it

    def next_batches(self) -> list[Batch]:
        """The batches of the next update (``train.accumulate`` of them), crossing epochs as needed."""
        if self._stream is None:  # created lazily, so that a resumed position is respected
            self._stream = self._epochs()
        return [next(self._stream) for _ in range(self.cfg.train.accumulate)]

    def _epochs(self) -> Iterator[Batch]:
        """The batches, epoch after epoch; two epochs in a row without one (a resumed epoch may end at
        once) mean there is nothing to train on: an error, not an endless loop."""
        empty_epochs = 0
        while empty_epochs < 2:
            empty_epochs += 1
            for batch in self.batches:
                empty_epochs = 0
                yield batch
        raise DataError(f"the training data gives no batch for rank {self.ctx.rank} of {self.ctx.world_size}: every "
                        f"pair was filtered out (data.max_length={self.cfg.data.max_length}?), or the corpus is "
                        f"too small for the ranks")

    @property
    def epoch_batches(self) -> int | None:
        """This rank's batches in an epoch; None while unknown (a stream's first epoch)."""
        return len(self.batches) if isinstance(self.batches, TrainBatches) else self.batches.last_epoch_length

    def steps_until_max_epochs(self) -> int | None:
        """Updates until ``train.max_epochs``; None while an epoch's length is unknown (for the progress bar)."""
        return epoch_steps_left(self.cfg.train.max_epochs, self.batches.epoch, self.batches.position,
                                self.epoch_batches, self.cfg.train.accumulate)

    @property
    def epochs_done(self) -> int:
        """Complete passes over the training data so far."""
        return self.batches.epoch + self.batches.epoch_finished

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
        sums = []  # each batch's (loss, nll), read once after the last: a GPU need not wait between the batches
        for i, batch in enumerate(batches):
            batch = batch.to(self.device)
            sync = i == len(batches) - 1 or not self.ctx.enabled
            with contextlib.nullcontext() if sync else self.forward_model.no_sync():
                step = self.graphed_steps or self.forward_backward
                loss, nll = step(batch.src, batch.tgt_in, batch.tgt_out, self.ctx.world_size / total_tokens)
            sums.append(torch.stack([loss.float(), nll.float()]))  # a copy: a graph's outputs are overwritten
        loss_sum = nll_sum = 0.0
        for loss, nll in torch.stack(sums).tolist():  # added in order, in double precision, as ever
            loss_sum, nll_sum = loss_sum + loss, nll_sum + nll
        loss_sum, nll_sum = self.ctx.all_reduce_sum([loss_sum, nll_sum], self.device)
        if not math.isfinite(loss_sum):
            self._clear_gradients()
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
        self._clear_gradients()
        return stats

    def forward_backward(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor,
                         factor: float | Tensor) -> tuple[Tensor, Tensor]:
        """Forward and loss of one batch, and backward of the loss times ``factor``; returns (loss, nll)."""
        with autocast(self.device, self.precision):
            logits = self.forward_model(src, tgt_in, self.cfg.train.attention_row_length)
        loss, nll = self.loss_function(logits, tgt_out, self.cfg.train.label_smoothing, self.model.pad_id)
        self.scaler.scale(loss * factor).backward()
        return loss.detach(), nll

    def _graphed_steps(self) -> GraphedSteps:
        """`forward_backward` replayed from CUDA graphs (train.cuda_graphs; `check_cuda_graphs` has passed), into the
        zeroed gradients."""
        return GraphedSteps(self.forward_backward, lambda: [p.grad for p in self.model.parameters()],
                            CudaGraphRecorder(self.device))

    def _clear_gradients(self) -> None:
        """Gradients to None, or to zero in place under CUDA graphs: a graph adds to the gradients at fixed
        addresses, so they are buffers of their own (allocated here, before any graph)."""
        if self.graphed_steps is None:
            self.optimizer.zero_grad(set_to_none=True)
            return
        for parameter in self.model.parameters():
            if parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)
        self.optimizer.zero_grad(set_to_none=False)

    # -- validation ----------------------------------------------------------------------------
    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Loss and perplexity by teacher forcing, then BLEU/chrF of decoded validation sentences; and the seconds each
        part took (``seconds_loss``, ``seconds_translate``, ``seconds_score``: a validation took 5-16 s of the
        90-second GPU recipe, which they break down)."""
        self.model.eval()
        start = time.perf_counter()
        nll_sum = tokens = 0.0
        for batch in self.data.valid_batches():
            batch = batch.to(self.device)
            with autocast(self.device, self.precision):
                logits = self.model(batch.src, batch.tgt_in)
            nll_sum += label_smoothed_cross_entropy(logits, batch.tgt_out, 0.0, self.model.pad_id)[1].item()
            tokens += batch.n_tgt_tokens
        limit = self.cfg.train.valid_max_sentences or None
        sources, references = self.data.valid_texts(limit)
        decode = replace(self.cfg.decode, beam_size=self.cfg.train.valid_beam_size, nbest=1, sampling=False)
        translator = Translator(self.model, self.data.tokenizer, decode, self.device, self.precision,
                                self.cfg.data.max_length)
        loss_done = time.perf_counter()
        hypotheses = translator.translate(sources, progress=self.ctx.is_main)  # a bar under training's: tens of s
        translated = time.perf_counter()
        scores = score_translations(hypotheses, [references])
        return {"loss": nll_sum / tokens, "ppl": math.exp(min(nll_sum / tokens, 50.0)),
                "bleu": scores["bleu"].score, "chrf": scores["chrf"].score, "seconds_loss": loss_done - start,
                "seconds_translate": translated - loss_done, "seconds_score": time.perf_counter() - translated}

    def improved(self, metrics: dict[str, float]) -> bool:
        """Record ``metrics`` against the best so far; True if this is a new best."""
        name = self.cfg.train.best_metric
        score = -metrics["loss"] if name == "loss" else metrics[name]
        if self.state.best_score is None or score > self.state.best_score:
            self.state.best_score, self.state.validations_without_improvement = score, 0
            return True
        self.state.validations_without_improvement += 1
        return False
