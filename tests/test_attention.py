import pytest
import torch

from transformer.model.attention import (
    DecoderCache,
    KeyValueCache,
    MultiHeadAttention,
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
)


def test_reference_attention_on_a_plain_matrix_matches_the_formula():
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


def test_fast_path_equals_reference_path():
    torch.manual_seed(0)
    self_attn = MultiHeadAttention(d_model=32, n_heads=4).eval()
    cross_attn = MultiHeadAttention(d_model=32, n_heads=4, cross_attention=True).eval()
    x, memory = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    mask = padding_mask(torch.tensor([[1] * 7, [1] * 4 + [0] * 3]), pad_id=0)
    for attn, kwargs in ((cross_attn, dict(memory=memory, mask=mask)), (self_attn, dict(causal=True)),
                         (self_attn, dict(mask=mask[..., :5], causal=True))):
        fast, none = attn(x, **kwargs)
        reference, weights = attn(x, need_weights=True, **kwargs)
        assert none is None and weights is not None
        torch.testing.assert_close(fast, reference, atol=1e-5, rtol=0)


def test_heads_use_full_size_projections():
    attn = MultiHeadAttention(d_model=32, n_heads=4)
    assert attn.qkv_proj.weight.shape == (3 * 32, 32)  # W^Q, W^K, W^V each d_model x d_model
    assert attn.out_proj.weight.shape == (32, 32)
    cross = MultiHeadAttention(d_model=32, n_heads=4, cross_attention=True)
    assert cross.q_proj.weight.shape == (32, 32) and cross.kv_proj.weight.shape == (2 * 32, 32)


def test_cross_attention_queries_can_share_a_memory_row():
    # beam search passes one memory row per sentence for its K beams (consecutive query rows)
    torch.manual_seed(0)
    attn = MultiHeadAttention(d_model=16, n_heads=2, cross_attention=True).eval()
    queries, memory = torch.randn(6, 3, 16), torch.randn(2, 5, 16)
    mask = padding_mask(torch.tensor([[1] * 5, [1] * 2 + [0] * 3]), pad_id=0)  # (2, 1, 1, 5)
    repeated_memory, repeated_mask = memory.repeat_interleave(3, dim=0), mask.repeat_interleave(3, dim=0)
    for need_weights in (False, True):
        shared, shared_weights = attn(queries, memory, mask=mask, need_weights=need_weights)
        expected, expected_weights = attn(queries, repeated_memory, mask=repeated_mask, need_weights=need_weights)
        torch.testing.assert_close(shared, expected, atol=1e-6, rtol=0)
        assert (shared_weights is None) == (not need_weights)
        if need_weights:
            torch.testing.assert_close(shared_weights, expected_weights, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="5 query rows cannot share 2 sources"):
        attn(queries[:5], memory, mask=mask)


def test_self_attention_cache_appends_and_reorders():
    torch.manual_seed(0)
    attn = MultiHeadAttention(d_model=16, n_heads=2).eval()
    x = torch.randn(3, 4, 16)
    full, _ = attn(x, causal=True)
    cache = KeyValueCache()
    steps = [attn(x[:, t : t + 1], causal=True, cache=cache)[0] for t in range(4)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-6, rtol=0)
    assert cache.key.shape == (3, 2, 4, 8)
    decoder_cache = DecoderCache([cache], [KeyValueCache()])
    before = cache.key.clone()
    decoder_cache.reorder(torch.tensor([2, 2, 0]))
    torch.testing.assert_close(cache.key, before[[2, 2, 0]])
    assert decoder_cache.length == 4


def test_multi_head_fast_path_gives_zeros_for_a_fully_masked_query():
    attn = MultiHeadAttention(d_model=16, n_heads=2, cross_attention=True).eval()
    mask = torch.tensor([[True, True, False], [False, False, False]])[None, None]  # (1, 1, Tq, Tk)
    out, _ = attn(torch.randn(1, 2, 16), memory=torch.randn(1, 3, 16), mask=mask)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[0, 1], attn.out_proj.bias)  # zero context, then W^O's bias


def test_cpu_training_path_matches_the_fused_path_and_its_gradients():
    # training on the CPU runs the explicit formula instead of F.scaled_dot_product_attention
    torch.manual_seed(0)
    self_attn = MultiHeadAttention(d_model=32, n_heads=4, dropout=0.0)
    cross_attn = MultiHeadAttention(d_model=32, n_heads=4, dropout=0.0, cross_attention=True)
    x, memory = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    mask = padding_mask(torch.tensor([[1] * 7, [1] * 4 + [0] * 3]), pad_id=0)
    for attn, kwargs in ((cross_attn, dict(memory=memory, mask=mask)), (self_attn, dict(causal=True)),
                         (self_attn, dict(mask=mask[..., :5], causal=True))):
        outputs, gradients = [], []
        for training in (True, False):
            attn.train(training)
            attn.zero_grad()
            out, _ = attn(x, **kwargs)
            out.square().sum().backward()
            outputs.append(out)
            gradients.append(attn.out_proj.weight.grad.clone())
        torch.testing.assert_close(outputs[0], outputs[1], atol=1e-5, rtol=0)
        torch.testing.assert_close(gradients[0], gradients[1], atol=1e-4, rtol=1e-5)


def test_attention_dropout_in_training_drops_weights_and_keeps_their_expectation():
    torch.manual_seed(0)
    attn = MultiHeadAttention(d_model=16, n_heads=2, dropout=0.5).train()
    x = torch.randn(4, 6, 16)
    first, second = attn(x)[0], attn(x)[0]
    assert not torch.equal(first, second)  # dropout is active
    attn.eval()
    expected = attn(x)[0]
    attn.train()
    mean = attn(x.repeat(4000, 1, 1))[0].view(4000, *x.shape).mean(0)  # 4000 draws of each sentence
    torch.testing.assert_close(mean, expected, atol=0.05, rtol=0)
