"""Tiny fixtures shared by the tests: a small model config and random token batches."""

import os
from pathlib import Path

# tests never touch the network
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest
import torch

from transformer.config import ModelConfig
from transformer.model import Transformer

PAD, UNK, BOS, EOS = 0, 1, 2, 3
VOCAB = 20
DATA_DIR = Path(os.environ.get("TRANSFORMER_DATA", Path(__file__).resolve().parents[1] / ".." / "shared" / "data"))


def tiny_config(**overrides) -> ModelConfig:
    values = dict(d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2, dropout=0.0,
                  attention_dropout=0.0, max_positions=16)
    values.update(overrides)
    return ModelConfig(**values)


def make_model(seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(tiny_config(**overrides), VOCAB, pad_id=PAD, bos_id=BOS, eos_id=EOS).eval()


@pytest.fixture
def tiny_model() -> Transformer:
    return make_model()


@pytest.fixture
def src() -> torch.Tensor:
    """Two padded sources of lengths 6 and 4."""
    return torch.tensor([[5, 6, 7, 8, 9, EOS], [10, 11, 12, EOS, PAD, PAD]])


@pytest.fixture
def tgt_in() -> torch.Tensor:
    return torch.tensor([[BOS, 4, 5, 6, 7], [BOS, 8, 9, 10, 11]])


def corpus_dir(name: str) -> Path:
    """The real corpus `name` under $TRANSFORMER_DATA, or skip (a fresh clone has no data)."""
    path = DATA_DIR / name
    if not path.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"corpus {name} not found at {path}: CI must run the corpus tests")
        pytest.skip(f"corpus {name} not found at {path}; set TRANSFORMER_DATA to the folder holding it")
    return path
