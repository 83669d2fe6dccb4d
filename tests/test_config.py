import re
from pathlib import Path

import pytest
import torch

from transformer.config import Config, ConfigError, parse_duration
from transformer.config_loading import anchored_overrides, config_from_dict, config_to_dict, load_config, save_config
from transformer.runtime.device import select_device


def write(tmp_path, text):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_defaults_are_the_paper_base_model():
    cfg = Config()
    assert (cfg.model.d_model, cfg.model.n_heads, cfg.model.d_ff, cfg.model.n_encoder_layers) == (512, 8, 2048, 6)
    assert cfg.train.label_smoothing == 0.1 and cfg.train.warmup_steps == 4000


def test_yaml_then_command_line_overrides_cast_to_field_types(tmp_path):
    path = write(tmp_path, "model: {d_model: 256, n_heads: 4}\ntrain: {lr: 5e-4}\n")
    cfg = load_config(path, ["train.lr=2e-4", "model.norm_first=true", "data.dataset_config=none",
                             "train.max_steps=1e3", "train.warmup_steps=2000.0", "train.seed=9007199254740993.0",
                             "train.log_every=1_000"])
    assert cfg.model.d_model == 256 and cfg.model.norm_first is True
    # 2000.0 was refused on the command line alone, and 2**53 + 1 written as a float was rounded to 2**53
    assert (cfg.train.warmup_steps, cfg.train.seed, cfg.train.log_every) == (2000, 2**53 + 1, 1000)
    assert cfg.train.lr == 2e-4 and isinstance(cfg.train.lr, float)
    assert cfg.train.max_steps == 1000 and cfg.data.dataset_config is None


def test_yaml_string_for_a_float_is_cast(tmp_path):
    # PyYAML reads 5e-4 (no dot) as a string; the field type decides
    assert load_config(write(tmp_path, "train: {lr: 5e-4}\n")).train.lr == 5e-4


def test_an_unquoted_no_for_a_language_is_a_line_saying_to_quote_it(tmp_path):
    # YAML 1.1 reads no (Norwegian) as false: the run was "data.src_lang-data.tgt_lang (en-False) must be ..."
    with pytest.raises(ConfigError, match=r"config.yaml: data.tgt_lang must be a string, got False: YAML reads an "
                                          r"unquoted no, yes, on or off as a truth value; quote the value "
                                          r"\(tgt_lang: 'no'\)$"):
        load_config(write(tmp_path, "data: {src_lang: en, tgt_lang: no}\n"))
    assert load_config(write(tmp_path, "data: {src_lang: en, tgt_lang: 'no'}\n")).data.tgt_lang == "no"
    assert load_config(None, ["data.tgt_lang=no"]).data.tgt_lang == "no"  # the command line's is a string


def test_an_empty_yaml_value_of_a_setting_whose_empty_string_means_none_is_taken(tmp_path):
    """`max_time:` (YAML's null) was "train.max_time must not be empty", though empty means no limit; a setting
    that needs a value still says so."""
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  max_time:\n  init_from: ~\n")
    cfg = load_config(path)
    assert cfg.train.max_time == "" and cfg.train.max_time_seconds == 0 and cfg.train.init_from == ""
    path.write_text("train:\n  lr:\n")
    with pytest.raises(ConfigError, match="train.lr must not be empty"):
        load_config(path)


def test_a_home_directory_in_a_path_setting_is_expanded(monkeypatch, tmp_path):
    # the shell leaves train.run_dir=~/runs as it is (not a variable assignment): runs went to a folder named ~
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = load_config(write(tmp_path, "data: {cache_dir: ~/cache}\n"),
                      ["train.run_dir=~/runs/x", "train.init_from=~/parent.pt"])
    assert (cfg.train.run_dir, cfg.train.init_from, cfg.data.cache_dir) == (
        f"{tmp_path}/runs/x", f"{tmp_path}/parent.pt", f"{tmp_path}/cache")
    assert load_config(None, ["data.dataset=~/corpus"]).data.dataset == "~/corpus"  # a hub name could hold one
    stored = config_to_dict(load_config(None, ["train.run_dir=runs/x"]))
    stored["train"]["run_dir"] = "~/runs/x"  # a checkpoint's config is read as it was written
    assert config_from_dict(stored).train.run_dir == "~/runs/x"


def test_unknown_key_lists_the_valid_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"config.yaml: unknown key 'model.d_modle'.*d_model, n_heads"):
        load_config(write(tmp_path, "model: {d_modle: 256}\n"))
    with pytest.raises(ConfigError, match="unknown section 'modle'"):
        load_config(None, ["modle.d_model=3"])
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config(None, ["d_model=3"])


