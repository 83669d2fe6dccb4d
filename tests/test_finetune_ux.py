"""Fine-tuning as a fairseq, OpenNMT-py or Marian user tries it: parents of every kind a user may point
`train.init_from` at, each wrong one a single line saying what to give instead, and settings that would quietly do
something else than meant (a resume with another parent, a multilingual parent without tags, a kept optimizer
whose steps never meet a validation)."""

import logging

import pytest
import torch
import yaml
from conftest import fine_tune

from transformer.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from transformer.config import ConfigError
from transformer.config_loading import load_config
from transformer.training import finetune


def test_a_checkpoint_of_another_toolkit_is_one_line_not_a_traceback(copy_corpus, parent_run, tmp_path):
    """A bare state dict under "model" (as many training scripts save) has no config: a KeyError before; and a
    checkpoint without its schedule cannot continue it."""
    state = load_checkpoint(parent_run / "checkpoint_last.pt")
    (tmp_path / "spm.model").write_bytes((parent_run / "spm.model").read_bytes())
    torch.save({"model": state["model"]}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match=r"train.init_from: .*other.pt: not a checkpoint of this toolkit \(no "
                                              r"'config' entry"):
        fine_tune(copy_corpus, tmp_path / "run", tmp_path / "other.pt", max_steps=5)
    save_checkpoint({key: value for key, value in state.items() if key != "scheduler"}, tmp_path / "no_schedule.pt")
    with pytest.raises(ConfigError, match="init_keep_optimizer=true needs a training checkpoint with its optimizer"):
        fine_tune(copy_corpus, tmp_path / "kept", tmp_path / "no_schedule.pt", max_steps=25, init_keep_optimizer=True)


def test_weights_that_do_not_fit_their_config_name_the_weight(copy_corpus, parent_run, tmp_path):
    """torch's message names the weights past its first line, which the one-line error showed alone."""
    state = load_checkpoint(parent_run / "checkpoint_last.pt")
    (tmp_path / "spm.model").write_bytes((parent_run / "spm.model").read_bytes())
    save_checkpoint({**state, "model": {**state["model"], "extra.weight": torch.zeros(2)}}, tmp_path / "extra.pt")
    with pytest.raises(CheckpointError, match=r"train.init_from: .*extra.pt: weights do not fit the model of its "
                                              r"config: it has extra.weight, which the model has not") as error:
        fine_tune(copy_corpus, tmp_path / "run", tmp_path / "extra.pt", max_steps=5)
    assert "\n" not in str(error.value)
    name = next(iter(state["model"]))
    save_checkpoint({**state, "model": {k: v for k, v in state["model"].items() if k != name}}, tmp_path / "less.pt")
    with pytest.raises(CheckpointError, match=rf"do not fit the model of its config: it has no {name}"):
        fine_tune(copy_corpus, tmp_path / "run2", tmp_path / "less.pt", max_steps=5)


def test_a_parent_whose_weights_do_not_fit_leaves_no_files_behind(copy_corpus, parent_run, tmp_path):
    """The weights were compared after the parent's tokenizer and config.yaml were written into the run directory:
    the same command with a good parent of another tokenizer then said "another tokenizer than the parent's"."""
    state = load_checkpoint(parent_run / "checkpoint_last.pt")
    (tmp_path / "bad").mkdir()
    name = next(key for key, value in state["model"].items() if value.dim() == 2)
    narrow = {**state["model"], name: state["model"][name][:, :5]}
    save_checkpoint({**state, "model": narrow}, tmp_path / "bad" / "narrow.pt")
    (tmp_path / "bad" / "spm.model").write_bytes((parent_run / "spm.model").read_bytes())
    with pytest.raises(CheckpointError, match=rf"narrow.pt: weights do not fit the model of its config: its {name} "
                                              rf"has shape \(\d+, 5\)"):
        fine_tune(copy_corpus, tmp_path / "run", tmp_path / "bad" / "narrow.pt", max_steps=5)
    assert not (tmp_path / "run").exists()  # refused before the run directory is made
    assert fine_tune(copy_corpus, tmp_path / "run", parent_run / "checkpoint_last.pt", max_steps=3).step == 3


