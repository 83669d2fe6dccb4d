import pytest
import torch
import torch.nn.functional as F
from conftest import BOS, EOS, PAD, VOCAB, make_model, tiny_config

from transformer.config_loading import load_config
from transformer.model.attention import padding_mask
from transformer.model.transformer import Transformer, count_parameters


@pytest.mark.parametrize("norm_first", [False, True])
def test_forward_shapes(norm_first, src, tgt_in):
    model = make_model(norm_first=norm_first)
    assert model(src, tgt_in).shape == (2, 5, VOCAB)
    memory = model.encode(src)
    assert memory.shape == (2, 6, 32)


def test_future_tokens_do_not_change_past_logits(tiny_model, src, tgt_in):
    edited = tgt_in.clone()
    edited[:, -1] = 17  # change only the last position
    torch.testing.assert_close(tiny_model(src, tgt_in)[:, :-1], tiny_model(src, edited)[:, :-1])
    assert not torch.allclose(tiny_model(src, tgt_in)[:, -1], tiny_model(src, edited)[:, -1])


@pytest.mark.parametrize("norm_first", [False, True])
def test_source_padding_does_not_change_logits(norm_first, tgt_in):
    model = make_model(norm_first=norm_first)
    src = torch.tensor([[5, 6, 7, EOS]])
    padded = torch.tensor([[5, 6, 7, EOS, PAD, PAD, PAD]])
    torch.testing.assert_close(model(src, tgt_in[:1]), model(padded, tgt_in[:1]), atol=1e-5, rtol=0)


def test_target_padding_does_not_change_logits_of_real_positions(tiny_model, src):
    short = torch.tensor([[BOS, 4, 5]])
    padded = torch.tensor([[BOS, 4, 5, PAD, PAD]])
    torch.testing.assert_close(tiny_model(src[:1], short), tiny_model(src[:1], padded)[:, :3], atol=1e-5, rtol=0)


@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_decoding_equals_uncached(norm_first, src, tgt_in):
    model = make_model(norm_first=norm_first)
    src_mask = padding_mask(src, PAD)
    memory = model.encode(src, src_mask)
    full = model.decode(tgt_in, memory, src_mask)
    cache = model.new_cache()
    steps = [model.decode(tgt_in[:, : t + 1], memory, src_mask, cache) for t in range(tgt_in.size(1))]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)
    assert cache.length == tgt_in.size(1)
    # several new positions at once, after a cached prefix
    cache = model.new_cache()
    first = model.decode(tgt_in[:, :2], memory, src_mask, cache)
    rest = model.decode(tgt_in, memory, src_mask, cache)
    torch.testing.assert_close(torch.cat([first, rest], dim=1), full, atol=1e-5, rtol=0)


def test_reordered_cache_follows_its_rows(tiny_model, src, tgt_in):
    src_mask = padding_mask(src, PAD)
    memory = tiny_model.encode(src, src_mask)
    cache = tiny_model.new_cache()
    tiny_model.decode(tgt_in[:, :3], memory, src_mask, cache)
    order = torch.tensor([1, 0])
    cache.reorder(order, order)
    step = tiny_model.decode(tgt_in[order], memory[order], src_mask[order], cache)
    torch.testing.assert_close(step, tiny_model.decode(tgt_in, memory, src_mask)[order, 3:], atol=1e-5, rtol=0)


@torch.no_grad()  # the search's path: the reordering waits for the next step's append
def test_reorderings_between_two_steps_compose(tiny_model, src, tgt_in):
    src_mask = padding_mask(src, PAD)
    memory = tiny_model.encode(src, src_mask)
    cache = tiny_model.new_cache()
    tiny_model.decode(tgt_in[:, :3], memory, src_mask, cache)
    swap, second = torch.tensor([1, 0]), torch.tensor([1])
    cache.reorder(swap, swap)
    cache.reorder(second, second)  # rows [1, 0], then its second: the original row 0 alone
    first = torch.tensor([0])
    step = tiny_model.decode(tgt_in[first, :4], memory[first], src_mask[first], cache)
    torch.testing.assert_close(step, tiny_model.decode(tgt_in, memory, src_mask)[first, 3:4], atol=1e-5, rtol=0)


