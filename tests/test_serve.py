"""transformer-serve: the API against the CLI, bad input, cross-request batching, SIGTERM, the CTranslate2 engine.

The API tests run the app in-process (FastAPI's TestClient); concurrency and SIGTERM talk to a real
uvicorn in a child process. The model is the copy task's, trained 200 steps (`quick_copy_run`).
"""

import asyncio
import json
import logging
import re
import shutil
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from conftest import subprocess_env

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
httpx = pytest.importorskip("httpx", reason="the dev extra (httpx) is not installed")

from fastapi.testclient import TestClient  # noqa: E402

from transformer.cli import main  # noqa: E402
from transformer.config import DecodeConfig  # noqa: E402
from transformer.decoding.alignment import moses_format  # noqa: E402
from transformer.decoding.translator import Translator  # noqa: E402
from transformer.serve.app import create_app, max_body_bytes  # noqa: E402
from transformer.serve.batcher import Batcher, Busy, Outcome  # noqa: E402
from transformer.serve.config import ServeConfig  # noqa: E402
from transformer.serve.model_info import describe  # noqa: E402
from transformer.serve.process import server_process  # noqa: E402

LIMITS = ServeConfig(max_sentences=8, max_chars=200, max_beam_size=6)


@pytest.fixture(scope="module")
def checkpoint(quick_copy_run):
    return quick_copy_run / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def translator(checkpoint):
    return Translator.from_checkpoint(checkpoint, device="cpu")


@pytest.fixture(scope="module")
def client(translator, checkpoint):
    with TestClient(create_app(translator, LIMITS, describe(translator, "torch", [str(checkpoint)]))) as client:
        yield client


@pytest.fixture(scope="module")
def sentences(copy_corpus):
    return (copy_corpus / "valid.src").read_text().splitlines()[:6]


def post(client, path: str, body) -> dict:
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


# -- the API --------------------------------------------------------------------------------------
NBEST_OPTIONS = {"beam_size": 3, "nbest": 2, "length_penalty": 1.0}
NBEST_FLAGS = ["--beam-size", "3", "--nbest", "2", "--length-penalty", "1.0"]


@pytest.mark.parametrize("options, flags", [({}, []), (NBEST_OPTIONS, NBEST_FLAGS)])
def test_translations_equal_the_clis(client, checkpoint, sentences, capsys, options, flags):
    text = [*sentences, ""]
    found = post(client, "/translate", {"text": text, **options})["translations"]
    assert main(["translate", "--checkpoint", str(checkpoint), *flags, *text]) == 0
    lines = capsys.readouterr().out.splitlines()
    if "nbest" in options:
        served = [f"{i} ||| {h['text']} ||| {h['score']:.4f}" for i, t in enumerate(found) for h in t["nbest"]]
    else:
        served = [t["text"] for t in found]
    assert served == lines
    assert found[-1] == {"text": "", "score": 0.0, "nbest": [{"text": "", "score": 0.0}], "truncated": False}


def test_one_text_timing_batch_health_model_and_docs(client, translator, checkpoint):
    answer = post(client, "/translate", {"text": "alpha beta gamma", "beam_size": 1})
    assert [t["text"] for t in answer["translations"]] == translator.translate(["alpha beta gamma"], beam_size=1)
    [[(_, score)]] = translator.translate_nbest(["alpha beta gamma"], beam_size=1)
    assert answer["translations"][0]["score"] == pytest.approx(score) and score < 0  # greedy's, normalised too
    assert answer["batch"] == {"requests": 1, "sentences": 1}
    assert 0 <= answer["timing"]["queue_ms"] and 0 < answer["timing"]["translate_ms"] <= answer["timing"]["total_ms"]
    assert client.get("/health").json() == {"status": "ready", "queued_requests": 0, "queued_sentences": 0}
    model = client.get("/model").json()
    assert (model["source_language"], model["target_language"], model["engine"]) == ("src", "tgt", "torch")
    assert model["model"]["d_model"] == 64 and model["decode"]["beam_size"] == 2
    assert model["limits"]["max_sentences"] == 8 and "loaded_from" not in model  # the server's own business
    assert "/translate" in client.get("/openapi.json").json()["paths"]
    assert client.get("/docs").status_code == 200
    assert "<canvas" in client.get("/").text and "drawHeatmap" in client.get("/static/app.js").text


