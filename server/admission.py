"""Request-level admission control: a bounded number running, a bounded number waiting.

Beyond both bounds a request is refused at once (429 with Retry-After) instead of queueing
without limit: a client can retry elsewhere, and latency stays bounded for the admitted ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from whisper_engine.errors import EngineOverloaded


class AdmissionControl:
    """At most ``max_running`` holders of a slot; at most ``max_waiting`` waiting for one."""

    def __init__(self, max_running: int, max_waiting: int, retry_after: float = 1.0) -> None:
        self.max_running = max_running
        self.max_waiting = max_waiting
        self.retry_after = retry_after
        self._slots = asyncio.Semaphore(max_running)
        self.running = 0
        self.waiting = 0

    async def acquire(self) -> None:
        """Take a slot, waiting if the queue has room; raise ``EngineOverloaded`` if not."""
        if self._slots.locked() and self.waiting >= self.max_waiting:
            raise EngineOverloaded(
                f"The server is busy ({self.running} requests running, {self.waiting} waiting); "
                "retry later.",
                retry_after=self.retry_after,
            )
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.running += 1

    def release(self) -> None:
        self.running -= 1
        self._slots.release()

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        await self.acquire()
        try:
            yield
        finally:
            self.release()

    async def wait_idle(self, poll_seconds: float = 0.05) -> None:
        """Return once nothing runs or waits (used to drain before shutting down)."""
        while self.running or self.waiting:
            await asyncio.sleep(poll_seconds)
