"""The web application of ``transformer-serve``: the REST API, its OpenAPI documentation and a page to try it.

    POST /translate   {"text": "..." or [...], "beam_size", "nbest", "length_penalty", "prefix", "constraints",
                      "alignments", "sampling", "sampling_topk", "sampling_topp", "sampling_temperature", "seed"}:
                      translations with their n-best lists (or samples), scores, word alignments and timing
                      (requests share batches: `batcher.py`)
    POST /attention   {"text": "...", ...}: the subwords and the last decoder layer's cross-attention
    GET  /health      ready or busy, and what is queued
    GET  /model       languages, the model's and the decoding settings, the scores reported for it
    GET  /docs        the OpenAPI documentation (/openapi.json)
    GET  /            the page (static/index.html, static/app.js)

Every error is a JSON object {"error": "one line"}: 400 a body that is not a JSON object (or not
UTF-8), 413 a body larger than the limits allow, 422 a field of the wrong type, a wrong value, an
unknown option or a request beyond a limit (`ServeConfig`), 503 when the queue is full or the
server is stopping. A failure of the server itself is a 500 with the same shape, and the server
goes on. A request whose client disconnects before its answer is taken out of the queue (its 499 is
never sent: nobody is there to read it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from transformer import __version__
from transformer.config import ConfigError, DecodeConfig
from transformer.decoding.alignment import moses_format
from transformer.engine import Engine
from transformer.errors import InputError
from transformer.serve.batcher import Batcher
from transformer.serve.config import ServeConfig
from transformer.serve.errors import ERRORS, BodyLimit, ClientGone, add_error_handlers
from transformer.serve.schema import (
    AttentionRequest,
    AttentionResponse,
    BatchInfo,
    DecodeOptions,
    Health,
    Hypothesis,
    Timing,
    TranslateRequest,
    TranslateResponse,
    Translation,
)

STATIC = Path(__file__).parent / "static"
R = TypeVar("R")


def max_body_bytes(config: ServeConfig) -> int:
    """The largest body a request within the limits can need: its sentences, prefixes and constraints
    (`_check_size`), every character written as a JSON escape of a surrogate pair (12 bytes), plus room
    for the options."""
    return 3 * 12 * config.max_sentences * config.max_chars + 4096


def create_app(translator: Engine, config: ServeConfig, info: dict[str, Any]) -> FastAPI:
    """The application serving ``translator`` (any engine); ``info`` is what /model says. Default decoding
    settings beyond the limits are a ConfigError here: else every request that keeps them would be refused."""
    beyond = beyond_limit(translator.decode, config)
    if beyond:
        raise ConfigError(f"decode.{beyond[0]}={beyond[1]} is more than this server's limit of "
                          f"{config.max_beam_size}: lower it, or raise --max-beam-size")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        def translate_nbest(sentences: list[str], decode: DecodeConfig, prefixes: list[str],
                            constraints: list[list[str]]) -> list[list[tuple[str, float]]]:
            settings = dataclasses.asdict(decode)
            del settings["fast_paths"]  # chosen when the model loads, refused per call
            return translator.translate_nbest(sentences, False, prefixes, constraints, **settings)

        def check(sentences: list[str], decode: DecodeConfig, prefixes: list[str],
                  constraints: list[list[str]]) -> None:
            """The translator's own checks of the prefixes and constraints: empty sentences are not searched."""
            translate_nbest([""] * len(sentences), decode, prefixes, constraints)

        app.state.batcher = Batcher(translate_nbest, config, check)
        app.state.batcher.start()
        yield
        await app.state.batcher.close()  # SIGTERM: uvicorn has let the requests in flight finish; drain the rest

    pair = ", ".join(info["directions"])
    app = FastAPI(title=f"transformer-serve ({pair})", version=__version__, lifespan=lifespan,
                  description=f"Translate {pair} with an encoder-decoder Transformer. Errors are "
                              '`{"error": "one line"}`.')
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes(config))
    add_error_handlers(app)

    @app.post("/translate", response_model=TranslateResponse, responses=ERRORS, response_model_exclude_none=True)
    async def translate(request: TranslateRequest, http: Request) -> TranslateResponse:
        """Translate one sentence or a list; each gets its n-best list, best first."""
        start = time.perf_counter()
        decode = _settings(translator, request, config)
        _check_size(request.text, config, request.prefix, request.constraints)
        if request.alignments and not translator.supports_alignment:
            raise InputError("alignments: this server's engine has no cross-attention to align with (use torch)")
        # tagged: requests of any language batch; an error names a sentence as the request does
        names = [f"text[{i}]" for i in range(len(request.text))]
        sources = translator.model_inputs(request.text, request.tgt_lang, names)
        align = functools.partial(_align, translator, sources) if request.alignments else None
        outcome = await _while_connected(http, app.state.batcher.translate(sources, decode, request.prefix,
                                                                           request.constraints, align))
        truncated = set(translator.too_long(sources))
        alignments = iter(outcome.follow_up or [])
        translations = []
        for i, hypotheses in enumerate(outcome.results):
            nbest = [Hypothesis(text=text, score=score, alignment=_moses(alignments)) for text, score in hypotheses]
            translations.append(Translation(**nbest[0].model_dump(), nbest=nbest, truncated=i in truncated))
        timing = Timing(queue_ms=outcome.queue_ms, translate_ms=outcome.translate_ms,
                        total_ms=(time.perf_counter() - start) * 1000)
        batch = BatchInfo(requests=outcome.batch_requests, sentences=outcome.batch_sentences)
        return TranslateResponse(translations=translations, timing=timing, batch=batch)

    @app.post("/attention", response_model=AttentionResponse, responses=ERRORS)
    async def attention(request: AttentionRequest, http: Request) -> AttentionResponse:
        """Translate one sentence; its cross-attention in the last decoder layer, mean over heads, for a heatmap."""
        _settings(translator, request, config, nbest=1)  # one translation, whatever the server's nbest
        _check_size([request.text], config)
        if not translator.supports_attention:
            raise InputError("this server's engine gives no attention weights (the torch and ctranslate2 ones do)")
        (source,) = translator.model_inputs([request.text], request.tgt_lang, ["text"])
        if not source.strip():  # a tag alone is blank too
            raise InputError("text: empty; give a sentence to translate")
        found = await _while_connected(http, app.state.batcher.run(
            functools.partial(translator.attention, source, **request.overrides())))
        weights = found.weights[-1].mean(0)  # (layers, heads, T, S) -> (T, S)
        return AttentionResponse(source=found.source_pieces, target=found.target_pieces, weights=weights.tolist())

    @app.get("/health", response_model=Health)
    async def health() -> Health:
        """Ready, or busy (translating, or requests waiting), with the queue's length."""
        batcher: Batcher = app.state.batcher
        busy = batcher.translating or batcher.queued_requests > 0
        return Health(status="busy" if busy else "ready", queued_requests=batcher.queued_requests,
                      queued_sentences=batcher.queued_sentences)

    @app.get("/model")
    async def model() -> dict[str, Any]:
        """The languages, the model's and the decoding settings, the limits, and the scores reported for it."""
        return {**info, "limits": dataclasses.asdict(config)}

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


