"""Fine-tuning (`train.init_from`): a run starts from a trained model's weights and tokenizer, with a fresh
optimizer unless told to keep it, refuses a parent that does not fit its config, and resumes itself."""

import copy
import json

import pytest
import torch
from conftest import fine_tune, run_config

from transformer.averaging import average_checkpoints
from transformer.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from transformer.config import ConfigError
from transformer.data import prepare
from transformer.data.tokenizer import TokenizerError
from transformer.training import finetune
from transformer.training.schedule import noam_learning_rate


def refuse_to_train_a_tokenizer(monkeypatch) -> None:
    """A fine-tuning run takes its parent's tokenizer: training one fails the test (one trained on the same
    corpus and seed would be byte for byte the parent's, so comparing the files alone could not tell)."""
    def train_tokenizer(*args, **kwargs):
        raise AssertionError("a fine-tuning run trained a tokenizer instead of taking its parent's")

    monkeypatch.setattr(prepare, "train_tokenizer", train_tokenizer)


def test_fine_tuning_starts_from_exactly_the_parents_weights_with_a_fresh_optimizer(
        copy_corpus, parent_run, tmp_path, monkeypatch):
    start = {}
    original = finetune.start_from_parent

    def spy(trainer, parent):
        original(trainer, parent)
        start.update(weights={k: v.clone() for k, v in trainer.model.state_dict().items()}, step=trainer.state.step,
                     optimizer=trainer.optimizer.state_dict()["state"])

    monkeypatch.setattr(finetune, "start_from_parent", spy)
    refuse_to_train_a_tokenizer(monkeypatch)
    summary = fine_tune(copy_corpus, tmp_path, parent_run / "checkpoint_last.pt", max_steps=5, lr=0.1, log_every=1)
    parent = load_checkpoint(parent_run / "checkpoint_last.pt")
    assert start["weights"].keys() == parent["model"].keys()
    for key, value in parent["model"].items():
        assert torch.equal(start["weights"][key], value), key
    assert start["step"] == 0 and start["optimizer"] == {}  # fresh Adam moments and schedule
    assert summary.step == 5
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    first_lr = next(r["lr"] for r in records if r["kind"] == "train")  # the schedule starts again at update 1
    assert first_lr == pytest.approx(noam_learning_rate(1, 64, 100, 0.1))
    assert (tmp_path / "spm.model").read_bytes() == (parent_run / "spm.model").read_bytes()  # the parent's


def test_the_run_records_and_checkpoints_name_the_parent_without_a_path(copy_corpus, parent_run, tmp_path,
                                                                        monkeypatch):
    fine_tune(copy_corpus, tmp_path, parent_run / "checkpoint_last.pt", max_steps=5)
    sessions = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    parent = next(r for r in sessions if r["kind"] == "session")["parent"]
    expected = {"name": f"{parent_run.name}/checkpoint_last.pt", "step": 20, "dataset": parent["dataset"],
                "languages": "src-tgt"}
    assert parent == expected
    assert parent["dataset"].startswith(f"{copy_corpus.name} (local files") and str(copy_corpus) not in str(parent)
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["parent"] == expected
    monkeypatch.chdir(parent_run)  # a relative path named the parent "/checkpoint_last.pt"
    fine_tune(copy_corpus, tmp_path / "relative", "checkpoint_last.pt", max_steps=5)
    assert load_checkpoint(tmp_path / "relative" / "checkpoint_last.pt")["parent"] == expected


def test_a_killed_fine_tuning_run_resumes_itself_not_the_parent(copy_corpus, parent_run, tmp_path):
    parent = tmp_path / "parent.pt"
    parent.write_bytes((parent_run / "checkpoint_last.pt").read_bytes())
    (tmp_path / "spm.model").write_bytes((parent_run / "spm.model").read_bytes())  # the parent's tokenizer beside it
    fine_tune(copy_corpus, tmp_path / "whole", parent, max_steps=20)
    fine_tune(copy_corpus, tmp_path / "split", parent, max_steps=10)
    parent.unlink()  # the resumed run must not need it
    summary = fine_tune(copy_corpus, tmp_path / "split", parent, max_steps=20)
    assert summary.step == 20
    whole = load_checkpoint(tmp_path / "whole" / "checkpoint_last.pt")
    split = load_checkpoint(tmp_path / "split" / "checkpoint_last.pt")
    for key, value in whole["model"].items():
        torch.testing.assert_close(split["model"][key], value, rtol=0, atol=0)
    assert split["parent"]["name"] == f"{tmp_path.name}/parent.pt"


