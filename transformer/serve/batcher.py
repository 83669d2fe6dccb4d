"""Cross-request batching: concurrent requests share the translator's calls, each getting back its own results.

Requests join a queue. One worker task waits until the oldest request has waited ``batch_wait_ms``
(or a batch is full), takes the oldest requests that fit in ``max_batch_sentences`` and
``max_batch_requests``, groups them by decoding settings, and calls the translator once per group
on a single thread (the model is never used by two calls at once). The translator returns its
outputs in input order, so each request's results are the slice at its own offset; a call that
fails is made again request by request, so that one request's bad input fails only it. Every
sentence is searched on its own (padding is masked), so what else shares a batch changes no
translation (tests/test_serve.py compares concurrent with single requests).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from transformer.config import DecodeConfig, ServeConfig

Nbest = list[list[tuple[str, float]]]  # per sentence: (translation, score), best first
# translate_nbest(sentences, decode, prefixes, constraints): one prefix ("" for none) and one list of
# constraint phrases per sentence
TranslateNbest = Callable[[list[str], DecodeConfig, list[str], list[list[str]]], Nbest]
R = TypeVar("R")


class Busy(Exception):
    """The queue is full or the server is stopping: the request may be sent again later (503)."""


@dataclass
class Outcome:
    """What one request gets back: its own results and how its batch went."""

    results: Nbest
    queue_ms: float  # from arrival to the start of its translator call
    translate_ms: float  # that call
    batch_requests: int  # requests sharing that call
    batch_sentences: int


@dataclass
class _Job:
    sentences: list[str]
    decode: DecodeConfig
    prefixes: list[str]
    constraints: list[list[str]]
    future: asyncio.Future[Outcome]
    arrived: float


class Batcher:
    """Gathers concurrent requests into calls of ``translate_nbest(sentences, decode, prefixes, constraints)``."""

    def __init__(self, translate_nbest: TranslateNbest, config: ServeConfig) -> None:
        self.translate_nbest, self.config = translate_nbest, config
        self.translating = False
        self._waiting: deque[_Job] = deque()
        self._arrived = asyncio.Event()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="translator")
        self._worker: asyncio.Task[None] | None = None
        self._closing = False

    @property
    def queued_requests(self) -> int:
        return len(self._waiting)

    @property
    def queued_sentences(self) -> int:
        return sum(len(job.sentences) for job in self._waiting)

    def start(self) -> None:
        """Start the worker task on the running event loop (the app's startup)."""
        self._worker = asyncio.create_task(self._work())

    async def close(self) -> None:
        """Refuse new requests, translate those already queued, then stop (the app's shutdown)."""
        self._closing = True
        self._arrived.set()
        if self._worker is not None:
            await self._worker
        self._executor.shutdown()

    async def translate(self, sentences: list[str], decode: DecodeConfig, prefixes: list[str] | None = None,
                        constraints: list[list[str]] | None = None) -> Outcome:
        """Queue ``sentences`` (with a prefix and constraint phrases each, or none) and wait for their
        translations; `Busy` when they cannot be queued."""
        if self._closing:
            raise Busy("the server is shutting down")
        if self.queued_sentences + len(sentences) > self.config.max_queued_sentences:
            raise Busy(f"{self.queued_sentences} sentences are waiting (limit {self.config.max_queued_sentences}); "
                       "try again later")
        job = _Job(sentences, decode, prefixes or [""] * len(sentences), constraints or [[] for _ in sentences],
                   asyncio.get_running_loop().create_future(), time.perf_counter())
        self._waiting.append(job)
        self._arrived.set()
        return await job.future

    async def run(self, function: Callable[..., R], *args: Any) -> R:
        """Run ``function(*args)`` on the translator's thread, between batches (for work outside them)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)

    async def _work(self) -> None:
        while self._waiting or not self._closing:
            if not self._waiting:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            await self._gather()
            await self._translate(self._take())

    def _full(self) -> bool:
        return (self.queued_sentences >= self.config.max_batch_sentences
                or len(self._waiting) >= self.config.max_batch_requests)

    async def _gather(self) -> None:
        """Wait until the oldest request has waited ``batch_wait_ms``, a batch is full, or the server stops."""
        deadline = self._waiting[0].arrived + self.config.batch_wait_ms / 1000
        while not self._closing and not self._full():
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except asyncio.TimeoutError:
                return

    def _take(self) -> list[_Job]:
        """The oldest requests that fit in one batch: at least one, however many sentences it has."""
        batch = [self._waiting.popleft()]
        sentences = len(batch[0].sentences)
        while (self._waiting and len(batch) < self.config.max_batch_requests
               and sentences + len(self._waiting[0].sentences) <= self.config.max_batch_sentences):
            batch.append(self._waiting.popleft())
            sentences += len(batch[-1].sentences)
        return batch

    async def _translate(self, batch: list[_Job]) -> None:
        """One translator call per decoding setting; each request's future gets its own slice."""
        groups: dict[tuple, list[_Job]] = {}
        for job in batch:
            if not job.future.done():  # done: the client went away and its request was cancelled
                groups.setdefault(dataclasses.astuple(job.decode), []).append(job)
        for jobs in groups.values():
            await self._answer(jobs)

    async def _answer(self, jobs: list[_Job]) -> None:
        """Translate ``jobs`` in one call. If it fails, each request is translated alone: one request's
        bad input (a prefix too long, constraints with sampling) is its own error, not its neighbours'."""
        sentences = [sentence for job in jobs for sentence in job.sentences]
        prefixes = [prefix for job in jobs for prefix in job.prefixes]
        constraints = [phrases for job in jobs for phrases in job.constraints]
        start = time.perf_counter()
        self.translating = True
        try:
            results = await self.run(self.translate_nbest, sentences, jobs[0].decode, prefixes, constraints)
        except Exception as error:  # the request answers with it; the server goes on
            if len(jobs) > 1:
                for job in (job for job in jobs if not job.future.done()):
                    await self._answer([job])
            elif not jobs[0].future.done():
                jobs[0].future.set_exception(error)
            return
        finally:
            self.translating = False
        translate_ms = (time.perf_counter() - start) * 1000
        offset = 0
        for job in jobs:
            own = results[offset:offset + len(job.sentences)]
            offset += len(job.sentences)
            if not job.future.done():
                job.future.set_result(Outcome(own, (start - job.arrived) * 1000, translate_ms, len(jobs),
                                              len(sentences)))
