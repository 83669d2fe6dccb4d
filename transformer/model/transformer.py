"""The encoder-decoder Transformer of "Attention Is All You Need" (Figure 1)."""

from __future__ import annotations

from torch import Tensor, nn

from transformer.config import DataConfig, ModelConfig
from transformer.model.attention import padding_mask
from transformer.model.cache import DecoderCache
from transformer.model.layers import DecoderLayer, EncoderLayer, PositionalEncoding, TokenEmbedding
from transformer.model.row_groups import RowGroups, group_size, grouped_masks


def _layer_args(cfg: ModelConfig) -> dict:
    return dict(d_model=cfg.d_model, n_heads=cfg.n_heads, d_ff=cfg.d_ff, dropout=cfg.dropout,
                attention_dropout=cfg.attention_dropout, activation_dropout=cfg.activation_dropout,
                norm_first=cfg.norm_first)


class Encoder(nn.Module):
    """Embedding + positions, then N identical layers (§3.1); a final LayerNorm when pre-norm."""

    def __init__(self, cfg: ModelConfig, embedding: TokenEmbedding) -> None:
        super().__init__()
        self.embedding = embedding
        self.positional = PositionalEncoding(cfg.d_model, cfg.dropout, cfg.max_positions)
        self.layers = nn.ModuleList(EncoderLayer(**_layer_args(cfg)) for _ in range(cfg.n_encoder_layers))
        self.final_norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()

    def forward(self, src: Tensor, src_mask: Tensor | RowGroups | None) -> Tensor:
        """src (B, S) token ids, src_mask (B, 1, 1, S) or rows' groups -> memory (B, S, D)."""
        x = self.positional(self.embedding(src))
        for layer in self.layers:
            x = layer(x, src_mask)
        return self.final_norm(x)


class Decoder(nn.Module):
    """Embedding + positions, N identical layers, final LayerNorm when pre-norm (§3.1)."""

    def __init__(self, cfg: ModelConfig, embedding: TokenEmbedding) -> None:
        super().__init__()
        self.embedding = embedding
        self.positional = PositionalEncoding(cfg.d_model, cfg.dropout, cfg.max_positions)
        self.layers = nn.ModuleList(DecoderLayer(**_layer_args(cfg)) for _ in range(cfg.n_decoder_layers))
        self.final_norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()

    def forward(
        self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor | RowGroups | None, cache: DecoderCache | None = None,
        need_weights: bool = False, self_mask: RowGroups | None = None,
    ) -> tuple[Tensor, list[Tensor]]:
        """Decoder states of the target positions not yet in ``cache`` (all of them without one).

        Shapes: tgt_in (B, T); memory (B, S, D) -> states (B, T - cache.length, D) and, if
        ``need_weights``, the cross-attention weights of every layer, each (B, H, T_new, S). With a
        cache, memory may hold one row for every G consecutive target rows (see `CrossAttentionCache`).
        Where rows attend in groups (`row_groups`), ``src_mask`` and ``self_mask`` are their masks.
        """
        start = cache.length if cache is not None else 0
        x = self.positional(self.embedding(tgt_in[:, start:]), offset=start)
        cross_weights = []
        for i, layer in enumerate(self.layers):
            self_cache = cache.self_attn[i] if cache is not None else None
            cross_cache = cache.cross_attn[i] if cache is not None else None
            x, weights = layer(x, memory, src_mask, self_cache, cross_cache, need_weights, self_mask)
            if need_weights:
                cross_weights.append(weights)
        return self.final_norm(x), cross_weights