def test_keeping_the_optimizer_continues_the_parents_step_and_schedule(copy_corpus, parent_run, tmp_path,
                                                                       monkeypatch, caplog):
    start = {}
    original = finetune.start_from_parent

    def spy(trainer, parent):
        original(trainer, parent)
        start.update(optimizer=copy.deepcopy(trainer.optimizer.state_dict()), step=trainer.state.step,
                     lr=trainer.optimizer.param_groups[0]["lr"])

    monkeypatch.setattr(finetune, "start_from_parent", spy)
    summary = fine_tune(copy_corpus, tmp_path, parent_run / "checkpoint_last.pt", max_steps=25,
                        init_keep_optimizer=True, adam_beta2=0.99)
    assert summary.step == 25  # 5 more than the parent's 20
    parent = load_checkpoint(parent_run / "checkpoint_last.pt")
    assert start["step"] == 20 and start["lr"] == parent["optimizer"]["param_groups"][0]["lr"]  # its schedule
    for index, moments in parent["optimizer"]["state"].items():  # its Adam moments
        for name in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(start["optimizer"]["state"][index][name], moments[name])
    assert start["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.99)  # this config's Adam settings
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "train"] == [25]
    with pytest.raises(ConfigError, match=r"train.max_steps=20 is not past the parent's step 20"):
        fine_tune(copy_corpus, tmp_path / "no_steps", parent_run / "checkpoint_last.pt", max_steps=20,
                  init_keep_optimizer=True)  # it would train none, and save the parent as a fine-tuned model
    [lr] = [r["lr"] for r in records if r["kind"] == "train"]  # update 25 at the schedule's step 25, not 5
    assert lr == pytest.approx(noam_learning_rate(25, 64, 100, 1.0))
    assert "train.init_keep_optimizer: the schedule goes on" not in caplog.text  # the parent's settings
    from transformer.deploy.release import export_release

    card = (export_release(tmp_path / "checkpoint_last.pt", tmp_path / "release") / "README.md").read_text()
    assert "transformer-train config.yaml train.init_from=PARENT train.init_keep_optimizer=true" in card
    fine_tune(copy_corpus, tmp_path / "other_lr", parent_run / "checkpoint_last.pt", max_steps=22,
              init_keep_optimizer=True, lr=0.5, warmup_steps=50)  # its curve dropped without a word
    assert ("the schedule goes on from the parent's step 20 with this config's settings, not the parent's "
            "(train.lr 1.0 -> 0.5; train.warmup_steps 100 -> 50)") in caplog.text


def test_fine_tuning_a_release_folder(copy_corpus, parent_run, tmp_path):
    from safetensors.torch import load_file

    from transformer.deploy.release import export_release

    release = export_release(parent_run / "checkpoint_last.pt", tmp_path / "release")
    start = {}
    original = finetune.start_from_parent

    def spy(trainer, parent):
        original(trainer, parent)
        start.update({k: v.clone() for k, v in trainer.model.state_dict().items()})

    with pytest.MonkeyPatch.context() as patch:
        refuse_to_train_a_tokenizer(patch)
        patch.setattr(finetune, "start_from_parent", spy)
        assert fine_tune(copy_corpus, tmp_path / "run", release, max_steps=5).step == 5
    released = load_file(release / "model.safetensors")
    assert released and all(torch.equal(start[name], weight) for name, weight in released.items())  # its weights
    with pytest.raises(ConfigError, match="init_keep_optimizer=true needs a training checkpoint"):
        fine_tune(copy_corpus, tmp_path / "run2", release, max_steps=5, init_keep_optimizer=True)


@pytest.mark.parametrize("setting, message", [
    ({"model.d_ff": 64}, r"parent model has model.d_ff=128, the config says 64; set model.d_ff=128"),
    ({"model.n_decoder_layers": 1}, r"model.n_decoder_layers=2, the config says 1"),
    ({"data.vocab_size": 300}, r"parent's vocabulary has data.vocab_size=320, the config says 300"),
    ({"data.spm_model_type": "bpe"}, r"parent.s vocabulary has data.spm_model_type=unigram, the config says bpe"),
])
def test_a_parent_that_does_not_fit_the_config_is_one_line_naming_the_difference(
        copy_corpus, parent_run, tmp_path, setting, message):
    with pytest.raises(ConfigError, match=message) as error:
        fine_tune(copy_corpus, tmp_path, parent_run / "checkpoint_last.pt", max_steps=5, **setting)
    assert "\n" not in str(error.value)
    assert not (tmp_path / "config.yaml").exists()  # refused before anything was written


