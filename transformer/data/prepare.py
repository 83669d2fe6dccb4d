"""What a training run needs from its corpus: the tokenizer and the encoded training and
validation splits, prepared once per run directory and cached."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from datasets import Dataset, IterableDataset

from transformer.config import Config, DataConfig
from transformer.data.batch import Batch, make_batch
from transformer.data.batching import StreamingTrainBatches, TrainBatches, token_batches
from transformer.data.cleaning import clean_training_pairs, encode_dataset, stream_training_pairs
from transformer.data.loading import load_split, stream_split
from transformer.data.tokenizer import Tokenizer, tokenizer_files, train_tokenizer
from transformer.errors import DataError
from transformer.runtime.distributed import DistributedContext

log = logging.getLogger(__name__)


@dataclass
class PreparedData:
    tokenizer: Tokenizer
    train: Dataset | None  # encoded and cleaned training pairs; None when streaming
    valid: Dataset  # encoded validation pairs, every line kept
    cfg: DataConfig

    def train_batches(self, seed: int, rank: int = 0, world_size: int = 1) -> TrainBatches | StreamingTrainBatches:
        """This rank's resumable stream of training batches, reshuffled every epoch from ``seed``."""
        if not self.cfg.streaming:
            return TrainBatches(self.train, self.cfg, seed, rank, world_size)
        stream = stream_training_pairs(self.cfg, self.tokenizer, seed, rank, world_size)

        def epoch_stream(epoch: int) -> IterableDataset:
            stream.set_epoch(epoch)
            return stream

        return StreamingTrainBatches(epoch_stream, self.cfg, seed)

    def valid_batches(self) -> Iterator[Batch]:
        """Token-budget batches of the validation split, for its loss: its pairs of at most ``data.max_length``
        tokens a side (`loss_pairs`)."""
        kept, src_len, tgt_len = self.loss_pairs, self.valid["src_len"], self.valid["tgt_len"]
        src_lengths = [src_len[i] + 1 for i in kept]  # + eos
        tgt_lengths = [tgt_len[i] + 1 for i in kept]  # + bos or eos
        for batch in token_batches(src_lengths, tgt_lengths, self.cfg.batch_tokens, seed=0, epoch=0,
                                   pool_batches=self.cfg.pool_batches):
            indices = [kept[i] for i in batch]
            rows = self.valid[indices]
            yield make_batch(rows["src_ids"], rows["tgt_ids"], indices, self.cfg.pad_id, self.cfg.bos_id,
                             self.cfg.eos_id)

    @cached_property
    def loss_pairs(self) -> list[int]:
        """The validation pairs the loss is computed on, found once for the run: those training could hold, at most
        ``data.max_length`` tokens a side. A longer one (a corpus's stray line of 66,000 tokens) took 25 s of teacher
        forcing at every validation, against 0.02 s for the rest; translation cuts such sources to that length."""
        limit = self.cfg.max_length
        return [i for i, (src, tgt) in enumerate(zip(self.valid["src_len"], self.valid["tgt_len"]))
                if src <= limit and tgt <= limit]

    def valid_texts(self, limit: int | None = None) -> tuple[list[str], list[str]]:
        """Source sentences and references of the validation split (the first ``limit`` of them)."""
        rows = self.valid if limit is None else self.valid.select(range(min(limit, len(self.valid))))
        return rows["src"], rows["tgt"]


def load_texts(cfg: DataConfig, split: str, cache_dir: Path | None = None) -> tuple[list[str], list[str]]:
    """Source sentences and references of a split, every line kept."""
    dataset = load_split(cfg, split, cache_dir)
    return dataset["src"], dataset["tgt"]


