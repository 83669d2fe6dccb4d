"""Subword tokenization with SentencePiece (§5.1 uses a shared source-target vocabulary).

One joint model ``spm.model`` (default) or one per language ``spm.{lang}.model``, trained on the
training split and kept in the run directory, so translating needs only that directory.

The models are trained so that ``decode(encode(x)) == x`` for text normalised by `transformer.data.files.normalize`
(Unicode NFC, no surrounding whitespace):

- ``normalization_rule_name="identity"``: the text is already NFC; SentencePiece's default NFKC
  rule would rewrite characters such as U+00A0 NO-BREAK SPACE;
- ``remove_extra_whitespaces=False``: double spaces and tabs inside a sentence survive;
- ``byte_fallback=True``: a character never seen in training becomes UTF-8 byte pieces, not ``<unk>``.

The one exception: U+2581 (▁), SentencePiece's own space marker, decodes as a space.
"""

from __future__ import annotations

import functools
import hashlib
import io
import itertools
import random
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import sentencepiece as spm
from torch import Tensor

from transformer.atomic_file import atomic_write
from transformer.config import DataConfig
from transformer.data.languages import TAG_PIECE, tags


class TokenizerError(ValueError):
    """A tokenizer model is missing, unreadable, or disagrees with the config."""


class MissingTagsError(TokenizerError):
    """A tokenizer without a piece for some target-language tags of the config (``tags``): a fine-tuning run, which
    keeps its parent's vocabulary, says which directions to drop."""

    def __init__(self, message: str, tags: list[str]) -> None:
        super().__init__(message)
        self.tags = tags


def tokenizer_files(cfg: DataConfig) -> list[str]:
    """Names of the model files for ``cfg``, relative to the run directory: source first."""
    if cfg.joint_vocab:
        return ["spm.model"]
    return [f"spm.{cfg.src_lang}.model", f"spm.{cfg.tgt_lang}.model"]


def read_models(directory: Path, cfg: DataConfig) -> dict[str, bytes]:
    """The serialized models of ``cfg`` in ``directory`` (a run directory or an exported folder), by file name."""
    models = {}
    for name in tokenizer_files(cfg):
        path = directory / name
        try:
            models[name] = path.read_bytes()
        except OSError as error:
            raise TokenizerError(f"cannot read tokenizer model {path}: {error.strerror}; it lies beside the "
                                 f"model it was trained with (a run directory or an exported folder)") from None
    return models


def fingerprint(models: dict[str, bytes]) -> str:
    """A short hash of serialized models and their file names: it keys the encoded-corpus cache, and checkpoints
    record it, so that a checkpoint is never read with another tokenizer than its own."""
    digest = hashlib.sha256()
    for name, proto in models.items():
        digest.update(name.encode() + b"\0" + hashlib.sha256(proto).digest())
    return digest.hexdigest()[:16]


def check_trained_with(models: dict[str, bytes], state: dict, checkpoint: str | Path, directory: Path) -> None:
    """Refuse tokenizer models (read from ``directory``) that are not those the checkpoint ``state`` was trained
    with: its weights would read other tokens and translate garbage (older checkpoints record no fingerprint)."""
    saved = state.get("tokenizer_fingerprint")
    if saved is not None and saved != fingerprint(models):
        raise TokenizerError(f"{checkpoint}: trained with another tokenizer than "
                             f"{', '.join(str(directory / name) for name in models)}; put the tokenizer of the run "
                             f"that wrote the checkpoint there")


