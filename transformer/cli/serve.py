"""``transformer-serve``: a checkpoint or a model folder behind a REST API, with a page to try it.

Loads the model as ``transformer-translate`` does (same options), then runs `transformer.serve.app`
on uvicorn. SIGTERM or Ctrl-C stop it gracefully: no new connections, the requests in flight
are answered, then it exits with status 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import socket
import sys
from typing import Any

from transformer.cli.model_options import (
    OVERRIDE,
    add_decode_aliases,
    add_model_options,
    add_runtime_options,
    decode_overrides,
    load_translator,
)
from transformer.errors import InputError
from transformer.serve.config import ServeConfig


def serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="transformer-serve",
                                     description="Serve a model over HTTP: POST /translate, GET /health, GET /model, "
                                                 "the API documentation at /docs and a page to try it at /.")
    parser.add_argument("overrides", nargs="*", default=[],  # a default: argparse would call it required
                        help="decode.key=value: the decoding settings of requests that do not give their own, e.g. "
                             "decode.beam_size=5")
    add_model_options(parser)
    add_decode_aliases(parser)
    add_runtime_options(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000; 0: any free one)")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="info",
                        help="uvicorn's logging; info logs every request")
    for field in dataclasses.fields(ServeConfig):
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=type(field.default), default=field.default,
                            help=f"{field.metadata['help']} (default {field.default})")
    return parser


def serve_main(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from transformer.serve.app import create_app
        from transformer.serve.model_info import describe
    except ImportError as error:
        raise InputError(f'transformer-serve needs {error.name}: pip install -e ".[serve]"') from None
    unknown = [item for item in args.overrides if not OVERRIDE.match(item)]
    if unknown:
        raise InputError(f"not a decode.key=value setting: {unknown[0]!r}")
    config = ServeConfig(**{field.name: getattr(args, field.name) for field in dataclasses.fields(ServeConfig)})
    with _listen(args.host, args.port) as listener:  # before the model loads: a port in use is said at once
        translator = load_translator(args, decode_overrides(args, args.overrides))
        info = describe(translator, args.engine, args.checkpoint, args.model)
        app = create_app(translator, config, info)  # refuses default settings beyond the limits
        print(banner(info, args.host, listener.getsockname()[1]), file=sys.stderr, flush=True)
        for stop in (signal.SIGINT, signal.SIGTERM):  # uvicorn drains, then raises the signal again: let it end here
            signal.signal(stop, lambda number, frame: None)
        server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=listener.getsockname()[1],
                                               log_level=args.log_level))
        server.run(sockets=[listener])
    return 0


def banner(info: dict[str, Any], host: str, port: int) -> str:
    """The line that says the server is up: every direction of a multilingual model, not only its default one
    (`transformer.serve.process` waits for this line)."""
    url = f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"
    return f"transformer-serve: {', '.join(info['directions'])} on {url} (API documentation: /docs)"


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port``, so that a port in use is one error line (exit 2), not a traceback.
    An empty host would listen on every interface, where the page's URL has no host: refused."""
    if not 0 <= port <= 65535:
        raise InputError(f"--port must be in [0, 65535], got {port}")
    if not host.strip():
        raise InputError("--host is empty: give the address to listen on, such as 127.0.0.1 (this machine only) "
                         "or 0.0.0.0 (every interface)")
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as error:
        listener.close()
        raise InputError(f"cannot listen on {host}:{port}: {error.strerror}") from None
    return listener