def tokenizer_sample(cfg: DataConfig, seed: int, cache_dir: Path) -> tuple[list[str], list[str]]:
    """The training sentences the tokenizer learns from: the whole split, or with ``data.streaming``
    the first ``data.spm_input_sentence_size`` pairs of the shuffled stream (memory bounded by that
    and ``data.shuffle_buffer``, never by the corpus)."""
    if not cfg.streaming:
        train = load_split(cfg, cfg.train_split, cache_dir, say=False)  # said when the batches read it
        sources, targets = train["src"], train["tgt"]
    else:
        size = min(cfg.spm_input_sentence_size, cfg.max_train_samples or cfg.spm_input_sentence_size)
        stream = stream_split(cfg, cfg.train_split).shuffle(seed=seed, buffer_size=cfg.shuffle_buffer).take(size)
        pairs = [(row["src"], row["tgt"]) for row in stream]
        sources, targets = [src for src, _ in pairs], [tgt for _, tgt in pairs]
    for side, sentences in (("source", sources), ("target", targets)):
        if not any(sentence.strip() for sentence in sentences):  # else SentencePiece's "INTERNAL: ... [!sentences_"
            raise DataError(f"{cfg.dataset}: training split {cfg.train_split!r} has no {side} text (no pairs, or "
                            f"blank lines alone)")
    return sources, targets


def prepare_tokenizer(cfg: DataConfig, run_dir: Path, ctx: DistributedContext, seed: int,
                      cache_dir: Path) -> Tokenizer:
    """Load the run's tokenizer, training it on the training split first if the run has none."""
    if ctx.is_main and not all((run_dir / name).exists() for name in tokenizer_files(cfg)):
        log.info("training the SentencePiece tokenizer (vocabulary %d, %s)", cfg.vocab_size, cfg.spm_model_type)
        trained = train_tokenizer(cfg, *tokenizer_sample(cfg, seed, cache_dir), run_dir, seed)
        sides = ({"source": trained.src_vocab_size, "target": trained.tgt_vocab_size} if len(trained.files) > 1
                 else {"joint": trained.src_vocab_size})
        short = [f"{side} {size:,}" for side, size in sides.items() if size < cfg.vocab_size]
        if short:  # SentencePiece stops where the text has no more pieces, without a word
            log.warning("the tokenizer has fewer pieces than data.vocab_size=%d (%s): the training text holds no "
                        "more, and the model is built for what there is", cfg.vocab_size, ", ".join(short))
    ctx.barrier()
    return Tokenizer.load(run_dir, cfg)


def corpus_cache(cfg: DataConfig, run_dir: Path) -> Path:
    """Where a run's encoded corpora are cached: ``data.cache_dir``, else the run directory's ``cache``."""
    return Path(cfg.cache_dir) if cfg.cache_dir else run_dir / "cache"


def prepare_data(cfg: Config, run_dir: Path, ctx: DistributedContext) -> PreparedData:
    """Tokenizer plus encoded splits; rank 0 encodes first so the other ranks read its cache."""
    cache_dir = corpus_cache(cfg.data, run_dir)
    tokenizer = prepare_tokenizer(cfg.data, run_dir, ctx, cfg.train.seed, cache_dir)
    prepared = None
    for turn in ("main", "others"):
        if ctx.is_main == (turn == "main"):
            train = None
            if not cfg.data.streaming:
                train_texts = load_split(cfg.data, cfg.data.train_split, cache_dir)
                train, _ = clean_training_pairs(train_texts, cfg.data, tokenizer, cache_dir, say=ctx.is_main)
            valid = encode_dataset(load_split(cfg.data, cfg.data.valid_split, cache_dir), tokenizer, cache_dir)
            prepared = PreparedData(tokenizer, train, valid, cfg.data)
            left_out = len(valid) - len(prepared.loss_pairs)
            if left_out == len(valid):
                raise DataError(f"{cfg.data.dataset}: every pair of the validation split {cfg.data.valid_split!r} is "
                                f"longer than data.max_length={cfg.data.max_length} tokens: nothing to validate on")
            if left_out and ctx.is_main:
                log.warning("%d of %d validation pairs are longer than data.max_length=%d tokens: the validation loss "
                            "leaves them out, as training does", left_out, len(valid), cfg.data.max_length)
        ctx.barrier()
    return prepared
