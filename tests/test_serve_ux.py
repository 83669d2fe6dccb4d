"""transformer-serve as a demanding user meets it: clients that go away, bodies beyond Python's JSON limits, a
multilingual model's errors in the request's own names, the command's start-up line and its listening checks.

The model is the copy task's (`quick_copy_run`); the app runs in-process, driven over ASGI where a test needs a
client that disconnects (TestClient cannot), and the command through `transformer.cli.main`.
"""

import asyncio
import copy
import dataclasses
import importlib
import json
import socket
import subprocess
import sys
import threading

import pytest
from conftest import subprocess_env

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
pytest.importorskip("httpx", reason="the dev extra (httpx) is not installed")

from fastapi.testclient import TestClient  # noqa: E402

from transformer.cli import main  # noqa: E402
from transformer.config import DecodeConfig  # noqa: E402
from transformer.decoding.translator import Translator  # noqa: E402
from transformer.serve.app import create_app  # noqa: E402
from transformer.serve.batcher import Batcher  # noqa: E402
from transformer.serve.config import ServeConfig  # noqa: E402
from transformer.serve.model_info import describe  # noqa: E402

LIMITS = ServeConfig(max_sentences=8, max_chars=200, max_beam_size=6, batch_wait_ms=0, max_batch_requests=1)


@pytest.fixture(scope="module")
def checkpoint(quick_copy_run):
    return quick_copy_run / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def translator(checkpoint):
    return Translator.from_checkpoint(checkpoint, device="cpu")


class Blocking:
    """The translator, but a call with the sentence "hold" waits until ``release`` is set; records what it
    translates (the checks' calls of empty sentences left out)."""

    def __init__(self, translator: Translator) -> None:
        self.translator, self.release, self.translated = translator, threading.Event(), []

    def __getattr__(self, name):
        return getattr(self.translator, name)

    def translate_nbest(self, sentences, *args, **overrides):
        if any(sentences):
            self.translated.extend(sentences)
        if "hold" in sentences:
            self.release.wait(30)
        return self.translator.translate_nbest(sentences, *args, **overrides)


async def asgi_post(app, path: str, body: dict, disconnect: asyncio.Event) -> list[dict]:
    """POST ``body`` to the ASGI ``app`` from a client that disconnects when ``disconnect`` is set; the
    messages the app sent."""
    data, sent, messages = json.dumps(body).encode(), [], []
    messages.append({"type": "http.request", "body": data, "more_body": False})

    async def receive():
        if messages:
            return messages.pop(0)
        await disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
             "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000)}
    await app(scope, receive, send)
    return sent


def status_of(sent: list[dict]) -> int:
    return next(message["status"] for message in sent if message["type"] == "http.response.start")


# -- clients that go away ------------------------------------------------------------------------------
@pytest.mark.parametrize("path, body", [("/translate", {"text": ["gone", "away"]}), ("/attention", {"text": "gone"})])
def test_a_request_whose_client_disconnects_leaves_the_queue_untranslated(translator, checkpoint, path, body):
    """uvicorn does not cancel a handler whose client went away: such a request stayed queued and was translated
    all the same, and every request behind it waited for that work (12 clients gone at beam 16 kept a 2-core
    server busy for 3 s before a one-word request was answered)."""
    engine = Blocking(translator)
    app = create_app(engine, LIMITS, describe(translator, "torch", [str(checkpoint)]))

    async def go():
        async with app.router.lifespan_context(app):
            batcher = app.state.batcher
            never = asyncio.Event()
            held = asyncio.ensure_future(asgi_post(app, "/translate", {"text": "hold"}, never))
            while not batcher.translating:
                await asyncio.sleep(0.01)
            leaving = asyncio.Event()
            gone = asyncio.ensure_future(asgi_post(app, path, body, leaving))
            while batcher.queued_requests < 1:
                await asyncio.sleep(0.01)
            leaving.set()
            try:
                await asyncio.wait_for(asyncio.shield(gone), 5)  # answered at once, though the translator is busy
                assert batcher.queued_requests == 0
            finally:
                engine.release.set()
            assert status_of(await held) == 200
            assert status_of(await gone) == 499
            after = await asgi_post(app, "/translate", {"text": "alpha"}, never)  # the server goes on
            assert status_of(after) == 200
        assert "gone" not in engine.translated and engine.translated == ["hold", "alpha"]

    asyncio.run(go())


