"""Release folders (transformer-export): safetensors weights, config, tokenizer and model card, read by
`Translator.from_pretrained` and ``--model`` to translate exactly as the checkpoint they came from."""

import json
import re
import shutil
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import make_model

pytest.importorskip("safetensors", reason='release folders need the export extra: pip install -e ".[dev,export]"')

from safetensors import safe_open  # noqa: E402

from transformer.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from transformer.cli import main  # noqa: E402
from transformer.config import DataConfig  # noqa: E402
from transformer.config_loading import load_config, save_config  # noqa: E402
from transformer.decoding.translator import Translator  # noqa: E402
from transformer.deploy.card import card_scores, read_front_matter  # noqa: E402
from transformer.deploy.folder import shipped_config  # noqa: E402
from transformer.deploy.release import export_release  # noqa: E402
from transformer.deploy.reports import find_report, scored_direction  # noqa: E402
from transformer.release_format import read_weights, write_weights  # noqa: E402

FILES = ["README.md", "config.yaml", "model.safetensors", "spm.model"]


@pytest.fixture(scope="module")
def checkpoint(trained_copy_run):
    return trained_copy_run / "checkpoint_best.pt"


@pytest.fixture(scope="module")
def report(checkpoint, tmp_path_factory):
    """The checkpoint's scores on the copy task's validation split, from transformer-evaluate --report."""
    path = tmp_path_factory.mktemp("report") / "valid.json"
    assert main(["evaluate", "--checkpoint", str(checkpoint), "--split", "valid", "--report", str(path)]) == 0
    return path


@pytest.fixture(scope="module")
def release(checkpoint, report, tmp_path_factory):
    output = tmp_path_factory.mktemp("release") / "copy_src_tgt"
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(output), "--report", str(report)]) == 0
    return output


@pytest.fixture(scope="module")
def sentences(copy_corpus):
    return (copy_corpus / "valid.src").read_text().splitlines()[:40] + ["", "alpha"]


def test_export_prints_the_folder_it_wrote(checkpoint, tmp_path, capsys):
    output = tmp_path / "model"
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(output)]) == 0
    assert capsys.readouterr().out == f"{output}\n"
    assert sorted(p.name for p in output.iterdir()) == FILES


def test_the_folder_holds_weights_config_tokenizer_and_card_and_no_pickle(release, checkpoint):
    assert sorted(p.name for p in release.iterdir()) == FILES  # no .pt, .bin or .pkl: nothing unpickled
    with safe_open(str(release / "model.safetensors"), framework="pt") as file:
        stored = set(file.keys())
    expected = torch.load(checkpoint, weights_only=True)["model"]
    assert len(stored) == len(expected) - 2  # the decoder embedding and output projection are the encoder's
    weights, _ = read_weights(release / "model.safetensors")
    assert weights.keys() == expected.keys()
    assert all(torch.equal(weights[name], value) for name, value in expected.items())
    assert (release / "spm.model").read_bytes() == (checkpoint.parent / "spm.model").read_bytes()
    trained, shipped = load_config(checkpoint.parent / "config.yaml"), load_config(release / "config.yaml")
    assert shipped == shipped_config(trained) and shipped.model == trained.model and shipped.decode == trained.decode
    # nothing of the exporter's machine: training from it, as the card says, starts a run of its own
    assert (shipped.train.run_dir, trained.train.run_dir) == ("runs/default", str(checkpoint.parent))


def test_an_averaged_checkpoints_card_says_what_it_averages_and_counts_its_tied_matrix_once(
        trained_copy_run, release, tmp_path):
    averaged = tmp_path / "averaged.pt"
    assert main(["average", "--run-dir", str(trained_copy_run), "--last", "2", "--output", str(averaged)]) == 0
    assert main(["export", "--checkpoint", str(averaged), "--output", str(tmp_path / "release")]) == 0
    card = (tmp_path / "release" / "README.md").read_text()
    assert "1000 training steps (`averaged.pt`, the average of 2 checkpoints: checkpoint_step750.pt, " \
           "checkpoint_step1000.pt)" in card
    parameters = re.compile(r"- parameters: ([\d,]+)")
    assert parameters.search(card).group(1) == parameters.search((release / "README.md").read_text()).group(1)


