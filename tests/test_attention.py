import math

import pytest
import torch

from transformer.model.attention import (
    CrossAttention,
    SelfAttention,
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
)
from transformer.model.cache import CrossAttentionCache, DecoderCache, KeyValueCache


def test_weight_free_self_attention_worked_out_by_hand():
    # softmax(X Xᵀ) X, the form tutorials start from: no projections and no 1/sqrt(d_k) (scale=1)
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    # X Xᵀ = [[1, 0, 1], [0, 1, 1], [1, 1, 2]]; row 1: softmax(1, 0, 1) = (e, 1, e) / (2e + 1)
    e = math.e
    expected_weights = torch.tensor([[e, 1, e], [1, e, e], [e, e, e * e]])
    expected_weights /= expected_weights.sum(dim=1, keepdim=True)
    context, weights = scaled_dot_product_attention(x, x, x, scale=1.0)
    torch.testing.assert_close(weights, expected_weights)
    # row 1: 0.4223 * (1, 0) + 0.1554 * (0, 1) + 0.4223 * (1, 1) = (0.8446, 0.5777)
    torch.testing.assert_close(context, torch.tensor([[0.8446, 0.5777], [0.5777, 0.8446], [0.7881, 0.7881]]),
                               atol=1e-4, rtol=0)


def test_attention_on_a_plain_matrix_matches_the_formula():
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 4), torch.randn(5, 4), torch.randn(5, 2)
    context, weights = scaled_dot_product_attention(q, k, v)
    expected = torch.softmax(q @ k.T / 2.0, dim=-1)  # sqrt(d_k) = 2
    torch.testing.assert_close(weights, expected)
    torch.testing.assert_close(context, expected @ v)
    assert context.shape == (3, 2) and weights.shape == (3, 5)


def test_weights_sum_to_one_and_are_exactly_zero_on_masked_keys():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8)
    tokens = torch.tensor([[5, 6, 7, 8, 0, 0], [5, 6, 0, 0, 0, 0]])
    mask = padding_mask(tokens, pad_id=0)
    _, weights = scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 4))
    assert (weights[0, :, :, 4:] == 0).all() and (weights[1, :, :, 2:] == 0).all()


def test_fully_masked_query_row_gives_zeros_not_nan():
    q, k, v = torch.randn(2, 4), torch.randn(3, 4), torch.randn(3, 4)
    mask = torch.tensor([[True, True, False], [False, False, False]])
    context, weights = scaled_dot_product_attention(q, k, v, mask)
    assert torch.isfinite(context).all()
    assert (weights[1] == 0).all() and (context[1] == 0).all()