def test_a_folder_or_file_that_is_not_a_parent_says_what_to_give(copy_corpus, parent_run, tmp_path):
    """A run directory (fairseq users give the directory), an engine's folder, a release folder's weights file."""
    with pytest.raises(ConfigError, match=r"is a run directory, not a model: give one of its checkpoints, such as "
                                          r".*checkpoint_(best|last).pt"):
        fine_tune(copy_corpus, tmp_path / "run", parent_run, max_steps=5)
    for engine, engine_file in (("ctranslate2", "model.bin"), ("onnx", "encoder.onnx")):  # what their folders hold
        (tmp_path / engine).mkdir()
        (tmp_path / engine / engine_file).write_bytes(b"")
        with pytest.raises(ConfigError, match="a CTranslate2 or ONNX folder, which cannot be fine-tuned: give the "
                                              "checkpoint or release folder it was exported from"):
            fine_tune(copy_corpus, tmp_path / "run", tmp_path / engine, max_steps=5)
    (tmp_path / "release").mkdir()
    (tmp_path / "release" / "model.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"model.safetensors is a weights file; give the release folder that "
                                          r"holds it \(.*release\)"):
        fine_tune(copy_corpus, tmp_path / "run", tmp_path / "release" / "model.safetensors", max_steps=5)


def test_the_release_folder_of_the_parent_is_not_a_run_directory(copy_corpus, parent_run, tmp_path):
    """Fine-tuning in the parent's release folder wrote the training config over the release's config.yaml."""
    from transformer.deploy.release import export_release

    release = export_release(parent_run / "checkpoint_last.pt", tmp_path / "release")
    before = (release / "config.yaml").read_bytes()
    with pytest.raises(ConfigError, match=r"is the parent's release folder \(train.init_from\): the run would write "
                                          r"over its config.yaml"):
        fine_tune(copy_corpus, release, release, max_steps=5)
    assert (release / "config.yaml").read_bytes() == before


def test_a_resume_with_another_parent_says_it_is_not_used_and_records_the_real_one(copy_corpus, parent_run,
                                                                                   tmp_path, caplog):
    """The same command with another init_from or init_keep_optimizer resumes the run (as documented): the
    checkpoints and the model card named the new settings, which trained nothing, and no line said so."""
    first = parent_run / "checkpoint_last.pt"
    fine_tune(copy_corpus, tmp_path, first, max_steps=5)
    with caplog.at_level(logging.WARNING):
        summary = fine_tune(copy_corpus, tmp_path, parent_run / "checkpoint_step10.pt", max_steps=25,
                            init_keep_optimizer=True)
    assert summary.step == 25  # resumed at 5, not the parent's 20
    assert (f"train.init_from={parent_run / 'checkpoint_step10.pt'}; train.init_keep_optimizer=True not used: the "
            f"run resumes its own fine-tuning of {parent_run.name}/checkpoint_last.pt") in caplog.text
    saved = load_checkpoint(tmp_path / "checkpoint_last.pt")
    assert saved["config"]["train"]["init_from"] == str(first)
    assert saved["config"]["train"]["init_keep_optimizer"] is False
    assert saved["parent"]["name"] == f"{parent_run.name}/checkpoint_last.pt"
    recorded = yaml.safe_load((tmp_path / "config.yaml").read_text())["train"]  # the run's config.yaml as well
    assert recorded["init_from"] == str(first) and recorded["init_keep_optimizer"] is False


def test_a_resume_of_another_runs_checkpoint_names_it_where_init_from_is_not_used(copy_corpus, parent_run, tmp_path,
                                                                                  caplog):
    """--resume CHECKPOINT with train.init_from: the warning said the new, empty run directory "holds a run of its
    own, which resumes"."""
    from conftest import run_config

    from transformer.training import train

    cfg = run_config(copy_corpus, tmp_path / "run", max_steps=25, init_from=parent_run / "checkpoint_step10.pt")
    with caplog.at_level(logging.WARNING):
        assert train(cfg, resume_from=parent_run / "checkpoint_step20.pt").step == 25
    assert (f"train.init_from={parent_run / 'checkpoint_step10.pt'} not used: the run resumes "
            f"{parent_run / 'checkpoint_step20.pt'}, which fine-tuned no parent") in caplog.text


def parent_model(*overrides: str, step: int = 20) -> finetune.ParentModel:
    cfg = load_config(None, list(overrides))
    return finetune.ParentModel(cfg, {}, {}, {"step": step}, {})