def test_inputs_longer_than_the_positional_table_work(tiny_model):
    long_src = torch.randint(4, VOCAB, (1, 40))  # max_positions is 16
    assert torch.isfinite(tiny_model(long_src, long_src)).all()


def test_attention_weights_are_returned_per_layer(tiny_model, src, tgt_in):
    memory = tiny_model.encode(src)
    logits, weights = tiny_model.decode_with_attention(tgt_in, memory, padding_mask(src, PAD))
    torch.testing.assert_close(logits, tiny_model(src, tgt_in))
    assert len(weights) == 2 and weights[0].shape == (2, 4, 5, 6)
    assert (weights[0][1, :, :, 4:] == 0).all()


def test_embedding_tying():
    three_way = make_model(share_embeddings=True, tie_output=True)
    assert three_way.encoder.embedding is three_way.decoder.embedding
    assert three_way.output_proj.weight is three_way.decoder.embedding.weight
    two_way = Transformer(tiny_config(share_embeddings=False), 20, 30)
    assert two_way.encoder.embedding is not two_way.decoder.embedding
    assert two_way.output_proj.weight is two_way.decoder.embedding.weight
    assert two_way(torch.tensor([[5, 3]]), torch.tensor([[2, 4]])).shape == (1, 2, 30)
    with pytest.raises(ValueError, match="one vocabulary"):
        Transformer(tiny_config(share_embeddings=True), 20, 30)


def test_base_model_has_about_63m_parameters():
    cfg = load_config("configs/transformer_base.yaml")
    with torch.device("meta"):
        model = Transformer(cfg.model, cfg.data.vocab_size)
    assert 62e6 < count_parameters(model) < 64e6  # paper: 65M with its own vocabulary


def test_big_model_has_about_213m_parameters():
    cfg = load_config("configs/transformer_big.yaml")
    with torch.device("meta"):
        model = Transformer(cfg.model, cfg.data.vocab_size)
    assert 205e6 < count_parameters(model) < 215e6  # paper: 213M


def test_weights_are_xavier_uniform():
    model = Transformer(tiny_config(d_model=64, d_ff=256), VOCAB)
    weight = model.encoder.layers[0].ff.linear1.weight  # (256, 64)
    bound = (6 / (64 + 256)) ** 0.5
    assert weight.abs().max() <= bound and weight.abs().max() > 0.9 * bound


@pytest.mark.slow
def test_tiny_model_learns_to_reverse_sequences():
    """End-to-end check: a small model learns to reverse random sequences (>= 99% token accuracy)."""
    torch.manual_seed(0)
    model = Transformer(tiny_config(d_model=64, d_ff=256, n_heads=4, max_positions=32), VOCAB)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)

    def sample(batch_size):
        body = torch.randint(4, VOCAB, (batch_size, 10))
        src = torch.cat([body, torch.full((batch_size, 1), EOS)], dim=1)
        tgt = torch.cat([torch.full((batch_size, 1), BOS), body.flip(1), torch.full((batch_size, 1), EOS)], dim=1)
        return src, tgt[:, :-1], tgt[:, 1:]

    model.train()
    for step in range(1500):
        src, tgt_in, tgt_out = sample(64)
        loss = F.cross_entropy(model(src, tgt_in).flatten(0, 1), tgt_out.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 100 == 99 and loss.item() < 0.01:
            break
    model.eval()
    src, tgt_in, tgt_out = sample(256)
    with torch.no_grad():
        accuracy = (model(src, tgt_in).argmax(-1) == tgt_out).float().mean().item()
    assert accuracy >= 0.99