def test_a_config_that_is_not_utf8_is_a_one_line_error_naming_its_line(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("model: {d_model: 256}\n# M\u00e4dchen\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1.yaml line 2: invalid UTF-8"):
        load_config(path)


@pytest.mark.parametrize("override, message", [
    ("model.n_heads=7", r"model.d_model \(512\) must be divisible by model.n_heads \(7\)"),
    ("model.dropout=1.0", r"model.dropout must be in \[0, 1\)"),
    ("model.dropout=-0.1", r"model.dropout must be in \[0, 1\)"),
    ("model.d_model=abc", "model.d_model must be of type int"),
    ("model.d_model=1.5", "model.d_model must be of type int"),
    ("model.norm_first=maybe", "model.norm_first must be of type bool"),
    ("train.precision=fp8", "train.precision must be"),
    ("data.src_lang=en", "must differ"),
    ("decode.nbest=9", "decode.nbest"),
    ("decode.length_penalty=-0.5", r"decode.length_penalty must be in \[0, 10\], got -0.5"),
    ("decode.length_penalty=5000", r"decode.length_penalty must be in \[0, 10\], got 5000"),
    ("train.cooldown=1.5", r"train.cooldown must be in \[0, 1\], got 1.5"),
    ("train.seed=-1", r"train.seed must be in \[0, 2\*\*63\) \(numpy's and torch's generators take no other\), got -1"),
    ("train.seed=99999999999999999999999", r"train.seed must be in \[0, 2\*\*63\)"),
    ("decode.seed=-1", r"decode.seed must be in \[0, 2\*\*63\), as train.seed, got -1"),  # -1 and 2**64-1 drew
    ("decode.seed=18446744073709551615", r"decode.seed must be in \[0, 2\*\*63\)"),  # other samples, unsaid
    ("train.adam_beta1=1.5", r"train.adam_beta1 must be in \[0, 1\), got 1.5"),
    ("train.adam_eps=0", "train.adam_eps must be positive, got 0"),
    ("train.weight_decay=-1", "train.weight_decay must be >= 0, got -1"),
    ("train.cooldown=0.2 train.max_epochs=10", "train.cooldown follows max_time or max_steps, not max_epochs"),
    ("train.compile=true train.compile_mode=fast", "train.compile_mode must be one of default, max-autotune-no-cuda"),
    ("train.compile=true train.compile_mode=reduce-overhead", r"\(CUDA graphs: train.cuda_graphs=true\)"),
    ("train.compile_mode=max-autotune-no-cudagraphs", "train.compile_mode=max-autotune-no-cudagraphs needs train.comp"),
    ("data.pad_to_multiple=0", "data.pad_to_multiple must be positive, got 0"),
])
def test_invalid_values_are_rejected_when_loading(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, override.split())


def test_sharing_embeddings_needs_a_joint_vocabulary():
    with pytest.raises(ConfigError, match="joint_vocab"):
        load_config(None, ["data.joint_vocab=false"])
    assert load_config(None, ["data.joint_vocab=false", "model.share_embeddings=false"]).data.joint_vocab is False


def test_bad_yaml_and_missing_file_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"config.yaml line 2: invalid YAML"):
        load_config(write(tmp_path, "model:\n  d_model: 1: 2\n"))
    with pytest.raises(ConfigError, match="cannot read config file .*missing.yaml"):
        load_config(tmp_path / "missing.yaml")


def test_round_trip_through_dict_and_yaml(tmp_path):
    cfg = load_config(None, ["model.d_model=128", "model.n_heads=4", "train.max_time=2h"])
    assert config_from_dict(config_to_dict(cfg)) == cfg
    save_config(cfg, tmp_path / "saved.yaml")
    assert load_config(tmp_path / "saved.yaml") == cfg


@pytest.mark.parametrize("path", sorted(Path(__file__).resolve().parents[1].glob("configs/*.yaml")),
                         ids=lambda path: path.name)
def test_shipped_configs_load(path):
    load_config(path)


def test_more_local_ranks_than_gpus_is_a_config_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(ConfigError, match="local rank 1 has no GPU of its own"):
        select_device("auto")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert select_device("auto") == torch.device("cuda", 0)


@pytest.mark.parametrize("name", ["mps", "xpu", "meta", "hpu", "gpu", "cuda:abc"])
def test_a_device_the_toolkit_does_not_run_on_is_refused_in_one_line(name):
    """mps, xpu, meta and hpu were taken, then failed in tracebacks from torch once the tokenizer had trained."""
    with pytest.raises(ConfigError) as refused:
        select_device(name)
    assert str(refused.value) == f"train.device: unknown device '{name}' (use auto, cpu, cuda or cuda:N)"


def test_a_gpu_the_machine_has_not_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ConfigError, match=r"^device=cuda:2: this machine has 2 GPU\(s\), cuda:0 to cuda:1$"):
        select_device("cuda:2", setting="device")


