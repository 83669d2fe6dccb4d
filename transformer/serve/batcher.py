"""Cross-request batching: concurrent requests share the translator's calls, each getting back its own results.

Requests join a queue. One worker task waits until the oldest request has waited ``batch_wait_ms``
(or a batch is full), takes the oldest requests that fit in ``max_batch_sentences`` and
``max_batch_requests``, groups them by decoding settings, and calls the translator once per group
on a single thread (the model is never used by two calls at once). The translator returns its
outputs in input order, so each request's results are the slice at its own offset. Every sentence
is searched on its own (padding is masked), so what else shares a batch changes no translation
(tests/test_serve.py compares concurrent with single requests).

A request is checked before it is queued (``check``: the translator's own checks of its prefixes and
constraints), so that bad input fails alone and never a call it would share. A shared call that fails
all the same is logged and made again request by request, so that one request's error is its own.
Other work on the model (/attention) waits in the same queue, within the same limits, as a request
of its own: the queue's length and /health count everything the translator is asked to do. A request
cancelled while it waits (its client went away: `app.py`) leaves the queue and is never translated.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from transformer.config import DecodeConfig
from transformer.serve.config import ServeConfig

Nbest = list[list[tuple[str, float]]]  # per sentence: (translation, score), best first
# translate_nbest(sentences, decode, prefixes, constraints): one prefix ("" for none) and one list of
# constraint phrases per sentence
TranslateNbest = Callable[[list[str], DecodeConfig, list[str], list[list[str]]], Nbest]
Check = Callable[[list[str], DecodeConfig, list[str], list[list[str]]], None]  # raises for input it refuses
FollowUp = Callable[[Nbest], Any]  # more work on a request's own results (its word alignments)
R = TypeVar("R")
log = logging.getLogger(__name__)


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
    follow_up: Any = None  # what the request's follow-up gave


@dataclass
class _Job:
    """A translation request: batched with others of the same decoding settings."""

    sentences: list[str]
    decode: DecodeConfig
    prefixes: list[str]
    constraints: list[list[str]]
    follow_up: FollowUp | None
    future: asyncio.Future[Outcome]
    arrived: float

    @property
    def size(self) -> int:
        return len(self.sentences)


@dataclass
class _Work:
    """Other work on the translator's thread: never batched, counted in the queue as ``size`` sentences."""

    function: Callable[[], Any]
    size: int
    future: asyncio.Future[Any]
    arrived: float