@pytest.mark.parametrize("tied", [True, False])
def test_tied_weights_are_stored_once_and_tied_again_on_load(tmp_path, tied):
    model = make_model(share_embeddings=tied, tie_output=tied)
    path = tmp_path / "model.safetensors"
    write_weights(model.state_dict(), path)
    with safe_open(str(path), framework="pt") as file:
        assert len(file.keys()) == len(model.state_dict()) - (2 if tied else 0)
    loaded = make_model(seed=1, share_embeddings=tied, tie_output=tied)
    loaded.load_state_dict(read_weights(path)[0])
    embeddings = loaded.encoder.embedding.embedding.weight, loaded.decoder.embedding.embedding.weight
    assert (loaded.output_proj.weight is embeddings[1] is embeddings[0]) == tied
    assert all(torch.equal(loaded.state_dict()[name], value) for name, value in model.state_dict().items())


@pytest.fixture(scope="module")
def both(checkpoint, release):
    return Translator.from_checkpoint(checkpoint, device="cpu"), Translator.from_pretrained(release, device="cpu")


@pytest.mark.parametrize("settings", [dict(beam_size=1), dict(beam_size=3), dict(beam_size=4, nbest=3)])
def test_from_pretrained_translates_exactly_as_from_checkpoint(both, sentences, settings):
    from_checkpoint, from_pretrained = both
    expected = from_checkpoint.translate_nbest(sentences, **settings)
    assert from_pretrained.translate_nbest(sentences, **settings) == expected  # texts and scores, bit for bit
    assert from_pretrained.decode == from_checkpoint.decode


def test_translate_with_model_prints_what_checkpoint_prints(checkpoint, release, copy_corpus, capsys):
    printed = []
    for option in (["--checkpoint", str(checkpoint)], ["--model", str(release)]):
        assert main(["translate", *option, "--input", str(copy_corpus / "valid.src"), "--beam-size", "3",
                     "--nbest", "2"]) == 0
        printed.append(capsys.readouterr().out)
    assert printed[0] == printed[1] and printed[0].count("\n") == 200


def test_evaluate_with_model_scores_as_the_checkpoint_and_leaves_the_folder_as_shipped(release, report, tmp_path):
    path = tmp_path / "valid.json"
    assert main(["evaluate", "--model", str(release), "--split", "valid", "--report", str(path)]) == 0
    assert json.loads(path.read_text())["scores"] == json.loads(report.read_text())["scores"]
    assert sorted(p.name for p in release.iterdir()) == FILES


def test_model_card_names_languages_data_and_bleu_with_its_signature(release, report, copy_corpus):
    card = (release / "README.md").read_text()
    front = yaml.safe_load(card.split("---\n")[1])
    assert {key: front[key] for key in ("language", "tags", "metrics")} == {
        "language": ["src", "tgt"], "tags": ["translation"], "metrics": ["bleu"]}
    bleu = json.loads(report.read_text())["scores"]["bleu"]
    assert f"BLEU {bleu['score']:.2f} (signature `{bleu['signature']}`)" in card
    # the splits the folder holds: the card listed the config's test split, which the copy corpus has not
    assert "# src→tgt Transformer" in card and f"{copy_corpus.name} (local files: train, valid)" in card
    for usage in ("transformer-train config.yaml", 'Translator.from_pretrained("copy_src_tgt")',
                  "transformer-translate --model copy_src_tgt"):
        assert usage in card


