"""Target prefixes, sampling, constraints, ensembles and alignments through the Translator API and the
translate command, on the model that has learned the copy task (target = source upper-cased)."""

import shutil
from pathlib import Path

import pytest
import torch
from conftest import BOS, EOS, PAD, VOCAB, make_model, tiny_config

from transformer.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from transformer.cli import main
from transformer.config import ConfigError
from transformer.decoding.ensemble import Ensemble
from transformer.decoding.search import PLAIN_STEPS
from transformer.decoding.translator import Translator
from transformer.errors import InputError
from transformer.fast.search import FAST_STEPS
from transformer.model.attention import padding_mask
from transformer.model.transformer import Transformer

SENTENCE = "alpha beta gamma delta"


@pytest.mark.parametrize("beam_size", [1, 3])
def test_a_prefix_starts_the_translation_and_the_model_goes_on_from_it(translator, beam_size):
    assert translator.translate([SENTENCE], beam_size=beam_size) == ["ALPHA BETA GAMMA DELTA"]
    sentences, prefixes = [SENTENCE, SENTENCE, "", "eta", SENTENCE], ["ALPHA BETA", "", "KAPPA", "", "DELTA"]
    found = translator.translate(sentences, prefixes=prefixes, beam_size=beam_size)
    assert found[:4] == ["ALPHA BETA GAMMA DELTA", "ALPHA BETA GAMMA DELTA", "KAPPA", "ETA"]
    assert found[4].startswith("DELTA ") and found[4] != "DELTA"  # forced off the copy, it goes on translating
    one_by_one = [translator.translate([s], prefixes=[p], beam_size=beam_size)[0] for s, p in zip(sentences, prefixes)]
    assert found == one_by_one


def test_bad_prefixes_are_one_line_errors(translator):
    with pytest.raises(InputError, match="2 prefixes for 1 sentences"):
        translator.translate([SENTENCE], prefixes=["A", "B"])
    with pytest.raises(InputError, match=r"prefix 2 has \d+ tokens; at most 64"):
        translator.translate([SENTENCE, SENTENCE], prefixes=["", "ALPHA " * 70])


def test_samples_are_reproducible_per_sentence_and_differ_between_seeds(translator):
    sentences = [SENTENCE, "eta theta", "", "kappa lambda mu iota"]
    settings = {"sampling": True, "nbest": 4, "sampling_temperature": 3.0}
    samples = translator.translate_nbest(sentences, seed=1, **settings)
    assert [len(n) for n in samples] == [4, 4, 1, 4] and samples[2] == [("", 0.0)]
    assert len({text for text, _ in samples[0]}) > 1  # a flat distribution gives different samples
    assert translator.translate_nbest(sentences, seed=1, **settings) == samples
    one_by_one = [translator.translate_nbest([s], seed=1, **settings)[0] for s in sentences]
    assert [[text for text, _ in n] for n in one_by_one] == [[text for text, _ in n] for n in samples]
    assert [score for n in one_by_one for _, score in n] == pytest.approx([score for n in samples for _, score in n])
    assert translator.translate_nbest(sentences, seed=2, **settings) != samples
    first = translator.translate(sentences, seed=1, sampling=True, sampling_temperature=3.0)
    assert first == [n[0][0] for n in samples]  # sample 1 of 1 is sample 1 of 4
    greedy = translator.translate(sentences, beam_size=1)
    assert translator.translate(sentences, sampling=True, sampling_topk=1) == greedy


def test_the_translate_command_reads_prefixes_from_a_file_or_a_second_column(checkpoint, tmp_path, capsys):
    (tmp_path / "in.txt").write_text(f"{SENTENCE}\neta\n")
    (tmp_path / "prefixes.txt").write_text("ALPHA\nKAPPA\n")
    assert main(["translate", "--checkpoint", checkpoint, "--input", str(tmp_path / "in.txt"),
                 "--prefixes", str(tmp_path / "prefixes.txt")]) == 0
    by_file = capsys.readouterr().out.splitlines()
    assert by_file[0] == "ALPHA BETA GAMMA DELTA" and by_file[1].startswith("KAPPA")
    (tmp_path / "columns.txt").write_text(f"{SENTENCE}\tALPHA\neta\tKAPPA\n")
    assert main(["translate", "--checkpoint", checkpoint, "--input", str(tmp_path / "columns.txt"),
                 "--prefix-column"]) == 0
    assert capsys.readouterr().out.splitlines() == by_file
    (tmp_path / "short.txt").write_text("ALPHA\n")
    assert main(["translate", "--checkpoint", checkpoint, "--input", str(tmp_path / "in.txt"),
                 "--prefixes", str(tmp_path / "short.txt")]) == 2
    assert "1 prefixes for 2 sentences" in capsys.readouterr().err