def test_cuda_under_torchrun_is_the_local_ranks_gpu(monkeypatch):
    """train.device=cuda, as auto: torch.cuda.set_device refuses a device without an index, and every rank
    on cuda:0 would share one GPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert select_device("cuda") == select_device("auto") == torch.device("cuda", 1)
    assert select_device("cuda:0") == torch.device("cuda", 0)


def test_a_gpu_device_turns_cudnn_attention_off(monkeypatch):
    """cuDNN's attention builds a plan per shape (`avoid_cudnn_attention`); the CPU leaves torch's switch alone."""
    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        select_device("cpu")
        assert torch.backends.cuda.cudnn_sdp_enabled()
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        for name in ("auto", "cuda:0"):
            torch.backends.cuda.enable_cudnn_sdp(True)
            select_device(name)
            assert not torch.backends.cuda.cudnn_sdp_enabled(), name
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


@pytest.mark.parametrize("text, seconds", [("", 0), ("90m", 5400), ("2h", 7200), ("1h30m", 5400), ("45s", 45),
                                           ("3600", 3600)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["two hours", "1.2.3m", "-5m", "5d", "m"])
def test_bad_duration_names_the_option(text):
    with pytest.raises(ConfigError, match="train.max_time: cannot read"):
        parse_duration(text)


def test_bad_duration_fails_when_the_config_is_loaded():
    with pytest.raises(ConfigError, match=r"^command line: train.max_time: cannot read 'two hours'; use e.g. 90m"):
        load_config(None, ["train.max_time=two hours"])
    assert load_config(None, ["train.max_time=1h30m"]).train.max_time_seconds == 5400


def test_scripts_anchor_relative_path_overrides_where_they_are_started(tmp_path):
    """run_recipe.sh and compare_multilingual.py run the toolkit in the checkout: a relative train.run_dir=,
    or a data.dataset= folder given where they were started, was looked up in the checkout."""
    (tmp_path / "corpus").mkdir()
    given = ["train.run_dir=runs/mine", "data.dataset=corpus", "data.dataset=bentrevett/multi30k",
             "train.init_from=", "data.cache_dir=/abs/cache", "train.lr=2", "train.init_from=~/parent.pt"]
    assert anchored_overrides(given, tmp_path) == [
        f"train.run_dir={tmp_path.resolve() / 'runs/mine'}", f"data.dataset={tmp_path.resolve() / 'corpus'}",
        "data.dataset=bentrevett/multi30k", "train.init_from=", "data.cache_dir=/abs/cache", "train.lr=2",
        f"train.init_from={Path('~/parent.pt').expanduser()}"]


def test_a_value_out_of_range_names_the_file_it_is_in(tmp_path):
    """An exported folder's config.yaml edited to eos_id: 4 said "data special ids must be 0..3" without a file."""
    path = tmp_path / "config.yaml"
    path.write_text("data:\n  eos_id: 4\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: data special ids"):
        load_config(path)
    path.write_text("model:\n  share_embeddings: true\ndata:\n  joint_vocab: false\n")  # a check across sections
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: "):
        load_config(path)


@pytest.mark.parametrize("override, message", [
    ("train.lr=inf", "train.lr must be a finite number, got inf"),  # diverged at step 1
    ("train.clip_norm=nan", "train.clip_norm must be a finite number, got nan"),  # clipped nothing, silently
    ("train.max_steps=1e999", "train.max_steps must be of type int, got '1e999'"),  # was an OverflowError
    ("train.max_steps=1e-3", "train.max_steps must be of type int, got '1e-3'"),  # was 0: a run of no steps
    ("train.max_steps=2.5e0", "train.max_steps must be of type int, got '2.5e0'"),  # was 2
    ("train.max_steps=nan", "train.max_steps must be of type int, got 'nan'"),
    ("train.max_steps=0x10", "train.max_steps must be of type int, got '0x10'"),
])
def test_values_no_training_can_use_are_one_line_errors(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, [override])
    assert load_config(None, ["data.max_length_ratio=inf"]).data.max_length_ratio == float("inf")  # no filter


def test_a_list_where_a_number_is_due_is_a_one_line_error(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("train:\n  max_steps: [5]\n")  # was a TypeError traceback
    with pytest.raises(ConfigError, match=re.escape(f"{path}: train.max_steps must be of type int, got [5]")):
        load_config(path)


@pytest.mark.parametrize("text, line, key", [
    ("train:\n  max_steps: 5\ntrain:\n  max_steps: 6\n", 3, "train"),  # the first section was dropped silently
    ("train:\n  max_steps: 5\n  lr: 0.5\n  max_steps: 6\n", 4, "max_steps"),
])
def test_a_key_given_twice_in_a_config_is_refused_naming_it_and_its_line(tmp_path, text, line, key):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=re.escape(f"{path} line {line}: invalid YAML ('{key}' given twice)")):
        load_config(path)
