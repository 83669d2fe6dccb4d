"""Word alignments from cross-attention weights (transformer.decoding.alignment)."""

import torch

from transformer.decoding.alignment import moses_format, word_alignment, word_index


def test_pieces_are_merged_into_words_at_each_word_start():
    assert word_index(["▁Ein", "▁Fahr", "rad", "."]) == [0, 1, 1, 1]
    assert word_index(["ab", "▁c"]) == [0, 1]  # the first piece begins a word even without the mark


def test_each_target_word_aligns_to_the_source_word_it_attends_to_most():
    source = ["▁Ein", "▁Fahr", "rad", "▁fährt"]  # words: Ein, Fahrrad, fährt
    target = ["▁A", "▁bi", "cycle", "▁rides"]  # words: A, bicycle, rides
    weights = torch.tensor([
        [0.7, 0.1, 0.1, 0.1],  # A -> Ein
        [0.1, 0.3, 0.3, 0.3],  # bi: Fahrrad's pieces together (0.6) outweigh fährt (0.3)
        [0.0, 0.2, 0.2, 0.6],  # cycle: fährt alone; with bi, Fahrrad still wins (0.5 vs 0.45)
        [0.2, 0.2, 0.0, 0.6],  # rides -> fährt
    ])
    pairs = word_alignment(source, target, weights)
    assert pairs == [(0, 0), (1, 1), (2, 2)]
    assert moses_format(pairs) == "0-0 1-1 2-2"
    crossing = torch.tensor([[0.1, 0.1, 0.8], [0.9, 0.05, 0.05]])  # target word 0 <- source word 2, 1 <- 0
    assert moses_format(word_alignment(["▁a", "▁b", "▁c"], ["▁x", "▁y"], crossing)) == "0-1 2-0"  # source order
    assert word_alignment([], target, weights[:, :0]) == []