def test_every_translation_holds_its_own_constraints_whatever_the_batching(translator):
    # sentences of different lengths: batches are sorted by length, and each keeps its own phrases
    sentences = ["eta", "alpha beta gamma delta epsilon", "kappa lambda", "", "mu nu xi omicron"]
    constraints = [["KAPPA"], ["ZETA ZETA", "ETA"], [], ["ALPHA"], ["MU", "PI"]]
    plain = translator.translate_nbest(sentences, beam_size=3, nbest=3)
    found = translator.translate_nbest(sentences, beam_size=3, nbest=3, constraints=constraints)
    for sentence, phrases, hypotheses in zip(sentences, constraints, found):
        assert all(phrase in text for text, _ in hypotheses for phrase in phrases) or not sentence
    assert found[2] == plain[2]  # no constraints: today's beam search
    assert found[3] == [("", 0.0)]  # an empty sentence stays empty (its prefix, if it has one)
    one_by_one = [translator.translate_nbest([s], beam_size=3, nbest=3, constraints=[c])[0]
                  for s, c in zip(sentences, constraints)]
    assert [[t for t, _ in n] for n in one_by_one] == [[t for t, _ in n] for n in found]
    assert [translator.translate([s], beam_size=3)[0] for s in sentences] == [n[0][0] for n in plain]


def test_a_sentence_without_constraints_is_translated_as_alone_beside_one_with_them(translator):
    """At beam 1 a sentence alone gets greedy search; a one-beam constrained search goes on after eos
    when the length penalty rewards length, so it must not take the sentences that have no constraints."""
    sentences = ["alpha beta", "gamma delta epsilon"]
    for beam_size in (1, 3):
        settings = {"beam_size": beam_size, "length_penalty": 10.0}
        found = translator.translate(sentences, constraints=[[], ["ZETA"]], **settings)
        assert found[0] == translator.translate(sentences[:1], **settings)[0] and "ZETA" in found[1]


def test_fast_paths_is_chosen_when_the_model_loads_and_refused_per_call(checkpoint, translator):
    """The fast paths pack the model's weights when it loads: a per-call fast_paths=False was accepted and
    ignored."""
    with pytest.raises(ConfigError, match="decode.fast_paths is chosen when the model loads, not per call"):
        translator.translate([SENTENCE], fast_paths=False)
    assert translator.steps is FAST_STEPS
    plain = Translator.from_checkpoint(checkpoint, device="cpu", fast_paths=False)
    assert plain.steps is PLAIN_STEPS and not plain.decode.fast_paths
    assert plain.translate([SENTENCE, "eta"], beam_size=3) == translator.translate([SENTENCE, "eta"], beam_size=3)
    old_style = Translator.from_checkpoint(checkpoint, device="cpu", overrides=["decode.fast_paths=false"])
    assert old_style.steps is PLAIN_STEPS
    forced_on = Translator.from_checkpoint(checkpoint, device="cpu", overrides=["decode.fast_paths=false"],
                                           fast_paths=True)
    assert forced_on.steps is FAST_STEPS


def test_blank_prefixes_and_constraint_phrases_force_nothing(translator):
    """A blank phrase was encoded as its spaces, tokens the search then had to emit."""
    plain = translator.translate([SENTENCE], beam_size=3)
    assert translator.translate([SENTENCE], beam_size=3, constraints=[["   "]], prefixes=[" \t "]) == plain


def test_bad_constraints_are_one_line_errors(translator):
    with pytest.raises(InputError, match="1 constraint lists for 2 sentences"):
        translator.translate([SENTENCE, SENTENCE], constraints=[["A"]])
    with pytest.raises(InputError, match=r"sentence 1: constraint 2 has \d+ tokens; at most 64"):
        translator.translate([SENTENCE], constraints=[["ALPHA", "BETA " * 70]])
    with pytest.raises(InputError, match="constraints need beam search: drop decode.sampling"):
        translator.translate([SENTENCE], constraints=[["ALPHA"]], sampling=True)


