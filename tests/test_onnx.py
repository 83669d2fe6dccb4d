"""ONNX export: an encoder graph and a decoder-step graph with an explicit cache, run by onnxruntime as the model.

A tiny model trained 200 steps on the copy corpus is exported once by ``transformer-export --format onnx``
(about 10 s); `OnnxTranslator` must then give our teacher-forced log-probabilities within 1e-4, our greedy
outputs exactly and our beam search's hypotheses with their scores.
"""

import contextlib
import io
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import (
    assert_greedy_outputs_are_ours,
    greedy_bleu_by_engine,
    max_log_prob_difference,
    trained_translator,
)

EXTRA = 'ONNX export needs the export extra: pip install -e ".[export]"'
onnxruntime = pytest.importorskip("onnxruntime", reason=EXTRA)
pytest.importorskip("onnxscript", reason=EXTRA)

from transformer.checkpoint import CheckpointError  # noqa: E402
from transformer.cli import main  # noqa: E402
from transformer.config_loading import load_config, save_config  # noqa: E402
from transformer.decoding.translator import Translator  # noqa: E402
from transformer.deploy.onnx import OnnxTranslator  # noqa: E402
from transformer.deploy.onnx_export import DECODER_STEP, ENCODER, export_onnx  # noqa: E402
from transformer.errors import InputError  # noqa: E402


@pytest.fixture(scope="module")
def trained(copy_corpus, tmp_path_factory) -> tuple[Translator, Path]:
    run_dir = tmp_path_factory.mktemp("onnx_run")
    return trained_translator(copy_corpus, run_dir), run_dir / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def export_command(trained) -> tuple[int, str, Path]:
    """transformer-export --format onnx of the trained checkpoint: exit code, what it printed, the folder."""
    _, checkpoint = trained
    folder = checkpoint.parent / "onnx"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["export", "--checkpoint", str(checkpoint), "--output", str(folder), "--format", "onnx"])
    return code, printed.getvalue(), folder


@pytest.fixture(scope="module")
def engine(export_command) -> OnnxTranslator:
    return OnnxTranslator(export_command[2], threads=1)


@pytest.fixture(scope="module")
def sentences(copy_corpus) -> list[str]:
    """Sources of 4 to 9 tokens, an empty line and a one-word one: one batch of different lengths."""
    return (copy_corpus / "valid.src").read_text().splitlines()[:16] + ["", "alpha"]


def test_export_command_writes_the_two_graphs_the_tokenizer_and_the_config(export_command):
    code, printed, folder = export_command
    assert code == 0 and printed == f"{folder}\n"
    assert sorted(p.name for p in folder.iterdir()) == ["SHA256SUMS", "config.yaml", DECODER_STEP, ENCODER,
                                                        "spm.model"]
    listed = (folder / "SHA256SUMS").read_text().splitlines()  # sha256sum's format, config.yaml the user's to edit
    assert [line.split("  ")[1] for line in listed] == [DECODER_STEP, ENCODER, "spm.model"]
    if shutil.which("sha256sum"):
        assert subprocess.run(["sha256sum", "--check", "--quiet", "SHA256SUMS"], cwd=folder).returncode == 0
    step = onnxruntime.InferenceSession(str(folder / DECODER_STEP), providers=["CPUExecutionProvider"])
    inputs = {i.name: i.shape for i in step.get_inputs()}
    outputs = {o.name: o.shape for o in step.get_outputs()}
    assert inputs["tokens"] == ["batch", 1] and inputs["src_mask"] == ["batch", 1, 1, "source"]
    assert inputs["cross_key_1"] == ["batch", 4, "source", 16]  # d_model 64, 4 heads
    assert inputs["self_value_1"] == ["batch", 4, "cache", 16]
    assert outputs["new_self_value_1"] == ["batch", 4, "cache + 1", 16]
    assert outputs["log_probs"][0] == "batch"


def test_decoder_step_log_probs_are_ours_teacher_forced(trained, engine, copy_corpus):
    translator, _ = trained
    sources = (copy_corpus / "valid.src").read_text().splitlines()[:16]
    targets = (copy_corpus / "valid.tgt").read_text().splitlines()[:16]
    assert max_log_prob_difference(engine, translator, sources, targets) < 1e-4