class Tokenizer:
    """Text <-> subword ids for both sides; ids never include bos/eos (callers add them)."""

    def __init__(self, models: dict[str, bytes], cfg: DataConfig, directory: Path | None = None) -> None:
        """Wrap serialized models keyed by file name, in the order of `tokenizer_files`; errors name them in
        ``directory``, where they were read."""
        self.files = list(models)
        self.models = dict(models)  # file name -> serialized model, to write beside an exported model
        processors = [self._processor(str(directory / name if directory else name), proto, cfg)
                      for name, proto in models.items()]
        self._src, self._tgt = processors[0], processors[-1]
        self.fingerprint = fingerprint(models)

    @staticmethod
    def _processor(name: str, proto: bytes, cfg: DataConfig) -> spm.SentencePieceProcessor:
        processor = spm.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(proto)
        except (RuntimeError, OSError) as error:
            raise TokenizerError(f"{name}: not a SentencePiece model ({error})") from None
        found = {"pad_id": processor.pad_id(), "unk_id": processor.unk_id(), "bos_id": processor.bos_id(),
                 "eos_id": processor.eos_id()}
        expected = {key: getattr(cfg, key) for key in found}
        if found != expected:
            raise TokenizerError(f"{name}: special ids {found} differ from the config's {expected}")
        missing = [tag for tag in tags(cfg) if processor.piece_to_id(tag) == processor.unk_id()]
        if missing:  # it would be cut into bytes: the model would never see one tag token
            raise MissingTagsError(f"{name}: no piece {missing[0]} for data.pairs {','.join(cfg.pairs)}: a tokenizer "
                                   f"trained for other directions; train one with these (a new train.run_dir)",
                                   missing)
        return processor

    @classmethod
    def load(cls, directory: str | Path, cfg: DataConfig) -> Tokenizer:
        """Load the model files of ``cfg`` from ``directory`` (a run directory or an exported folder)."""
        return cls(read_models(Path(directory), cfg), cfg, Path(directory))

    @classmethod
    def beside(cls, checkpoint: Path, state: dict, cfg: DataConfig) -> Tokenizer:
        """The tokenizer found beside a checkpoint, refused where it is not the one the checkpoint ``state`` was
        trained with (`check_trained_with`)."""
        models = read_models(checkpoint.parent, cfg)
        # first: another run's models fail the checks of the pieces (a multilingual config's tags) with advice
        # for training, where the fault is the file beside the checkpoint
        check_trained_with(models, state, checkpoint, checkpoint.parent)
        return cls(models, cfg, checkpoint.parent)

    @functools.cached_property
    def tag_ids(self) -> set[int]:
        """Every language tag of the target vocabulary, the config's or not (a fine-tuned child keeps its parent's):
        pieces added whole (score 0, where learned pieces have their log-probability) named as tags. Found on first
        use (prefixes and constraints), not by every tokenizer that loads: a pass over the whole vocabulary."""
        pieces = self._tgt.id_to_piece(list(range(self._tgt.get_piece_size())))
        return {index for index, piece in enumerate(pieces)
                if TAG_PIECE.fullmatch(piece) and self._tgt.get_score(index) == 0.0}

    @property
    def src_vocab_size(self) -> int:
        return self._src.get_piece_size()

    @property
    def tgt_vocab_size(self) -> int:
        return self._tgt.get_piece_size()

    @property
    def pad_id(self) -> int:
        return self._src.pad_id()

    @property
    def unk_id(self) -> int:
        return self._src.unk_id()

    @property
    def bos_id(self) -> int:
        return self._src.bos_id()

    @property
    def eos_id(self) -> int:
        return self._src.eos_id()

    def encode_src(self, texts: Sequence[str]) -> list[list[int]]:
        """Source sentences -> subword ids, without eos."""
        return self._src.encode(list(texts), out_type=int)

    def encode_tgt(self, texts: Sequence[str]) -> list[list[int]]:
        """Target sentences -> subword ids, without bos/eos."""
        return self._tgt.encode(list(texts), out_type=int)

    def decode_tgt(self, ids: Sequence[Sequence[int]] | Tensor) -> list[str]:
        """Target ids -> sentences; stops at the first eos and skips pad and bos. A sentence has no spaces around it,
        as no training target has: a model may still end a hypothesis with a bare "▁" piece."""
        rows = ids.tolist() if isinstance(ids, Tensor) else ids
        eos, skip = self.eos_id, {self.pad_id, self.bos_id}
        content = [[i for i in itertools.takewhile(lambda i: i != eos, row) if i not in skip] for row in rows]
        return [text.strip() for text in self._tgt.decode(content)]

    def src_pieces(self, source: str | Sequence[int]) -> list[str]:
        """Subword strings of a source sentence or of its ids (labels for attention plots)."""
        if isinstance(source, str):
            return self._src.encode(source, out_type=str)
        return [self._src.id_to_piece(int(i)) for i in source]

    def tgt_pieces(self, ids: Sequence[int]) -> list[str]:
        """Subword strings of target ids, specials included (labels for attention plots)."""
        return [self._tgt.id_to_piece(int(i)) for i in ids]