def test_attention_is_the_translators_last_layer_mean_over_heads(client, translator):
    answer = post(client, "/attention", {"text": "alpha beta", "beam_size": 1})
    found = translator.attention("alpha beta", beam_size=1)
    assert answer["source"] == found.source_pieces and answer["target"] == found.target_pieces
    weights = torch.tensor(answer["weights"])
    torch.testing.assert_close(weights, found.weights[-1].mean(0))
    torch.testing.assert_close(weights.sum(-1), torch.ones(len(answer["target"])))


def test_model_reports_the_scores_beside_the_checkpoint_and_in_a_release_folder(quick_copy_run, tmp_path):
    from transformer.deploy.release import export_release

    run = tmp_path / "run"
    shutil.copytree(quick_copy_run, run, ignore=shutil.ignore_patterns("cache", "tensorboard"))
    scores = {"bleu": {"score": 87.5, "signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"}}
    (run / "scores.json").write_text(json.dumps({"checkpoint": "checkpoint_last.pt", "scores": scores}))
    translator = Translator.from_checkpoint(run / "checkpoint_last.pt")
    assert describe(translator, "torch", [str(run / "checkpoint_last.pt")])["scores"] == scores
    folder = export_release(run / "checkpoint_last.pt", tmp_path / "release")
    with TestClient(create_app(translator, LIMITS, describe(Translator.from_pretrained(folder), "torch",
                                                            model=str(folder)))) as client:
        assert client.get("/model").json()["scores"] == scores
        assert client.get("/model").json()["scores_direction"] == "src→tgt"
    assert describe(translator, "torch", [str(quick_copy_run / "checkpoint_last.pt")])["scores"] == {}


def test_model_reports_no_scores_of_another_training_step(quick_copy_run, tmp_path):
    """A report beside the checkpoint named its file but scored it at another step (checkpoint_last.pt saved again
    since): /model showed those stale scores; the model card's rule (`find_report`) leaves them out."""
    run = tmp_path / "run"
    shutil.copytree(quick_copy_run, run, ignore=shutil.ignore_patterns("cache", "tensorboard"))
    step = torch.load(run / "checkpoint_last.pt", weights_only=True)["step"]
    scores = {"bleu": {"score": 87.5, "signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"}}
    report = {"checkpoint": str(run / "checkpoint_last.pt"), "scores": scores}
    translator = Translator.from_checkpoint(run / "checkpoint_last.pt")
    (run / "scores.json").write_text(json.dumps({**report, "step": step - 1}))
    assert describe(translator, "torch", [str(run / "checkpoint_last.pt")])["scores"] == {}
    (run / "scores.json").write_text(json.dumps({**report, "step": step}))
    assert describe(translator, "torch", [str(run / "checkpoint_last.pt")])["scores"] == scores


def strings(value) -> list[str]:
    """Every string in a JSON value, keys included."""
    if isinstance(value, dict):
        return [text for key, item in value.items() for text in (key, *strings(item))]
    if isinstance(value, list):
        return [text for item in value for text in strings(item)]
    return [value] if isinstance(value, str) else []


def test_model_tells_what_a_client_needs_and_no_path_of_the_servers_disk(client, translator, checkpoint, copy_corpus,
                                                                         tmp_path, tmp_path_factory):
    """Neither the files the model was loaded from nor the corpus's folder: the dataset by its own name."""
    from transformer.deploy.release import export_release

    folder = export_release(checkpoint, tmp_path / "release")
    released = describe(Translator.from_pretrained(folder), "torch", model=str(folder))
    with TestClient(create_app(translator, LIMITS, released)) as from_folder:
        answers = [client.get("/model").json(), from_folder.get("/model").json()]
    for answer in answers:
        assert answer["training_data"] == f"{copy_corpus.name} (local files: train, valid)"
        assert answer["decode"]["beam_size"] == 2 and answer["limits"]["max_chars"] == 200
        paths = [text for text in strings(answer) if str(tmp_path_factory.getbasetemp()) in text
                 or "/" in text and Path(text).exists()]
        assert paths == []