def test_greedy_outputs_are_ours(trained, engine, sentences):
    """Ours with and without the fast paths; one batch of different lengths, and batches of one."""
    translator, checkpoint = trained
    plain = Translator.from_checkpoint(checkpoint, overrides=["decode.fast_paths=false"])
    assert_greedy_outputs_are_ours(engine, translator, sentences)
    assert_greedy_outputs_are_ours(engine, plain, sentences)
    greedy = translator.translate(sentences[:3], beam_size=1)
    assert [engine.translate([sentence], beam_size=1)[0] for sentence in sentences[:3]] == greedy


@pytest.mark.parametrize("settings", [dict(beam_size=4, nbest=4), dict(beam_size=4, max_len_a=0.0, max_len_b=3),
                                      dict(beam_size=4, length_penalty=0.0)])
def test_beam_search_finds_our_hypotheses_with_our_scores(trained, engine, sentences, settings):
    """The same hypotheses in the same order, scores within 1e-4. Exact text equality holds on this model;
    two hypotheses whose scores differ by less than the two runtimes' rounding (about 1e-6) could swap."""
    translator, _ = trained
    ours = translator.translate_nbest(sentences, **settings)
    theirs = engine.translate_nbest(sentences, **settings)
    assert [[text for text, _ in hypotheses] for hypotheses in theirs] == [[t for t, _ in h] for h in ours]
    for mine, their in zip(ours, theirs):
        assert [score for _, score in their] == pytest.approx([score for _, score in mine], abs=1e-4)


@pytest.mark.parametrize("settings", [dict(beam_size=1), dict(beam_size=3, nbest=2),
                                      dict(sampling=True, nbest=3, sampling_temperature=2.0, seed=3)])
def test_prefixes_constraints_and_samples_are_ours(trained, engine, sentences, settings):
    """The prefix's tokens go through the step graph one call each, as ours; constrained
    search and sampling run ours on the graphs' log-probabilities: the same texts."""
    translator, _ = trained
    prefixes = ["", "ALPHA BETA", "KAPPA", *[s.upper().split()[-1] if s else "" for s in sentences[3:]]]
    constraints = None if settings.get("sampling") else [["KAPPA"] if i % 2 else [] for i in range(len(sentences))]
    ours = translator.translate_nbest(sentences, prefixes=prefixes, constraints=constraints, **settings)
    theirs = engine.translate_nbest(sentences, prefixes=prefixes, constraints=constraints, **settings)
    assert [[text for text, _ in hypotheses] for hypotheses in theirs] == [[t for t, _ in h] for h in ours]


def test_pre_norm_untied_separate_vocabularies_score_as_the_model(copy_corpus, tmp_path):
    overrides = {"model.norm_first": "true", "model.tie_output": "false", "model.share_embeddings": "false",
                 "data.joint_vocab": "false"}
    translator = trained_translator(copy_corpus, tmp_path / "run", max_steps=1, save_every=1, **overrides)
    folder = export_onnx(tmp_path / "run" / "checkpoint_last.pt", tmp_path / "onnx")
    assert {"spm.src.model", "spm.tgt.model"} <= {p.name for p in folder.iterdir()}
    sources = (copy_corpus / "valid.src").read_text().splitlines()[:4]
    targets = (copy_corpus / "valid.tgt").read_text().splitlines()[:4]
    assert max_log_prob_difference(OnnxTranslator(folder), translator, sources, targets) < 1e-4


