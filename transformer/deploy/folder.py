"""What every engine folder holds besides the engine's own files, and the translator part that needs only that.

    spm.model / spm.{lang}.model     the SentencePiece model(s), to turn text into ids and back
    config.yaml                      this toolkit's config (decoding settings, maximum length, model sizes)

`transformer.deploy.ctranslate2` and `transformer.deploy.onnx` write such folders; their translators
extend `FolderTranslator`, which reads them.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformer.checkpoint import CheckpointError, load_checkpoint
from transformer.config import Config, DataConfig, DecodeConfig
from transformer.config_loading import apply_overrides, config_from_dict, load_config, save_config
from transformer.data.tokenizer import Tokenizer
from transformer.decoding.inputs import too_long
from transformer.decoding.translator import build_model
from transformer.model.transformer import Transformer

CONFIG = "config.yaml"


def load_for_export(checkpoint: Path) -> tuple[Transformer, Config, Tokenizer]:
    """The float32 model of ``checkpoint`` on the CPU, as trained (no inference speed paths swapped in), its
    config and its tokenizer (found beside it)."""
    state = load_checkpoint(checkpoint)
    cfg = config_from_dict(state["config"], where=str(checkpoint))
    tokenizer = Tokenizer.load(checkpoint.parent, cfg.data)
    model = build_model(cfg.model, tokenizer, state["model"], checkpoint).eval()
    return model, Config(model=cfg.model, data=cfg.data, decode=cfg.decode), tokenizer


def write_config_and_tokenizer(cfg: Config, tokenizer: Tokenizer, output: Path) -> None:
    """Put the SentencePiece model(s) and config.yaml into ``output``, so that the folder is self-contained."""
    for name, proto in tokenizer.models.items():
        (output / name).write_bytes(proto)
    save_config(cfg, output / CONFIG)


class FolderTranslator(ABC):
    """The settings, tokenizer and source handling of an engine folder; subclasses add ``translate_nbest``."""

    def __init__(self, directory: Path, kind: str, engine_files: Sequence[str], overrides: Sequence[str]) -> None:
        """Check that ``directory`` holds ``engine_files`` (else a one-line error: not ``kind``, naming the first
        file missing), then read its config, with ``overrides`` (decode.key=value), and its tokenizer."""
        missing = [name for name in engine_files if not (directory / name).is_file()]
        if missing:
            raise CheckpointError(f"not {kind} (no {missing[0]}): {directory}")
        self.cfg = apply_overrides(load_config(directory / CONFIG), overrides, sections=("decode",))
        self.decode, self.data, self.max_source_length = self.cfg.decode, self.cfg.data, self.cfg.data.max_length
        self.tokenizer = Tokenizer.load(directory, self.cfg.data)

    def settings(self, **overrides: Any) -> DecodeConfig:
        """The folder's decoding settings with ``overrides`` of `DecodeConfig` fields, checked."""
        return self.decode.with_overrides(**overrides)

    def data_config(self, dataset: str | None = None) -> DataConfig:
        """The training data settings, optionally pointing at another corpus."""
        return dataclasses.replace(self.data, dataset=dataset) if dataset else self.data

    def too_long(self, sentences: list[str]) -> list[int]:
        """Positions of the sentences whose source is cut to ``max_source_length`` tokens to be translated."""
        return too_long(self.tokenizer, sentences, self.max_source_length)

    def translate(self, sentences: list[str], progress: bool = False, prefixes: Sequence[str] | None = None,
                  constraints: Sequence[Sequence[str]] | None = None, **overrides: Any) -> list[str]:
        """Detokenized best translation of each sentence; an empty sentence gives an empty line (or its prefix)."""
        found = self.translate_nbest(sentences, progress, prefixes, constraints, **overrides)
        return [hypotheses[0][0] for hypotheses in found]

    @abstractmethod
    def translate_nbest(self, sentences: list[str], progress: bool = False, prefixes: Sequence[str] | None = None,
                        constraints: Sequence[Sequence[str]] | None = None,
                        **overrides: Any) -> list[list[tuple[str, float]]]:
        """The ``nbest`` best translations (or samples) of each sentence with our GNMT-normalised scores, each
        starting with its prefix and holding its constraints, as `Translator.translate_nbest`."""
