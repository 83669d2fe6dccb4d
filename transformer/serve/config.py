"""The limits and batching of ``transformer-serve``, set by its options: a service's settings, not part of a run's
config (`transformer.config`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from transformer.config import ensure


@dataclass
class ServeConfig:
    """Batching and input limits of ``transformer-serve``.

    Requests arriving within ``batch_wait_ms`` of the first one waiting are translated in one call,
    up to ``max_batch_sentences`` sentences and ``max_batch_requests`` requests (1: one request at
    a time). The limits bound what one request may cost; beyond them it gets a 4xx error.
    """

    batch_wait_ms: float = field(default=5.0, metadata={"help": "how long the oldest waiting request waits "
                                                                "for others to share its batch"})
    max_batch_sentences: int = field(default=64, metadata={"help": "sentences per translator call"})
    max_batch_requests: int = field(default=64, metadata={"help": "requests per translator call (1: no "
                                                                  "cross-request batching)"})
    max_sentences: int = field(default=64, metadata={"help": "sentences per request"})
    max_chars: int = field(default=2000, metadata={"help": "characters per sentence"})
    max_beam_size: int = field(default=16, metadata={"help": "largest beam_size a request may ask for"})
    max_queued_sentences: int = field(default=4096, metadata={"help": "sentences waiting, beyond which "
                                                                      "requests are refused with 503"})

    def __post_init__(self) -> None:
        # named as transformer-serve's options, which set them
        ensure(0 <= self.batch_wait_ms <= 60_000, f"--batch-wait-ms must be in [0, 60000], got {self.batch_wait_ms}")
        for name in ("max_batch_sentences", "max_batch_requests", "max_sentences", "max_chars", "max_beam_size",
                     "max_queued_sentences"):
            ensure(getattr(self, name) >= 1, f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        ensure(self.max_queued_sentences >= self.max_sentences,  # else a full request could never be queued
               f"--max-queued-sentences ({self.max_queued_sentences}) must be >= --max-sentences "
               f"({self.max_sentences})")