def test_bad_folders_and_lengths_beyond_the_graphs_are_one_line_errors(export_command, tmp_path):
    with pytest.raises(CheckpointError, match=r"not an ONNX model folder \(no encoder.onnx\)"):
        OnnxTranslator(tmp_path)
    with pytest.raises(CheckpointError, match=r"nowhere: no such folder \(give an ONNX model folder\)$"):
        OnnxTranslator(tmp_path / "nowhere")
    release = tmp_path / "release"  # said "not an ONNX model folder (no encoder.onnx)", as of an empty folder
    release.mkdir()
    (release / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match="release: a release folder, not an ONNX model folder; drop --engine"):
        OnnxTranslator(release)
    folder = export_command[2]
    for name in ("config.yaml", "spm.model", ENCODER):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    (tmp_path / DECODER_STEP).write_bytes(b"not a graph")
    with pytest.raises(CheckpointError, match=f"{DECODER_STEP}: not a readable ONNX graph"):
        OnnxTranslator(tmp_path)
    with pytest.raises(InputError, match="hold 1024 positions"):
        OnnxTranslator(folder).translate(["alpha"], max_len_a=10, max_len_b=1024)
    with pytest.raises(InputError, match="hold 1024 positions"):  # a prefix's tokens come on top of the limit
        OnnxTranslator(folder).translate(["alpha"], prefixes=["ALPHA " * 25], max_len_b=1000)
    with pytest.raises(InputError, match=r"^translation 2 has \d+ tokens: .* hold 1024 positions .* needs \d+$"):
        OnnxTranslator(folder).score(["alpha", "beta"], ["ALPHA", "BETA " * 1100])


@pytest.mark.parametrize("name", ["spm.model", ENCODER])
def test_a_file_other_than_the_exported_one_is_refused_in_one_line(export_command, tmp_path, capsys, name):
    """Another export's tokenizer model translated garbage, or failed inside onnxruntime with a 58-line traceback
    (a token id beyond the graph's vocabulary), which the service answered with a 500 at every request."""
    folder = tmp_path / "onnx"
    shutil.copytree(export_command[2], folder)
    (folder / name).write_bytes((folder / name).read_bytes() + b"\0")
    assert main(["translate", "--engine", "onnx", "--model", str(folder), "alpha"]) == 2
    assert capsys.readouterr().err == (f"error: {folder / name}: not the file this folder was exported with (its "
                                       f"sha256 differs from SHA256SUMS'); restore the export's files, or export "
                                       f"again\n")
    (folder / name).write_bytes((export_command[2] / name).read_bytes())
    lines = (folder / "SHA256SUMS").read_text().splitlines()  # as `sha256sum -b` writes them, CRLF, a blank line
    (folder / "SHA256SUMS").write_text("".join(line.replace("  ", " *", 1) + "\r\n" for line in lines) + "\n")
    assert main(["translate", "--engine", "onnx", "--model", str(folder), "alpha"]) == 0
    (folder / "SHA256SUMS").unlink()  # what a folder exported before SHA256SUMS has: read as it is
    (folder / name).write_bytes((export_command[2] / name).read_bytes())
    assert main(["translate", "--engine", "onnx", "--model", str(folder), "alpha"]) == 0


def test_a_config_that_does_not_fit_the_graphs_is_one_line_naming_it(export_command, tmp_path, capsys):
    """Model sizes in config.yaml other than the graphs' failed at the first search step, with a traceback."""
    folder = tmp_path / "onnx"
    shutil.copytree(export_command[2], folder)
    for setting in ("model.n_decoder_layers=1", "model.n_heads=2"):
        save_config(load_config(export_command[2] / "config.yaml", [setting]), folder / "config.yaml")
        assert main(["translate", "--engine", "onnx", "--model", str(folder), "alpha"]) == 2
        assert capsys.readouterr().err == (f"error: {folder}/config.yaml: its model settings (n_decoder_layers, "
                                           f"n_heads, d_model) do not fit {DECODER_STEP}\n")


def test_export_refuses_the_checkpoints_folder_and_replaces_another_only_when_forced(trained, tmp_path, capsys):
    checkpoint = trained[1]
    before = {path.name: path.read_bytes() for path in checkpoint.parent.iterdir() if path.is_file()}
    other = tmp_path / "release"
    other.mkdir()
    (other / "model.safetensors").write_bytes(b"another export's weights")
    export = ["export", "--checkpoint", str(checkpoint), "--format", "onnx", "--output"]
    for output, says in ((checkpoint.parent, f"{checkpoint.parent}: holds the checkpoint"),
                         (other, f"{other}: exists and is not empty")):
        assert main([*export, str(output)]) == 2
        error = capsys.readouterr().err
        assert error.startswith(f"error: {says}") and error.count("\n") == 1
    assert {path.name: path.read_bytes() for path in checkpoint.parent.iterdir() if path.is_file()} == before
    assert [p.name for p in other.iterdir()] == ["model.safetensors"]
    assert main([*export, str(other), "--force"]) == 0
    assert sorted(p.name for p in other.iterdir()) == ["SHA256SUMS", "config.yaml", DECODER_STEP, ENCODER,
                                                       "spm.model"]