async def _while_connected(request: Request, work: Awaitable[R]) -> R:
    """``work``'s result, or `ClientGone` as soon as the client disconnects, ``work`` then cancelled: uvicorn
    does not cancel a handler whose client went away, and a request nobody waits for would still be translated,
    delaying every request queued behind it (clients that time out and retry would pile up work)."""
    task, gone = asyncio.ensure_future(work), asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():  # the client went away, or this handler was cancelled
            task.cancel()
    if not task.done():
        raise ClientGone("the client closed the connection before its answer was ready")
    return task.result()


async def _disconnect(request: Request) -> None:
    """Return when the client disconnects: once the body is read, the server's next message is that one."""
    while (await request.receive())["type"] != "http.disconnect":
        await asyncio.sleep(0.05)  # a server that repeats empty body messages would otherwise keep this loop busy


def _settings(translator: Engine, request: DecodeOptions, config: ServeConfig, **fixed: Any) -> DecodeConfig:
    """The request's decoding settings, with those the endpoint ``fixed``, checked by `DecodeConfig` and against
    the server's beam limit (which also bounds the samples per sentence)."""
    decode = translator.settings(**request.overrides(), **fixed)
    beyond = beyond_limit(decode, config)
    if beyond:
        raise InputError(f"{beyond[0]}: {beyond[1]} is more than this server's limit of {config.max_beam_size}")
    return decode


def beyond_limit(decode: DecodeConfig, config: ServeConfig) -> tuple[str, int] | None:
    """The first setting beyond the server's limits, with its value: the beam or the n-best list (or the
    samples per sentence) beyond ``max_beam_size``; None when all are within them."""
    return next(((name, getattr(decode, name)) for name in ("beam_size", "nbest")
                 if getattr(decode, name) > config.max_beam_size), None)


def _align(translator: Engine, sentences: list[str],
           results: list[list[tuple[str, float]]]) -> list[list[tuple[int, int]]]:
    """The word alignment of each translation in ``results`` (n-best lists, in order) with its sentence."""
    return translator.align([s for s, found in zip(sentences, results) for _ in found],
                            [text for found in results for text, _ in found])


def _moses(alignments: Iterator[list[tuple[int, int]]]) -> str | None:
    """The next alignment in Moses notation; None when none was asked for."""
    pairs = next(alignments, None)
    return None if pairs is None else moses_format(pairs)


def _check_size(sentences: list[str], config: ServeConfig, prefixes: list[str] | None = None,
                constraints: list[list[str]] | None = None) -> None:
    """At most ``max_sentences`` sentences of ``max_chars`` characters; a sentence's prefix, and all its
    constraint phrases together (a character more for each), at most ``max_chars`` too: both lengthen the search."""
    if len(sentences) > config.max_sentences:
        raise InputError(f"text: {len(sentences)} sentences, more than this server's limit of "
                         f"{config.max_sentences} per request")
    sizes = [(f"text[{i}]", len(sentence)) for i, sentence in enumerate(sentences)]
    sizes += [(f"prefix[{i}]", len(prefix)) for i, prefix in enumerate(prefixes or [])]
    sizes += [(f"constraints[{i}]", sum(len(phrase) + 1 for phrase in phrases))  # + 1: a separator each
              for i, phrases in enumerate(constraints or [])]
    for name, size in sizes:
        if size > config.max_chars:
            raise InputError(f"{name}: {size} characters, more than this server's limit of {config.max_chars}")
