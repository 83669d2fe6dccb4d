"""The Translator API and the translate / evaluate / average / plot commands, on a model that has
learned the copy task (target = source upper-cased)."""

import argparse
import io
import json
import re
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import VOCAB, make_model, toy_overrides

from transformer import fast
from transformer.cli import main
from transformer.decoding.translator import Translator
from transformer.errors import InputError
from transformer.fast.packed_linear import PackedLinear, can_pack_linear_weights
from transformer.model.transformer import Transformer
from transformer.runtime.int8 import quantize_int8
from transformer.runtime.threads import parallel_map


def test_bf16_translator_holds_bf16_weights_and_translates_like_fp32(checkpoint, translator, copy_corpus):
    bf16 = Translator.from_checkpoint(checkpoint, device="cpu", dtype="bf16")
    assert {p.dtype for p in bf16.model.parameters()} == {torch.bfloat16}
    assert isinstance(bf16.model.output_proj, PackedLinear) == can_pack_linear_weights(torch.bfloat16)
    assert isinstance(translator.model.output_proj, PackedLinear) == can_pack_linear_weights(torch.float32)
    assert {p.dtype for p in translator.model.parameters()} == {torch.float32}
    sentences = (copy_corpus / "valid.src").read_text().splitlines()[:50]
    pairs = zip(bf16.translate(sentences, beam_size=2), translator.translate(sentences, beam_size=2))
    assert sum(a == b for a, b in pairs) >= 45