# -- bad input ------------------------------------------------------------------------------------
JSON = {"Content-Type": "application/json"}
TOO_BIG = b'{"text": "' + b"a" * (max_body_bytes(LIMITS) + 1) + b'"}'
MALFORMED = [  # path, body bytes, headers, status, what the error says
    ("/translate", b"not json", JSON, 400, "not valid JSON"),
    ("/translate", b'{"text": "a",}', JSON, 400, "not valid JSON"),
    ("/translate", b"[1, 2]", JSON, 400, "must be a JSON object"),
    ("/translate", b'{"text": "a"}', {}, 400, "Content-Type: application/json"),
    ("/translate", b"", JSON, 400, "must be a JSON object"),
    ("/translate", b'{"text": "\xff\xfe ein Mann"}', JSON, 400, "not valid UTF-8"),
    ("/translate", b'{"text": 5}', JSON, 422, "text: must be a string or a list of strings"),
    ("/translate", b'{"text": null}', JSON, 422, "text: must be a string"),
    ("/translate", b'{"text": ["a", 3]}', JSON, 422, "text[1]: Input should be a valid string"),
    ("/translate", b'{"text": "a", "beam_size": "4"}', JSON, 422, "beam_size: Input should be a valid integer"),
    ("/translate", b'{"text": "a", "beam_size": 2.5}', JSON, 422, "beam_size: Input should be a valid integer"),
    ("/translate", b'{"text": "a", "nbest": true}', JSON, 422, "nbest: Input should be a valid integer"),
    ("/translate", b'{"text": "a", "length_penalty": "x"}', JSON, 422, "length_penalty: Input should be"),
    ("/translate", b'{"text": "a", "length_penalty": NaN}', JSON, 422, "length_penalty: Input should be a finite"),
    ("/translate", b'{"text": "a", "length_penalty": 5000}', JSON, 422, "decode.length_penalty must be in [0, 10]"),
    ("/translate", b'{"text": []}', JSON, 422, "text: List should have at least 1 item"),
    ("/translate", b"{}", JSON, 422, "text: required"),
    ("/translate", json.dumps({"text": "a" * 201}).encode(), JSON, 422, "text[0]: 201 characters, more than"),
    ("/translate", json.dumps({"text": ["a"] * 9}).encode(), JSON, 422, "text: 9 sentences, more than"),
    ("/translate", b'{"text": "\\ud800"}', JSON, 422, "text[0]: not valid Unicode"),
    ("/translate", b'{"text": "a", "beam": 4}', JSON, 422, "unknown option 'beam'"),
    ("/translate", b'{"text": "a", "beam_size": 0}', JSON, 422, "decode.beam_size must be >= 1, got 0"),
    ("/translate", b'{"text": "a", "beam_size": 2, "nbest": 3}', JSON, 422, "decode.nbest must be in [1, "),
    ("/translate", b'{"text": "a", "beam_size": 7}', JSON, 422, "beam_size: 7 is more than this server's limit of 6"),
    ("/translate", b'{"text": "a", "beam_size": 100000000000000000000}', JSON, 422,
     "decode.beam_size must be at most 1024"),
    ("/translate", TOO_BIG, JSON, 413, "the body is larger than this server's limit"),
    ("/translate", b'{"text": ["a", "b"], "prefix": ["x"]}', JSON, 422, "prefix: 1 given for 2 sentences"),
    ("/translate", b'{"text": "a", "prefix": 3}', JSON, 422, "prefix: must be a string or a list of strings"),
    ("/translate", b'{"text": "a", "constraints": ["x"]}', JSON, 422, "constraints[0]: Input should be a valid list"),
    ("/translate", b'{"text": "a", "constraints": [["x"], []]}', JSON, 422, "constraints: 2 given for 1 sentences"),
    ("/translate", b'{"text": "a", "constraints": [["ALPHA"]], "sampling": true}', JSON, 422,
     "constraints need beam search"),
    ("/translate", b'{"text": "a", "sampling": true, "nbest": 7}', JSON, 422, "nbest: 7 is more than this server"),
    ("/translate", b'{"text": "a", "sampling": true, "sampling_topp": 0}', JSON, 422, "decode.sampling_topp must be"),
    ("/translate", b'{"text": "a", "seed": "1"}', JSON, 422, "seed: Input should be a valid integer"),
    ("/translate", b'{"text": "a", "seed": -1}', JSON, 422, "decode.seed must be in [0, 2**63), as train.seed, got -1"),
    ("/translate", b'{"text": "a", "alignments": "yes"}', JSON, 422, "alignments: Input should be a valid boolean"),
    ("/attention", b'{"text": " "}', JSON, 422, "text: empty"),
    ("/attention", b'{"text": ["a"]}', JSON, 422, "text: Input should be a valid string"),
    ("/attention", b'{"text": "a", "nbest": 2}', JSON, 422, "unknown option 'nbest'"),
    ("/translate", json.dumps({"text": "a", "prefix": "A" * 201}).encode(), JSON, 422,
     "prefix[0]: 201 characters, more than"),
    ("/translate", json.dumps({"text": "a", "constraints": [[""] * 201]}).encode(), JSON, 422,
     "constraints[0]: 201 characters, more than"),
    ("/nowhere", b"{}", JSON, 404, "Not Found"),
]


