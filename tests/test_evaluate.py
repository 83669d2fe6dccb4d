import json

import pytest
import sacrebleu

from transformer.errors import InputError
from transformer.evaluate import EvaluationError, score_files, score_translations, write_report

HYPS = ["A man rides a bike .", "Two dogs play in the snow."]
REFS = ["A man is riding a bicycle.", "Two dogs play in the snow."]


def test_scores_equal_sacrebleu_and_carry_signatures():
    scores = score_translations(HYPS, [REFS])
    assert scores["bleu"].score == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score)
    assert scores["chrf"].score == pytest.approx(sacrebleu.corpus_chrf(HYPS, [REFS]).score)
    assert scores["ter"].score == pytest.approx(sacrebleu.corpus_ter(HYPS, [REFS]).score)
    assert scores["bleu"].signature.startswith("nrefs:1|case:mixed|eff:no|tok:13a")


def test_files_with_different_line_counts_are_rejected(tmp_path):
    (tmp_path / "hyp.txt").write_text("a\nb\n")
    (tmp_path / "ref.txt").write_text("a\nb\nc\n")
    with pytest.raises(EvaluationError, match=r"hyp.txt has 2 lines but .*ref.txt has 3"):
        score_files(tmp_path / "hyp.txt", [tmp_path / "ref.txt"])


def test_invalid_utf8_names_the_line(tmp_path):
    (tmp_path / "hyp.txt").write_bytes(b"ok\nbad \xff\n")
    with pytest.raises(InputError, match=r"hyp.txt line 2: invalid UTF-8"):
        score_files(tmp_path / "hyp.txt", [tmp_path / "hyp.txt"])


def test_report_is_json_with_signatures(tmp_path):
    write_report(tmp_path / "r.json", score_translations(HYPS, [REFS]), checkpoint="x.pt")
    report = json.loads((tmp_path / "r.json").read_text())
    assert set(report["scores"]) == {"bleu", "chrf", "ter"} and report["checkpoint"] == "x.pt"
    assert "signature" in report["scores"]["bleu"]