def set_stdin(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


@pytest.mark.slow
def test_copy_task_is_learned_through_the_cli(checkpoint, copy_corpus, tmp_path, capsys):
    output = tmp_path / "hyp.txt"
    assert main(["translate", "--checkpoint", checkpoint, "--input", str(copy_corpus / "valid.src"),
                 "--output", str(output), "--beam-size", "1"]) == 0
    hypotheses = output.read_text().splitlines()
    references = (copy_corpus / "valid.tgt").read_text().splitlines()
    assert len(hypotheses) == len(references) == 100
    exact = sum(h == r for h, r in zip(hypotheses, references)) / len(references)
    assert exact >= 0.95


def test_translator_api_gives_text_nbest_and_attention(translator):
    assert translator.translate(["alpha beta gamma"], beam_size=2) == ["ALPHA BETA GAMMA"]
    nbest = translator.translate_nbest(["alpha beta gamma"], nbest=2, beam_size=3)
    assert len(nbest[0]) == 2 and nbest[0][0][1] >= nbest[0][1][1]
    attention = translator.attention("alpha beta")
    layers, heads, target, source = attention.weights.shape
    assert (target, source) == (len(attention.target_pieces), len(attention.source_pieces))
    assert attention.weights.sum(-1).allclose(attention.weights.new_ones(layers, heads, target))


@pytest.mark.parametrize("beam_size", [1, 3])
def test_translation_does_not_depend_on_the_batch(translator, copy_corpus, beam_size):
    sentences = (copy_corpus / "valid.src").read_text().splitlines()[:20]
    together = translator.translate(sentences, beam_size=beam_size)
    one_by_one = [translator.translate([s], beam_size=beam_size)[0] for s in sentences]
    assert together == one_by_one


@pytest.mark.parametrize("dtype, quantize", [("fp32", None), ("bf16", None), ("fp32", "int8")])
def test_a_sentences_scores_do_not_depend_on_its_batch_to_the_bit(checkpoint, copy_corpus, dtype, quantize):
    """The same scores, bit for bit, alone and beside other sentences, in beam and greedy search, with target
    prefixes and in sampling. torch's CPU attention summed a sentence's keys in another order when its batch
    padded it to another length (`transformer.decoding.inputs.SOURCE_LENGTH_MULTIPLE`), and a batch's common
    prefix was decoded in one call instead of step by step (`transformer.decoding.search.bos_start`): scores
    changed in their last bits, and in bf16 some translations with them. Sentences of 200 tokens and more were
    padded to other widths beside longer ones, which other blocks of torch's kernels summed otherwise: each
    sentence is batched only with sentences of its own width. One thread: with more, torch splits some sums
    by the batch's size (docs/decoding.md)."""
    torch.set_num_threads(1)  # conftest puts it back
    lines = (copy_corpus / "valid.src").read_text().splitlines()[:12]
    sentences = lines + [" ".join(lines[i: i + 3]) for i in range(0, 12, 3)]  # batches padded past 16, 32, 48
    prefixes = [" ".join(line.split()[: i % 4]) for i, line in enumerate(sentences)]
    translator = Translator.from_checkpoint(checkpoint, device="cpu", dtype=dtype, quantize=quantize)
    for settings in ({"nbest": 2, "beam_size": 3}, {"nbest": 1, "beam_size": 1},
                     {"nbest": 2, "sampling": True, "sampling_temperature": 2.0}):
        for given in (None, prefixes):
            together = translator.translate_nbest(sentences, prefixes=given, **settings)
            alone = [translator.translate_nbest([sentence], prefixes=given and [given[i]], **settings)[0]
                     for i, sentence in enumerate(sentences)]
            assert together == alone, (settings, given is not None)
    every = (copy_corpus / "valid.src").read_text().split()
    long = [" ".join(every[:200]), " ".join(every[200:440]), " ".join(every[440:660]), lines[0]]
    translator.max_source_length = 600  # the copy model's data.max_length would cut them to 64 tokens
    assert max(map(len, translator._encode(long))) > 200
    short = {"max_len_a": 0.0, "max_len_b": 8, "beam_size": 2, "nbest": 2}  # the encoder is what differed
    assert translator.translate_nbest(long, **short) == [translator.translate_nbest([s], **short)[0] for s in long]


def test_parallel_workers_give_the_same_translations_in_order(checkpoint, copy_corpus, capsys):
    sentences = (copy_corpus / "valid.src").read_text().splitlines()[:40]
    one, two = (Translator.from_checkpoint(checkpoint, device="cpu", workers=workers) for workers in (1, 2))
    for each in (one, two):
        each.decode = replace(each.decode, batch_tokens=60)  # a dozen batches for the two workers
    threads = torch.get_num_threads()
    for beam_size in (1, 3):
        assert two.translate(sentences, beam_size=beam_size) == one.translate(sentences, beam_size=beam_size)
    assert torch.get_num_threads() == threads  # the workers' share of the threads was given back
    assert main(["translate", "--checkpoint", checkpoint, "--workers", "0", "abc"]) == 2
    assert "--workers must be >= 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 0.05)])  # bf16 rounding
def test_packed_linear_weights_compute_what_the_linear_layers_do(dtype, tolerance):
    if not can_pack_linear_weights(dtype):
        pytest.skip(f"this torch lacks oneDNN's linear ops, or this CPU cannot run them in {dtype}")
    torch.manual_seed(0)
    model = make_model()
    for linear in (m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.bias is not None):
        torch.nn.init.normal_(linear.bias)  # zero at initialisation: make a lost bias show
    model = model.to(dtype)
    src, tgt_in = torch.randint(4, VOCAB, (3, 7)), torch.randint(4, VOCAB, (3, 5))
    expected = model(src, tgt_in).float()
    fast.for_inference(model, torch.device("cpu"))
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    torch.testing.assert_close(model(src, tgt_in).float(), expected, atol=tolerance, rtol=tolerance * 0.4)


def test_without_onednn_linear_ops_and_for_int8_layers_the_model_is_left_as_it_is(monkeypatch):
    quantized = quantize_int8(make_model())
    fast.for_inference(quantized, torch.device("cpu"))
    assert not any(isinstance(m, PackedLinear) for m in quantized.modules())
    monkeypatch.setattr(fast, "can_pack_linear_weights", lambda dtype: False)
    for dtype in (torch.float32, torch.bfloat16):
        model = make_model().to(dtype)
        fast.for_inference(model, torch.device("cpu"))
        assert isinstance(model.output_proj, torch.nn.Linear)


def test_workers_share_the_threads_and_a_single_batch_keeps_them_all():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert list(parallel_map(lambda _: torch.get_num_threads(), range(3), workers=2)) == [1, 1, 1]
        assert list(parallel_map(lambda _: torch.get_num_threads(), range(1), workers=2)) == [2]
    finally:
        torch.set_num_threads(threads)


def test_one_output_line_per_input_line_from_stdin(checkpoint, monkeypatch, capsys):
    set_stdin(monkeypatch, "alpha beta gamma\n\n   \ngamma\u2028delta\r\nkappa lambda mu\n".encode())
    assert main(["translate", "--checkpoint", checkpoint, "--beam-size", "2"]) == 0
    lines = capsys.readouterr().out.split("\n")
    assert lines[-1] == "" and len(lines[:-1]) == 5
    assert lines[0] == "ALPHA BETA GAMMA" and lines[1] == "" and lines[2] == "" and lines[4] == "KAPPA LAMBDA MU"


def test_invalid_utf8_names_the_line(checkpoint, monkeypatch, capsys):
    set_stdin(monkeypatch, b"alpha\nbeta \xff\n")
    assert main(["translate", "--checkpoint", checkpoint]) == 2
    assert capsys.readouterr().err.strip() == "error: stdin line 2: invalid UTF-8"


def test_a_byte_order_mark_does_not_change_the_first_translation(checkpoint, monkeypatch, capsys):
    for mode in ([], ["--interactive"]):
        set_stdin(monkeypatch, "\ufeffalpha beta gamma\nkappa lambda mu\n".encode())
        assert main(["translate", "--checkpoint", checkpoint, "--beam-size", "1", *mode]) == 0
        assert capsys.readouterr().out.splitlines() == ["ALPHA BETA GAMMA", "KAPPA LAMBDA MU"]


@pytest.mark.parametrize("errors", ["strict", "surrogateescape"])  # stdin's in a UTF-8 locale, in the C locale
def test_invalid_utf8_in_interactive_mode_names_the_line_and_the_session_goes_on(
        checkpoint, monkeypatch, capsys, errors):
    """A bad line ended the session: the lines after it were never translated."""
    data = b"alpha beta gamma\nbeta \xe4\nkappa lambda mu\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors=errors))
    assert main(["translate", "--checkpoint", checkpoint, "--interactive", "--beam-size", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["ALPHA BETA GAMMA", "", "KAPPA LAMBDA MU"]  # one output line per input line
    assert captured.err.strip() == "error: stdin line 2: invalid UTF-8"


@pytest.mark.parametrize("options, message", [
    ({"dtype": "fp16"}, "dtype 'fp16': give 'fp32' or 'bf16'"),  # oneDNN's error from deep inside, at translate
    ({"quantize": "int4"}, "quantize 'int4': give None or 'int8'"),  # fp32, without a word
    ({"quantize": "int8", "dtype": "bf16"}, "quantize='int8' computes in fp32"),  # bf16 dropped without a word
])
def test_the_api_refuses_a_dtype_or_quantization_it_does_not_run(checkpoint, tmp_path, options, message):
    with pytest.raises(InputError, match=re.escape(message)):
        Translator.from_checkpoint(checkpoint, **options)
    with pytest.raises(InputError, match=re.escape(message)):  # before any file is read (after, before)
        Translator.from_pretrained(tmp_path / "no_such_folder", **options)


def test_the_api_refuses_one_string_or_a_sentence_that_is_not_a_string(translator):
    with pytest.raises(InputError, match=r"sentences: give a list of strings, not one str \('alpha beta'\)"):
        translator.translate("alpha beta")
    with pytest.raises(InputError, match="sentence 2: a string, not NoneType"):
        translator.translate_nbest(["alpha", None])


def test_over_long_input_is_truncated_with_a_warning(checkpoint, capsys):
    long_line = " ".join(["alpha"] * 200)  # data.max_length is 64 subwords
    assert main(["translate", "--checkpoint", checkpoint, "mu", long_line, "--beam-size", "1"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 2
    assert "argument line 2: longer than 64 tokens, truncated" in captured.err


def test_an_interactive_sessions_wrong_options_are_said_once_before_any_line(checkpoint, monkeypatch, capsys):
    """Since a bad line no longer ends the session, an error of its options came at every line instead."""
    set_stdin(monkeypatch, b"alpha\tA\nbeta\tB\n")
    assert main(["translate", "--checkpoint", checkpoint, "--interactive", "--prefix-column", "--constraints"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ("error: --prefix-column takes the second column: with --prefixes "
                                                   "FILE or --constraints, give the prefixes in a file\n")


def test_interactive_mode_translates_each_line(checkpoint, monkeypatch, capsys):
    set_stdin(monkeypatch, b"alpha beta gamma\nkappa lambda mu\n")
    assert main(["translate", "--checkpoint", checkpoint, "--interactive", "--beam-size", "1"]) == 0
    assert capsys.readouterr().out.splitlines() == ["ALPHA BETA GAMMA", "KAPPA LAMBDA MU"]


def test_nbest_output_format(checkpoint, capsys):
    assert main(["translate", "--checkpoint", checkpoint, "--nbest", "2", "alpha beta gamma", "beta"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" ||| ")[0] for line in lines] == ["0", "0", "1", "1"]
    assert lines[0].split(" ||| ")[1] == "ALPHA BETA GAMMA"


def test_attention_heatmaps_are_written(checkpoint, tmp_path, capsys):
    assert main(["translate", "--checkpoint", checkpoint, "alpha beta", "", "gamma",
                 "--plot-attention", str(tmp_path), "--attention-head", "0"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attention_0001.png", "attention_0003.png"]
    assert (tmp_path / "attention_0001.png").read_bytes()[:4] == b"\x89PNG"
    # the translations written where a heatmap then went: lost, with exit status 0
    assert main(["translate", "--checkpoint", checkpoint, "alpha beta", "--plot-attention", str(tmp_path),
                 "--output", str(tmp_path / "attention_0001.png")]) == 2
    assert capsys.readouterr().err.endswith(f"/attention_0001.png: a heatmap of --plot-attention {tmp_path} would be "
                                            f"written over it; name it otherwise\n")


def test_a_full_disk_behind_stdout_is_one_line_naming_it(checkpoint, monkeypatch, capsys):
    """A redirection to a full disk (> /dev/full) said "error: [Errno 28] No space left on device"."""
    class FullDisk(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(sys, "stdout", FullDisk())
    assert main(["translate", "--checkpoint", checkpoint, "alpha beta"]) == 2
    assert capsys.readouterr().err == ("error: cannot write the translations to standard output (No space left on "
                                       "device)\n")


def test_evaluate_a_checkpoint_on_a_split_writes_a_report(checkpoint, tmp_path, capsys):
    report = tmp_path / "report.json"
    assert main(["evaluate", "--checkpoint", checkpoint, "--split", "valid", "--beam-size", "2",
                 "--report", str(report)]) == 0
    out = capsys.readouterr().out
    assert "BLEU = " in out and "signature: nrefs:1|case:mixed" in out
    scores = json.loads(report.read_text())
    assert scores["scores"]["bleu"]["score"] > 90 and scores["decoding"]["beam_size"] == 2


def test_evaluate_with_int8_weights_and_one_thread(checkpoint, tmp_path, capsys):
    report, threads = tmp_path / "report.json", torch.get_num_threads()
    try:
        assert main(["evaluate", "--checkpoint", checkpoint, "--split", "valid", "--quantize", "int8",
                     "--threads", "1", "--report", str(report)]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    scores = json.loads(report.read_text())
    assert scores["scores"]["bleu"]["score"] > 90 and scores["decoding"]["quantize"] == "int8"
    assert main(["translate", "--checkpoint", checkpoint, "--threads", "-1", "abc"]) == 2
    assert "--threads must be >= 0, got -1" in capsys.readouterr().err


def test_evaluate_files_with_different_line_counts(tmp_path, capsys):
    (tmp_path / "hyp").write_text("a\n")
    (tmp_path / "ref").write_text("a\nb\n")
    assert main(["evaluate", "--hypotheses", str(tmp_path / "hyp"), "--references", str(tmp_path / "ref")]) == 2
    assert "has 1 lines but" in capsys.readouterr().err


def test_evaluate_refuses_empty_files_and_files_beside_a_model(checkpoint, tmp_path, capsys):
    (tmp_path / "hyp").write_text("")
    assert main(["evaluate", "--hypotheses", str(tmp_path / "hyp"), "--references", str(tmp_path / "hyp")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {tmp_path / 'hyp'}: empty, nothing to score"
    assert main(["evaluate", "--checkpoint", checkpoint, "--split", "valid", "--hypotheses", str(tmp_path / "hyp"),
                 "--references", str(tmp_path / "hyp")]) == 2
    assert "--hypotheses and --references score translations already made" in capsys.readouterr().err


def test_evaluate_translates_the_configs_test_split_by_default(checkpoint, tmp_path, capsys):
    from transformer.checkpoint import load_checkpoint, save_checkpoint

    state = load_checkpoint(checkpoint)
    state["config"]["data"]["test_split"] = "valid"  # the copy corpus has train and valid only
    save_checkpoint(state, tmp_path / "checkpoint.pt")
    shutil.copyfile(Path(checkpoint).parent / "spm.model", tmp_path / "spm.model")
    assert main(["evaluate", "--checkpoint", str(tmp_path / "checkpoint.pt"), "--beam-size", "1", "--report",
                 str(tmp_path / "report.json")]) == 0
    assert json.loads((tmp_path / "report.json").read_text())["split"] == "valid"


def test_no_output_overwrites_a_file_the_command_reads(checkpoint, copy_corpus, tmp_path, capsys):
    """The input, the checkpoint, the corpus's files of the split, the hypotheses: each stays as it was."""
    source = tmp_path / "in.txt"
    source.write_text("alpha beta\n")
    corpus_file = copy_corpus / "valid.src"
    tokenizer = Path(checkpoint).parent / "spm.model"
    kept = {path: path.read_bytes() for path in (source, corpus_file, tokenizer, Path(checkpoint))}
    for command in (["translate", "--checkpoint", checkpoint, "--input", str(source), "--output", str(source)],
                    ["translate", "--checkpoint", checkpoint, "alpha", "--output", checkpoint],
                    ["translate", "--checkpoint", checkpoint, "alpha", "--output", str(tokenizer)],
                    ["evaluate", "--checkpoint", checkpoint, "--split", "valid", "--report", checkpoint],
                    ["evaluate", "--checkpoint", checkpoint, "--split", "valid", "--output", str(corpus_file)],
                    ["evaluate", "--hypotheses", str(source), "--references", str(source), "--report", str(source)],
                    ["evaluate", "--checkpoint", checkpoint, "--split", "valid", "--output", str(tmp_path / "hyp"),
                     "--report", str(tmp_path / "hyp")]):
        assert main(command) == 2, command
        assert "that is a file this command reads or writes already" in capsys.readouterr().err
    assert {path: path.read_bytes() for path in kept} == kept
    run = tmp_path / "run"  # a report of its own beside the model: written, and written again
    run.mkdir()
    for path in (Path(checkpoint), tokenizer):
        shutil.copyfile(path, run / path.name)
    for _ in range(2):
        assert main(["evaluate", "--checkpoint", str(run / Path(checkpoint).name), "--split", "valid", "--report",
                     str(run / "valid.json"), "--beam-size", "1"]) == 0


def test_every_file_an_export_writes_into_a_model_folder_is_one_no_output_may_overwrite(tmp_path):
    """The engines' list of a --model folder's files lacked an ONNX graph's external data (written beside a graph
    past 2 GB) and the model card, which an output of the same name would have replaced."""
    from transformer.cli.model_options import model_files

    written = ["config.yaml", "spm.model", "encoder.onnx", "encoder.onnx.data", "decoder_step.onnx", "README.md",
               "model.safetensors", "model.bin", "config.json", "shared_vocabulary.json"]
    for name in [*written, "valid.json", "hyp.txt"]:  # a report and translations of the user's own: theirs to rewrite
        (tmp_path / name).write_text("x")
    args = argparse.Namespace(model=str(tmp_path), checkpoint=None)
    assert sorted(path.name for path in model_files(args)) == sorted(written)


def test_average_and_plot_commands(trained_copy_run, tmp_path, capsys):
    output = tmp_path / "averaged.pt"
    assert main(["average", "--run-dir", str(trained_copy_run), "--last", "2", "--output", str(output)]) == 0
    (output.parent / "spm.model").write_bytes((trained_copy_run / "spm.model").read_bytes())
    assert Translator.from_checkpoint(output).translate(["iota kappa mu"], beam_size=1) == ["IOTA KAPPA MU"]
    assert main(["plot", str(trained_copy_run), "--output", str(tmp_path / "curves.png")]) == 0
    assert (tmp_path / "curves.png").stat().st_size > 1000


def test_decode_overrides_are_the_config_keys_and_the_short_flags_are_aliases(checkpoint, tmp_path, capsys):
    sentences = ["alpha beta gamma", "kappa"]
    assert main(["translate", "--checkpoint", checkpoint, *sentences, "decode.beam_size=3", "decode.nbest=2"]) == 0
    by_key = capsys.readouterr().out
    assert main(["translate", "--checkpoint", checkpoint, *sentences, "--beam-size", "3", "--nbest", "2"]) == 0
    assert capsys.readouterr().out == by_key and by_key.count(" ||| ") == 8  # 2 sentences x 2 hypotheses
    report = tmp_path / "report.json"
    assert main(["evaluate", "--checkpoint", checkpoint, "--split", "valid", "decode.beam_size=3",
                 "decode.length_penalty=1.0", "--report", str(report)]) == 0
    decoding = json.loads(report.read_text())["decoding"]
    assert decoding["beam_size"] == 3 and decoding["length_penalty"] == 1.0


def test_sentences_and_settings_may_come_between_options_and_a_setting_needs_its_value(checkpoint, capsys):
    assert main(["translate", "--checkpoint", checkpoint, "decode.max_len_b=20", "--beam-size", "1",
                 "alpha beta gamma"]) == 0
    assert capsys.readouterr().out == "ALPHA BETA GAMMA\n"
    assert main(["translate", "--checkpoint", checkpoint, "--beam-size", "1", "--", "-alpha", "beta"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2  # after "--", a sentence may start with "-"
    assert main(["translate", "--checkpoint", checkpoint, "decode.beam_size", "5", "alpha"]) == 2
    assert capsys.readouterr().err == ("error: decode.beam_size: a setting without its value; write "
                                       "decode.beam_size=VALUE (a sentence that reads like a setting goes through "
                                       "--input or stdin)\n")


def test_ctrl_c_outside_the_training_loop_is_one_line_not_a_traceback(copy_corpus, tmp_path, monkeypatch, capsys):
    """Ctrl-C while the data or the tokenizer was prepared printed a KeyboardInterrupt traceback."""
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("transformer.training.loop.prepare_data", interrupted)
    assert main(["train", str(copy_corpus / "copy.yaml"), *toy_overrides(copy_corpus, tmp_path)]) == 130
    assert capsys.readouterr().err.endswith("interrupted\n")


@pytest.mark.parametrize("override, message", [
    ("train.lr=0.1", "only decode.* settings can be given here, not train.lr"),
    ("decode.beam=3", "unknown key 'decode.beam'"),
    ("decode.nbest=3", "decode.nbest must be in [1, decode.beam_size=2], got 3"),  # the checkpoint's beam is 2
    ("decode.beam_size=100000", "decode.beam_size must be at most 1024, got 100000"),  # not the memory's end
    ("decode.nbest=5000", "decode.nbest must be at most 1024, got 5000"),
    ("decode.max_len_b=100000", "decode.max_len_b in [0, 1024], got 1.5 and 100000"),  # not minutes of search
])
def test_a_bad_decode_override_is_one_line_and_exit_code_2(checkpoint, capsys, override, message):
    assert main(["translate", "--checkpoint", checkpoint, "alpha", override]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


@pytest.mark.parametrize("arguments, message", [
    (["--alignments", "--attention-layer", "6"],
     "--attention-layer 6: the model's attention has 2 decoder layers (0 to 1)"),
    (["--plot-attention", "PLOTS", "--attention-head", "-99"], "--attention-head -99: the model's attention has"),
    (["--output", "nowhere/out.txt"], "--output nowhere/out.txt: no directory"),
    (["--output", "PLOTS"], "a directory"),
    (["--plot-attention", "copy.yaml"], "--plot-attention copy.yaml: a file, not a directory"),
])
def test_options_that_would_fail_after_translating_are_refused_before(checkpoint, tmp_path, capsys, monkeypatch,
                                                                      arguments, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "PLOTS").mkdir()
    (tmp_path / "copy.yaml").write_text("")
    monkeypatch.setattr(Translator, "translate_nbest", lambda *args, **kwargs: pytest.fail("translated first"))
    assert main(["translate", "--checkpoint", checkpoint, "alpha", *arguments]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert main(["evaluate", "--checkpoint", checkpoint, "--split", "valid", "--report", "nowhere/r.json"]) == 2
    assert "--report nowhere/r.json: no directory" in capsys.readouterr().err
    assert main(["average", "--run-dir", str(tmp_path), "--last", "0", "--output", "avg.pt"]) == 2
    assert "--last must be >= 1, got 0" in capsys.readouterr().err


def test_api_overrides_replace_the_checkpoint_settings_for_one_call(translator, checkpoint):
    assert translator.settings(beam_size=3).beam_size == 3 and translator.decode.beam_size == 2
    with pytest.raises(ValueError, match="unknown decoding setting 'beam'"):
        translator.translate(["alpha"], beam=3)
    overridden = Translator.from_checkpoint(checkpoint, overrides=["decode.beam_size=3"])
    assert overridden.decode.beam_size == 3


def test_a_translator_around_a_model_in_training_leaves_its_linear_layers(translator):
    tokenizer = translator.tokenizer  # the Trainer's validation wraps the model it trains: packing would change it
    model = Transformer(translator.model.cfg, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.pad_id,
                        tokenizer.bos_id, tokenizer.eos_id)
    Translator(model, tokenizer, translator.decode, torch.device("cpu")).translate(["a b c"])
    assert isinstance(model.output_proj, torch.nn.Linear) and model.output_proj.weight.requires_grad


def test_the_python_api_says_in_one_line_what_is_wrong_with_an_argument(translator, checkpoint):
    """Each was taken silently and gave wrong translations (a string read character by character, "no" taken for
    true), or was a TypeError from deep inside the search or the tokenizer."""
    calls = {
        "prefixes: give a list of strings, not one str": lambda: translator.translate(["a b"], prefixes="A"),
        "prefix 1: a string, not NoneType": lambda: translator.translate(["a b"], prefixes=[None]),
        "constraints 1: give a list of phrases for the sentence, not one string": lambda: translator.translate(
            ["a b"], constraints=["dog"]),
        "decode.sampling must be a bool, got 'no'": lambda: translator.translate(["a b"], sampling="no"),
        "decode.beam_size must be an int, got '3'": lambda: translator.translate(["a b"], beam_size="3"),
        "decode.beam_size must be an int, got 2.5": lambda: translator.translate(["a b"], beam_size=2.5),
        "decode.seed must be an int, got 'x'": lambda: translator.translate(["a b"], sampling=True, seed="x"),
        "decode.sampling_temperature must be in [1e-06, 1e+06], got 1e-300": lambda: translator.translate(
            ["a b"], sampling=True, sampling_temperature=1e-300),
        "sentence 2: character 3 is a lone surrogate": lambda: translator.translate(["a", "ab\ud800"]),
        "sentences: give a list of strings, not NoneType": lambda: translator.translate(None),
        "sentences: give a list of strings, not dict": lambda: translator.translate({"a": 1}),
        "sentence: give one string, not list": lambda: translator.attention(["a b"]),
        "nbest: the attention is that of the one best translation": lambda: translator.attention("a b", nbest=2),
        "sentences: give a list of strings, not one str": lambda: translator.align("a", "b"),
        "translation 1: a string, not int": lambda: translator.align(["a"], [1]),
        "overrides: give a list of 'decode.key=value' strings": lambda: Translator.from_checkpoint(
            checkpoint, device="cpu", overrides="decode.beam_size=2"),
    }
    if not torch.cuda.is_available():
        calls["device=cuda but CUDA is not available"] = lambda: Translator.from_checkpoint(checkpoint, device="cuda")
    for message, call in calls.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            call()
    assert translator.translate(["alpha beta"], prefixes=["ALPHA"], constraints=[["BETA"]]) == ["ALPHA BETA"]
    numpy = pytest.importorskip("numpy")  # numpy's scalars and arrays, and any iterable, are taken as before
    assert translator.translate(numpy.array(["alpha beta"]), beam_size=numpy.int64(2), sampling=numpy.False_,
                                length_penalty=numpy.float32(1.0)) == ["ALPHA BETA"]
    assert translator.translate(s for s in ("alpha beta", "gamma")) == translator.translate(["alpha beta", "gamma"])
    assert translator.translate(("alpha",), prefixes=(p for p in ["ALPHA"]), constraints=[("BETA",)]) == \
        translator.translate(["alpha"], prefixes=["ALPHA"], constraints=[["BETA"]])


def test_a_search_cut_short_closes_its_progress_bar(translator, monkeypatch):
    """Ctrl-C during a search left its bar open, so "interrupted" was printed at the end of the bar's line."""
    import transformer.decoding.translator as translator_module

    bars = []

    class RecordedBar(translator_module.tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            bars.append(self)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(translator_module, "tqdm", RecordedBar)
    monkeypatch.setattr(translator, "search_batch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        translator.translate(["alpha beta"], progress=True)
    assert len(bars) == 1 and bars[0].disable  # closed: tqdm disables a bar it closes
