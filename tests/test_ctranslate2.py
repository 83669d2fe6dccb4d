"""CTranslate2 export: every architecture variant scores and translates as the PyTorch model does.

Each variant trains a tiny model for 200 steps on the copy corpus (about 8 s on a CPU core: enough
for most greedy outputs to end with eos before the length limit, so both ways of stopping are
compared), converts it, and compares CTranslate2 in float32 with the model: teacher-forced
log-probabilities within 1e-4, and identical greedy translations.
"""

import shutil
from pathlib import Path

import pytest
import torch
from conftest import (
    assert_greedy_outputs_are_ours,
    greedy_bleu_by_engine,
    max_log_prob_difference,
    trained_translator,
)

from transformer.decoding.inputs import source_ids
from transformer.decoding.translator import Translator
from transformer.deploy.folder import load_for_export
from transformer.errors import InputError
from transformer.model.attention import padding_mask
from transformer.model.layers import sinusoidal_positional_encoding

ctranslate2 = pytest.importorskip("ctranslate2", reason="the export extra (ctranslate2) is not installed")

from transformer.deploy.ctranslate2 import CTranslate2Translator  # noqa: E402
from transformer.deploy.ctranslate2_export import convert_to_ctranslate2, transformer_spec_of  # noqa: E402

VARIANTS = {
    "post-norm, tied, joint": {},
    "pre-norm": {"model.norm_first": "true"},
    "untied output": {"model.tie_output": "false"},
    "separate vocabularies": {"model.share_embeddings": "false", "data.joint_vocab": "false"},
}


def export(run_dir: Path, output: Path, quantization: str | None = None) -> Path:
    """What ``transformer-export --format ctranslate2`` writes of the run's last checkpoint."""
    return convert_to_ctranslate2(*load_for_export(run_dir / "checkpoint_last.pt"), output, quantization)


@pytest.fixture(scope="module")
def variant_runs(copy_corpus, tmp_path_factory) -> dict[str, tuple[Translator, Path]]:
    """Each variant's model and run directory, trained once when first asked for."""
    runs: dict[str, tuple[Translator, Path]] = {}

    def run(name: str) -> tuple[Translator, Path]:
        if name not in runs:
            run_dir = tmp_path_factory.mktemp("ct2_run")
            runs[name] = trained_translator(copy_corpus, run_dir, **VARIANTS[name]), run_dir
        return runs[name]

    return run


@pytest.mark.parametrize("name", VARIANTS)
def test_ctranslate2_matches_the_model(copy_corpus, variant_runs, tmp_path, name):
    overrides = VARIANTS[name]
    translator, run_dir = variant_runs(name)
    folder = export(run_dir, tmp_path / "ct2")
    vocabularies = {p.name for p in folder.glob("*vocabulary.json")}
    joint = overrides.get("data.joint_vocab", "true") == "true"
    assert vocabularies == ({"shared_vocabulary.json"} if joint else
                            {"source_vocabulary.json", "target_vocabulary.json"})
    engine = CTranslate2Translator(folder, compute_type="float32", threads=1)
    sources = (copy_corpus / "valid.src").read_text().splitlines()[:16]
    targets = (copy_corpus / "valid.tgt").read_text().splitlines()[:16]

    assert max_log_prob_difference(engine, translator, sources, targets) < 1e-4
    assert_greedy_outputs_are_ours(engine, translator, sources)


def test_beam_scores_are_ours_and_quantized_models_translate(copy_corpus, variant_runs, tmp_path):
    """nbest scores are our GNMT-normalised ones; an int8 export loads and translates."""
    translator, run_dir = variant_runs("post-norm, tied, joint")
    engine = CTranslate2Translator(export(run_dir, tmp_path / "ct2"), compute_type="float32")
    sources = (copy_corpus / "valid.src").read_text().splitlines()[:4]
    ours = {(i, text): score for i, hypotheses in enumerate(translator.translate_nbest(sources, beam_size=2, nbest=2))
            for text, score in hypotheses}
    compared = 0
    for i, hypotheses in enumerate(engine.translate_nbest(sources, beam_size=2, nbest=2)):
        assert len(hypotheses) == 2 and hypotheses[0][1] >= hypotheses[1][1]
        for text, score in hypotheses:
            if (i, text) in ours:  # the two beam searches normalise lengths differently while searching
                assert score == pytest.approx(ours[i, text], abs=1e-4)
                compared += 1
    assert compared >= len(sources)
    given = [source.upper() for source in sources]  # forced decoding too: the model's scores
    assert engine.score(sources, given) == pytest.approx(translator.score(sources, given), abs=1e-4)
    model, cfg, tokenizer = load_for_export(run_dir / "checkpoint_last.pt")
    weights = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    int8 = CTranslate2Translator(convert_to_ctranslate2(model, cfg, tokenizer, tmp_path / "int8", "int8"))
    assert len(int8.translate(sources)) == len(sources)
    for name, tensor in model.state_dict().items():  # quantizing the spec left the model alone
        assert torch.equal(tensor, weights[name]), name


