"""transformer-translate as a user meets it: pipes closed early, --output files replaced whole, and the options
that --interactive used to ignore without a word (on the tiny copy model of `quick_copy_run`)."""

import errno
import importlib
import io
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import subprocess_env, toy_overrides

from transformer.cli import main
from transformer.model.transformer import Encoder


@pytest.fixture(scope="module")
def checkpoint(quick_copy_run):
    return str(quick_copy_run / "checkpoint_last.pt")


class Terminal(io.TextIOWrapper):
    """stdin as a person typing at a terminal: the session prompts."""

    def isatty(self) -> bool:
        return True


def set_stdin(monkeypatch, data: bytes, tty: bool = False) -> None:
    monkeypatch.setattr(sys, "stdin", (Terminal if tty else io.TextIOWrapper)(io.BytesIO(data), encoding="utf-8"))


def translate_command(checkpoint: str, *options: str) -> list[str]:
    return [sys.executable, "-m", "transformer", "translate", "--checkpoint", checkpoint, "--beam-size", "1", *options]


@pytest.mark.parametrize("mode", [[], ["--interactive"]])
def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(checkpoint, mode):
    """`transformer-translate ... | head -1` printed "error: [Errno 32] Broken pipe" and exited with 2."""
    process = subprocess.Popen(translate_command(checkpoint, *mode), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=subprocess_env())
    process.stdout.close()  # the reader is gone before the first translation is written
    _, err = process.communicate(b"alpha beta\n" * 20, timeout=120)
    assert err.decode() == "" and process.returncode == 141


def test_an_output_file_is_replaced_whole_or_left_as_it_was(checkpoint, tmp_path):
    """--output truncated the old file, then wrote: a write that failed half-way (a full disk, here a file size
    limit) lost the old translations and left the new ones cut short."""
    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("alpha beta gamma delta\n" * 60)
    output.write_text("OLD\n")
    os.chmod(output, 0o600)
    limit = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))  # noqa: E731  the output needs more
    done = subprocess.run(translate_command(str(checkpoint), "--input", str(source), "--output", str(output)),
                          capture_output=True, text=True, env=subprocess_env(), preexec_fn=limit, timeout=120)
    assert done.returncode == 2
    assert done.stderr.endswith(f"error: --output {output}: cannot write it (File too large)\n")
    assert output.read_text() == "OLD\n" and sorted(path.name for path in tmp_path.iterdir()) == ["in.txt", "out.txt"]
    assert main(["translate", "--checkpoint", checkpoint, "--beam-size", "1", "--input", str(source),
                 "--output", str(output)]) == 0
    assert len(output.read_text().splitlines()) == 60 and (output.stat().st_mode & 0o777) == 0o600  # its mode kept


def test_output_to_a_device_is_written_through(checkpoint, capfd):
    options = ["translate", "--checkpoint", checkpoint, "--beam-size", "1", "alpha beta"]
    assert main(options) == 0
    expected = capfd.readouterr().out
    assert main([*options, "--output", "/dev/stdout"]) == 0
    assert capfd.readouterr().out == expected and len(expected.splitlines()) == 1 and Path("/dev/stdout").exists()


def test_interactive_mode_prints_nbest_lists_and_alignments_as_a_file_gets_them(checkpoint, tmp_path, monkeypatch,
                                                                                capsys):
    """--interactive printed the best translation alone, whatever --nbest and --alignments said."""
    (tmp_path / "in.txt").write_text("alpha beta\n\ngamma\n")
    options = ["translate", "--checkpoint", checkpoint, "--beam-size", "2", "--nbest", "2", "--alignments"]
    assert main([*options, "--input", str(tmp_path / "in.txt")]) == 0
    from_file = capsys.readouterr().out.splitlines()
    set_stdin(monkeypatch, b"alpha beta\n\ngamma\n")
    assert main([*options, "--interactive"]) == 0
    assert capsys.readouterr().out.splitlines() == from_file
    assert [line.split(" ||| ")[0] for line in from_file if not line.startswith("1 ")] == ["0", "0", "2", "2"]


