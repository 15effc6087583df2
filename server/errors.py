"""Every failure leaves the server in OpenAI's error shape:
``{"error": {"message", "type", "param", "code"}}``, never FastAPI's ``{"detail": ...}``.

This module is the one place that maps exceptions to status codes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from whisper_engine.errors import (
    AudioDecodeError,
    AudioTooLong,
    Cancelled,
    EngineFailure,
    EngineOverloaded,
    EngineUnavailable,
    InvalidOption,
    ModelLoadError,
)

logger = logging.getLogger(__name__)

INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
SERVER_ERROR = "server_error"
RATE_LIMIT = "rate_limit_error"
CLIENT_CLOSED_REQUEST = 499


class APIError(Exception):
    """An error already phrased for the client: status, message and OpenAI's fields."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        type: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, dict[str, str | None]]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status_code, headers=self.headers)


class UploadTooLarge(StarletteHTTPException):
    """Raised while the body arrives, as soon as it passes the limit (FastAPI re-raises
    HTTPExceptions from body parsing unchanged, so it reaches the handler below)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"The file is too large: the limit is {limit} bytes.")
        self.limit = limit


def upload_too_large(limit: int) -> APIError:
    return APIError(
        413,
        f"Maximum content size limit ({limit} bytes) exceeded.",
        param="file",
        code="file_too_large",
    )


def model_not_found(name: str) -> APIError:
    return APIError(
        404,
        f"The model `{name}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


def not_ready() -> APIError:
    return APIError(
        503,
        "The server is not ready: the model is loading or shutting down.",
        type=SERVER_ERROR,
        code="service_unavailable",
    )


def from_exception(exc: BaseException, retry_after: int = 1) -> APIError:
    """The client-facing error for an exception raised while serving a request."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, UploadTooLarge):
        return upload_too_large(exc.limit)
    if isinstance(exc, InvalidOption):
        return APIError(400, str(exc), param=exc.param)
    if isinstance(exc, (AudioDecodeError, AudioTooLong)):
        return APIError(400, str(exc), param="file")
    if isinstance(exc, EngineOverloaded):
        seconds = max(1, round(exc.retry_after))
        return APIError(
            429,
            str(exc),
            type=RATE_LIMIT,
            code="rate_limit_exceeded",
            headers={"Retry-After": str(seconds)},
        )
    if isinstance(exc, Cancelled):
        # nginx's "client closed request": nobody reads it, but metrics tell it from a 503
        return APIError(CLIENT_CLOSED_REQUEST, "The client closed the request.")
    if isinstance(exc, (EngineUnavailable, ModelLoadError)):
        return APIError(503, str(exc) or "The engine is unavailable.", type=SERVER_ERROR)
    if isinstance(exc, EngineFailure):
        return APIError(500, "The engine failed while transcribing.", type=SERVER_ERROR)
    return APIError(
        500, "The server had an error while processing your request.", type=SERVER_ERROR
    )


_HTTP_MESSAGES = {
    404: "Not found: no such route.",
    405: "Method not allowed.",
}


def _http_error(exc: StarletteHTTPException) -> APIError:
    if isinstance(exc, UploadTooLarge):
        return upload_too_large(exc.limit)
    message = _HTTP_MESSAGES.get(exc.status_code, str(exc.detail))
    error_type = INVALID_REQUEST if exc.status_code < 500 else SERVER_ERROR
    return APIError(exc.status_code, message, type=error_type, headers=exc.headers)


def _validation_error(exc: RequestValidationError) -> APIError:
    """FastAPI's 422 becomes OpenAI's 400, naming the first offending field."""
    errors = exc.errors()
    first = errors[0] if errors else {}
    location = [str(part) for part in first.get("loc", ()) if part not in ("body", "query")]
    param = location[0].removesuffix("[]") if location else None
    if first.get("type") == "missing" and param is not None:
        message = f"Missing required parameter: '{param}'."
    else:
        reason = first.get("msg", "Invalid request")
        message = f"Invalid value for '{param}': {reason}." if param else f"{reason}."
    return APIError(400, message, param=param)


def install_error_handlers(app: FastAPI) -> None:
    async def on_api_error(_request: Request, exc: Exception) -> JSONResponse:
        return from_exception(exc).response()

    async def on_http_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        return _http_error(exc).response()

    async def on_validation_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return _validation_error(exc).response()

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("Unexpected error serving %s %s", request.method, request.url.path)
        return from_exception(exc).response()

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    for engine_error in (
        InvalidOption,
        AudioDecodeError,
        AudioTooLong,
        EngineOverloaded,
        EngineUnavailable,
        EngineFailure,
        Cancelled,
        ModelLoadError,
    ):
        app.add_exception_handler(engine_error, on_api_error)
    app.add_exception_handler(Exception, on_unexpected)
