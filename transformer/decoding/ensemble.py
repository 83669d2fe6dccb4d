"""Ensembles: several models with one vocabulary translating together.

`Ensemble` looks like one `Transformer` to the searches: its ``encode`` runs every member's
encoder, its cache holds one `DecoderCache` per member (each reordered with the beams), and its
``decode`` returns the mean of the members' log-probabilities at every position, which the search
renormalises with its log-softmax (a normalised geometric mean of the members' distributions).
An ensemble of a model with itself is that model. Attention plots and word alignments read the
first member's cross-attention.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from transformer.config import ModelConfig
from transformer.model.cache import DecoderCache
from transformer.model.transformer import Transformer


class EnsembleMemory:
    """Each member's encoder output for the same batch; rows are selected in all of them at once."""

    def __init__(self, members: list[Tensor]) -> None:
        self.members = members

    def __getitem__(self, rows: Tensor) -> EnsembleMemory:
        return EnsembleMemory([memory[rows] for memory in self.members])

    def size(self, dim: int) -> int:
        return self.members[0].size(dim)


class EnsembleCache:
    """One decoder cache per member, reordered together."""

    def __init__(self, members: list[DecoderCache]) -> None:
        self.members = members

    def reorder(self, index: Tensor, source_index: Tensor | None = None) -> None:
        for cache in self.members:
            cache.reorder(index, source_index)


def vocabularies(model: Transformer) -> tuple[int, int, int, int, int]:
    """What members of an ensemble must agree on: vocabulary sizes and special ids."""
    return (model.encoder.embedding.embedding.num_embeddings, model.output_proj.out_features, model.pad_id,
            model.bos_id, model.eos_id)


class Ensemble(nn.Module):
    """Models that share the source and target vocabularies, decoding as one (see the module's docstring)."""

    def __init__(self, models: Sequence[Transformer]) -> None:
        super().__init__()
        first = models[0]
        if any(vocabularies(model) != vocabularies(first) for model in models[1:]):
            raise ValueError(f"an ensemble's models must share their vocabularies; got (source size, target size, "
                             f"pad, bos, eos) {', '.join(str(vocabularies(model)) for model in models)}")
        self.members = nn.ModuleList(models)
        self.pad_id, self.bos_id, self.eos_id = first.pad_id, first.bos_id, first.eos_id

    @property
    def cfg(self) -> ModelConfig:
        """The first member's settings (what model information reports)."""
        return self.members[0].cfg

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> EnsembleMemory:
        return EnsembleMemory([model.encode(src, src_mask) for model in self.members])

    def new_cache(self, incremental: bool = True) -> EnsembleCache:
        return EnsembleCache([model.new_cache(incremental) for model in self.members])

    def decode(self, tgt_in: Tensor, memory: EnsembleMemory, src_mask: Tensor | None,
               cache: EnsembleCache | None = None) -> Tensor:
        """The mean of the members' log-probabilities (B, T', V), in float32, for the positions each decodes."""
        caches = cache.members if cache is not None else [None] * len(self.members)
        return torch.stack([model.decode(tgt_in, part, src_mask, part_cache).log_softmax(dim=-1, dtype=torch.float32)
                            for model, part, part_cache in zip(self.members, memory.members, caches)]).mean(dim=0)

    def decode_with_attention(self, tgt_in: Tensor, memory: EnsembleMemory,
                              src_mask: Tensor | None) -> tuple[Tensor, list[Tensor]]:
        """The ensemble's log-probabilities and the first member's cross-attention weights."""
        _, weights = self.members[0].decode_with_attention(tgt_in, memory.members[0], src_mask)
        return self.decode(tgt_in, memory, src_mask), weights