def test_the_card_takes_the_newest_report_of_this_checkpoint_beside_it(checkpoint, report, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for name in ("checkpoint_best.pt", "spm.model"):
        shutil.copyfile(checkpoint.parent / name, run / name)
    card = (export_release(run / "checkpoint_best.pt", tmp_path / "a") / "README.md").read_text()
    assert "Not evaluated at export" in card
    scores = json.loads(report.read_text())
    (run / "test.json").write_text(json.dumps(scores))
    other = {**{k: v for k, v in scores.items() if k != "weights"}, "checkpoint": str(run / "checkpoint_last.pt"),
             "scores": {"bleu": {"score": 1.0, "signature": "x"}}}  # older reports: named files and steps decide
    (run / "last.json").write_text(json.dumps(other))  # newer, but of another checkpoint
    # newer still, none of them this checkpoint's: an ensemble it was part of, translations scored from
    # files, and this file name at another step (checkpoint_best.pt saved again since)
    (run / "ensemble.json").write_text(json.dumps({**other, "checkpoint": [str(run / "checkpoint_best.pt")] * 2}))
    (run / "files.json").write_text(json.dumps({"hypotheses": "h", "references": "r", "scores": other["scores"]}))
    (run / "older.json").write_text(json.dumps({**other, "checkpoint": "checkpoint_best.pt",
                                                "step": scores["step"] + 1}))
    card = (export_release(run / "checkpoint_best.pt", tmp_path / "b") / "README.md").read_text()
    assert f"BLEU {scores['scores']['bleu']['score']:.2f}" in card and "BLEU 1.00" not in card


def _break(folder, how):
    weights = folder / "model.safetensors"
    if how == "missing folder":
        shutil.rmtree(folder)
    elif how == "missing weights":
        weights.unlink()
    elif how == "truncated weights":
        weights.write_bytes(weights.read_bytes()[:1000])
    elif how == "flipped byte":
        data = bytearray(weights.read_bytes())
        data[-1] ^= 0xFF
        weights.write_bytes(bytes(data))
    elif how == "weights of another size":
        save_config(load_config(folder / "config.yaml", ["model.d_ff=96"]), folder / "config.yaml")


@pytest.mark.parametrize("how, message", [
    ("missing folder", "release folder not found: {folder}"),
    ("missing weights", "weights not found: {folder}/model.safetensors"),
    ("truncated weights", "{folder}/model.safetensors: not a readable safetensors file"),
    ("flipped byte", "{folder}/model.safetensors: corrupt weights (checksum mismatch)"),
    # the setting is named: the folder records the settings its weights were written with
    ("weights of another size", "{folder}/config.yaml: model.d_ff is 96, but model.safetensors was written with 128"),
])
def test_a_bad_release_folder_is_one_line_naming_the_file(release, tmp_path, capsys, how, message):
    folder = tmp_path / "release"
    shutil.copytree(release, folder)
    _break(folder, how)
    assert main(["translate", "--model", str(folder), "alpha"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: " + message.format(folder=folder)) and error.count("\n") == 1


def test_a_file_given_as_a_model_is_said_to_be_one(trained_copy_run, release, tmp_path, capsys):
    """"release folder not found: afile", of a file that is there."""
    checkpoint, text = trained_copy_run / "checkpoint_best.pt", tmp_path / "afile"
    text.write_text("x")
    for given, says in ((text, ""),
                        (checkpoint, f"; give --checkpoint {checkpoint} (--model takes an exported folder)"),
                        (release / "model.safetensors", f"; give its folder, --model {release}")):
        assert main(["translate", "--model", str(given), "alpha"]) == 2
        assert capsys.readouterr().err == f"error: {given}: a file, not a release folder{says}\n"


def test_a_training_runs_folder_given_as_a_model_names_its_checkpoint(trained_copy_run, capsys):
    assert main(["translate", "--model", str(trained_copy_run), "alpha"]) == 2
    assert capsys.readouterr().err == (f"error: {trained_copy_run}: a training run's folder, not a release folder; "
                                       f"give --checkpoint {trained_copy_run / 'checkpoint_best.pt'} (or export it: "
                                       f"transformer-export)\n")


@pytest.mark.parametrize("command", [["translate", "alpha"], ["evaluate", "--split", "valid"]])
@pytest.mark.parametrize("given", ["both", "neither"])
def test_exactly_one_of_checkpoint_and_model(checkpoint, release, capsys, command, given):
    options = ["--checkpoint", str(checkpoint), "--model", str(release)] if given == "both" else []
    if given == "neither" and command[0] == "evaluate":
        options = ["decode.beam_size=2"]  # without a model, evaluate scores files
    assert main([*command, *options]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "--checkpoint" in error and "--model" in error


def test_export_errors_are_one_line(checkpoint, tmp_path, capsys):
    (tmp_path / "notes.json").write_text("[1, 2]")
    for argv, message in (
        (["--checkpoint", str(tmp_path / "none.pt")], "checkpoint not found"),
        (["--checkpoint", str(checkpoint), "--report", str(tmp_path / "notes.json")],
         "not a transformer-evaluate report"),
    ):
        assert main(["export", *argv, "--output", str(tmp_path / "out")]) == 2
        error = capsys.readouterr().err
        assert message in error and error.count("\n") == 1
    assert not (tmp_path / "out").exists()


def contents(folder):
    """Every file under ``folder`` with its bytes, hidden ones included."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def test_export_refuses_the_checkpoints_folder_and_a_folder_of_another_export_before_writing(checkpoint, tmp_path,
                                                                                             capsys):
    """Exporting into the run directory wrote model.safetensors and rewrote its config.yaml before failing, and
    an export into a CTranslate2 folder mixed model.bin with model.safetensors: both are refused before
    anything is written; --force replaces a folder of an export's files (not one holding the checkpoint) whole,
    and refuses one that holds anything else (`--output "$HOME/$UNSET" --force` deleted the user's home)."""
    run = tmp_path / "run"
    run.mkdir()
    for name in ("checkpoint_best.pt", "spm.model", "config.yaml"):
        shutil.copyfile(checkpoint.parent / name, run / name)
    other = tmp_path / "ct2"
    other.mkdir()
    (other / "model.bin").write_bytes(b"CTranslate2 weights")
    home = tmp_path / "home"
    (home / "docs").mkdir(parents=True)
    (home / "config.yaml").write_text("mine")
    (home / "docs" / "thesis.txt").write_text("precious")
    before = contents(tmp_path)
    for output, force, says in ((run, [], f"{run}: holds the checkpoint {run / 'checkpoint_best.pt'}"),
                                (run, ["--force"], f"{run}: holds the checkpoint"),
                                (tmp_path, ["--force"], f"{tmp_path}: holds the checkpoint"),  # replacing deletes it
                                (other, [], f"{other}: exists and is not empty; give --force"),
                                (home, ["--force"], f"{home}: holds docs, which no export writes: --force replaces "
                                                    f"an export's folder only; give another --output")):
        assert main(["export", "--checkpoint", str(run / "checkpoint_best.pt"), "--output", str(output), *force]) == 2
        error = capsys.readouterr().err
        assert error.startswith(f"error: {says}") and error.count("\n") == 1
        assert contents(tmp_path) == before
    assert main(["export", "--checkpoint", str(run / "checkpoint_best.pt"), "--output", str(other), "--force"]) == 0
    assert sorted(p.name for p in other.iterdir()) == FILES  # no model.bin
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2", "home", "run"]  # nothing left beside it
    (tmp_path / "empty").mkdir()
    assert main(["export", "--checkpoint", str(run / "checkpoint_best.pt"), "--output", str(tmp_path / "empty")]) == 0


def test_a_failed_export_leaves_the_folder_it_would_replace_as_it_was(checkpoint, tmp_path, monkeypatch, capsys):
    output = tmp_path / "model"
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(output)]) == 0
    before = contents(tmp_path)

    def disk_full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("transformer.deploy.release.model_card", disk_full)
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(output), "--force"]) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert contents(tmp_path) == before


def test_an_export_goes_into_a_linked_folder_and_the_current_one_which_stay_what_they_are(
        checkpoint, tmp_path, monkeypatch):
    """The new content is moved into the output folder, not renamed over it: a symbolic link stays a link to
    the folder that gets the export, "." stays the shell's folder (and a mount point stays mounted)."""
    target, link = tmp_path / "v3", tmp_path / "release"
    target.mkdir()
    link.symlink_to(target)
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(link)]) == 0
    assert link.is_symlink() and sorted(p.name for p in target.iterdir()) == FILES
    assert sorted(p.name for p in tmp_path.iterdir()) == ["release", "v3"]
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert main(["export", "--checkpoint", str(checkpoint), "--output", "."]) == 0
    assert sorted(p.name for p in here.iterdir()) == FILES and Path.cwd().samefile(here)