class Batcher:
    """Gathers concurrent requests into calls of ``translate_nbest(sentences, decode, prefixes, constraints)``,
    each request checked first by ``check(sentences, decode, prefixes, constraints)`` (none: not checked)."""

    def __init__(self, translate_nbest: TranslateNbest, config: ServeConfig, check: Check | None = None) -> None:
        self.translate_nbest, self.config, self.check = translate_nbest, config, check
        self.translating = False
        self._waiting: deque[_Job | _Work] = deque()
        self._arrived = asyncio.Event()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="translator")
        self._worker: asyncio.Task[None] | None = None
        self._closing = False

    @property
    def queued_requests(self) -> int:
        return len(self._waiting)

    @property
    def queued_sentences(self) -> int:
        return sum(job.size for job in self._waiting)

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
                        constraints: list[list[str]] | None = None, follow_up: FollowUp | None = None) -> Outcome:
        """Check and queue ``sentences`` (with a prefix and constraint phrases each, or none) and wait for their
        translations; ``follow_up(results)`` then runs on the translator's thread, its value in the outcome.
        `Busy` when they cannot be queued; the check's error when it refuses them."""
        prefixes, constraints = prefixes or [""] * len(sentences), constraints or [[] for _ in sentences]
        if self.check is not None:
            self.check(sentences, decode, prefixes, constraints)
        return await self._queue(_Job(sentences, decode, prefixes, constraints, follow_up, self._future(),
                                      time.perf_counter()))

    async def run(self, function: Callable[..., R], *args: Any, sentences: int = 1) -> R:
        """Run ``function(*args)`` on the translator's thread as a request of its own, queued and counted as
        ``sentences`` sentences: `Busy` when they cannot be queued."""
        return await self._queue(_Work(functools.partial(function, *args), sentences, self._future(),
                                       time.perf_counter()))

    def _future(self) -> asyncio.Future[Any]:
        return asyncio.get_running_loop().create_future()

    async def _queue(self, job: _Job | _Work) -> Any:
        if self._closing:
            raise Busy("the server is shutting down")
        if self.queued_sentences + job.size > self.config.max_queued_sentences:
            raise Busy(f"{self.queued_sentences} sentences are waiting (limit {self.config.max_queued_sentences}); "
                       "try again later")
        self._waiting.append(job)
        self._arrived.set()
        try:
            return await job.future
        except asyncio.CancelledError:  # its client went away: leave the queue, so that no call translates it
            self._leave(job)
            raise

    def _leave(self, job: _Job | _Work) -> None:
        """Take ``job`` out of the queue if it is still waiting (by identity: two requests may be equal)."""
        for index, waiting in enumerate(self._waiting):
            if waiting is job:
                del self._waiting[index]
                return

    async def _work(self) -> None:
        while self._waiting or not self._closing:
            if not self._waiting:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            if isinstance(self._waiting[0], _Job):
                await self._gather()
                if not self._waiting:  # the requests it waited with were cancelled meanwhile
                    continue
            batch = self._take()
            self.translating = True
            try:
                await (self._translate(batch) if isinstance(batch[0], _Job) else self._do(batch[0]))
            finally:
                self.translating = False

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

    def _take(self) -> list[Any]:
        """The oldest requests that fit in one batch: at least one, however many sentences it has; other work
        alone."""
        batch = [self._waiting.popleft()]
        sentences = batch[0].size
        while (isinstance(batch[0], _Job) and self._waiting and isinstance(self._waiting[0], _Job)
               and len(batch) < self.config.max_batch_requests
               and sentences + self._waiting[0].size <= self.config.max_batch_sentences):
            batch.append(self._waiting.popleft())
            sentences += batch[-1].size
        return batch

    async def _do(self, work: _Work) -> None:
        if not work.future.done():  # done: the client went away and its request was cancelled
            try:
                _settle(work.future, await self._on_thread(work.function))
            except Exception as error:  # the request answers with it; the server goes on
                _settle(work.future, error=error)

    async def _translate(self, batch: list[_Job]) -> None:
        """One translator call per decoding setting; each request's future gets its own slice."""
        groups: dict[tuple, list[_Job]] = {}
        for job in batch:
            if not job.future.done():
                groups.setdefault(dataclasses.astuple(job.decode), []).append(job)
        for jobs in groups.values():
            await self._answer(jobs)

    async def _answer(self, jobs: list[_Job]) -> None:
        """Translate ``jobs`` in one call. If it fails, each request is translated alone: one request's error
        is its own, not its neighbours'."""
        sentences = [sentence for job in jobs for sentence in job.sentences]
        prefixes = [prefix for job in jobs for prefix in job.prefixes]
        constraints = [phrases for job in jobs for phrases in job.constraints]
        start = time.perf_counter()
        try:
            results = await self._on_thread(self.translate_nbest, sentences, jobs[0].decode, prefixes, constraints)
        except Exception as error:  # the request answers with it; the server goes on
            if len(jobs) == 1:
                _settle(jobs[0].future, error=error)
                return
            log.exception("a translator call shared by %d requests (%d sentences) failed; translating each "
                          "request alone", len(jobs), len(sentences))
            for job in (job for job in jobs if not job.future.done()):
                await self._answer([job])
            return
        translate_ms = (time.perf_counter() - start) * 1000
        offset = 0
        for job in jobs:
            outcome = Outcome(results[offset:offset + job.size], (start - job.arrived) * 1000, translate_ms,
                              len(jobs), len(sentences))
            offset += job.size
            try:
                if job.follow_up is not None and not job.future.done():
                    outcome.follow_up = await self._on_thread(job.follow_up, outcome.results)
                _settle(job.future, outcome)
            except Exception as error:
                _settle(job.future, error=error)

    async def _on_thread(self, function: Callable[..., R], *args: Any) -> R:
        """Run ``function(*args)`` on the translator's thread."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)


def _settle(future: asyncio.Future[Any], result: Any = None, error: Exception | None = None) -> None:
    """Give a waiting request its result or error, unless the client went away and it was cancelled."""
    if not future.done():
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