@pytest.mark.parametrize("path, body, headers, status, says", MALFORMED, ids=range(len(MALFORMED)))
def test_each_kind_of_bad_input_gets_its_status_and_one_line(client, path, body, headers, status, says):
    response = client.post(path, content=body, headers=headers)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert says in error and "\n" not in error, error


def test_hundreds_of_bad_requests_then_a_good_one(client, translator):
    """TestClient raises any exception the app does not handle, so none of these was a 500."""
    for number in range(300):
        path, body, headers, status, _ = MALFORMED[number % len(MALFORMED)]
        response = client.post(path, content=body, headers=headers)
        assert response.status_code == status and set(response.json()) == {"error"}
    assert client.get("/translate").status_code == 405
    chunked = client.post("/translate", content=iter([TOO_BIG]), headers=JSON)  # no Content-Length: cut while read
    assert chunked.status_code == 413 and "larger than this server's limit" in chunked.json()["error"]
    answer = post(client, "/translate", {"text": ["alpha beta", "gamma"]})
    assert [t["text"] for t in answer["translations"]] == translator.translate(["alpha beta", "gamma"])


def test_a_failure_of_the_translator_is_a_one_line_500_and_the_server_goes_on(translator, checkpoint):
    class Failing:
        """The translator, but its translations fail."""

        def __getattr__(self, name):
            return getattr(translator, name)

        def translate_nbest(self, sentences, *args, **overrides):
            raise RuntimeError("out of memory\nsomewhere")

    app = create_app(Failing(), LIMITS, describe(translator, "torch", [str(checkpoint)]))
    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.post("/translate", json={"text": "alpha"})
        assert response.status_code == 500
        assert response.json() == {"error": "internal error: RuntimeError: out of memory somewhere"}
        assert client.get("/health").json()["status"] == "ready"


def test_attention_takes_one_translation_and_an_engine_without_weights_says_so(translator, checkpoint):
    """/attention translates once whatever the server's nbest (a request cannot set it there); an engine
    without attention weights (onnx) answers 422, not 500."""
    nbest = Translator.from_checkpoint(checkpoint, device="cpu", overrides=["decode.beam_size=4", "decode.nbest=4"])
    with TestClient(create_app(nbest, LIMITS, describe(nbest, "torch", [str(checkpoint)]))) as client:
        answer = post(client, "/attention", {"text": "alpha beta", "beam_size": 2})
        assert answer["target"] == translator.attention("alpha beta", beam_size=2).target_pieces

    class WithoutAttention:  # an engine (`transformer.engine.Engine`) that says it has no attention weights
        supports_attention = False

        def __getattr__(self, name):
            return getattr(translator, name)

    app = create_app(WithoutAttention(), LIMITS, describe(translator, "torch", [str(checkpoint)]))
    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.post("/attention", json={"text": "alpha"})
        assert response.status_code == 422 and "gives no attention weights" in response.json()["error"]


# -- cross-request batching ------------------------------------------------------------------------
def echo_translations(calls: list):
    """A stand-in translator that tags each sentence with its settings and records its calls."""

    def translate_nbest(sentences: list[str], decode: DecodeConfig, prefixes: list[str],
                        constraints: list[list[str]]) -> list[list[tuple[str, float]]]:
        calls.append((list(sentences), decode.beam_size))
        return [[(f"{prefix}{sentence}/{decode.beam_size}{''.join(phrases)}", 0.0)]
                for sentence, prefix, phrases in zip(sentences, prefixes, constraints)]

    return translate_nbest