def test_a_report_of_another_checkpoint_is_refused(checkpoint, report, tmp_path, capsys):
    """Any --report was taken, and its scores went on the card: it must score this checkpoint at its step,
    by the rule that picks the report beside the checkpoint (`is_report_of`)."""
    scored = json.loads(report.read_text())
    older = {k: v for k, v in scored.items() if k != "weights"}  # a report from before they were recorded
    others = {"another checkpoint": {**older, "checkpoint": str(checkpoint.parent / "checkpoint_last.pt")},
              "another step": {**older, "step": scored["step"] + 1},
              "another run's file of that name and step": {**scored, "weights": "0" * 32},
              "an ensemble": {**scored, "checkpoint": [str(checkpoint)] * 2},
              "translation files": {"hypotheses": "h", "references": "r", "scores": scored["scores"]},
              "a release folder": {**{k: v for k, v in scored.items() if k != "checkpoint"}, "model": "release"}}
    for name, other in others.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(other))
        assert main(["export", "--checkpoint", str(checkpoint), "--output", str(tmp_path / "out"),
                     "--report", str(path)]) == 2
        error = capsys.readouterr().err
        assert error.startswith(f"error: {path}: scores ") and error.count("\n") == 1, name
        assert f"not {checkpoint} at step {scored['step']}" in error
    assert not (tmp_path / "out").exists()
    # given twice, the last one won without a word; with another format, it was ignored
    for extra, message in ((["--report", str(report)], "--report given 2 times: a model card holds the scores of one "
                                                       "report"),
                           (["--format", "onnx"], "--report is for the model card of --format release; onnx "
                                                  "folders have none")):
        assert main(["export", "--checkpoint", str(checkpoint), "--output", str(tmp_path / "out"),
                     "--report", str(report), *extra]) == 2
        assert capsys.readouterr().err == f"error: {message}\n"
    assert not (tmp_path / "out").exists()


