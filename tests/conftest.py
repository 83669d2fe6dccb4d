"""Tiny fixtures shared by the tests: a small model config and random token batches."""

import compileall
import json
import os
import sys
from pathlib import Path

# tests never touch the network
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest
import torch

from transformer.config import ModelConfig
from transformer.config_loading import load_config
from transformer.decoding.translator import Translator
from transformer.fast.loss import label_smoothed_cross_entropy
from transformer.model.transformer import Transformer

PAD, UNK, BOS, EOS = 0, 1, 2, 3
VOCAB = 20
ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = Path(os.environ.get("TRANSFORMER_DATA", ROOT / ".." / "shared" / "data"))


def pytest_sessionstart(session: pytest.Session) -> None:
    """The hundreds of commands the tests start each import this checkout; where PYTHONDONTWRITEBYTECODE is set (as
    on the machines CI runs on), each compiled it from source again (0.2 s a start): compiled once, here."""
    for folder in ("transformer", "scripts"):
        compileall.compile_dir(ROOT / folder, quiet=1)


def training_step(model):
    """The step `GraphedSteps` records and replays (train.cuda_graphs), for ``model``: forward, the label-smoothed
    loss (epsilon 0.1), backward of the loss times ``factor``; returns (loss, nll)."""
    def step(src, tgt_in, tgt_out, factor):
        loss, nll = label_smoothed_cross_entropy(model(src, tgt_in), tgt_out, 0.1, PAD)
        (loss * factor).backward()
        return loss.detach(), nll
    return step


def subprocess_env() -> dict[str, str]:
    """The environment for a command the tests start: this checkout first on PYTHONPATH (the packages
    the caller's PYTHONPATH adds stay), the console scripts of this Python on PATH, one CPU thread."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PYTHONPATH": path, "PATH": bin_dir + os.pathsep + os.environ["PATH"],
            "OMP_NUM_THREADS": "1"}


def tiny_config(**overrides) -> ModelConfig:
    values = dict(d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2, dropout=0.0,
                  attention_dropout=0.0, max_positions=16)
    values.update(overrides)
    return ModelConfig(**values)


def make_model(seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(tiny_config(**overrides), VOCAB, pad_id=PAD, bos_id=BOS, eos_id=EOS).eval()


@pytest.fixture(autouse=True)
def restore_torch_threads():
    """Commands run in-process set torch's thread count for the whole process: put it back after
    each test, so that a test's train.threads=2 does not oversubscribe the CPU for the rest."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tiny_model() -> Transformer:
    return make_model()


@pytest.fixture
def src() -> torch.Tensor:
    """Two padded sources of lengths 6 and 4."""
    return torch.tensor([[5, 6, 7, 8, 9, EOS], [10, 11, 12, EOS, PAD, PAD]])


@pytest.fixture
def tgt_in() -> torch.Tensor:
    return torch.tensor([[BOS, 4, 5, 6, 7], [BOS, 8, 9, 10, 11]])


def corpus_dir(name: str) -> Path:
    """The real corpus `name` under $TRANSFORMER_DATA, or skip (a fresh clone has no data)."""
    path = DATA_DIR / name
    if not path.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"corpus {name} not found at {path}: CI must run the corpus tests")
        pytest.skip(f"corpus {name} not found at {path}; set TRANSFORMER_DATA to the folder holding it")
    return path


WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def write_copy_corpus(directory: Path, n_train: int = 3000, n_valid: int = 100, seed: int = 0) -> Path:
    """A synthetic task: the target is the source upper-cased (splits train/valid, languages src/tgt)."""
    import random

    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_valid)):
        pairs = [" ".join(rng.choices(WORDS, k=rng.randint(3, 8))) for _ in range(n)]
        (directory / f"{split}.src").write_text("".join(p + "\n" for p in pairs))
        (directory / f"{split}.tgt").write_text("".join(p.upper() + "\n" for p in pairs))
    (directory / "copy.yaml").write_text(COPY_MODEL_YAML)
    return directory


COPY_MODEL_YAML = """\
model: {d_model: 64, n_heads: 4, d_ff: 128, n_encoder_layers: 2, n_decoder_layers: 2,
        dropout: 0.0, attention_dropout: 0.0}
"""


def toy_overrides(corpus: Path, run_dir: Path, **train) -> list[str]:
    """Overrides that make a tiny model train on the copy corpus in seconds, on the CPU unless ``device``
    says otherwise: the quality thresholds of the tests were set there, and a bf16 run on a GPU
    follows another trajectory (of seeds 1-4 on an H100, seed 1 copied only 67% of the sentences
    exactly after 1000 steps, the others 98-100%)."""
    values = {
        "data.dataset": corpus, "data.src_lang": "src", "data.tgt_lang": "tgt", "data.valid_split": "valid",
        "data.vocab_size": 320, "data.batch_tokens": 512, "data.max_length": 64,
        "train.run_dir": run_dir, "train.lr": 1.0, "train.warmup_steps": 100, "train.max_steps": 20,
        "train.valid_every": 0, "train.save_every": 10, "train.log_every": 5, "train.threads": 1, "train.device": "cpu",
        "decode.beam_size": 2,
    }
    values.update({f"train.{k}" if "." not in k else k: v for k, v in train.items()})
    return [f"{key}={value}" for key, value in values.items()]