def test_positions_are_the_interleaved_table(copy_corpus, tmp_path):
    """The stored positional table is ours (sin at even, cos at odd dimensions) with model.max_positions
    rows, not CTranslate2's built-in one (all sines, then all cosines); the folder can translate text,
    up to outputs that need all the rows, and refuses longer ones before searching."""
    trained_translator(copy_corpus, tmp_path / "run", max_steps=1, save_every=1)
    model, cfg, tokenizer = load_for_export(tmp_path / "run" / "checkpoint_last.pt")
    spec = transformer_spec_of(model, cfg, tokenizer)
    d_model, rows = cfg.model.d_model, cfg.model.max_positions
    for stack in (spec.encoder, spec.decoder):
        table = torch.from_numpy(stack.position_encodings.encodings.numpy())
        assert table.shape == (rows, d_model)
        assert torch.equal(table, sinusoidal_positional_encoding(rows, d_model))
        assert torch.allclose(table[5, 0::2], torch.sin(5 * table.new_tensor(
            [10000 ** (-2 * i / d_model) for i in range(d_model // 2)])), atol=1e-6)
    assert spec.config.add_source_eos and spec.config.decoder_start_token == spec.config.bos_token == "<s>"
    assert (spec.config.unk_token, spec.config.eos_token) == ("<unk>", "</s>")
    folder = export(tmp_path / "run", tmp_path / "ct2")
    assert {"model.bin", "config.json", "config.yaml", "spm.model"} <= {p.name for p in folder.iterdir()}
    engine = CTranslate2Translator(folder)  # a model trained one step: it never emits eos, so outputs reach the limit
    longest = engine.translate(["alpha"], beam_size=1, max_len_a=0.0, max_len_b=rows - 1)[0]
    assert len(tokenizer.encode_tgt([longest])[0]) > cfg.data.max_length + 2  # beyond the old table of max_length + 2
    with pytest.raises(InputError, match=f"holds {rows} target positions"):
        engine.translate(["alpha"], beam_size=1, max_len_a=0.0, max_len_b=rows)


def test_export_command_writes_a_ctranslate2_folder_that_translates_as_the_checkpoint(trained_copy_run, tmp_path,
                                                                                      capsys):
    from transformer.cli import main

    checkpoint = trained_copy_run / "checkpoint_best.pt"
    sentences = ["alpha beta gamma", "kappa lambda mu iota", "eta", "zeta theta iota kappa delta"]
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(tmp_path / "ct2"),
                 "--format", "ctranslate2"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "ct2")
    ours = Translator.from_checkpoint(checkpoint).translate(sentences, beam_size=1)
    assert CTranslate2Translator(tmp_path / "ct2").translate(sentences, beam_size=1) == ours
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(tmp_path / "int8"),
                 "--format", "ctranslate2", "--quantization", "int8"]) == 0
    assert (tmp_path / "int8" / "model.bin").stat().st_size < (tmp_path / "ct2" / "model.bin").stat().st_size
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(tmp_path / "r"),
                 "--quantization", "int8"]) == 2
    assert "--quantization is for --format ctranslate2" in capsys.readouterr().err


def test_export_refuses_the_checkpoints_folder_and_replaces_another_only_when_forced(trained_copy_run, tmp_path,
                                                                                     capsys):
    from transformer.cli import main

    run = tmp_path / "run"
    run.mkdir()
    for name in ("checkpoint_best.pt", "spm.model", "config.yaml"):
        (run / name).write_bytes((trained_copy_run / name).read_bytes())
    release = tmp_path / "release"
    release.mkdir()
    (release / "model.safetensors").write_bytes(b"another export's weights")
    export = ["export", "--checkpoint", str(run / "checkpoint_best.pt"), "--format", "ctranslate2", "--output"]
    for output, says in ((run, f"{run}: holds the checkpoint"), (release, f"{release}: exists and is not empty")):
        assert main([*export, str(output)]) == 2
        error = capsys.readouterr().err
        assert error.startswith(f"error: {says}") and error.count("\n") == 1
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint_best.pt", "config.yaml", "spm.model"]
    assert (run / "config.yaml").read_bytes() == (trained_copy_run / "config.yaml").read_bytes()
    assert [p.name for p in release.iterdir()] == ["model.safetensors"]
    assert main([*export, str(release), "--force"]) == 0
    assert sorted(p.name for p in release.iterdir()) == ["SHA256SUMS", "config.json", "config.yaml", "model.bin",
                                                         "shared_vocabulary.json", "spm.model"]