def test_a_report_of_the_same_weights_under_another_name_is_taken(checkpoint, report, tmp_path, capsys):
    """checkpoint_best.pt is a copy of a numbered checkpoint: a report that scored the copy (or the original, or
    checkpoint_last.pt where they are one) scores the same model, and its weights say so."""
    copy = tmp_path / "run" / "checkpoint_step1000.pt"
    copy.parent.mkdir()
    shutil.copyfile(checkpoint, copy)
    shutil.copyfile(checkpoint.parent / "spm.model", copy.parent / "spm.model")
    assert main(["export", "--checkpoint", str(copy), "--output", str(tmp_path / "out"), "--report", str(report)]) == 0
    bleu = json.loads(report.read_text())["scores"]["bleu"]
    assert f"BLEU {bleu['score']:.2f} (signature `{bleu['signature']}`)" in (tmp_path / "out" / "README.md").read_text()


def test_without_the_extra_the_commands_say_what_to_install(release, checkpoint, tmp_path, monkeypatch, capsys):
    from transformer.deploy import release as release_module

    for name in ("safetensors", "safetensors.torch"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails as when safetensors is not installed
    assert main(["translate", "--model", str(release), "alpha"]) == 2
    assert capsys.readouterr().err == 'error: release folders need safetensors: pip install -e ".[export]"\n'
    read = []
    monkeypatch.setattr(release_module, "load_checkpoint", lambda path: read.append(path))
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == 'error: release folders need safetensors: pip install -e ".[export]"\n'
    assert read == [] and not (tmp_path / "out").exists()  # said before a checkpoint of gigabytes is read


def test_the_cards_front_matter_holds_the_scores_as_the_hubs_model_index(release, report, copy_corpus):
    front = read_front_matter((release / "README.md").read_text())
    scores = json.loads(report.read_text())["scores"]
    [model] = front["model-index"]
    assert model["name"] == "copy_src_tgt"
    [result] = model["results"]
    assert result["task"] == {"type": "translation", "name": "Translation src→tgt"}
    assert result["dataset"] == {"name": f"{copy_corpus.name} (local files: train, valid)",
                                 "type": copy_corpus.name, "split": "valid"}
    assert result["metrics"] == [{"type": key, "value": value["score"], "name": name,
                                  "args": {"signature": value["signature"]}}
                                 for (key, value), name in zip(scores.items(), ("BLEU", "chrF", "TER"))]
    assert card_scores(release) == ({key: {"score": value["score"], "signature": value["signature"]}
                                     for key, value in scores.items()}, "src→tgt")


def test_rewording_the_card_keeps_its_scores_and_a_card_without_them_has_none(release, tmp_path):
    """The scores are read from the front matter, not parsed out of the prose (rewording it emptied /model);
    a card of an older export, or one edited into invalid YAML, has no scores and breaks nothing."""
    folder = tmp_path / "release"
    shutil.copytree(release, folder)
    card = folder / "README.md"
    front = card.read_text().split("---\n")[1]
    card.write_text(f"---\n{front}---\n\n# Our model\n\nIt scores well; see the table on the hub.\n")
    assert card_scores(folder) == card_scores(release) != ({}, None)
    for text in ("# src→tgt Transformer\n\n## Scores\n\n- BLEU 12.34 (signature `nrefs:1`)\n",  # no front matter
                 "---\nmodel-index: [\n---\n# broken YAML\n",
                 "---\nmodel-index: {results: 3}\n---\n",
                 "---\nmodel-index:\n- results:\n  - metrics: [{type: bleu, value: high}, 7]\n---\n"):
        card.write_text(text)
        assert card_scores(folder) == ({}, None)
    card.unlink()
    assert card_scores(folder) == ({}, None)


@pytest.mark.parametrize("dataset, split, name, kind", [
    ("../shared/data/multi30k", "test2016", "multi30k (local files: train, val, test2016)", "multi30k"),
    ("bentrevett/multi30k", "test", "bentrevett/multi30k", "bentrevett/multi30k"),
])
def test_the_card_names_the_dataset_as_a_user_knows_it(checkpoint, report, tmp_path, dataset, split, name, kind):
    """A run of the shipped config said it was trained on `../shared/data/multi30k`, a path of the machine
    that exported it: the card names a local corpus by its folder's name and splits, a hub dataset by its id."""
    run = tmp_path / "run"
    run.mkdir()
    shutil.copyfile(checkpoint.parent / "spm.model", run / "spm.model")
    state = load_checkpoint(checkpoint)
    # the corpus's own languages: a local folder's splits are those it holds files of in the model's languages
    state["config"]["data"].update(dataset=dataset, src_lang="de", tgt_lang="en", train_split="train",
                                   valid_split="val", test_split="test2016")
    state.pop("dataset")  # the corpus as the run named it: the copy task's; named from the config without it
    save_checkpoint(state, run / "checkpoint_best.pt")
    scored = {**json.loads(report.read_text()), "data": dataset, "split": split}
    (run / "scores.json").write_text(json.dumps({**scored, "checkpoint": str(run / "checkpoint_best.pt")}))
    card = (export_release(run / "checkpoint_best.pt", tmp_path / "out") / "README.md").read_text()
    assert f"on {name}, " in card and f"On split `{split}` of {name}, " in card
    assert "shared/data" not in card and str(tmp_path) not in card
    [model] = read_front_matter(card)["model-index"]
    assert model["results"][0]["dataset"] == {"name": name, "type": kind, "split": split}


def test_a_multilingual_models_card_and_model_info_take_the_report_of_its_default_direction(tmp_path):
    """The newest report won, whichever direction it scored: a zero-shot fr→de one went on the card of an en→de
    model, and GET /model showed its scores without a direction."""
    data = DataConfig(src_lang="en", tgt_lang="de", pairs=["en-de", "de-en", "en-fr"])
    scores = {"bleu": {"score": 1.0, "signature": "nrefs:1"}}
    for name, (src, tgt) in (("test.en-de.json", ("en", "de")), ("test.fr-de.json", ("fr", "de"))):
        report = {"checkpoint": "checkpoint_best.pt", "step": 5, "src_lang": src, "tgt_lang": tgt, "scores": scores}
        (tmp_path / name).write_text(json.dumps(report))
        time.sleep(0.01)  # the zero-shot one is the newest
    report = find_report(tmp_path / "checkpoint_best.pt", 5, "weights", data)
    assert scored_direction(report, data) == "en→de"
    (tmp_path / "test.en-de.json").unlink()
    assert scored_direction(find_report(tmp_path / "checkpoint_best.pt", 5, "weights", data), data) == "fr→de"


def test_a_card_of_several_results_gives_the_scores_and_direction_of_one(tmp_path):
    """The metrics of every result were merged (the last won) and paired with the first result's direction."""
    results = [{"task": {"type": "translation", "name": f"Translation {direction}"},
                "metrics": [{"type": "bleu", "value": value, "args": {"signature": "nrefs:1"}}]}
               for direction, value in (("de→en", 30.0), ("en→de", 20.0))]
    front = yaml.safe_dump({"model-index": [{"name": "m", "results": results}]}, allow_unicode=True)
    (tmp_path / "README.md").write_text(f"---\n{front}---\n# m\n")
    assert card_scores(tmp_path) == ({"bleu": {"score": 30.0, "signature": "nrefs:1"}}, "de→en")


def test_the_card_of_a_model_without_a_test_split_scores_its_validation_split(checkpoint, tmp_path):
    """With data.test_split empty (a corpus of train and valid), the card told to run transformer-evaluate
    --split '', which refuses an empty split: it names the validation split."""
    state = load_checkpoint(checkpoint)
    state["config"]["data"]["test_split"] = ""
    (tmp_path / "run").mkdir()
    save_checkpoint(state, tmp_path / "run" / "checkpoint.pt")
    shutil.copy(checkpoint.parent / "spm.model", tmp_path / "run" / "spm.model")
    card = (export_release(tmp_path / "run" / "checkpoint.pt", tmp_path / "release") / "README.md").read_text()
    assert "transformer-evaluate --model release --split valid --report scores.json" in card


def test_a_probe_left_by_a_killed_command_is_no_users_file(checkpoint, tmp_path, capsys):
    """The file that checks a folder can be written (created and deleted at once), left there by a kill, made the
    next `--force` export refuse the folder: "holds .1a2b.probe, which no export writes"."""
    output = tmp_path / "release"
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(output)]) == 0
    (output / ".1a2b3c4d5e6f.probe").write_bytes(b"")
    capsys.readouterr()
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(output), "--force"]) == 0
    assert not (output / ".1a2b3c4d5e6f.probe").exists()
