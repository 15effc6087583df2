"""ASGI middleware that must act before a request body is read: authentication and the
upload size cap. Both answer in OpenAI's error shape."""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.errors import APIError, UploadTooLarge, upload_too_large

OPEN_PATHS = frozenset({"/health", "/ready", "/metrics"})


class ApiKeyMiddleware:
    """``Authorization: Bearer <key>`` on every route but the probes, before the upload is
    read (a client without a key must not be able to make the server spool 25 MiB)."""

    def __init__(self, app: ASGIApp, api_keys: Iterable[str]) -> None:
        self.app = app
        self.api_keys = tuple(key.encode() for key in api_keys)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or not self.api_keys
            or scope["path"] in OPEN_PATHS
            or scope["method"] == "OPTIONS"  # CORS preflight carries no credentials
        ):
            await self.app(scope, receive, send)
            return
        error = self._check(Headers(scope=scope).get("authorization"))
        if error is None:
            await self.app(scope, receive, send)
        else:
            await error.response()(scope, receive, send)

    def _check(self, authorization: str | None) -> APIError | None:
        scheme, _, key = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return APIError(
                401,
                "You didn't provide an API key. Provide it in the "
                "Authorization header as 'Bearer YOUR_KEY'.",
                code="invalid_api_key",
            )
        given = key.strip().encode()
        if any(hmac.compare_digest(given, accepted) for accepted in self.api_keys):
            return None
        return APIError(401, "Incorrect API key provided.", code="invalid_api_key")


class UploadLimitMiddleware:
    """Refuses a body larger than ``max_bytes`` on ``paths``: at once from Content-Length,
    else as soon as the bytes received pass the limit (nothing beyond is buffered)."""

    def __init__(self, app: ASGIApp, max_bytes: int, paths: Iterable[str]) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.paths = frozenset(paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await upload_too_large(self.max_bytes).response()(scope, receive, send)
            return
        received = 0
        response_started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise UploadTooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal response_started
            response_started = response_started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except UploadTooLarge:
            if response_started:
                raise
            await upload_too_large(self.max_bytes).response()(scope, receive, send)