def run_config(corpus: Path, run_dir: Path, **train):
    """The copy task's config with `toy_overrides`."""
    return load_config(corpus / "copy.yaml", toy_overrides(corpus, run_dir, **train))


def trained_translator(corpus: Path, run_dir: Path, **overrides):
    """A Translator of a tiny model trained 200 steps on the copy corpus (about 8 s on a CPU core): enough
    for most greedy outputs to end with eos, still uncertain enough to compare beam searches on."""
    from transformer.training import train

    settings = {"max_steps": 200, "lr": 1.0, "warmup_steps": 60, "save_every": 200, **overrides}
    train(run_config(corpus, run_dir, **settings))
    return Translator.from_checkpoint(run_dir / "checkpoint_last.pt")


def teacher_forced_log_probs(translator, source: str, target: str) -> torch.Tensor:
    """log P(y_t | y_<t, x) of each target token and the final eos, teacher-forced through the model."""
    tok = translator.tokenizer
    src = torch.tensor([tok.encode_src([source])[0] + [tok.eos_id]])
    ids = tok.encode_tgt([target])[0]
    tgt_in, tgt_out = torch.tensor([[tok.bos_id] + ids]), torch.tensor([ids + [tok.eos_id]])
    with torch.no_grad():
        log_probs = translator.model(src, tgt_in).log_softmax(-1)
    return log_probs.gather(-1, tgt_out[..., None])[0, :, 0]


def max_log_prob_difference(engine, translator, sources: list[str], targets: list[str]) -> float:
    """The largest |log P(target + eos | source)| difference between an exported engine's forced decoding
    (``forced_log_probs``) and the model, teacher-forced; the tokens each counts must agree."""
    theirs = engine.forced_log_probs(sources, targets, engine.decode)
    ours = [teacher_forced_log_probs(translator, source, target) for source, target in zip(sources, targets)]
    assert [length for _, length in theirs] == [len(log_probs) for log_probs in ours]
    differences = [abs(log_prob - mine.sum().item()) for (log_prob, _), mine in zip(theirs, ours)]
    print(f"max |log P difference|: {max(differences):.2e}")
    return max(differences)


def assert_greedy_outputs_are_ours(engine, translator, sentences: list[str]) -> None:
    """An exported engine translates greedily as the model: where outputs end with eos (some must) and
    where the length limit stops them."""
    greedy = translator.translate(sentences, beam_size=1)
    assert engine.translate(sentences, beam_size=1) == greedy
    a, b = translator.decode.max_len_a, translator.decode.max_len_b
    limits = [int(a * (len(ids) + 1) + b) for ids in translator.tokenizer.encode_src(sentences)]
    lengths = [len(ids) for ids in translator.tokenizer.encode_tgt(greedy)]
    assert any(length < limit for length, limit in zip(lengths, limits)), "no output ended with eos"
    short = dict(beam_size=1, max_len_a=0.0, max_len_b=3)  # every output stops at the length limit
    assert engine.translate(sentences, **short) == translator.translate(sentences, **short)


def greedy_bleu_by_engine(checkpoint: str, folder: str, engine: str, tmp_path: Path) -> dict[str, float]:
    """transformer-evaluate's greedy BLEU on the copy corpus's valid split: the checkpoint's (under "torch")
    and ``engine``'s on its exported ``folder``."""
    from transformer.cli import main

    scores = {}
    for name, source in (("torch", ["--checkpoint", checkpoint]), (engine, ["--model", folder])):
        report = tmp_path / f"{name}.json"
        assert main(["evaluate", "--engine", name, *source, "--split", "valid", "decode.beam_size=1",
                     "--report", str(report)]) == 0
        scores[name] = json.loads(report.read_text())["scores"]["bleu"]["score"]
    return scores


def metric_records(run_dir: Path, kind: str) -> list[dict]:
    """The run's metrics.jsonl records of ``kind`` (train, valid) without the wall-clock figures,
    which differ between runs."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in r.items() if k not in ("time", "tokens_per_s") and not k.startswith("seconds_")}
            for r in map(json.loads, lines) if r["kind"] == kind]


@pytest.fixture(scope="session")
def copy_corpus(tmp_path_factory) -> Path:
    return write_copy_corpus(tmp_path_factory.mktemp("copy_corpus"))


@pytest.fixture(scope="session")
def trained_copy_run(copy_corpus, tmp_path_factory) -> Path:
    """A run directory with a model that has learned the copy task, trained through the CLI."""
    from transformer.cli import main

    run_dir = tmp_path_factory.mktemp("copy_run")
    overrides = toy_overrides(copy_corpus, run_dir, max_steps=1000, lr=0.5, warmup_steps=200, valid_every=500,
                              save_every=250)
    assert main(["train", str(copy_corpus / "copy.yaml"), *overrides]) == 0
    return run_dir


@pytest.fixture(scope="module")
def checkpoint(trained_copy_run) -> str:
    """trained_copy_run's best checkpoint (a module that needs another defines its own ``checkpoint``)."""
    return str(trained_copy_run / "checkpoint_best.pt")