def test_causal_mask_shifts_its_diagonal_for_cached_queries():
    assert causal_mask(3, 3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert causal_mask(2, 4).tolist() == [[True, True, True, False], [True, True, True, True]]


def test_fused_kernel_equals_the_formula():
    torch.manual_seed(0)
    self_attn, cross_attn = SelfAttention(32, 4).eval(), CrossAttention(32, 4).eval()
    x, memory = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    mask = padding_mask(torch.tensor([[1] * 7, [1] * 4 + [0] * 3]), pad_id=0)
    q, k, v = (self_attn.split_heads(t) for t in self_attn.qkv_proj(x).chunk(3, dim=-1))
    for causal, key_mask in ((True, None), (True, mask[..., :5]), (False, mask[..., :5])):
        fused, none = self_attn.attention(q, k, v, key_mask, causal)
        formula, weights = self_attn.attention(q, k, v, key_mask, causal, need_weights=True)
        assert none is None and weights is not None
        torch.testing.assert_close(fused, formula, atol=1e-5, rtol=0)
    fused, _ = cross_attn(x, memory, mask)
    formula, weights = cross_attn(x, memory, mask, need_weights=True)
    torch.testing.assert_close(fused, formula, atol=1e-5, rtol=0)
    assert weights.shape == (2, 4, 5, 7) and (weights[1, :, :, 4:] == 0).all()


def test_decoder_self_attention_sees_no_later_position():
    torch.manual_seed(0)
    attn = SelfAttention(16, 2).eval()
    x = torch.randn(1, 5, 16)
    edited = x.clone()
    edited[0, 3:] = torch.randn(2, 16)
    torch.testing.assert_close(attn(x, causal=True)[:, :3], attn(edited, causal=True)[:, :3])
    assert not torch.allclose(attn(x)[:, :3], attn(edited)[:, :3])  # without the causal mask it does


def test_heads_use_full_size_projections():
    attn = SelfAttention(d_model=32, n_heads=4)
    assert attn.qkv_proj.weight.shape == (3 * 32, 32)  # W^Q, W^K, W^V each d_model x d_model
    assert attn.out_proj.weight.shape == (32, 32)
    cross = CrossAttention(d_model=32, n_heads=4)
    assert cross.q_proj.weight.shape == (32, 32) and cross.kv_proj.weight.shape == (2 * 32, 32)


def test_beams_share_their_sentences_row_of_the_cross_attention_cache():
    # beam search keeps one memory row per sentence for its K beams (consecutive query rows)
    torch.manual_seed(0)
    attn = CrossAttention(d_model=16, n_heads=2).eval()
    queries, memory = torch.randn(6, 3, 16), torch.randn(2, 5, 16)
    mask = padding_mask(torch.tensor([[1] * 5, [1] * 2 + [0] * 3]), pad_id=0)  # (2, 1, 1, 5)
    repeated_memory, repeated_mask = memory.repeat_interleave(3, dim=0), mask.repeat_interleave(3, dim=0)
    for need_weights in (False, True):
        cache = CrossAttentionCache()
        shared, shared_weights = attn(queries, memory, mask, cache, need_weights)
        expected, expected_weights = attn(queries, repeated_memory, repeated_mask, need_weights=need_weights)
        torch.testing.assert_close(shared, expected, atol=1e-6, rtol=0)
        assert cache.key.shape == (2, 2, 5, 8)  # one row per sentence, not per beam
        if need_weights:
            torch.testing.assert_close(shared_weights, expected_weights, atol=1e-6, rtol=0)
        again, _ = attn(queries, None, mask, cache)  # later steps read the cache, not the memory
        torch.testing.assert_close(again, shared)
    with pytest.raises(ValueError, match="5 query rows cannot share 2 source rows"):
        attn(queries[:5], memory, mask, cache)


def test_self_attention_cache_appends_and_reorders():
    torch.manual_seed(0)
    attn = SelfAttention(d_model=16, n_heads=2).eval()
    x = torch.randn(3, 4, 16)
    full = attn(x, causal=True)
    cache = KeyValueCache()
    steps = [attn(x[:, t : t + 1], causal=True, cache=cache) for t in range(4)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-6, rtol=0)
    assert cache.key.shape == (3, 2, 4, 8)
    decoder_cache = DecoderCache([cache], [CrossAttentionCache()])
    before = cache.key.detach().clone()
    decoder_cache.reorder(torch.tensor([2, 0, 1]))
    decoder_cache.reorder(torch.tensor([0, 0, 1]))  # rows [2, 0, 1], then its first twice and its second
    assert decoder_cache.length == 4
    new = torch.randn(3, 2, 1, 8)
    with torch.no_grad():  # the reordering happens with the next append, in one copy
        key, _ = cache.append(new, new)
    torch.testing.assert_close(key, torch.cat([before[[2, 2, 0]], new], dim=2), atol=0, rtol=0)
    assert decoder_cache.length == 5
    assert DecoderCache.empty(2, incremental=False).length == 0  # the prefix is recomputed


def test_fully_masked_query_gives_zeros_through_the_fused_kernel_too():
    attn = CrossAttention(d_model=16, n_heads=2).eval()
    mask = torch.tensor([[True, True, False], [False, False, False]])[None, None]  # (1, 1, Tq, Tk)
    for need_weights in (False, True):
        out, _ = attn(torch.randn(1, 2, 16), torch.randn(1, 3, 16), mask, need_weights=need_weights)
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out[0, 1], attn.out_proj.bias)  # zero context, then W^O's bias


def test_attention_dropout_in_training_drops_weights_and_keeps_their_expectation():
    torch.manual_seed(0)
    attn = SelfAttention(d_model=16, n_heads=2, dropout=0.5).train()
    x = torch.randn(4, 6, 16)
    first, second = attn(x), attn(x)
    assert not torch.equal(first, second)  # dropout is active
    attn.eval()
    expected = attn(x)
    attn.train()
    mean = attn(x.repeat(4000, 1, 1)).view(4000, *x.shape).mean(0)  # 4000 draws of each sentence
    torch.testing.assert_close(mean, expected, atol=0.05, rtol=0)