def test_translate_and_evaluate_run_the_onnx_engine_like_the_checkpoint(trained, export_command, tmp_path, capsys):
    checkpoint, folder = str(trained[1]), str(export_command[2])
    sentences = ["alpha beta gamma", "", "kappa lambda mu iota", "eta"]
    for settings in (["decode.beam_size=1"], ["--beam-size", "4"]):
        assert main(["translate", "--checkpoint", checkpoint, *sentences, *settings]) == 0
        ours = capsys.readouterr().out
        assert main(["translate", "--engine", "onnx", "--model", folder, *sentences, *settings, "--threads", "1"]) == 0
        assert capsys.readouterr().out == ours
    (tmp_path / "in.txt").write_text("\n".join(sentences) + "\n")
    (tmp_path / "given.txt").write_text("\n".join(sentence.upper() for sentence in sentences) + "\n")
    scored = {}
    for model in (["--checkpoint", checkpoint], ["--engine", "onnx", "--model", folder]):
        assert main(["translate", *model, "--input", str(tmp_path / "in.txt"), "--score",
                     str(tmp_path / "given.txt")]) == 0
        scored[model[0]] = [float(line) for line in capsys.readouterr().out.splitlines()]
    assert scored["--engine"] == pytest.approx(scored["--checkpoint"], abs=2e-4) and len(scored["--engine"]) == 4
    scores = greedy_bleu_by_engine(checkpoint, folder, "onnx", tmp_path)
    assert scores["onnx"] == scores["torch"]
    capsys.readouterr()
    assert main(["translate", "--engine", "onnx", "--model", str(tmp_path), "alpha"]) == 2
    assert capsys.readouterr().err == f"error: not an ONNX model folder (no encoder.onnx): {tmp_path}\n"
    assert main(["translate", "--engine", "onnx", "--model", folder, "--dtype", "bf16", "alpha"]) == 2
    assert "drop --dtype" in capsys.readouterr().err


def test_without_the_extra_the_commands_say_what_to_install(trained, export_command, tmp_path, monkeypatch, capsys):
    for extra in ("onnxruntime", "onnxscript"):  # imports fail as when the extra is not installed
        monkeypatch.setitem(sys.modules, extra, None)
    for module in ("transformer.deploy.onnx", "transformer.deploy.onnx_export"):
        monkeypatch.delitem(sys.modules, module)
    assert main(["export", "--checkpoint", str(trained[1]), "--output", str(tmp_path), "--format", "onnx"]) == 2
    expected = 'error: ONNX export needs onnx, onnxscript and onnxruntime: pip install -e ".[export]"\n'
    assert capsys.readouterr().err == expected
    assert main(["translate", "--engine", "onnx", "--model", str(export_command[2]), "alpha"]) == 2
    assert capsys.readouterr().err == ("error: ONNX models run on onnxruntime, which is not installed: pip install "
                                       'onnxruntime (or pip install -e ".[export]")\n')


def test_an_onnx_folder_translates_with_onnxruntime_alone(trained, export_command, monkeypatch):
    """A deployment installs onnxruntime, not the exporter's onnx and onnxscript (the translator imported the
    exporter's module for the folder's file names, which refused to load without them)."""
    for exporter in ("onnx", "onnxscript"):
        monkeypatch.setitem(sys.modules, exporter, None)
    for module in ("transformer.deploy.onnx", "transformer.deploy.onnx_export"):
        monkeypatch.delitem(sys.modules, module)
    from transformer.deploy.onnx import OnnxTranslator

    sentences = ["alpha beta", "gamma"]
    assert OnnxTranslator(export_command[2], threads=1).translate(sentences) == trained[0].translate(sentences)
