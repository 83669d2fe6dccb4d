"""estimate_flops: the matmul FLOPs of a training step that the benchmark's MFU divides by."""

import torch
from torch.utils.flop_counter import FlopCounterMode

from transformer import fast
from transformer.config import ModelConfig
from transformer.model.transformer import Transformer, estimate_flops

# 1 encoder layer, 2 decoder layers (so that swapping the stacks changes the count), d_model 4, d_ff 8
CFG = ModelConfig(d_model=4, n_heads=2, d_ff=8, n_encoder_layers=1, n_decoder_layers=2, dropout=0.0,
                  attention_dropout=0.0, max_positions=16)
VOCAB, SRC, TGT = 10, (2, 3), (2, 5)  # 2 sentences, 3 source and 5 target positions each


def test_estimate_counts_every_matmul_of_a_training_step():
    # multiply-adds of the forward, by hand: 6 source and 10 target positions; d x d = 16, d x d_ff = 32
    encoder = (4 * 16 * 6  # self-attention Q, K, V, output
               + 2 * 32 * 6  # FFN
               + 2 * 2 * (3 * 3 * 4))  # QKᵀ and weights x V (2), 2 sentences, 3 x 3 x d each
    decoder_layer = (4 * 16 * 10  # self-attention Q, K, V, output
                     + 2 * 16 * 10  # cross-attention Q, output
                     + 2 * 16 * 6  # cross-attention K, V of the source positions
                     + 2 * 32 * 10  # FFN
                     + 2 * 2 * (5 * 5 * 4)  # self-attention, 2 sentences, 5 x 5 x d (causal half included)
                     + 2 * 2 * (5 * 3 * 4))  # cross-attention, 2 sentences, 5 x 3 x d
    output = 4 * VOCAB * 10
    assert (encoder, decoder_layer, output) == (912, 2432, 400)
    # forward 2 FLOPs per multiply-add, backward twice the forward
    assert estimate_flops(CFG, VOCAB, SRC, TGT) == 6 * (encoder + 2 * decoder_layer + output) == 37056


def test_estimate_equals_torchs_flop_counter_on_a_training_step():
    torch.manual_seed(0)
    model = Transformer(CFG, VOCAB, pad_id=0).train()
    fast.for_training(model)  # attention as explicit matrix products: the counter misses part of the CPU fused kernel
    src, tgt_in = torch.randint(4, VOCAB, SRC), torch.randint(4, VOCAB, TGT)
    with FlopCounterMode(display=False) as counter:
        model(src, tgt_in).sum().backward()
    assert counter.get_total_flops() == estimate_flops(CFG, VOCAB, src.shape, tgt_in.shape)
