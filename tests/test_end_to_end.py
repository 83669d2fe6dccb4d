"""End to end on real data: tokenizer, training, checkpoint, translation and scoring on a slice of
Multi30k, through the commands a user types (about a minute on a 2-core CPU)."""

import json

import pytest
from conftest import corpus_dir

from transformer.cli import main


@pytest.mark.slow
@pytest.mark.corpus
def test_a_small_model_learns_german_to_english_on_multi30k(tmp_path, capsys):
    data = corpus_dir("multi30k")
    run = tmp_path / "run"
    overrides = [
        f"data.dataset={data}", "data.max_train_samples=6000", "data.vocab_size=2000", "data.batch_tokens=2048",
        "model.d_model=128", "model.d_ff=512", "model.n_heads=4", "model.n_encoder_layers=2",
        "model.n_decoder_layers=2", "model.dropout=0.1", f"train.run_dir={run}", "train.max_steps=250",
        "train.warmup_steps=100", "train.lr=1.0", "train.valid_every=250", "train.valid_max_sentences=100",
        "train.save_every=125", "train.log_every=25", "train.threads=2", "decode.beam_size=2",
    ]
    assert main(["train", "configs/multi30k_de_en.yaml", *overrides]) == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    assert losses[-1] < 0.7 * losses[0]  # falling fast from ~7.6 (uniform over 2000 subwords)

    report = tmp_path / "test2016.json"
    assert main(["evaluate", "--checkpoint", str(run / "checkpoint_best.pt"), "--split", "test2016",
                 "--report", str(report)]) == 0
    scores = json.loads(report.read_text())
    assert scores["split"] == "test2016" and scores["scores"]["chrf"]["score"] > 15
    assert main(["translate", "--checkpoint", str(run / "checkpoint_best.pt"), "Ein Mann fährt Fahrrad."]) == 0
    assert capsys.readouterr().out.strip()