def test_the_translate_command_reads_constraints_as_tab_separated_columns(checkpoint, tmp_path, capsys):
    (tmp_path / "in.txt").write_text(f"{SENTENCE}\tKAPPA\tMU MU\neta\n")
    assert main(["translate", "--checkpoint", checkpoint, "--input", str(tmp_path / "in.txt"), "--constraints"]) == 0
    first, second = capsys.readouterr().out.splitlines()
    assert "KAPPA" in first and "MU MU" in first and second == "ETA"
    (tmp_path / "prefixes.txt").write_text("BETA\n\n")
    assert main(["translate", "--checkpoint", checkpoint, "--input", str(tmp_path / "in.txt"), "--constraints",
                 "--prefixes", str(tmp_path / "prefixes.txt")]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("BETA") and "KAPPA" in first and "MU MU" in first
    assert main(["translate", "--checkpoint", checkpoint, "--input", str(tmp_path / "in.txt"), "--constraints",
                 "--prefix-column"]) == 2
    assert "--prefix-column takes the second column" in capsys.readouterr().err


def test_an_ensemble_of_a_model_with_itself_translates_as_the_model(checkpoint, translator, copy_corpus):
    ensemble = Translator.from_checkpoint([checkpoint, checkpoint], device="cpu")
    assert isinstance(ensemble.model, Ensemble) and len(ensemble.model.members) == 2
    sentences = (copy_corpus / "valid.src").read_text().splitlines()[:12] + [""]
    for settings in ({"beam_size": 1}, {"beam_size": 3, "nbest": 3}):
        ours = translator.translate_nbest(sentences, **settings)
        theirs = ensemble.translate_nbest(sentences, **settings)
        assert [[t for t, _ in n] for n in theirs] == [[t for t, _ in n] for n in ours]
        assert [s for n in theirs for _, s in n] == pytest.approx([s for n in ours for _, s in n], abs=1e-4)
    constraints = [["KAPPA"]] * len(sentences)
    assert ensemble.translate(sentences, constraints=constraints) == translator.translate(sentences,
                                                                                          constraints=constraints)


def test_an_ensemble_of_models_of_other_directions_is_refused(checkpoint, tmp_path):
    """Only the first model's directions were checked: the others got tags they never saw, or none."""
    state = load_checkpoint(checkpoint)
    state["config"]["data"].update(src_lang="tgt", tgt_lang="src")
    save_checkpoint(state, tmp_path / "reverse.pt")
    shutil.copy(Path(checkpoint).parent / "spm.model", tmp_path)
    with pytest.raises(CheckpointError, match=r"reverse.pt: translates tgt→src, .* src→tgt; an ensemble's models "
                                              r"translate alike"):
        Translator.from_checkpoint([checkpoint, tmp_path / "reverse.pt"], device="cpu")


def test_an_ensemble_averages_its_members_log_probabilities():
    first, second = make_model(0), make_model(1)
    src, tgt_in = torch.tensor([[5, 6, 7, 3]]), torch.tensor([[2, 8, 9]])
    ensemble = Ensemble([first, second]).eval()
    mask = padding_mask(src, 0)
    log_probs = ensemble.decode(tgt_in, ensemble.encode(src, mask), mask)
    expected = (first(src, tgt_in).log_softmax(-1) + second(src, tgt_in).log_softmax(-1)) / 2
    assert torch.allclose(log_probs, expected, atol=1e-5)
    with pytest.raises(ValueError, match="an ensemble's models must share their vocabularies"):
        torch.manual_seed(0)
        Ensemble([first, Transformer(tiny_config(), VOCAB + 1, pad_id=PAD, bos_id=BOS, eos_id=EOS)])


def test_the_translate_command_takes_several_checkpoints_as_an_ensemble(checkpoint, capsys):
    assert main(["translate", "--checkpoint", checkpoint, "--checkpoint", checkpoint, SENTENCE]) == 0
    assert capsys.readouterr().out == "ALPHA BETA GAMMA DELTA\n"


def test_alignments_of_the_copy_task_are_the_diagonal(translator, checkpoint, capsys):
    sentences = [SENTENCE, "kappa lambda mu", "", "eta"]
    translations = translator.translate(sentences)
    diagonal = [[(i, i) for i in range(len(s.split()))] for s in sentences]
    assert translator.align(sentences, translations) == diagonal
    assert translator.align(sentences, translations, layer=0) == diagonal
    assert main(["translate", "--checkpoint", checkpoint, "--alignments", *sentences]) == 0
    assert capsys.readouterr().out.splitlines() == ["ALPHA BETA GAMMA DELTA ||| 0-0 1-1 2-2 3-3",
                                                    "KAPPA LAMBDA MU ||| 0-0 1-1 2-2", " ||| ", "ETA ||| 0-0"]
    assert main(["translate", "--checkpoint", checkpoint, "--alignments", "--nbest", "2", "--beam-size", "2",
                 "eta"]) == 0
    first, second = capsys.readouterr().out.splitlines()
    assert first.startswith("0 ||| ETA ||| ") and first.endswith(" ||| 0-0") and second.startswith("0 ||| ")


def test_a_layer_head_or_batch_size_the_model_lacks_is_a_one_line_error_in_python_too(translator, tmp_path):
    """The command checked --attention-layer and --attention-head; `align` and `plot_attention` raised IndexError
    (and `align` a ValueError from range for batch_size 0) from deep inside."""
    from transformer.plots import plot_attention

    with pytest.raises(InputError, match=r"^layer 5: the model's attention has 2 decoder layers \(0 to 1\)$"):
        translator.align(["eta"], ["ETA"], layer=5)
    with pytest.raises(InputError, match="^batch_size must be >= 1, got 0$"):
        translator.align(["eta"], ["ETA"], batch_size=0)
    attention = translator.attention("eta")
    with pytest.raises(InputError, match=r"^layer -3: the model's attention has 2 decoder layers"):
        plot_attention(attention, tmp_path / "a.png", layer=-3)
    with pytest.raises(InputError, match=r"^head 9: the model's attention has \d+ heads"):
        plot_attention(attention, tmp_path / "a.png", head=9)
    assert plot_attention(attention, tmp_path / "a.png", layer=-1, head=0).stat().st_size > 0
