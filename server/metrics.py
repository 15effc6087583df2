"""Prometheus metrics, in a registry owned by one app (two apps in a process do not mix)."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "whisper_http_requests",
            "HTTP requests by route, method and status.",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "whisper_http_request_duration_seconds",
            "Time to answer a request, by route.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.audio_seconds = Counter(
            "whisper_audio_seconds_processed",
            "Seconds of input audio transcribed, by task.",
            ["task"],
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "whisper_requests_waiting",
            "Transcriptions admitted to the queue, waiting for a slot.",
            registry=self.registry,
        )
        self.running = Gauge(
            "whisper_requests_running",
            "Transcriptions decoding or on the engine.",
            registry=self.registry,
        )
        self.pending_windows = Gauge(
            "whisper_engine_pending_windows",
            "30 s windows submitted to the engine, unanswered.",
            registry=self.registry,
        )
        self.engine_errors = Counter(
            "whisper_engine_errors",
            "Transcriptions that failed in the engine, by error kind.",
            ["kind"],
            registry=self.registry,
        )
        self.rejected = Counter(
            "whisper_requests_rejected",
            "Requests refused by admission control (429).",
            registry=self.registry,
        )
        self.cancelled = Counter(
            "whisper_requests_cancelled",
            "Transcriptions stopped because the client went away.",
            registry=self.registry,
        )

    def track(
        self,
        running: Callable[[], int],
        waiting: Callable[[], int],
        pending_windows: Callable[[], int],
    ) -> None:
        """Read the live gauges from their owners at scrape time."""
        self.running.set_function(running)
        self.queue_depth.set_function(waiting)
        self.pending_windows.set_function(pending_windows)

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class MetricsMiddleware:
    """Counts every response by route template (not raw path: ids would explode the labels)."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        started = time.perf_counter()

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            route = scope.get("route")
            label = getattr(route, "path", None) or "unmatched"
            self.metrics.requests.labels(label, scope["method"], str(status)).inc()
            self.metrics.latency.labels(label).observe(time.perf_counter() - started)