def test_a_missing_parent_and_a_kept_optimizer_without_parent_are_refused(copy_corpus, tmp_path):
    with pytest.raises(ConfigError, match=r"train.init_from: .*nowhere.pt not found"):
        fine_tune(copy_corpus, tmp_path, tmp_path / "nowhere.pt", max_steps=5)
    (tmp_path / "a_run").mkdir()  # a run directory given instead of its checkpoint: "weights not found"
    with pytest.raises(ConfigError, match=r"train.init_from: .*a_run is a folder without model.safetensors: give a "
                                          r"checkpoint file or a release folder"):
        fine_tune(copy_corpus, tmp_path / "child", tmp_path / "a_run", max_steps=5)
    with pytest.raises(ConfigError, match="train.init_keep_optimizer=true needs train.init_from"):
        run_config(copy_corpus, tmp_path, init_keep_optimizer=True)


def test_an_averaged_parent_another_tokenizer_in_the_run_and_an_unreadable_one_are_refused(
        copy_corpus, parent_run, tmp_path):
    """docs/training.md's refusals: an averaged checkpoint holds no optimizer to keep; a run directory with another
    tokenizer would mix two vocabularies; a parent whose tokenizer cannot be read has no vocabulary to give."""
    averaged = tmp_path / "parent" / "checkpoint_averaged.pt"
    averaged.parent.mkdir()
    save_checkpoint(average_checkpoints(sorted(parent_run.glob("checkpoint_*0.pt"))), averaged)
    (averaged.parent / "spm.model").write_bytes((parent_run / "spm.model").read_bytes())
    with pytest.raises(ConfigError, match="init_keep_optimizer=true needs a training checkpoint"):
        fine_tune(copy_corpus, tmp_path / "kept", averaged, max_steps=5, init_keep_optimizer=True)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "spm.model").write_bytes(b"another tokenizer")
    with pytest.raises(TokenizerError, match=r"spm.model is another tokenizer than the parent's "
                                             r"\(train.init_from\); use a new train.run_dir"):
        fine_tune(copy_corpus, tmp_path / "other", averaged, max_steps=5)
    (averaged.parent / "spm.model").unlink()
    with pytest.raises(CheckpointError, match=r"cannot read the parent's tokenizer .*spm.model"):
        fine_tune(copy_corpus, tmp_path / "unreadable", averaged, max_steps=5)


def test_a_fine_tuning_started_again_without_its_parent_is_refused(copy_corpus, parent_run, tmp_path):
    """A fine-tuning killed before its first checkpoint leaves the parent's tokenizer and its config.yaml; started
    again without train.init_from it trained from random weights on that tokenizer, unsaid."""
    from transformer.training import train

    run = tmp_path / "run"
    fine_tune(copy_corpus, run, parent_run / "checkpoint_last.pt", max_steps=2)
    for checkpoint in run.glob("*.pt"):  # as if killed before its first save
        checkpoint.unlink()
    with pytest.raises(ConfigError, match=r"a fine-tuning of train.init_from=.*checkpoint_last.pt \(its config.yaml\) "
                                          r"that has no checkpoint yet; without train.init_from this run would train "
                                          r"from random weights"):
        train(run_config(copy_corpus, run, max_steps=2))
    assert fine_tune(copy_corpus, run, parent_run / "checkpoint_last.pt", max_steps=2).step == 2


def test_the_model_card_names_the_parent(copy_corpus, parent_run, tmp_path):
    from transformer.deploy.release import export_release

    fine_tune(copy_corpus, tmp_path / "run", parent_run / "checkpoint_last.pt", max_steps=5)
    card = (export_release(tmp_path / "run" / "checkpoint_last.pt", tmp_path / "release") / "README.md").read_text()
    assert f"Fine-tuned from `{parent_run.name}/checkpoint_last.pt` at step 20, a src-tgt model trained on " \
           f"{copy_corpus.name} (local files" in card
    assert str(parent_run) not in card
    assert str(parent_run) not in (tmp_path / "release" / "config.yaml").read_text()  # no path of this machine
    # config.yaml ships without the parent's path: the command alone trained a new model from scratch
    assert (f"transformer-train config.yaml train.init_from=PARENT  # PARENT: your copy of {parent_run.name}/"
            f"checkpoint_last.pt") in card