@pytest.fixture(scope="module")
def translator(checkpoint) -> Translator:
    return Translator.from_checkpoint(checkpoint, device="cpu")


@pytest.fixture(scope="session")
def quick_copy_run(copy_corpus, tmp_path_factory) -> Path:
    """A run directory whose checkpoint_last.pt was trained 200 steps on the copy corpus (`trained_translator`)."""
    run_dir = tmp_path_factory.mktemp("quick_copy_run")
    trained_translator(copy_corpus, run_dir)
    return run_dir


@pytest.fixture(scope="session")
def parent_run(copy_corpus, tmp_path_factory) -> Path:
    """A parent to fine-tune: trained 20 steps on the copy task, with checkpoints at steps 10 and 20."""
    from transformer.training import train

    run_dir = tmp_path_factory.mktemp("parent")
    train(run_config(copy_corpus, run_dir, max_steps=20, save_every=10))
    return run_dir


def fine_tune(copy_corpus: Path, run_dir: Path, parent: str | Path, **settings):
    """Fine-tune ``parent`` on the copy task into ``run_dir`` (`run_config`'s settings and ``settings``)."""
    from transformer.training import train

    return train(run_config(copy_corpus, run_dir, init_from=parent, **settings))


@pytest.fixture(scope="session")
def multi30k(tmp_path_factory):
    """Multi30k de-en (DataConfig) and its default tokenizer (unigram, 8000 pieces), trained once."""
    from transformer.config import DataConfig
    from transformer.data.loading import load_split
    from transformer.data.tokenizer import train_tokenizer

    base = tmp_path_factory.mktemp("multi30k")
    cfg = DataConfig(dataset=str(corpus_dir("multi30k")), cache_dir=str(base / "cache"))
    train = load_split(cfg, "train")
    return cfg, train_tokenizer(cfg, train["src"], train["tgt"], base / "run", seed=1)


# Two "languages" to translate the source words into: upper-cased, and capitalized
TARGETS = {"up": lambda words: [w.upper() for w in words], "cap": lambda words: [w.capitalize() for w in words]}
# How a translation into each looks, whatever words it got right: what following the tag means
IN_LANGUAGE = {"up": str.isupper, "cap": str.istitle}


def write_two_target_corpus(directory: Path, n_train: int = 3000, n_valid: int = 60) -> Path:
    """Line-aligned files {split}.src, {split}.up, {split}.cap: one source, two target languages."""
    import random

    rng = random.Random(0)
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_valid)):
        sentences = [rng.choices(WORDS, k=rng.randint(3, 7)) for _ in range(n)]
        (directory / f"{split}.src").write_text("".join(" ".join(words) + "\n" for words in sentences))
        for lang, rule in TARGETS.items():
            (directory / f"{split}.{lang}").write_text("".join(" ".join(rule(words)) + "\n" for words in sentences))
    (directory / "two.yaml").write_text("model: {d_model: 64, n_heads: 4, d_ff: 128, n_encoder_layers: 2, "
                                        "n_decoder_layers: 2, dropout: 0.0, attention_dropout: 0.0}\n")
    return directory


@pytest.fixture(scope="session")
def two_target_corpus(tmp_path_factory) -> Path:
    return write_two_target_corpus(tmp_path_factory.mktemp("two_targets"))


@pytest.fixture(scope="session")
def two_target_run(two_target_corpus, tmp_path_factory) -> Path:
    """A tiny model trained on both directions of the two-target corpus, through the CLI: it follows its tag and
    copies about two thirds of the validation sentences exactly (BLEU 80-90). In fp32 on every CPU: with bf16
    where the CPU has it, its trajectory and the sentences it gets right depended on the CPU, and it took twice as
    long (56 s against 28 s on a Xeon with AMX)."""
    from transformer.cli import main

    run_dir = tmp_path_factory.mktemp("two_target_run")
    overrides = toy_overrides(two_target_corpus, run_dir, max_steps=1000, lr=0.5, warmup_steps=200, save_every=1000,
                              valid_every=1000, precision="fp32")
    assert main(["train", str(two_target_corpus / "two.yaml"), *overrides, "data.pairs=src-up,src-cap",
                 "data.tgt_lang=up"]) == 0
    return run_dir