def test_a_target_language_is_refused_by_the_parents_vocabulary_not_its_config(two_target_corpus, two_target_run,
                                                                               tmp_path):
    """A parent fine-tuned on fewer directions keeps the others' tags in its vocabulary: its child may take them up
    again. A language without a tag says to drop it: the tokenizer's own advice, to train one, cannot be followed by
    a fine-tuning run."""
    from conftest import toy_overrides

    from transformer.training import train

    def fine_tune_directions(run_dir, parent, pairs):
        overrides = toy_overrides(two_target_corpus, run_dir, max_steps=2, init_from=parent,
                                  **{"data.pairs": pairs, "data.tgt_lang": "up"})
        return train(load_config(two_target_corpus / "two.yaml", overrides))

    fine_tune_directions(tmp_path / "child", two_target_run / "checkpoint_last.pt", "src-up")
    grandchild = fine_tune_directions(tmp_path / "grandchild", tmp_path / "child" / "checkpoint_last.pt",
                                      "src-up,src-cap")
    assert grandchild.step == 2
    with pytest.raises(ConfigError, match=r"^train.init_from: the parent's vocabulary has no tag for low, and a "
                                          r"fine-tuning run keeps it: take the directions into low out of "
                                          r"data.pairs, or train a new model$"):
        fine_tune_directions(tmp_path / "new", two_target_run / "checkpoint_last.pt", "src-up,src-low")


def test_a_multilingual_parent_fine_tuned_without_its_tags_is_warned_about():
    """Johnson et al.'s model reads the target language from the tag; a bilingual config drops it silently."""
    parent = parent_model("data.pairs=en-de,en-fr", "data.src_lang=en", "data.tgt_lang=de")
    child = load_config(None, ["data.src_lang=en", "data.tgt_lang=fr", "train.init_from=parent.pt"])
    [said] = finetune.warn_about_fine_tuning(parent, child)
    assert "the parent is multilingual (en-de, en-fr)" in said and "set data.pairs=en-fr to keep it" in said
    tagged = load_config(None, ["data.pairs=en-fr", "data.src_lang=en", "data.tgt_lang=fr", "train.init_from=p.pt"])
    assert finetune.warn_about_fine_tuning(parent, tagged) == []
    untaggable = load_config(None, ["data.src_lang=en", "data.tgt_lang=cs", "train.init_from=parent.pt"])
    [said] = finetune.warn_about_fine_tuning(parent, untaggable)  # data.pairs=en-cs: a tag the parent lacks
    assert said.endswith("without the tag: the parent has no tag for 'cs'")


def test_a_resume_names_its_parent_however_the_path_is_written(copy_corpus, parent_run, tmp_path, caplog,
                                                               monkeypatch):
    """runs/p/x.pt at the first start and ./runs/p/x.pt at the resume were "not used: the run resumes ..."."""
    monkeypatch.chdir(parent_run.parent)
    fine_tune(copy_corpus, tmp_path, parent_run / "checkpoint_last.pt", max_steps=5)
    with caplog.at_level(logging.WARNING):
        fine_tune(copy_corpus, tmp_path, f"./{parent_run.name}/checkpoint_last.pt", max_steps=7)
    assert "not used" not in caplog.text


def test_a_kept_optimizer_whose_steps_never_reach_a_validation_is_warned_about():
    """Steps go on from the parent's: from step 6000 to max_steps 6400 with valid_every 1000 nothing validates,
    and no checkpoint_best.pt is written, though valid_every < max_steps (the loop's own check passes)."""
    parent = parent_model(step=6000)
    settings = ["train.init_from=parent.pt", "train.init_keep_optimizer=true", "train.valid_every=1000"]
    [said] = finetune.warn_about_fine_tuning(parent, load_config(None, settings + ["train.max_steps=6400"]))
    assert "no multiple of it lies between the parent's step 6000 and train.max_steps=6400" in said
    assert finetune.warn_about_fine_tuning(parent, load_config(None, settings + ["train.max_steps=7000"])) == []
    fresh = ["train.init_from=parent.pt", "train.valid_every=1000", "train.max_steps=6400"]
    assert finetune.warn_about_fine_tuning(parent, load_config(None, fresh)) == []
