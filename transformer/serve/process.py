"""A ``transformer-serve`` in a child process on a free loopback port: what the load benchmark and the
tests talk to over real sockets (uvicorn, SIGTERM), where an in-process test client would not do."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

READY = re.compile(r"^transformer-serve: .* on (http://\S+/) ", re.MULTILINE)


@dataclass
class ServerProcess:
    process: subprocess.Popen
    url: str  # ends with "/"
    log: Path  # the server's stdout and stderr

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, then the exit status once the server has answered what was in flight."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)


@contextmanager
def server_process(args: list[str], env: dict[str, str] | None = None, timeout: float = 120) -> Iterator[ServerProcess]:
    """Run ``python -m transformer serve *args --port 0`` until the block ends (then SIGTERM); ready
    when /health answers. ``env`` replaces the environment (default: this one)."""
    with tempfile.TemporaryDirectory(prefix="transformer-serve-") as tmp:
        log = Path(tmp) / "server.log"
        with log.open("w") as output:
            process = subprocess.Popen([sys.executable, "-m", "transformer", "serve", *args, "--host", "127.0.0.1",
                                        "--port", "0"], stdout=output, stderr=subprocess.STDOUT,
                                       env=env if env is not None else dict(os.environ))
        try:
            server = ServerProcess(process, _wait_until_ready(process, log, timeout), log)
            yield server
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def _wait_until_ready(process: subprocess.Popen, log: Path, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"transformer-serve exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        found = READY.search(log.read_text())
        if found:
            try:
                with urllib.request.urlopen(found.group(1) + "health", timeout=5):
                    return found.group(1)
            except OSError:
                pass  # bound, not yet listening
        time.sleep(0.1)
    raise RuntimeError(f"transformer-serve not ready after {timeout} s:\n{log.read_text()[-3000:]}")