def sample_sentences(texts: Iterable[str], size: int, seed: int) -> list[str]:
    """``size`` of ``texts`` drawn uniformly by ``seed`` (reservoir sampling, Vitter's algorithm R), or all of them
    in order if there are no more (``size`` 0: all).

    Sampled here, not by SentencePiece's ``input_sentence_size``: its sampling ignores
    ``set_random_generator_seed`` (sentencepiece 0.2.x: the same seed gives another model in every new process,
    and the same in one process whatever the seed), and a run must train the same tokenizer from the same seed."""
    if size == 0:
        return list(texts)
    rng, sample = random.Random(seed), []
    for index, text in enumerate(texts):
        if index < size:
            sample.append(text)
        elif (slot := rng.randrange(index + 1)) < size:
            sample[slot] = text
    return sample


_TOO_FEW_PIECES = re.compile(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)")


def _train_model(texts: Iterable[str], cfg: DataConfig, seed: int) -> bytes:
    """Train one SentencePiece model in memory; same texts, config and seed give the same bytes, in any process."""
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sample_sentences(texts, cfg.spm_input_sentence_size, seed)), model_writer=model,
            vocab_size=cfg.vocab_size, model_type=cfg.spm_model_type, character_coverage=cfg.character_coverage,
            # sampled already, so SentencePiece never samples; kept in its trainer spec, which the model file holds
            input_sentence_size=cfg.spm_input_sentence_size, shuffle_input_sentence=True,
            normalization_rule_name="identity", remove_extra_whitespaces=False, byte_fallback=True,
            hard_vocab_limit=False,  # a small corpus gets a smaller vocabulary instead of an error
            pad_id=cfg.pad_id, unk_id=cfg.unk_id, bos_id=cfg.bos_id, eos_id=cfg.eos_id,
            user_defined_symbols=tags(cfg),  # a multilingual model's target-language tags: one piece each
            num_threads=cfg.spm_threads, minloglevel=2)
    except RuntimeError as error:
        too_small = _TOO_FEW_PIECES.search(str(error))
        if too_small:  # SentencePiece's advice names its own flags ("--character_coverage option"), not ours
            asked, needed = too_small.groups()
            raise TokenizerError(f"data.vocab_size={asked} is smaller than the {needed} pieces the training text's "
                                 f"characters need (with the special pieces): raise data.vocab_size above {needed}, "
                                 f"or lower data.character_coverage={cfg.character_coverage} so that rare "
                                 f"characters are spelt in bytes") from None
        raise TokenizerError(f"SentencePiece training failed: {error}") from None
    return model.getvalue()


def train_tokenizer(cfg: DataConfig, src_texts: Iterable[str], tgt_texts: Iterable[str], out_dir: str | Path,
                    seed: int) -> Tokenizer:
    """Train the tokenizer of ``cfg`` on training text and write its model file(s) into ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = tokenizer_files(cfg)
    corpora = [itertools.chain(src_texts, tgt_texts)] if cfg.joint_vocab else [src_texts, tgt_texts]
    models = {}
    for name, texts in zip(names, corpora):
        models[name] = _train_model(texts, cfg, seed)
        with atomic_write(out_dir / name) as partial:  # never leave a half-written model behind
            partial.write_bytes(models[name])
    return Tokenizer(models, cfg)


def install_tokenizer(models: dict[str, bytes], directory: Path, owner: str,
                      advice: str = "use a new train.run_dir") -> None:
    """Put ``owner``'s tokenizer models into a directory, where a run (a fine-tuned or resumed model keeps its
    vocabulary), or a checkpoint translated from there, reads them; another model of the same name there is an
    error, found before anything is written."""
    for name, proto in models.items():
        if (directory / name).exists() and (directory / name).read_bytes() != proto:
            raise TokenizerError(f"{directory / name} is another tokenizer than {owner}; {advice}")
    for name, proto in models.items():
        with atomic_write(directory / name) as partial:
            partial.write_bytes(proto)