def run_batcher(config: ServeConfig, requests: list[tuple[list[str], int]], calls: list):
    """Send ``requests`` (sentences, beam size) at once to a `Batcher`; its outcomes, in request order."""

    async def go():
        batcher = Batcher(echo_translations(calls), config)
        batcher.start()
        try:
            return await asyncio.gather(*(batcher.translate(s, DecodeConfig(beam_size=b)) for s, b in requests),
                                        return_exceptions=True)
        finally:
            await batcher.close()

    return asyncio.run(go())


def test_batcher_groups_by_settings_keeps_each_requests_own_slice_and_respects_the_caps():
    requests = [([f"r{i}s{j}" for j in range(i % 3 + 1)], 1 + i % 2) for i in range(12)]
    calls: list = []
    outcomes = run_batcher(ServeConfig(batch_wait_ms=50, max_batch_sentences=10), requests, calls)
    for (sentences, beam), outcome in zip(requests, outcomes):
        assert [hypotheses[0][0] for hypotheses in outcome.results] == [f"{s}/{beam}" for s in sentences]
    assert sorted(s for call, _ in calls for s in call) == sorted(s for r, _ in requests for s in r)
    assert all(len(call) <= 10 for call, _ in calls) and len(calls) < len(requests)
    assert max(o.batch_requests for o in outcomes) > 1

    calls.clear()
    one_at_a_time = run_batcher(ServeConfig(batch_wait_ms=0, max_batch_requests=1), requests, calls)
    assert len(calls) == len(requests) and all(o.batch_requests == 1 for o in one_at_a_time)


def test_batcher_keeps_each_sentences_prefix_and_constraints_with_it():
    async def go():
        batcher = Batcher(echo_translations(calls), ServeConfig(batch_wait_ms=50))
        batcher.start()
        try:
            return await asyncio.gather(batcher.translate(["a", "b"], DecodeConfig(), ["P", ""], [[], ["x", "y"]]),
                                        batcher.translate(["c"], DecodeConfig()),
                                        batcher.translate(["d"], DecodeConfig(), ["Q"], [["z"]]))
        finally:
            await batcher.close()

    calls: list = []
    outcomes = asyncio.run(go())
    assert [[n[0][0] for n in o.results] for o in outcomes] == [["Pa/4", "b/4xy"], ["c/4"], ["Qd/4z"]]
    assert len(calls) == 1  # one call for the three requests


def test_one_requests_bad_input_fails_only_that_request():
    """The translator checks some input itself (a prefix's length, constraints with sampling): a request
    that fails there must not fail the requests batched with it."""
    calls: list = []
    echo = echo_translations(calls)

    def translate_nbest(sentences, decode, prefixes, constraints):
        if "bad" in sentences:
            raise ValueError("sentence 'bad' is bad")
        return echo(sentences, decode, prefixes, constraints)

    async def go():
        batcher = Batcher(translate_nbest, ServeConfig(batch_wait_ms=50))
        batcher.start()
        try:
            return await asyncio.gather(*(batcher.translate(s, DecodeConfig()) for s in (["a"], ["b", "bad"], ["c"])),
                                        return_exceptions=True)
        finally:
            await batcher.close()

    first, failed, last = asyncio.run(go())
    assert [first.results[0][0][0], last.results[0][0][0]] == ["a/4", "c/4"]
    assert isinstance(failed, ValueError) and str(failed) == "sentence 'bad' is bad"


def test_batcher_refuses_beyond_the_queue_limit_and_drains_on_close():
    calls: list = []
    config = ServeConfig(batch_wait_ms=20, max_queued_sentences=5, max_sentences=2)
    outcomes = run_batcher(config, [(["a", "b"], 1)] * 4, calls)
    assert [type(o) for o in outcomes] == [Outcome] * 2 + [Busy] * 2
    assert "sentences are waiting" in str(outcomes[-1])


