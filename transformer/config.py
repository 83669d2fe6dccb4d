"""Every setting of the toolkit, written once, as typed dataclasses.

Each section checks its values and their combinations (``d_model`` divisible by ``n_heads``, ...)
when it is built, so a mistake fails when the config is loaded, not halfway through training.
`transformer.config_loading` reads them from YAML files and ``section.key=value`` overrides.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")  # torch.compile's without CUDA graphs (train.cuda_graphs)
MAX_LENGTH_PENALTY = 10  # GNMT's alpha; recipes use 0.6-2, and far beyond, lp(Y) overflows a float
MAX_BEAM_SIZE = 1024  # beams and samples a sentence: wider than studies of the beam go; 100,000 ran out of memory
MAX_LEN_A, MAX_LEN_B = 10, 1024  # output length limits; beam search may run to its limit: 100,000 ran for minutes
TEMPERATURES = (1e-6, 1e6)  # sampling's range: 1e-300 and 1e300 overflowed float32 into empty samples


class ConfigError(ValueError):
    """A setting is unknown, of the wrong type, or inconsistent with another one."""


def ensure(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def _check_dropout(section: str, name: str, value: float) -> None:
    ensure(0.0 <= value < 1.0, f"{section}.{name} must be in [0, 1), got {value}")


def parse_duration(text: str) -> float:
    """Seconds in a budget such as "90m", "2h", "1h30m", "45s" or "3600"; 0 for an empty string."""
    cleaned = text.strip().lower()
    ensure(re.fullmatch(r"(\d+(\.\d+)?[hms])*(\d+(\.\d+)?)?", cleaned) is not None,
           f"train.max_time: cannot read {text!r}; use e.g. 90m, 2h or 1h30m")
    units = {"h": 3600, "m": 60, "s": 1, "": 1}  # a number without a unit counts seconds
    return sum((float(number) * units[unit] for number, unit in re.findall(r"([\d.]+)([hms]?)", cleaned)), 0.0)


@dataclass
class ModelConfig:
    """Architecture; the defaults are the base model of the paper (Table 3)."""

    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    dropout: float = 0.1  # P_drop: sublayer outputs and embedding sums (§5.4)
    attention_dropout: float = 0.1  # on the attention weights
    activation_dropout: float = 0.0  # inside the feed-forward network, after the ReLU
    norm_first: bool = False  # False: post-norm as in the paper; True: pre-norm
    share_embeddings: bool = True  # one embedding for source and target (needs a joint vocabulary)
    tie_output: bool = True  # target embedding = pre-softmax projection (§3.4)
    max_positions: int = 1024  # initial positional table; longer inputs extend it

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "d_ff", "n_encoder_layers", "n_decoder_layers",
                     "max_positions"):
            ensure(getattr(self, name) > 0, f"model.{name} must be positive, got {getattr(self, name)}")
        ensure(self.d_model % self.n_heads == 0,
               f"model.d_model ({self.d_model}) must be divisible by model.n_heads ({self.n_heads})")
        ensure(self.d_model % 2 == 0, f"model.d_model must be even (sin/cos pairs, §3.5), got {self.d_model}")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            _check_dropout("model", name, getattr(self, name))


@dataclass
class DataConfig:
    """Where the corpus is, how it is cleaned, tokenized and batched."""

    dataset: str = ""  # local directory/file, or a HuggingFace hub name
    dataset_config: str | None = None  # hub configuration name, e.g. "de-en" for wmt/wmt14
    src_lang: str = "de"
    tgt_lang: str = "en"
    # one multilingual model (Johnson et al., 2017): translation directions such as [en-de, de-en, en-fr]; each
    # source starts with the tag of its target language (<2de>); src_lang/tgt_lang are then the default direction
    pairs: list[str] = field(default_factory=list)
    train_split: str = "train"
    valid_split: str = "validation"
    test_split: str = "test"
    max_train_samples: int | None = None  # use only the first N training pairs (of each direction of data.pairs)
    # cleaning of the training split only
    max_length: int = 256  # subword tokens per side; longer training pairs are dropped
    max_length_ratio: float = 3.0  # drop training pairs whose token lengths differ more
    # SentencePiece (§5.1 uses a shared BPE vocabulary)
    vocab_size: int = 8000
    joint_vocab: bool = True
    spm_model_type: str = "unigram"
    character_coverage: float = 1.0
    spm_input_sentence_size: int = 1_000_000  # sentences sampled to train the tokenizer; 0 = all
    # (with streaming: the first this many pairs of the shuffled stream, so it must not be 0)
    spm_threads: int = 4  # trainer threads; fixed, not the machine's core count: the model depends on it
    pad_id: int = 0
    unk_id: int = 1
    bos_id: int = 2
    eos_id: int = 3
    # batching
    batch_tokens: int = 4096  # padded tokens per batch, per side
    pool_batches: int = 100  # length-sort pools of this many batches' worth of sentences
    pad_to_multiple: int = 1  # training batches' lengths rounded up to a multiple (8 for GPUs' tensor cores)
    pad_rows: bool = False  # training batches filled with empty rows to the budget: few shapes, for CUDA graphs
    rows_multiple: int = 1  # training batches' rows a multiple of this where the budget holds that many (fairseq's
    # required_batch_size_multiple; 8 lets rows attend in groups of up to 8, train.attention_row_length)
    streaming: bool = False
    shuffle_buffer: int = 100_000
    cache_dir: str | None = None  # where encoded corpora are cached; default: in the run directory

    def __post_init__(self) -> None:
        ensure(self.src_lang != self.tgt_lang,
               f"data.src_lang and data.tgt_lang must differ, both are {self.src_lang!r}")
        for pair in self.pairs:
            ensure(re.fullmatch(r"[A-Za-z0-9_]+-[A-Za-z0-9_]+", pair) is not None
                   and len(set(pair.lower().split("-"))) == 2,
                   f"data.pairs: {pair!r} is not a direction such as en-de (source-target, two languages)")
        ensure(len({pair.lower() for pair in self.pairs}) == len(self.pairs),
               f"data.pairs: a direction is given twice in {self.pairs}")
        default = f"{self.src_lang}-{self.tgt_lang}"
        other_case = [pair for pair in self.pairs if pair.lower() == default.lower() and pair != default]
        ensure(not self.pairs or default in self.pairs,
               f"data.src_lang-data.tgt_lang ({default}), the direction scored by default, must be one of data.pairs "
               f"{','.join(self.pairs)}" + (f" (language codes are case-sensitive: {other_case[0]} is another "
                                            f"direction)" if other_case else ""))
        ensure(not self.pairs or self.joint_vocab, "data.pairs needs data.joint_vocab=true (one vocabulary for "
                                                   "all languages)")
        ensure(not (self.pairs and self.streaming), "data.pairs does not stream: set data.streaming=false")
        ensure(self.spm_model_type in ("unigram", "bpe"),
               f"data.spm_model_type must be 'unigram' or 'bpe', got {self.spm_model_type!r}")
        ensure(0.0 < self.character_coverage <= 1.0,
               f"data.character_coverage must be in (0, 1], got {self.character_coverage}")
        ids = {"pad_id": self.pad_id, "unk_id": self.unk_id, "bos_id": self.bos_id, "eos_id": self.eos_id}
        ensure(len(set(ids.values())) == 4, f"data special ids must be distinct, got {ids}")
        ensure(all(0 <= i < 4 for i in ids.values()), f"data special ids must be 0..3, got {ids}")
        ensure(self.vocab_size > 4, f"data.vocab_size must exceed the 4 special tokens, got {self.vocab_size}")
        for name in ("max_length", "batch_tokens", "pool_batches", "shuffle_buffer", "spm_threads", "pad_to_multiple",
                     "rows_multiple"):
            ensure(getattr(self, name) > 0, f"data.{name} must be positive, got {getattr(self, name)}")
        ensure(self.spm_input_sentence_size == 0 or self.spm_input_sentence_size > 100,  # SentencePiece's limit
               f"data.spm_input_sentence_size must be 0 (all) or above 100, got {self.spm_input_sentence_size}")
        ensure(not (self.streaming and self.spm_input_sentence_size == 0),
               "data.streaming=true trains the tokenizer on a sample of the stream: set "
               "data.spm_input_sentence_size above 0 (e.g. 1000000)")
        ensure(self.max_train_samples is None or self.max_train_samples > 0,
               f"data.max_train_samples must be positive, got {self.max_train_samples}")
        ensure(self.max_length_ratio >= 1.0, f"data.max_length_ratio must be >= 1, got {self.max_length_ratio}")
        ensure(self.batch_tokens >= self.max_length + 2,
               f"data.batch_tokens ({self.batch_tokens}) must hold one sentence of "
               f"data.max_length ({self.max_length}) + 2 tokens")


@dataclass
class TrainConfig:
    """Optimisation recipe; the defaults follow the paper (§5.3, §5.4)."""

    run_dir: str = "runs/default"
    seed: int = 1
    init_from: str = ""  # fine-tune: start from this checkpoint or release folder (its weights and tokenizer)
    init_keep_optimizer: bool = False  # ... and continue its optimizer, schedule and step (a checkpoint)
    lr_schedule: str = "noam"  # "noam": d_model^-0.5 * min(step^-0.5, step * warmup^-1.5); "inverse_sqrt"
    lr: float = 1.0  # noam: multiplier of the formula; inverse_sqrt: peak learning rate
    warmup_steps: int = 4000
    cooldown: float = 0.0  # last fraction of the budget (max_time or max_steps) in which the lr falls linearly to 0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-9
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    clip_norm: float = 0.0  # 0 = no gradient clipping
    accumulate: int = 1  # batches per optimizer step
    max_steps: int = 100_000
    max_epochs: int = 0  # 0 = no limit
    max_time: str = ""  # wall-clock budget such as "90m" or "2h"; empty = no limit
    patience: int = 0  # validations without improvement before stopping; 0 = never stop early
    valid_every: int = 1000  # steps; 0 = once per epoch
    valid_max_sentences: int = 0  # 0 = the whole validation split
    valid_beam_size: int = 1  # validation BLEU during training: 1 = greedy (fast)
    best_metric: str = "bleu"  # bleu, chrf or loss
    save_every: int = 1000
    keep_last: int = 5
    precision: str = "auto"  # auto, fp32, bf16, fp16
    device: str = "auto"  # auto, cpu, cuda, cuda:1, ...
    threads: int = 0  # CPU threads; 0 = torch default
    compile: bool = False  # torch.compile each layer and the loss (transformer/runtime/compile.py): GPUs, not CPUs
    compile_mode: str = "default"  # torch.compile's mode
    cuda_graphs: bool = False  # forward and backward replayed from CUDA graphs (runtime/cuda_graphs.py; data.pad_rows)
    fast_paths: bool = True  # transformer.fast's CPU speed paths (byte dropout, explicit attention, loss)
    attention_row_length: int = 0  # short rows attend in groups of up to this many positions (model/row_groups.py)
    float32_residual: bool = True  # bf16/fp16: false keeps the layers' outputs in autocast's dtype (precision.py)
    log_every: int = 100
    max_nonfinite_steps: int = 10  # consecutive NaN/inf losses (updates skipped) before training stops

    def __post_init__(self) -> None:
        ensure(self.lr_schedule in ("noam", "inverse_sqrt"),
               f"train.lr_schedule must be 'noam' or 'inverse_sqrt', got {self.lr_schedule!r}")
        ensure(self.precision in ("auto", "fp32", "bf16", "fp16"),
               f"train.precision must be auto, fp32, bf16 or fp16, got {self.precision!r}")
        ensure(self.best_metric in ("bleu", "chrf", "loss"),
               f"train.best_metric must be bleu, chrf or loss, got {self.best_metric!r}")
        ensure(0.0 <= self.label_smoothing < 1.0,
               f"train.label_smoothing must be in [0, 1), got {self.label_smoothing}")
        for name in ("lr", "adam_eps", "weight_decay", "clip_norm", "cooldown"):  # lr=inf diverged at step 1,
            value = getattr(self, name)  # clip_norm=nan clipped nothing: settings the optimizer computes with
            ensure(math.isfinite(value), f"train.{name} must be a finite number, got {value}")
        ensure(self.lr > 0, f"train.lr must be positive, got {self.lr}")
        ensure(0 <= self.seed < 2**63, f"train.seed must be in [0, 2**63) (numpy's and torch's generators take "
                                       f"no other), got {self.seed}")
        for name in ("adam_beta1", "adam_beta2"):
            ensure(0.0 <= getattr(self, name) < 1.0, f"train.{name} must be in [0, 1), got {getattr(self, name)}")
        ensure(self.run_dir.strip() != "", "train.run_dir is empty: name the folder of the run (it would be the "
                                           "current one)")
        ensure(self.adam_eps > 0, f"train.adam_eps must be positive, got {self.adam_eps}")
        ensure(self.weight_decay >= 0, f"train.weight_decay must be >= 0, got {self.weight_decay}")
        ensure(0.0 <= self.cooldown <= 1.0, f"train.cooldown must be in [0, 1], got {self.cooldown}")
        ensure(self.init_from or not self.init_keep_optimizer, "train.init_keep_optimizer=true needs train.init_from")
        ensure(self.compile_mode in COMPILE_MODES,
               f"train.compile_mode must be one of {', '.join(COMPILE_MODES)} (CUDA graphs: train.cuda_graphs=true), "
               f"got {self.compile_mode!r}")
        ensure(self.compile or self.compile_mode == "default",
               f"train.compile_mode={self.compile_mode} needs train.compile=true")
        ensure(not (self.cooldown > 0 and self.max_epochs > 0),
               "train.cooldown follows max_time or max_steps, not max_epochs: set train.max_steps instead")
        for name in ("warmup_steps", "accumulate", "max_steps", "keep_last", "log_every", "max_nonfinite_steps",
                     "valid_beam_size"):
            ensure(getattr(self, name) > 0, f"train.{name} must be positive, got {getattr(self, name)}")
        for name in ("max_epochs", "patience", "valid_every", "valid_max_sentences", "save_every", "threads",
                     "attention_row_length"):
            ensure(getattr(self, name) >= 0, f"train.{name} must be >= 0, got {getattr(self, name)}")
        parse_duration(self.max_time)  # a typo fails here, not after the tokenizer has trained

    @property
    def max_time_seconds(self) -> float:
        """``max_time`` in seconds; 0 = no limit."""
        return parse_duration(self.max_time)


@dataclass
class DecodeConfig:
    """Search settings for translation; the paper used beam 4 and alpha 0.6 (§6.1)."""

    beam_size: int = 4
    length_penalty: float = 0.6
    max_len_a: float = 1.5  # output length limit = a * source length + b
    max_len_b: int = 10
    nbest: int = 1
    batch_tokens: int = 8192  # source tokens x beam_size per batch
    fast_paths: bool = True  # transformer.fast's search steps and packed weights; read once, when a model loads
    sampling: bool = False  # draw nbest samples per sentence instead of searching (beam_size is not used)
    sampling_topk: int = 0  # draw from the k most likely tokens only; 0: all
    sampling_topp: float = 1.0  # draw from the smallest set of tokens with this much probability (nucleus)
    sampling_temperature: float = 1.0  # > 1 flattens the distribution, < 1 sharpens it
    seed: int = 0  # the samples of a sentence depend only on this seed and the sentence

    def __post_init__(self) -> None:
        ensure(self.beam_size >= 1, f"decode.beam_size must be >= 1, got {self.beam_size}")
        for name in ("beam_size", "nbest"):
            ensure(getattr(self, name) <= MAX_BEAM_SIZE,
                   f"decode.{name} must be at most {MAX_BEAM_SIZE}, got {getattr(self, name)}")
        ensure(self.nbest >= 1 and (self.sampling or self.nbest <= self.beam_size),
               f"decode.nbest must be in [1, decode.beam_size={self.beam_size}], got {self.nbest}")
        ensure(self.sampling_topk >= 0, f"decode.sampling_topk must be >= 0, got {self.sampling_topk}")
        ensure(0 < self.sampling_topp <= 1, f"decode.sampling_topp must be in (0, 1], got {self.sampling_topp}")
        ensure(TEMPERATURES[0] <= self.sampling_temperature <= TEMPERATURES[1],
               f"decode.sampling_temperature must be in [{TEMPERATURES[0]:g}, {TEMPERATURES[1]:g}], got "
               f"{self.sampling_temperature}")
        ensure(0 <= self.length_penalty <= MAX_LENGTH_PENALTY,
               f"decode.length_penalty must be in [0, {MAX_LENGTH_PENALTY}], got {self.length_penalty}")
        ensure(0 <= self.max_len_a <= MAX_LEN_A and 0 <= self.max_len_b <= MAX_LEN_B,
               f"decode.max_len_a must be in [0, {MAX_LEN_A}] and decode.max_len_b in [0, {MAX_LEN_B}], got "
               f"{self.max_len_a} and {self.max_len_b}")
        ensure(self.batch_tokens > 0, f"decode.batch_tokens must be positive, got {self.batch_tokens}")
        ensure(0 <= self.seed < 2**63, f"decode.seed must be in [0, 2**63), as train.seed, got {self.seed}")


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def __post_init__(self) -> None:
        ensure(not self.model.share_embeddings or self.data.joint_vocab,
               "model.share_embeddings=true needs data.joint_vocab=true (one vocabulary for both sides)")


SECTIONS: dict[str, type] = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig,
                             "decode": DecodeConfig}