class Transformer(nn.Module):
    """Encoder-decoder Transformer; `forward` returns next-token logits for teacher forcing.

    Weight matrices are initialised Xavier-uniform (as in the reference tensor2tensor code and
    the Annotated Transformer), embeddings N(0, d_model^-0.5), biases zero. With
    ``share_embeddings`` the source and target embeddings are one matrix; with ``tie_output``
    the pre-softmax projection reuses the target embedding (§3.4): three-way tying when both hold.
    `forward`'s ``attention_row_length`` (train.attention_row_length) lets short rows attend in groups of up to
    that many positions (`row_groups`: a GPU's speed path; the same function, dropout's draws aside).
    """

    def __init__(self, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int | None = None,
                 pad_id: int = DataConfig.pad_id, bos_id: int = DataConfig.bos_id,
                 eos_id: int = DataConfig.eos_id) -> None:
        super().__init__()
        tgt_vocab_size = src_vocab_size if tgt_vocab_size is None else tgt_vocab_size
        if cfg.share_embeddings and src_vocab_size != tgt_vocab_size:
            raise ValueError(f"model.share_embeddings needs one vocabulary, got sizes "
                             f"{src_vocab_size} and {tgt_vocab_size}")
        self.cfg = cfg
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        src_embedding = TokenEmbedding(src_vocab_size, cfg.d_model, pad_id)
        tgt_embedding = src_embedding if cfg.share_embeddings else TokenEmbedding(tgt_vocab_size, cfg.d_model, pad_id)
        self.encoder = Encoder(cfg, src_embedding)
        self.decoder = Decoder(cfg, tgt_embedding)
        self.output_proj = nn.Linear(cfg.d_model, tgt_vocab_size, bias=False)  # pre-softmax projection
        if cfg.tie_output:
            self.output_proj.weight = tgt_embedding.weight
        else:
            nn.init.xavier_uniform_(self.output_proj.weight)

    @property
    def n_decoder_layers(self) -> int:
        return len(self.decoder.layers)

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """src (B, S) -> memory (B, S, D); the mask defaults to the padding mask of ``src``."""
        if src_mask is None:
            src_mask = padding_mask(src, self.pad_id)
        return self.encoder(src, src_mask)

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor | None,
               cache: DecoderCache | None = None) -> Tensor:
        """Next-token logits (B, T_new, V) for the positions of ``tgt_in`` (B, T) not yet in ``cache``.

        Without a cache every position is computed; with one, only the new ones, whose keys and
        values are appended to the cache (incremental decoding).
        """
        states, _ = self.decoder(tgt_in, memory, src_mask, cache)
        return self.output_proj(states)

    def decode_with_attention(self, tgt_in: Tensor, memory: Tensor,
                              src_mask: Tensor | None) -> tuple[Tensor, list[Tensor]]:
        """Logits (B, T, V) and the cross-attention weights of every layer, each (B, H, T, S): for attention
        heatmaps and word alignments, apart from `decode` because the fused attention kernels that `decode` runs
        return no weights (the explicit formula computes them)."""
        states, weights = self.decoder(tgt_in, memory, src_mask, need_weights=True)
        return self.output_proj(states), weights

    def new_cache(self, incremental: bool = True) -> DecoderCache:
        """An empty cache for `decode`; ``incremental=False`` recomputes the prefix at every step."""
        return DecoderCache.empty(self.n_decoder_layers, incremental)

    def forward(self, src: Tensor, tgt_in: Tensor, attention_row_length: int = 0) -> Tensor:
        """Teacher forcing: src (B, S), tgt_in (B, T) -> logits (B, T, V); with ``attention_row_length``, rows
        attend in groups of up to that many positions where two or more fit (`row_groups`)."""
        src_mask = padding_mask(src, self.pad_id)
        encoder_mask, cross_mask, self_mask = src_mask, src_mask, None
        rows = group_size(src.size(0), max(src.size(1), tgt_in.size(1)), attention_row_length)
        if rows > 1:
            masks = grouped_masks(src_mask.view(src.shape), tgt_in.size(1), rows)
            encoder_mask, cross_mask, self_mask = masks.encoder, masks.cross, masks.decoder
        states, _ = self.decoder(tgt_in, self.encoder(src, encoder_mask), cross_mask, self_mask=self_mask)
        return self.output_proj(states)


def count_parameters(model: nn.Module) -> int:
    """Number of distinct trainable parameters (tied matrices count once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def estimate_flops(cfg: ModelConfig, vocab_size: int, src_shape: tuple[int, int],
                   tgt_shape: tuple[int, int]) -> float:
    """Matmul FLOPs of one training step (forward and backward) on sources (B, S) and target
    inputs (B, T), padding included: 6 x the multiply-adds of the forward, for MFU.

    Multiply-adds: every weight matrix times the positions it is applied to (encoder: Q, K, V,
    output and the FFN's two; decoder: self-attention Q, K, V, output, cross-attention Q and
    output and the FFN's two on the target positions, cross-attention K and V on the source
    positions; the output projection to ``vocab_size``), plus QKᵀ and the weighted sum of the
    values (2 x Tq x Tk x d_model per sentence and attention, the causal half included).
    Backward costs twice the forward, hence 3 x 2 FLOPs per multiply-add. Not counted: the
    embedding lookups, softmax, layer norms, biases, dropout and the loss.
    """
    d, d_ff = cfg.d_model, cfg.d_ff
    sentences, src_len = src_shape
    tgt_len = tgt_shape[1]
    src_positions, tgt_positions = sentences * src_len, sentences * tgt_len
    weights = cfg.n_encoder_layers * (4 * d * d + 2 * d * d_ff) * src_positions  # self-attention, FFN
    weights += cfg.n_decoder_layers * ((6 * d * d + 2 * d * d_ff) * tgt_positions  # self, cross Q and out, FFN
                                       + 2 * d * d * src_positions)  # cross-attention K, V of the memory
    weights += d * vocab_size * tgt_positions  # output projection
    attention = 2 * d * sentences * (cfg.n_encoder_layers * src_len**2
                                     + cfg.n_decoder_layers * (tgt_len**2 + tgt_len * src_len))
    return 6.0 * (weights + attention)