def gather_requests(batcher_of, requests: list[list[str]]) -> list:
    """Send ``requests`` at once to the `Batcher` that ``batcher_of()`` makes; outcomes or errors, in order."""

    async def go():
        batcher = batcher_of()
        batcher.start()
        try:
            return await asyncio.gather(*(batcher.translate(s, DecodeConfig()) for s in requests),
                                        return_exceptions=True)
        finally:
            await batcher.close()

    return asyncio.run(go())


def test_the_batcher_checks_a_request_before_it_joins_a_shared_call():
    """A request the translator would refuse fails alone, before it is queued: the call its neighbours
    share never sees it (it failed that call, which was then made again request by request)."""
    calls: list = []

    def check(sentences, decode, prefixes, constraints):
        if "bad" in sentences:
            raise ValueError("sentence 'bad' is bad")

    requests = [["a"], ["b", "bad"], ["c"]]
    first, failed, last = gather_requests(lambda: Batcher(echo_translations(calls), ServeConfig(batch_wait_ms=50),
                                                          check), requests)
    assert isinstance(failed, ValueError) and str(failed) == "sentence 'bad' is bad"
    assert [first.results[0][0][0], last.results[0][0][0]] == ["a/4", "c/4"]
    assert calls == [(["a", "c"], 4)]  # one call, shared by the good requests alone


def test_a_failed_shared_call_is_logged_with_its_exception(caplog):
    """A shared call that fails all the same is a failure of the server, not of a request: it is logged
    with its traceback before each request is translated alone (it was swallowed)."""
    calls: list = []
    echo = echo_translations(calls)

    def translate_nbest(sentences, decode, prefixes, constraints):
        if len(sentences) > 1:
            raise RuntimeError("out of memory")
        return echo(sentences, decode, prefixes, constraints)

    with caplog.at_level(logging.ERROR, logger="transformer.serve.batcher"):
        outcomes = gather_requests(lambda: Batcher(translate_nbest, ServeConfig(batch_wait_ms=50)),
                                   [["a"], ["b"], ["c"]])
    assert [o.results[0][0][0] for o in outcomes] == ["a/4", "b/4", "c/4"]
    [record] = [r for r in caplog.records if r.name == "transformer.serve.batcher"]
    assert "a translator call shared by 3 requests (3 sentences) failed" in record.getMessage()
    assert record.levelno == logging.ERROR and record.exc_info[0] is RuntimeError