def test_interactive_mode_plots_the_attention_of_each_line(checkpoint, tmp_path, monkeypatch):
    set_stdin(monkeypatch, b"alpha beta\n\ngamma\n")
    assert main(["translate", "--checkpoint", checkpoint, "--interactive", "--plot-attention",
                 str(tmp_path / "plots")]) == 0
    assert sorted(path.name for path in (tmp_path / "plots").iterdir()) == ["attention_0001.png", "attention_0003.png"]


@pytest.mark.parametrize("options, culprit", [
    (["--input", "IN"], "--input IN"),
    (["--output", "OUT"], "--output OUT (redirect stdout instead)"),
    (["alpha"], "sentence 'alpha'"),
])
def test_interactive_mode_refuses_what_it_would_ignore(checkpoint, tmp_path, monkeypatch, capsys, options, culprit):
    (tmp_path / "IN").write_text("alpha\n")
    monkeypatch.chdir(tmp_path)
    set_stdin(monkeypatch, b"beta\n")
    assert main(["translate", "--checkpoint", checkpoint, "--interactive", *options]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"error: --interactive reads stdin and writes stdout: drop {culprit}\n"
    assert not (tmp_path / "OUT").exists()


def test_the_interactive_prompt_goes_to_stderr(checkpoint, monkeypatch, capsys):
    """At a terminal, "> " went to stdout: `--interactive > out.txt` wrote it before every translation; and the
    shell's prompt came after the last "> " at Ctrl+D."""
    assert main(["translate", "--checkpoint", checkpoint, "--beam-size", "1", "alpha beta"]) == 0
    translation = capsys.readouterr().out  # what a 200-step model says depends on the CPU's arithmetic
    set_stdin(monkeypatch, b"alpha beta\n", tty=True)
    assert main(["translate", "--checkpoint", checkpoint, "--beam-size", "1", "--interactive"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "> > \n" and captured.out == translation and len(translation.splitlines()) == 1


def test_a_prefixes_file_of_the_wrong_length_is_named(checkpoint, tmp_path, capsys):
    (tmp_path / "in.txt").write_text("alpha\nbeta\n")
    (tmp_path / "prefixes.txt").write_text("ALPHA\n")
    assert main(["translate", "--checkpoint", checkpoint, "--input", str(tmp_path / "in.txt"), "--prefixes",
                 str(tmp_path / "prefixes.txt")]) == 2
    assert capsys.readouterr().err == (f"error: --prefixes {tmp_path / 'prefixes.txt'}: 1 prefixes for 2 sentences: "
                                       f"give one line per input line (an empty line: no prefix)\n")


def test_a_missing_input_file_is_said_before_the_model_loads(checkpoint, tmp_path, capsys, monkeypatch):
    """A typo in --input was said only once the model had loaded (seconds; minutes for a large model)."""
    def load(*args, **kwargs):
        raise AssertionError("the model was loaded first")

    monkeypatch.setattr(importlib.import_module("transformer.cli.translate"), "load_translator", load)
    missing = tmp_path / "nowhere.de"
    assert main(["translate", "--checkpoint", str(checkpoint), "--input", str(missing)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and str(missing) in error and "the model was loaded" not in error


def run_out_of_memory(monkeypatch, error: RuntimeError) -> None:
    """Make the model's encoder raise an error like ``error``, as an allocation that does not fit does: a new one
    each time, since a raised error keeps its traceback, and with it the frames and a Trainer, alive as long as
    the error is (``error`` is a parameter of the tests, alive to the end of the session)."""
    def forward(self, src, src_mask):
        raise type(error)(*error.args)

    monkeypatch.setattr(Encoder, "forward", forward)


CUDA_OUT_OF_MEMORY = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of "
                      "which 1.06 GiB is free. Of the allocated memory 75.10 GiB is allocated by PyTorch. See "
                      "documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html)")


@pytest.mark.parametrize("error, size", [
    (torch.OutOfMemoryError(CUDA_OUT_OF_MEMORY), "2.00 GiB"),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you "
                  "tried to allocate 8000000000 bytes. Error code 12 (Cannot allocate memory)"), "8000000000 bytes"),
])
def test_running_out_of_memory_is_one_line_naming_the_setting_to_lower(checkpoint, copy_corpus, tmp_path, monkeypatch,
                                                                       capsys, error, size):
    """torch's out-of-memory error, a traceback, named neither the setting that bounds a command's memory use."""
    run_out_of_memory(monkeypatch, error)
    capsys.readouterr()
    assert main(["translate", "--checkpoint", checkpoint, "alpha beta"]) == 1
    assert capsys.readouterr().err == (f"error: out of memory (allocating {size} more failed): lower --batch-tokens "
                                       f"(decode.batch_tokens: source tokens times beam size in one batch)\n")
    assert main(["train", str(copy_corpus / "copy.yaml"), *toy_overrides(copy_corpus, tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (f"error: out of memory (allocating {size} more failed): lower data.batch_tokens "
                                    f"(tokens in one training batch), or decode.batch_tokens for the validation "
                                    f"translations")
    assert "Traceback" not in err


def test_other_runtime_errors_keep_their_traceback(checkpoint, monkeypatch):
    run_out_of_memory(monkeypatch, RuntimeError("a bug"))
    with pytest.raises(RuntimeError, match="a bug"):
        main(["translate", "--checkpoint", checkpoint, "alpha beta"])


@pytest.mark.parametrize("command", [
    ["export", "--checkpoint", "CHECKPOINT", "--output", "", "--force"],
    ["translate", "--checkpoint", "CHECKPOINT", "--input", ""],
    ["translate", "--checkpoint", "CHECKPOINT", "--output", " ", "alpha"],
    ["evaluate", "--checkpoint", "CHECKPOINT", "--report", ""],
    ["average", "--output", "", "CHECKPOINT"],
])
def test_an_empty_file_option_is_refused_in_one_line(checkpoint, tmp_path, monkeypatch, capsys, command):
    """An unset shell variable (--output "$DIR"): export --force replaced the current folder whole, --input read
    stdin, --output printed to stdout, --report wrote nothing, none of it said."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("precious")
    set_stdin(monkeypatch, b"alpha\n")
    with pytest.raises(SystemExit) as stopped:
        main([checkpoint if item == "CHECKPOINT" else item for item in command])
    assert stopped.value.code == 2
    option = next(item for item in command if item.startswith("--") and item not in ("--checkpoint", "--force"))
    name = f"transformer-{command[0]}"
    assert capsys.readouterr().err == (f"{name}: error: argument {option}: empty value (an unset shell variable?): "
                                       f"give a file or folder (see {name} --help)\n")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["notes.txt"]


def test_option_errors_are_one_line_and_a_path_option_given_twice_is_refused(checkpoint, capsys):
    """argparse printed its usage first (five lines and more), and kept the last of two --model or export
    --checkpoint values, unsaid."""
    for command, line in (
            (["translate", "--checkpoint", checkpoint, "--beam-size", "x"],
             "transformer-translate: error: argument --beam-size: invalid int value: 'x'"),
            (["translate", "--model", "a", "--model", "b", "alpha"],
             "transformer-translate: error: argument --model: given twice (a and b); give it once"),
            (["export", "--checkpoint", "a.pt", "--checkpoint", "b.pt", "--output", "out"],
             "transformer-export: error: argument --checkpoint: given twice (a.pt and b.pt); give it once")):
        with pytest.raises(SystemExit) as stopped:
            main(command)
        assert stopped.value.code == 2
        assert capsys.readouterr().err == f"{line} (see transformer-{command[0]} --help)\n"


@pytest.mark.parametrize("options, error", [
    (["--input", "IN", "alpha"], "give sentences or --input, not both: sentence 'alpha' and --input IN"),
    (["--attention-layer", "0", "alpha"], "--attention-layer goes with --plot-attention or --alignments"),
    (["--attention-head", "0", "alpha"], "--attention-head goes with --plot-attention or --alignments"),
])
def test_options_that_would_be_ignored_are_refused(checkpoint, tmp_path, monkeypatch, capsys, options, error):
    """Sentences given with --input left the file untranslated; attention flags without a plot or alignments did
    nothing; none of it was said."""
    (tmp_path / "IN").write_text("beta\n")
    monkeypatch.chdir(tmp_path)
    assert main(["translate", "--checkpoint", checkpoint, *options]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"error: {error}\n"


@pytest.mark.parametrize("interactive", [False, True])
def test_a_third_column_is_no_part_of_the_prefix(checkpoint, monkeypatch, capsys, interactive):
    """--prefix-column reads SOURCE<tab>PREFIX: a third column went into the prefix, its tab too."""
    set_stdin(monkeypatch, b"alpha beta\tALPHA\tgamma\n")
    mode = ["--interactive"] if interactive else []
    assert main(["translate", "--checkpoint", checkpoint, "--beam-size", "1", "--prefix-column", *mode]) == 2
    captured = capsys.readouterr()
    assert "error: stdin line 1: 3 tab-separated columns; --prefix-column reads SOURCE<tab>PREFIX\n" in captured.err
    assert "\t" not in captured.out


def test_nbest_1_prints_the_score_of_the_best(checkpoint, monkeypatch, capsys):
    """--nbest 1 printed the text alone: the 1-best's score could not be had from the command."""
    assert main(["translate", "--checkpoint", checkpoint, "--beam-size", "2", "--nbest", "1", "alpha beta"]) == 0
    [line] = capsys.readouterr().out.splitlines()
    index, text, score = line.split(" ||| ")
    assert index == "0" and text and float(score) < 0
    assert main(["translate", "--checkpoint", checkpoint, "--beam-size", "2", "decode.nbest=1", "alpha beta"]) == 0
    assert capsys.readouterr().out == f"{line}\n"  # --nbest is short for decode.nbest
    assert main(["translate", "--checkpoint", checkpoint, "--beam-size", "2", "alpha beta"]) == 0
    assert capsys.readouterr().out == f"{text}\n"  # without --nbest: the text alone


def test_the_current_folder_is_never_replaced_by_an_export(checkpoint, tmp_path, monkeypatch, capsys):
    """`--output . --force` replaced the current folder whole, as documented for a folder, and so deleted all the
    user had in it; a folder above it likewise. (An empty current folder takes an export: tests/test_release.py.)"""
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    (tmp_path / "work" / "notes.txt").write_text("precious")
    for output in (".", str(tmp_path)):
        assert main(["export", "--checkpoint", checkpoint, "--output", output, "--force"]) == 2
        assert capsys.readouterr().err == (f"error: {output}: the current folder, or one that holds it, and not empty; "
                                           f"export into a folder of its own\n")
    assert (tmp_path / "work" / "notes.txt").read_text() == "precious"
    assert main(["export", "--checkpoint", checkpoint, "--output", "release", "--force"]) == 0


def test_references_given_twice_are_two_references(tmp_path, capsys):
    """`--references r1 --references r2` scored against r2 alone (nrefs:1), unsaid; `--references r1 r2` against
    both."""
    for name, text in (("hyp", "a b c d\n"), ("r1", "a b c d\n"), ("r2", "a b c e\n")):
        (tmp_path / name).write_text(text)
    hyp, r1, r2 = (str(tmp_path / name) for name in ("hyp", "r1", "r2"))
    assert main(["evaluate", "--hypotheses", hyp, "--references", r1, r2]) == 0
    together = capsys.readouterr().out
    assert main(["evaluate", "--hypotheses", hyp, "--references", r1, "--references", r2]) == 0
    assert capsys.readouterr().out == together and "nrefs:2" in together


@pytest.mark.parametrize("command", [["train", ""], ["train", "c.yaml", "--resume", ""],
                                     ["evaluate", "--checkpoint", "c.pt", "--dataset", ""]])
def test_an_empty_config_checkpoint_or_corpus_is_refused(command, capsys):
    """train '' said "cannot read config file : Is a directory", --resume "$UNSET" resumed the run directory's last
    checkpoint as a bare --resume does, evaluate --dataset '' took the config's corpus."""
    with pytest.raises(SystemExit) as stopped:
        main(command)
    assert stopped.value.code == 2
    assert "empty value (an unset shell variable?)" in capsys.readouterr().err


# A Ctrl-C while torch loads (the commands' first second): the import is interrupted where the commands import torch
INTERRUPTED_IMPORT = """
import builtins, sys
imported = builtins.__import__
def interrupted(name, *args, **kwargs):
    if name == "torch":
        raise KeyboardInterrupt
    return imported(name, *args, **kwargs)
builtins.__import__ = interrupted
from transformer.console import main, train
sys.exit(train() if sys.argv[1] == "train" else main())
"""


@pytest.mark.parametrize("entry", ["train", "python -m transformer"])
def test_a_ctrl_c_while_the_commands_load_says_interrupted_without_a_traceback(entry):
    done = subprocess.run([sys.executable, "-c", INTERRUPTED_IMPORT, entry.split()[0], "train", "--help"],
                          env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (130, "interrupted\n")  # was Python's traceback of the import


def test_the_commands_and_the_translator_start_without_importing_datasets():
    """datasets (with pandas and pyarrow) took 0.8-1.1 s of every command's start, translate's and --help's too,
    imported for type hints; a corpus is read through `transformer.data.loading`, which imports it."""
    code = ("import sys, transformer.cli, transformer.decoding.translator, transformer.serve.app; "
            "print(sorted(name for name in ('datasets', 'pandas') if name in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], env=subprocess_env(), capture_output=True, text=True,
                          timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (0, "[]\n", "")


def read_only(monkeypatch, folder: Path) -> None:
    """No file can be created in ``folder``, as on a read-only file system (a folder's mode would not stop root)."""
    create = os.open

    def refusing(path, flags, *args, **kwargs):
        if flags & os.O_CREAT and Path(path).absolute().parent == folder:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return create(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing)


@pytest.mark.parametrize("command, says", [
    (["translate", "alpha", "--output", "{folder}/out.txt"], "--output {folder}/out.txt: cannot write into {folder}"),
    (["translate", "alpha", "--plot-attention", "{folder}/plots"], "--plot-attention {folder}/plots: cannot write "
                                                                   "into it"),
    (["evaluate", "--split", "valid", "--output", "{folder}/hyp.txt"], "--output {folder}/hyp.txt: cannot write "
                                                                       "into {folder}"),
    (["export", "--output", "{folder}/release"], "{folder}/release: cannot write into it"),
])
def test_an_output_that_cannot_be_written_is_said_before_the_work(checkpoint, tmp_path, monkeypatch, capsys, command,
                                                                  says):
    """Found when the translations were done, and said naming a hidden temporary file ("error: [Errno 30]
    Read-only file system: 'romnt/.o.txt.5b56349a676a.tmp'"); an export's likewise, after the conversion."""
    from transformer.decoding.translator import Translator
    from transformer.deploy import release

    def never(*args, **kwargs):
        raise AssertionError("the work began")

    monkeypatch.setattr(Translator, "search", never)
    monkeypatch.setattr(release, "load_checkpoint", never)  # the export's first step
    read_only(monkeypatch, tmp_path)
    options = [part.format(folder=tmp_path) for part in command]
    assert main([options[0], "--checkpoint", checkpoint, *options[1:]]) == 2
    assert capsys.readouterr().err == f"error: {says.format(folder=tmp_path)} (Read-only file system)\n"


def test_translations_that_cannot_be_written_keep_their_scores(checkpoint, tmp_path, monkeypatch, capsys):
    """transformer-evaluate --output on a full disk printed no scores: the file was written before scoring."""
    from transformer import atomic_file, evaluate

    def full_disk(path, text):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic_file, "write_output", full_disk)
    monkeypatch.setattr(evaluate, "write_output", full_disk)  # the report's
    hypotheses, report = tmp_path / "hyp.txt", tmp_path / "scores.json"
    command = ["evaluate", "--checkpoint", checkpoint, "--split", "valid", "--output", str(hypotheses)]
    assert main(command) == 2
    captured = capsys.readouterr()
    assert captured.out.startswith("BLEU = ")
    assert captured.err.endswith(f"error: --output {hypotheses}: cannot write it (No space left on device)\n")
    assert main([*command, "--report", str(report)]) == 2  # both said, on one line
    assert capsys.readouterr().err.endswith(f"error: --output {hypotheses}: cannot write it (No space left on "
                                            f"device); --report {report}: cannot write it (No space left on "
                                            f"device)\n")


def test_a_failed_atomic_write_names_the_file_not_its_temporary_one(tmp_path, monkeypatch):
    from transformer.atomic_file import atomic_write

    target = tmp_path / "out.txt"
    read_only(monkeypatch, tmp_path)
    with pytest.raises(OSError) as caught:
        with atomic_write(target):
            pass
    assert (caught.value.errno, caught.value.filename) == (errno.EROFS, str(target))
    monkeypatch.undo()
    for error in (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), FileNotFoundError(errno.ENOENT, "gone", "src")):
        with pytest.raises(OSError) as caught:
            with atomic_write(target):
                raise error
        # a full disk names no file: the target; another file the writer read stays named
        assert caught.value.filename == (str(target) if error.filename is None else "src")
    assert list(tmp_path.iterdir()) == []


def test_a_sentence_argument_that_is_not_utf8_is_said_so(checkpoint, capsys):
    """Python reads the byte 0xff of `transformer-translate $'Ein \\xff Hund'` as the lone surrogate U+DCFF, and the
    error said "character 5 is a lone surrogate ('\\udcff')", where a file's line says "invalid UTF-8"."""
    assert main(["translate", "--checkpoint", checkpoint, "alpha", os.fsdecode(b"Ein \xff Hund")]) == 2
    assert capsys.readouterr().err == "error: argument line 2: invalid UTF-8\n"
    assert main(["translate", "--checkpoint", checkpoint, "--beam-size", "1", os.fsdecode("Größe".encode())]) == 0


def test_a_dash_is_standard_input_and_output(checkpoint, monkeypatch, capsys):
    """`--input -` said "cannot read -: No such file or directory", where fairseq, Marian and transformer-evaluate
    --hypotheses read standard input."""
    set_stdin(monkeypatch, b"alpha beta\ngamma\n")
    assert main(["translate", "--checkpoint", checkpoint, "--beam-size", "1", "--input", "-", "--output", "-"]) == 0
    dashed = capsys.readouterr().out
    assert main(["translate", "--checkpoint", checkpoint, "--beam-size", "1", "alpha beta", "gamma"]) == 0
    assert dashed == capsys.readouterr().out and len(dashed.splitlines()) == 2
    assert main(["translate", "--checkpoint", checkpoint, "alpha", "--input", "-"]) == 2  # stdin unread, unsaid
    assert capsys.readouterr().err == "error: give sentences or --input, not both: sentence 'alpha' and --input -\n"
    for flag in ("--output", "--report"):  # a file named "-"
        assert main(["evaluate", "--checkpoint", checkpoint, "--split", "valid", flag, "-"]) == 2
        assert capsys.readouterr().err == f"error: {flag} -: standard output holds the scores; give a file\n"


def test_a_rank_that_lost_another_leaves_torchruns_error_file_to_another(tmp_path, monkeypatch, capsys):
    """torchrun names the earliest error file's rank the root cause: a lost rank's "stopped: lost another of the 2
    ranks ... torchrun's report says why", written in the same second as the failed rank's, could be named."""
    import argparse

    from transformer.cli import _run
    from transformer.runtime.distributed import RankLost

    error_file = tmp_path / "error.json"
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))

    def failing(error):
        def main(args):
            raise error
        return main

    assert _run(failing(RankLost("stopped: lost another of the 2 ranks")), argparse.ArgumentParser(), []) == 2
    assert capsys.readouterr().err == "rank 1: error: stopped: lost another of the 2 ranks\n"
    assert not error_file.exists()
    assert _run(failing(OSError("disk on fire")), argparse.ArgumentParser(), []) == 2
    assert capsys.readouterr().err == "rank 1: error: disk on fire\n"
    assert json.loads(error_file.read_text())["message"] == "error: disk on fire"  # torchrun's report shows it