def test_a_cancelled_request_leaves_the_batchers_queue_and_the_worker_goes_on():
    """Cancelled while it waits, a request is taken out of the queue (its length, /health and the 503 limit count
    only requests someone waits for); cancelled while the worker gathers a batch around it, the worker goes on."""
    translated, release = [], threading.Event()

    def translate_nbest(sentences, decode, prefixes, constraints):
        translated.extend(sentences)
        if "hold" in sentences:
            release.wait(30)
        return [[(sentence, 0.0)] for sentence in sentences]

    async def go():
        batcher = Batcher(translate_nbest, ServeConfig(batch_wait_ms=0, max_batch_requests=1))
        batcher.start()
        held = asyncio.ensure_future(batcher.translate(["hold"], DecodeConfig()))
        while not batcher.translating:
            await asyncio.sleep(0.01)
        waiting = asyncio.ensure_future(batcher.translate(["gone"], DecodeConfig()))
        await asyncio.sleep(0.05)
        assert (batcher.queued_requests, batcher.queued_sentences) == (1, 1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert (batcher.queued_requests, batcher.queued_sentences) == (0, 0)
        release.set()
        assert (await held).results == [[("hold", 0.0)]]
        await batcher.close()

        gathering = Batcher(translate_nbest, ServeConfig(batch_wait_ms=200))
        gathering.start()
        first = asyncio.ensure_future(gathering.translate(["cancelled while gathered"], DecodeConfig()))
        await asyncio.sleep(0.05)
        first.cancel()
        await asyncio.sleep(0.3)
        assert (await gathering.translate(["next"], DecodeConfig())).results == [[("next", 0.0)]]
        await gathering.close()

    asyncio.run(go())
    assert translated == ["hold", "next"]


# -- bodies Python's JSON parser refuses ------------------------------------------------------------------
@pytest.mark.parametrize("body, says", [
    (b'{"text": ' + b"[" * 20_000 + b"]" * 20_000 + b"}", "the body is not valid JSON (nested too deeply)"),
    (b'{"text": "a", "seed": ' + b"9" * 5000 + b"}", "the body is not valid JSON (a number of more than"),
])
def test_a_body_beyond_pythons_json_limits_says_what_is_wrong(translator, checkpoint, body, says):
    """FastAPI answered only "There was an error parsing the body", which names nothing the client can fix."""
    with TestClient(create_app(translator, LIMITS, describe(translator, "torch", [str(checkpoint)]))) as client:
        response = client.post("/translate", content=body, headers={"Content-Type": "application/json"})
        assert response.status_code == 400 and response.json()["error"].startswith(says), response.text
        assert "\n" not in response.json()["error"] and "set_int_max_str_digits" not in response.json()["error"]
        assert client.post("/translate", json={"text": "alpha"}).status_code == 200


# -- GET /model -----------------------------------------------------------------------------------------
def test_model_says_the_weights_are_int8(translator, checkpoint):
    """Under --quantize int8, /model said precision fp32 and nothing else: a client could not tell the int8
    model from the fp32 one whose scores it reports."""
    int8 = Translator.from_checkpoint(checkpoint, device="cpu", quantize="int8")
    assert describe(int8, "torch", [str(checkpoint)])["quantize"] == "int8"
    assert describe(translator, "torch", [str(checkpoint)])["quantize"] is None


# -- a multilingual model --------------------------------------------------------------------------------
def multilingual(translator: Translator) -> Translator:
    """The copy model as if trained on two directions (src-tgt, tgt-src): its sources need a target language."""
    model = copy.copy(translator)
    model.data = dataclasses.replace(translator.data, pairs=["src-tgt", "tgt-src"], joint_vocab=True)
    return model


@pytest.mark.parametrize("path, body, says", [
    ("/translate", {"text": ["<2tgt> alpha", "<2xx> beta"]}, "text[1] leads with <2xx>, the tag of no language"),
    ("/translate", {"text": ["alpha", "<2src> beta"], "tgt_lang": "tgt"}, "text[1] leads with the tag <2src>"),
    ("/attention", {"text": "<2src> beta", "tgt_lang": "tgt"}, "text leads with the tag <2src>"),
])
def test_a_multilingual_models_errors_name_the_sentence_as_the_request_does(translator, checkpoint, path, body,
                                                                            says):
    """They said "sentence 2", counted from 1, where every other error of the API says text[1]."""
    model = multilingual(translator)
    with TestClient(create_app(model, LIMITS, describe(model, "torch", [str(checkpoint)]))) as client:
        response = client.post(path, json=body)
        assert response.status_code == 422 and response.json()["error"].startswith(says), response.text


# -- the command -----------------------------------------------------------------------------------------
def test_the_start_up_line_names_every_direction_and_a_valid_url():
    """A multilingual model's line named only its default direction (en→de for six), and an IPv6 host's URL
    had no brackets (http://::1:8000/)."""
    from transformer.cli.serve import banner

    info = {"directions": ["en→de", "de→en", "en→fr"], "source_language": "en", "target_language": "de"}
    assert banner(info, "127.0.0.1", 8000) == ("transformer-serve: en→de, de→en, en→fr on http://127.0.0.1:8000/ "
                                               "(API documentation: /docs)")
    assert " on http://[::1]:8000/ " in banner({"directions": ["de→en"]}, "::1", 8000)


def not_loaded(*args, **kwargs):
    """`load_translator` for a command that must fail before it loads the model (the package's `serve` is the
    command's function, hence `importlib` to reach the module)."""
    raise AssertionError("the model loaded before the address to listen on was checked")


def test_an_empty_host_is_refused(checkpoint, capsys, monkeypatch):
    """--host "" (an unset variable) listened on every interface and printed http://:PORT/."""
    monkeypatch.setattr(importlib.import_module("transformer.cli.serve"), "load_translator", not_loaded)
    assert main(["serve", "--checkpoint", str(checkpoint), "--host", "", "--port", "0"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: --host is empty") and "\n" not in error


def test_a_port_in_use_is_said_before_the_model_loads(checkpoint, capsys, monkeypatch):
    """The port was bound only after the model had loaded: a port in use was said seconds (a large model:
    minutes) after the command started."""
    monkeypatch.setattr(importlib.import_module("transformer.cli.serve"), "load_translator", not_loaded)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--checkpoint", str(checkpoint), "--host", "127.0.0.1", "--port", str(port)]) == 2
    error = capsys.readouterr().err.strip()
    assert error == f"error: cannot listen on 127.0.0.1:{port}: Address already in use"


def test_a_model_that_fails_to_load_leaves_no_socket_open():
    """The port is taken before the model loads; a load that failed left the socket open (a ResourceWarning)."""
    code = "from transformer.cli import main; main(['serve', '--checkpoint', '/nonexistent.pt', '--port', '0'])"
    result = subprocess.run([sys.executable, "-X", "dev", "-c", code], capture_output=True, text=True, timeout=120,
                            env=subprocess_env())
    assert "checkpoint not found" in result.stderr and "ResourceWarning" not in result.stderr, result.stderr


def test_the_serve_extra_installs_what_serving_a_release_folder_needs():
    # `pip install -e ".[serve]" && transformer-serve --model FOLDER` (the README's) stopped with "release folders
    # need safetensors": it came with the export extra alone
    import configparser

    from conftest import ROOT

    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    serve = {line.split(">")[0].split("=")[0].strip() for line in setup["options.extras_require"]["serve"].split()}
    assert {"fastapi", "uvicorn", "safetensors"} <= serve
