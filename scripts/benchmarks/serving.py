"""Serving under load: transformer-serve on loopback, many concurrent clients, with cross-request batching
and with one request at a time.

Each mode starts ``transformer-serve`` in a child process (`transformer.serve.process`) with the
checkpoint's own decoding settings. ``clients`` clients (asyncio + httpx, in this process) share a
fixed list of requests of 1 to 4 test sentences, each client sending its next request when the
previous one is answered, until the list is done or ``time_cap_s`` has passed (the requests left
are counted as not sent). "one at a time" runs first: no wait, one request per translator call,
so each answer is what its request gets alone; "batched" is the server's default (a few
milliseconds' wait, up to 64 requests and 64 sentences per call).

Lost: a request sent that got no 200 answer (an error status, a timeout, a dropped connection).
Mismatched: a batched answer that differs from the one-at-a-time answer to the same request
(tests/test_serve.py checks that those are the command line's translations).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import httpx
import numpy as np
import torch

from transformer.decoding.translator import Translator
from transformer.serve.process import server_process

ROOT = Path(__file__).resolve().parents[2]
MODES = {"one_at_a_time": ["--batch-wait-ms", "0", "--max-batch-requests", "1"], "batched": []}


def make_requests(sources: list[str], n: int) -> list[list[str]]:
    """``n`` requests of 1, 2, 3, 4, 1, ... consecutive sentences of ``sources``, taken round robin."""
    requests, start = [], 0
    for i in range(n):
        size = 1 + i % 4
        requests.append([sources[(start + j) % len(sources)] for j in range(size)])
        start += size
    return requests


async def send_load(url: str, requests: list[list[str]], clients: int, time_cap_s: float) -> dict:
    """``clients`` clients working through ``requests``: rates, latency percentiles, what was lost, and the
    translations answered (None where a request got none)."""
    latencies: list[float] = []
    counts = {"sent": 0, "lost": 0, "sentences": 0}
    batch_requests: list[int] = []
    answers: list[list[str] | None] = [None] * len(requests)
    todo = iter(range(len(requests)))
    deadline = time.perf_counter() + time_cap_s

    async def client(session: httpx.AsyncClient) -> None:
        for index in todo:
            if time.perf_counter() > deadline:
                return
            counts["sent"] += 1
            start = time.perf_counter()
            try:
                response = await session.post("translate", json={"text": requests[index]})
            except httpx.HTTPError:
                counts["lost"] += 1
                continue
            if response.status_code != 200:
                counts["lost"] += 1
                continue
            latencies.append(time.perf_counter() - start)
            answer = response.json()
            counts["sentences"] += len(requests[index])
            answers[index] = [t["text"] for t in answer["translations"]]
            batch_requests.append(answer["batch"]["requests"])

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=time_cap_s + 60, limits=limits) as session:
        start = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(clients)))
        seconds = time.perf_counter() - start
    done = len(latencies)
    p50, p95, p99 = np.percentile(latencies, [50, 95, 99]) * 1000 if latencies else (float("nan"),) * 3
    return {"seconds": seconds, "sent": counts["sent"], "answered": done, "not_sent": len(requests) - counts["sent"],
            "lost": counts["lost"], "requests_per_s": done / seconds, "answers": answers,
            "sentences_per_s": counts["sentences"] / seconds, "latency_ms": {"p50": p50, "p95": p95, "p99": p99},
            "mean_requests_per_call": float(np.mean(batch_requests)) if batch_requests else 0.0}


def serving_benchmark(checkpoint: Path, sources: list[str], clients: int, n_requests: int,
                      time_cap_s: float) -> dict:
    """Both modes on the same requests, one at a time first; batched answers checked against its."""
    threads = torch.get_num_threads()
    requests = make_requests(sources, n_requests)
    decode = Translator.from_checkpoint(checkpoint, "cpu").decode
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result: dict = {"checkpoint": str(checkpoint), "clients": clients, "requests": n_requests,
                    "sentences": sum(map(len, requests)), "time_cap_s": time_cap_s, "server_threads": threads,
                    "decode": {"beam_size": decode.beam_size, "length_penalty": decode.length_penalty}, "modes": {}}
    for mode, flags in MODES.items():
        args = ["--checkpoint", str(checkpoint), "--threads", str(threads), "--log-level", "warning", *flags]
        with server_process(args, env) as server:
            found = asyncio.run(send_load(server.url, requests, clients, time_cap_s))
            result["modes"][mode] = {**found, "exit_status": server.stop()}
    alone, batched = result["modes"]["one_at_a_time"], result["modes"]["batched"]
    compared = [(a, b) for a, b in zip(alone.pop("answers"), batched.pop("answers")) if a is not None and b is not None]
    batched["compared"], batched["mismatched"] = len(compared), sum(a != b for a, b in compared)
    return result