def wait_until(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_attention_and_alignments_wait_in_the_queue_within_its_limits(translator, checkpoint):
    """/attention and word alignments are work on the model as translations are: queued behind them,
    counted by /health, and a 503 when the queue is full (they went around the queue and its limits)."""
    started, release = threading.Event(), threading.Event()

    class Slow:
        """The translator, but a translation waits for ``release``."""

        def __getattr__(self, name):
            return getattr(translator, name)

        def translate_nbest(self, sentences, *args, **overrides):
            if any(s.strip() for s in sentences):  # the check's empty sentences are not held up
                started.set()
                release.wait(60)
            return translator.translate_nbest(sentences, *args, **overrides)

    limits = ServeConfig(max_sentences=2, max_queued_sentences=2, max_chars=200, batch_wait_ms=0)
    app = create_app(Slow(), limits, describe(translator, "torch", [str(checkpoint)]))
    with TestClient(app) as client, ThreadPoolExecutor(3) as pool:
        try:
            first = pool.submit(client.post, "/translate", json={"text": "alpha"})
            assert started.wait(60)
            attention = pool.submit(client.post, "/attention", json={"text": "beta"})
            wait_until(lambda: client.get("/health").json()["queued_requests"] == 1)
            assert client.get("/health").json() == {"status": "busy", "queued_requests": 1, "queued_sentences": 1}
            aligned = pool.submit(client.post, "/translate", json={"text": "gamma", "alignments": True})
            wait_until(lambda: client.get("/health").json()["queued_sentences"] == 2)
            refused = [client.post(path, json={"text": "delta"}) for path in ("/attention", "/translate")]
        finally:
            release.set()
        assert [r.status_code for r in refused] == [503, 503]
        assert all("2 sentences are waiting (limit 2)" in r.json()["error"] for r in refused)
        assert [f.result().status_code for f in (first, attention, aligned)] == [200] * 3
        assert aligned.result().json()["translations"][0]["alignment"] is not None
        assert client.get("/health").json() == {"status": "ready", "queued_requests": 0, "queued_sentences": 0}


def expected_translations(translator: Translator, requests: list[dict]) -> list[list[str]]:
    return [translator.translate(r["text"], **{k: v for k, v in r.items() if k != "text"}) for r in requests]


def concurrent_requests(sentences: list[str], n: int) -> list[dict]:
    """``n`` requests of 1 to 4 sentences each, alternating greedy and beam search."""
    return [{"text": [sentences[(i + j) % len(sentences)] for j in range(1 + i % 4)], "beam_size": 1 + i % 2}
            for i in range(n)]


async def send_all(url: str, requests: list[dict]) -> list:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        return await asyncio.gather(*(client.post("translate", json=r) for r in requests))


def test_concurrent_clients_each_get_their_own_translations(checkpoint, translator, sentences):
    requests = concurrent_requests(sentences, 24)
    with server_process(["--checkpoint", str(checkpoint), "--batch-wait-ms", "100", "--threads", "1"],
                        subprocess_env()) as server:
        responses = asyncio.run(send_all(server.url, requests))
    assert [r.status_code for r in responses] == [200] * len(requests)
    answers = [r.json() for r in responses]
    assert [[t["text"] for t in a["translations"]] for a in answers] == expected_translations(translator, requests)
    assert max(a["batch"]["requests"] for a in answers) > 1


def decoding_option_requests(sentences: list[str]) -> list[dict]:
    """Requests with prefixes, constraints, samples and alignments, mixed with plain ones."""
    upper = [s.upper().split() for s in sentences]
    return [{"text": sentences[:2], "prefix": [upper[0][-1], ""], "beam_size": 2},
            {"text": sentences[2:4], "constraints": [["KAPPA"], []], "beam_size": 3, "nbest": 2},
            {"text": sentences[:3], "sampling": True, "nbest": 3, "seed": 4, "sampling_temperature": 2.0},
            {"text": sentences[3:], "alignments": True},
            {"text": sentences[1], "prefix": upper[1][0], "constraints": [["ETA"]], "alignments": True},
            {"text": sentences[:2], "beam_size": 2}]


def test_concurrent_requests_with_decoding_options_get_what_the_translator_gives(checkpoint, translator,
                                                                                 sentences):
    requests = decoding_option_requests(sentences) * 2
    with server_process(["--checkpoint", str(checkpoint), "--batch-wait-ms", "200", "--threads", "1"],
                        subprocess_env()) as server:
        responses = asyncio.run(send_all(server.url, requests))
    assert [r.status_code for r in responses] == [200] * len(requests)
    answers = [r.json() for r in responses]
    assert max(a["batch"]["requests"] for a in answers) > 1
    for request, answer in zip(requests, answers):
        text = [request["text"]] if isinstance(request["text"], str) else request["text"]
        options = {k: v for k, v in request.items() if k not in ("text", "prefix", "constraints", "alignments")}
        prefix = [request["prefix"]] if isinstance(request.get("prefix"), str) else request.get("prefix")
        expected = translator.translate_nbest(text, prefixes=prefix, constraints=request.get("constraints"),
                                              **options)
        served = [[h["text"] for h in t["nbest"]] for t in answer["translations"]]
        assert served == [[t for t, _ in n] for n in expected]
        if request.get("alignments"):
            aligned = translator.align(text, [n[0][0] for n in expected])
            assert [t["alignment"] for t in answer["translations"]] == [moses_format(a) for a in aligned]
        else:
            assert all("alignment" not in t for t in answer["translations"])  # only when asked for


def test_sigterm_answers_the_requests_in_flight_then_exits_0(checkpoint, translator, sentences):
    requests = concurrent_requests(sentences, 8)
    with server_process(["--checkpoint", str(checkpoint), "--batch-wait-ms", "500", "--threads", "1"],
                        subprocess_env()) as server:

        async def terminate_mid_flight():
            sent = asyncio.ensure_future(send_all(server.url, requests))
            async with httpx.AsyncClient(base_url=server.url) as client:
                while (await client.get("health")).json()["queued_requests"] < len(requests):
                    await asyncio.sleep(0.02)
            server.process.terminate()  # SIGTERM while every request waits for its batch
            return await sent

        responses = asyncio.run(terminate_mid_flight())
        assert server.process.wait(60) == 0
        assert "Application shutdown complete" in server.log.read_text()
    assert [r.status_code for r in responses] == [200] * len(requests)
    answers = [[t["text"] for t in r.json()["translations"]] for r in responses]
    assert answers == expected_translations(translator, requests)


# -- the command and the CTranslate2 engine -----------------------------------------------------------
def test_command_errors_are_one_line(checkpoint, capsys):
    assert main(["serve"]) == 2
    assert capsys.readouterr().err.strip() == "error: give exactly one of --checkpoint FILE and --model DIR"
    assert main(["serve", "--checkpoint", str(checkpoint), "--max-sentences", "0"]) == 2
    assert capsys.readouterr().err.strip() == "error: --max-sentences must be >= 1, got 0"  # the option's name
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        assert main(["serve", "--checkpoint", str(checkpoint), "--port", str(port)]) == 2
    assert re.fullmatch(rf"error: cannot listen on 127\.0\.0\.1:{port}: .+", capsys.readouterr().err.strip())
    for flags, says in ((["--port", "70000"], "--port must be in [0, 65535], got 70000"),
                        (["--batch-wait-ms", "inf"], "--batch-wait-ms must be in [0, 60000], got inf"),
                        (["--max-queued-sentences", "10"], "--max-queued-sentences (10) must be >= --max-sentences "
                                                           "(64)")):
        assert main(["serve", "--checkpoint", str(checkpoint), *flags]) == 2
        assert capsys.readouterr().err.strip() == f"error: {says}"


@pytest.mark.parametrize("settings, name, value", [
    (["decode.beam_size=50"], "beam_size", 50),
    (["--beam-size", "7"], "beam_size", 7),
    (["decode.sampling=true", "decode.nbest=7"], "nbest", 7),  # samples per sentence
])
def test_default_settings_beyond_the_limits_are_refused_at_startup(checkpoint, capsys, settings, name, value):
    """The server started, then refused every request that kept its default beam with a 422."""
    assert main(["serve", "--checkpoint", str(checkpoint), "--port", "0", "--max-beam-size", "6", *settings]) == 2
    assert capsys.readouterr().err == (f"error: decode.{name}={value} is more than this server's limit of 6: "
                                       f"lower it, or raise --max-beam-size\n")


def test_a_damaged_ctranslate2_folder_is_one_line(checkpoint, tmp_path, capsys):
    pytest.importorskip("ctranslate2", reason="the export extra (ctranslate2) is not installed")
    from transformer.deploy.ctranslate2_export import export_ctranslate2

    folder = export_ctranslate2(checkpoint, tmp_path / "ct2")
    weights = folder / "model.bin"
    weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2])
    assert main(["serve", "--engine", "ctranslate2", "--model", str(folder)]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: {weights}: not the file this folder was exported with") and error.count("\n") == 1
    (folder / "SHA256SUMS").unlink()  # as a folder exported before it was written: CTranslate2's own error
    assert main(["serve", "--engine", "ctranslate2", "--model", str(folder)]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: {folder}: cannot load this CTranslate2 model (") and error.count("\n") == 1


def test_the_ctranslate2_engine_serves_the_same_api(checkpoint, sentences, tmp_path):
    pytest.importorskip("ctranslate2", reason="the export extra (ctranslate2) is not installed")
    from transformer.deploy.ctranslate2 import CTranslate2Translator
    from transformer.deploy.ctranslate2_export import export_ctranslate2

    engine = CTranslate2Translator(export_ctranslate2(checkpoint, tmp_path / "ct2"), compute_type="float32")
    app = create_app(engine, LIMITS, describe(engine, "ctranslate2", model=str(tmp_path / "ct2")))
    with TestClient(app) as client:
        found = post(client, "/translate", {"text": sentences, "beam_size": 2, "nbest": 2})["translations"]
        assert [[(h["text"], h["score"]) for h in t["nbest"]] for t in found] == engine.translate_nbest(
            sentences, beam_size=2, nbest=2)
        attention = post(client, "/attention", {"text": sentences[0]})
        assert len(attention["weights"]) == len(attention["target"])
        assert {len(row) for row in attention["weights"]} == {len(attention["source"])}
        assert client.get("/model").json()["engine"] == "ctranslate2"