def test_a_relative_corpus_path_is_named_as_its_run_named_it_from_any_folder(copy_corpus, tmp_path, monkeypatch):
    """A parent trained on a relative data.dataset was recorded as a hub dataset of that name when fine-tuned, or
    exported, from another folder (where the path leads nowhere); and so was its release folder, fine-tuned or
    served (the folder records the name in its weights' metadata)."""
    from transformer.deploy.release import export_release
    from transformer.training import train

    monkeypatch.chdir(copy_corpus.parent)
    train(run_config(copy_corpus, tmp_path / "parent", max_steps=5, **{"data.dataset": copy_corpus.name}))
    monkeypatch.chdir(tmp_path)
    local = f"{copy_corpus.name} (local files: train, valid)"
    fine_tune(copy_corpus, tmp_path / "child", tmp_path / "parent" / "checkpoint_last.pt", max_steps=3)
    assert load_checkpoint(tmp_path / "child" / "checkpoint_last.pt")["parent"]["dataset"] == local
    card = (export_release(tmp_path / "parent" / "checkpoint_last.pt", tmp_path / "release") / "README.md").read_text()
    assert f"trained with the transformer-nmt toolkit on {local}, 5 training steps" in card
    from transformer.decoding.translator import Translator
    from transformer.serve.model_info import describe  # the service's GET /model

    served = str(tmp_path / "parent" / "checkpoint_last.pt")
    assert describe(Translator.from_checkpoint(served), "torch", [served])["training_data"] == local
    release = tmp_path / "release"
    assert describe(Translator.from_pretrained(release), "torch", model=str(release))["training_data"] == local
    fine_tune(copy_corpus, tmp_path / "from_release", release, max_steps=3)
    parent = load_checkpoint(tmp_path / "from_release" / "checkpoint_last.pt")["parent"]
    assert parent["dataset"] == local and parent["step"] == 5  # the step was lost (None): the release recorded none
    card = (export_release(tmp_path / "from_release" / "checkpoint_last.pt", tmp_path / "child_release")
            / "README.md").read_text()
    assert "Fine-tuned from `release` at step 5, " in card


def test_the_card_of_a_kept_optimizer_counts_the_steps_after_the_parents(copy_corpus, parent_run, tmp_path):
    """With train.init_keep_optimizer the steps go on from the parent's 20: the card said "30 training steps" on
    the new data, where 10 were."""
    from transformer.deploy.release import export_release

    fine_tune(copy_corpus, tmp_path / "run", parent_run / "checkpoint_last.pt", max_steps=30, init_keep_optimizer=True)
    card = (export_release(tmp_path / "run" / "checkpoint_last.pt", tmp_path / "release") / "README.md").read_text()
    assert "(local files: train, valid), 10 training steps after the parent's 20 (`checkpoint_last.pt`)." in card


def test_a_parent_without_the_tags_of_the_configs_directions_is_refused(copy_corpus, parent_run, tmp_path):
    """A bilingual parent has no tags at all: it was told to take the directions out of data.pairs, leaving none
    (a multilingual parent without some of the tags: tests/test_finetune_ux.py)."""
    with pytest.raises(ConfigError, match=r"^train.init_from: the parent is a bilingual model, its vocabulary has no "
                                          r"language tags: drop data.pairs"):
        fine_tune(copy_corpus, tmp_path, parent_run / "checkpoint_last.pt", max_steps=5, **{"data.pairs": "src-tgt"})


def test_a_fine_tuning_run_whose_checkpoints_are_all_unreadable_is_an_error(copy_corpus, parent_run, tmp_path):
    from transformer.checkpoint import CheckpointError

    fine_tune(copy_corpus, tmp_path, parent_run / "checkpoint_last.pt", max_steps=10, save_every=5)
    for checkpoint in tmp_path.glob("checkpoint_*.pt"):
        checkpoint.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match=r"no intact checkpoint to resume from \(checkpoint_last.pt"):
        fine_tune(copy_corpus, tmp_path, parent_run / "checkpoint_last.pt", max_steps=20, save_every=5)