@pytest.fixture(scope="module")
def exported(trained_copy_run, tmp_path_factory) -> Path:
    return export(trained_copy_run, tmp_path_factory.mktemp("ct2") / "model")


def damage(folder: Path, how: str) -> None:
    weights = folder / "model.bin"
    if "exported before SHA256SUMS" in how:
        (folder / "SHA256SUMS").unlink()
    if how.startswith("truncated model.bin"):
        weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2])
    elif how == "config.json not JSON":
        (folder / "config.json").write_text('{"bos_token": ')
    elif how.startswith("vocabulary not JSON"):
        (folder / "shared_vocabulary.json").write_text('["<unk>", ')
    elif how == "config.json not an object":
        (folder / "config.json").write_text("[]")
    elif how == "no config.json":
        (folder / "config.json").unlink()
    elif how == "another tokenizer":  # a KeyError's traceback from the detokenizer, or a wrong translation
        (folder / "spm.model").write_bytes((folder / "spm.model").read_bytes() + b"\0")
    elif how == "SHA256SUMS not sha256sum's":
        (folder / "SHA256SUMS").write_text("model.bin 0123\n")


@pytest.mark.parametrize("how, says", [
    ("truncated model.bin", "{folder}/model.bin: not the file this folder was exported with (its sha256 differs"),
    ("another tokenizer", "{folder}/spm.model: not the file this folder was exported with (its sha256 differs"),
    ("SHA256SUMS not sha256sum's", "{folder}/SHA256SUMS line 1: not 'SHA256  FILE' of a file in the folder"),
    ("truncated model.bin, exported before SHA256SUMS", "{folder}: cannot load this CTranslate2 model ("),
    ("config.json not JSON", "{folder}/config.json: not valid JSON ("),
    ("vocabulary not JSON, exported before SHA256SUMS", "{folder}/shared_vocabulary.json: not valid JSON ("),
    ("config.json not an object", "{folder}: cannot load this CTranslate2 model ("),
    ("no config.json", "not a CTranslate2 model folder (no config.json): {folder}"),
])
def test_a_damaged_folder_is_one_line_naming_it(exported, tmp_path, capsys, how, says):
    """A truncated model.bin was a traceback (RuntimeError: Variable 'decoder/embeddings/weight' has an invalid
    payload size), and so was invalid JSON."""
    from transformer.cli import main

    folder = tmp_path / "ct2"
    shutil.copytree(exported, folder)
    damage(folder, how)
    assert main(["translate", "--engine", "ctranslate2", "--model", str(folder), "alpha"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: " + says.format(folder=folder)) and error.count("\n") == 1


def test_translate_and_evaluate_run_the_ctranslate2_engine_like_the_checkpoint(trained_copy_run, tmp_path, capsys):
    from transformer.cli import main

    checkpoint, folder = str(trained_copy_run / "checkpoint_best.pt"), str(tmp_path / "ct2")
    assert main(["export", "--checkpoint", checkpoint, "--output", folder, "--format", "ctranslate2"]) == 0
    capsys.readouterr()
    sentences = ["alpha beta gamma", "", "kappa lambda mu iota", "eta"]
    assert main(["translate", "--checkpoint", checkpoint, *sentences, "decode.beam_size=1"]) == 0
    ours = capsys.readouterr().out
    assert main(["translate", "--engine", "ctranslate2", "--model", folder, *sentences, "--beam-size", "1",
                 "--workers", "2"]) == 0
    assert capsys.readouterr().out == ours
    scores = greedy_bleu_by_engine(checkpoint, folder, "ctranslate2", tmp_path)
    assert scores["ctranslate2"] == scores["torch"] > 90
    assert main(["translate", "--engine", "ctranslate2", "--checkpoint", checkpoint, "alpha"]) == 2
    assert "--engine ctranslate2 needs --model DIR" in capsys.readouterr().err


def test_attention_is_the_models_last_layer_mean_over_heads(copy_corpus, variant_runs, tmp_path):
    """CTranslate2's attention (the export's alignment heads: all of the last layer's) is ours, less the
    source eos column CTranslate2 leaves out (greedy: the two beam searches may find different outputs)."""
    translator, run_dir = variant_runs("post-norm, tied, joint")
    engine = CTranslate2Translator(export(run_dir, tmp_path / "ct2"), compute_type="float32")
    for sentence in (copy_corpus / "valid.src").read_text().splitlines()[:4]:
        ours, theirs = translator.attention(sentence, beam_size=1), engine.attention(sentence, beam_size=1)
        assert theirs.source_pieces == ours.source_pieces[:-1] and ours.source_pieces[-1] == "</s>"
        rows = len(theirs.target_pieces)  # at the length limit ours ends with a forced eos, CTranslate2's stops
        assert theirs.target_pieces == ours.target_pieces[:rows] and ours.target_pieces[rows:] in ([], ["</s>"])
        torch.testing.assert_close(theirs.weights[-1].mean(0), ours.weights[-1].mean(0)[:rows, :-1], atol=1e-4,
                                   rtol=0)


def test_an_output_that_ends_at_once_is_empty_in_both(copy_corpus, variant_runs, tmp_path):
    """eos as the first token: our search allows it, so CTranslate2 must too (its min_decoding_length
    defaults to 1). The untied output row of eos is pointed at the first decoder state of every source."""
    run_dir = variant_runs("untied output")[1]
    model, cfg, tokenizer = load_for_export(run_dir / "checkpoint_last.pt")  # its own copy, changed below
    translator = Translator(model, tokenizer, cfg.decode, torch.device("cpu"))
    sources = (copy_corpus / "valid.src").read_text().splitlines()[:4]
    src = torch.nn.utils.rnn.pad_sequence([torch.tensor(ids) for ids in source_ids(tokenizer, sources, 64)],
                                          batch_first=True, padding_value=tokenizer.pad_id)
    with torch.no_grad():
        mask = padding_mask(src, tokenizer.pad_id)
        first, _ = model.decoder(torch.full((len(sources), 1), tokenizer.bos_id), model.encode(src, mask), mask)
        direction = first[:, 0].mean(0)
        model.output_proj.weight[tokenizer.eos_id] = 100 * direction / direction.norm()
    assert translator.translate(sources, beam_size=1) == [""] * len(sources)
    engine = CTranslate2Translator(convert_to_ctranslate2(model, cfg, tokenizer, tmp_path / "ct2"),
                                   compute_type="float32")
    assert engine.translate(sources, beam_size=1) == [""] * len(sources)
    assert engine.attention(sources[0], beam_size=1).target_pieces == ["</s>"]


def test_prefixes_run_on_ctranslate2_sampling_and_constraints_are_refused(copy_corpus, variant_runs, tmp_path):
    """A target prefix gives our greedy translation and our score, its limit counting the prefix as ours does;
    sampling is refused: CTranslate2 seeds its generators once per thread, so a seed cannot reproduce samples."""
    translator, run_dir = variant_runs("post-norm, tied, joint")
    engine = CTranslate2Translator(export(run_dir, tmp_path / "ct2"), compute_type="float32", threads=1)
    sources = (copy_corpus / "valid.src").read_text().splitlines()[:8] + ["", "eta"]
    prefixes = [source.upper().split()[0] for source in sources[:8]] + ["KAPPA", "THETA BETA"]
    prefixes[1:3] = ["", "ZETA ZETA ZETA ZETA"]
    for settings in ({"beam_size": 1}, {"beam_size": 1, "max_len_a": 0.0, "max_len_b": 2}):
        ours = translator.translate_nbest(sources, prefixes=prefixes, **settings)
        theirs = engine.translate_nbest(sources, prefixes=prefixes, **settings)
        assert [n[0][0] for n in theirs] == [n[0][0] for n in ours]
        assert [n[0][1] for n in theirs[:8]] == pytest.approx([n[0][1] for n in ours[:8]], abs=1e-3)
    with pytest.raises(InputError, match="decode.sampling runs on the torch and onnx engines"):
        engine.translate(sources, sampling=True)
    with pytest.raises(InputError, match="constraints run on the torch and onnx engines"):
        engine.translate(sources[:1], constraints=[["KAPPA"]])


def test_scores_come_from_the_search_and_batches_never_change_a_translation(copy_corpus, variant_runs, tmp_path):
    """Our score of a hypothesis that ended with eos and had no prefix comes from CTranslate2's own beam score:
    only hypotheses the length limit ended are scored a second time (every hypothesis was, which made
    ``--engine ctranslate2`` 1.4x slower than CTranslate2's translate_batch on test2016); CTranslate2's
    batch settings change no translation and no score."""
    translator, run_dir = variant_runs("post-norm, tied, joint")
    engine = CTranslate2Translator(export(run_dir, tmp_path / "ct2"), compute_type="float32")
    sources = (copy_corpus / "valid.src").read_text().splitlines()[:8]
    scored: list[int] = []

    class CountingScores:  # ctranslate2.Translator's methods cannot be patched
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def score_batch(self, sources, targets, **options):
            scored.append(len(targets))
            return self.inner.score_batch(sources, targets, **options)

    engine.translator = CountingScores(engine.translator)
    found = engine.translate_nbest(sources, beam_size=2, nbest=2)
    limits = [int(engine.decode.max_len_a * (len(ids) + 1) + engine.decode.max_len_b)
              for ids in engine.tokenizer.encode_src(sources)]
    ended = sum(len(tokens) < limit for hypotheses, limit in zip(found, limits)
                for tokens in engine.tokenizer.encode_tgt([text for text, _ in hypotheses]))
    assert ended >= len(sources) and sum(scored) <= 2 * len(sources) - ended
    ours = {(i, text): score for i, hypotheses in enumerate(translator.translate_nbest(sources, beam_size=2, nbest=2))
            for text, score in hypotheses}
    assert sum(ours.get((i, text), score) == pytest.approx(score, abs=1e-4)
               for i, hypotheses in enumerate(found) for text, score in hypotheses) == 2 * len(sources)
    for engine.batch_type, engine.batch_size in (("examples", 1), ("tokens", 7)):
        again = engine.translate_nbest(sources, beam_size=2, nbest=2)
        assert [[text for text, _ in hypotheses] for hypotheses in again] == [[t for t, _ in h] for h in found]
        assert [s for h in again for _, s in h] == pytest.approx([s for h in found for _, s in h], abs=1e-5)


def test_an_engine_without_constrained_search_refuses_constraints(trained_copy_run, tmp_path, capsys):
    from transformer.cli import main

    folder = str(tmp_path / "ct2")
    assert main(["export", "--checkpoint", str(trained_copy_run / "checkpoint_best.pt"), "--output", folder,
                 "--format", "ctranslate2"]) == 0
    capsys.readouterr()
    assert main(["translate", "--engine", "ctranslate2", "--model", folder, "--constraints", "alpha\tALPHA"]) == 2
    assert capsys.readouterr().err == ("error: --constraints: the ctranslate2 engine has no lexically constrained "
                                       "search (the torch and onnx ones do)\n")


def test_attention_layers_and_heads_are_refused_where_ctranslate2_gives_their_mean_alone(exported, tmp_path, capsys):
    """--attention-layer 0 was taken and plotted CTranslate2's last layer's mean; the model's real last layer was
    refused as beyond "1 decoder layers"."""
    from transformer.cli import main

    for flag in ("--attention-layer", "--attention-head"):
        assert main(["translate", "--engine", "ctranslate2", "--model", str(exported), "--plot-attention",
                     str(tmp_path / "plots"), flag, "0", "alpha"]) == 2
        assert capsys.readouterr().err == (f"error: {flag}: the ctranslate2 engine gives its last decoder layer's "
                                           f"attention, mean over heads, alone\n")
    assert not (tmp_path / "plots").exists()


def test_the_best_translation_is_the_first_of_every_nbest_list(copy_corpus, tmp_path):
    """CTranslate2 returned its own best by its length normalisation for --nbest 1, and re-ranked by ours only the
    lists it gave for --nbest 2 or more: the 1-best depended on --nbest. Its beam's hypotheses are all ranked by
    ours now. A model trained 30 steps, whose hypotheses score close, and a strong length penalty show it."""
    run_dir = tmp_path / "run"
    trained_translator(copy_corpus, run_dir, max_steps=30)
    engine = CTranslate2Translator(export(run_dir, tmp_path / "ct2"), compute_type="float32", threads=1)
    sources = (copy_corpus / "valid.src").read_text().splitlines()[:40]
    settings = {"beam_size": 4, "length_penalty": 2.0}
    best = engine.translate(sources, **settings)
    for nbest in (2, 4):
        lists = engine.translate_nbest(sources, nbest=nbest, **settings)
        assert [hypotheses[0][0] for hypotheses in lists] == best and {len(h) for h in lists} == {nbest}
    plotted = [engine.attention(source, **settings).target_pieces for source in sources]  # what --plot-attention
    assert ["".join(p for p in pieces if p != "</s>").replace("▁", " ").strip() for pieces in plotted] == best
