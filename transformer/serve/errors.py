"""How a request fails in ``transformer-serve``: every error a JSON object {"error": "one line"} with its status
(the statuses: `transformer.serve.app`'s docstring), from FastAPI's validation, the body's size and encoding,
Python's JSON limits, the toolkit's own one-line errors, a full queue, a client gone, or a failure of the server.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from transformer.config import ConfigError
from transformer.errors import InputError
from transformer.serve.batcher import Busy
from transformer.serve.schema import ErrorResponse, validation_error

ERRORS: dict[int | str, dict[str, Any]] = {status: {"model": ErrorResponse} for status in (400, 413, 422, 503)}
CLIENT_GONE = 499  # nginx's "client closed request": never sent, as the client has gone, but a status all the same
log = logging.getLogger(__name__)


class ClientGone(Exception):
    """The client closed its connection before its answer was ready."""


class BodyTooLarge(Exception):
    """A body without a Content-Length grew past the limit while it was read."""


class BodyLimit:
    """Refuse bodies over ``max_bytes`` with a JSON 413: a declared Content-Length before anything is read, a
    body without one as soon as it passes the limit. (FastAPI's own max_body_size answers in plain text.)"""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared = dict(scope.get("headers", [])).get(b"content-length", b"")
        if scope["type"] == "http" and declared.isdigit() and int(declared) > self.max_bytes:
            return await error_response(413, self.message())(scope, receive, send)
        received = 0

        async def receive_counted() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise BodyTooLarge(self.message())  # FastAPI answers 400 "error parsing the body" from it
            return message

        await self.app(scope, receive_counted, send)

    def message(self) -> str:
        return f"the body is larger than this server's limit of {self.max_bytes} bytes"


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": " ".join(message.split())}, status_code=status, headers=headers)


def _beyond_json_limits(error: Exception) -> str:
    """What Python's JSON parser could not take, in a client's words: FastAPI says only "There was an error
    parsing the body", and Python's own message advises the server to call sys.set_int_max_str_digits."""
    if isinstance(error, RecursionError):
        return "nested too deeply"
    if "integer string conversion" in str(error):
        return f"a number of more than {sys.get_int_max_str_digits()} digits"
    return str(error)


def add_error_handlers(app: FastAPI) -> None:
    """Every error as {"error": "one line"}; see the module's docstring for the statuses."""

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
        return error_response(*validation_error(list(error.errors())))

    @app.exception_handler(HTTPException)
    async def httperror_response(request: Request, error: HTTPException) -> JSONResponse:
        if isinstance(error.__cause__, UnicodeDecodeError):  # FastAPI's "There was an error parsing the body"
            return error_response(400, "the body is not valid UTF-8")
        if isinstance(error.__cause__, BodyTooLarge):
            return error_response(413, str(error.__cause__))
        if isinstance(error.__cause__, (RecursionError, ValueError)):  # json.loads beyond Python's own limits
            return error_response(400, f"the body is not valid JSON ({_beyond_json_limits(error.__cause__)})")
        return error_response(error.status_code, str(error.detail), getattr(error, "headers", None))

    @app.exception_handler(ConfigError)
    @app.exception_handler(InputError)
    async def invalid_value(request: Request, error: ValueError) -> JSONResponse:
        return error_response(422, str(error))

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, error: ClientGone) -> JSONResponse:
        return error_response(CLIENT_GONE, str(error))

    @app.exception_handler(Busy)
    async def busy(request: Request, error: Busy) -> JSONResponse:
        return error_response(503, str(error), {"Retry-After": "1"})

    @app.exception_handler(Exception)
    async def internalerror_response(request: Request, error: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return error_response(500, f"internal error: {type(error).__name__}: {error}")
