import math

import torch

from transformer.model import layers
from transformer.model.layers import PositionalEncoding, TokenEmbedding, sinusoidal_positional_encoding


def test_positional_encoding_matches_the_formula_for_even_and_odd_dimensions():
    table = sinusoidal_positional_encoding(50, 16)
    assert table.shape == (50, 16)
    for pos in (0, 1, 7, 49):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert math.isclose(table[pos, 2 * i].item(), math.sin(angle), abs_tol=1e-6)
            assert math.isclose(table[pos, 2 * i + 1].item(), math.cos(angle), abs_tol=1e-6)


def test_positional_encoding_extends_beyond_its_table_and_is_not_saved():
    encoding = PositionalEncoding(d_model=8, dropout=0.0, max_positions=4).eval()
    out = encoding(torch.zeros(1, 10, 8))  # longer than the table: must not crash
    torch.testing.assert_close(out[0], sinusoidal_positional_encoding(10, 8))
    shifted = encoding(torch.zeros(1, 3, 8), offset=20)
    torch.testing.assert_close(shifted[0], sinusoidal_positional_encoding(23, 8)[20:])
    assert "table" not in encoding.state_dict() and not list(encoding.parameters())


def test_embeddings_are_scaled_by_sqrt_d_model():
    embedding = TokenEmbedding(vocab_size=10, d_model=16, pad_id=0)
    tokens = torch.tensor([[3, 0]])
    torch.testing.assert_close(embedding(tokens)[0, 0], embedding.weight[3] * 4.0)
    assert (embedding(tokens)[0, 1] == 0).all()  # padding row


def test_growing_the_positional_table_never_shrinks_it(monkeypatch):
    # two decoding workers may grow the table at once: a smaller new table must not replace a larger one
    encoding = PositionalEncoding(8, dropout=0.0, max_positions=4).eval()
    real = layers.sinusoidal_positional_encoding

    def another_thread_grows_it_meanwhile(length: int, d_model: int) -> torch.Tensor:
        encoding.table = real(64, d_model)
        return real(length, d_model)

    monkeypatch.setattr(layers, "sinusoidal_positional_encoding", another_thread_grows_it_meanwhile)
    out = encoding(torch.zeros(1, 6, 8))
    assert encoding.table.size(0) == 64
    torch.testing.assert_close(out[0], real(6, 8))
