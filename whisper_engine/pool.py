"""A pool of backends that batches the windows of concurrent callers into shared forward passes.

``EnginePool`` is itself a ``Backend``: a ``Transcriber`` built on it does not know it is
talking to several engines. Callers on many threads submit work; one worker thread per backend
takes whatever is pending (up to ``max_batch_windows`` windows), runs ONE backend call for all
of it, and resolves each caller's futures. A caller's windows go to the least-loaded backends.
A backend that raises fails only the batch it was running (its callers get ``EngineFailure``);
the pool keeps serving.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from whisper_engine.backends.base import AlignmentRequest, Backend, WindowOutput, WindowRequest
from whisper_engine.errors import EngineFailure, EngineUnavailable, WhisperEngineError

logger = logging.getLogger(__name__)

_STOP = object()  # queue sentinel: the worker exits once it reads it


@dataclass
class _GenerateJob:
    request: WindowRequest
    future: Future[WindowOutput] = field(default_factory=Future)
    size: int = 1


@dataclass
class _LogprobJob:
    audio: np.ndarray
    prompt_ids: tuple[int, ...]
    candidates: tuple[int, ...]
    future: Future[np.ndarray] = field(default_factory=Future)
    size: int = 1


@dataclass
class _AlignmentJob:
    request: AlignmentRequest
    future: Future[np.ndarray | None] = field(default_factory=Future)
    size: int = 1


_Job = _GenerateJob | _LogprobJob | _AlignmentJob


class _Worker:
    """One backend, the queue in front of it and the thread that drains the queue in batches."""

    def __init__(self, backend: Backend, max_batch_windows: int, index: int) -> None:
        self.backend = backend
        self.max_batch_windows = max_batch_windows
        self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.load = 0  # windows submitted and not yet resolved (guarded by the pool's lock)
        self.thread = threading.Thread(
            target=self._run, name=f"engine-pool-{index}-{backend.name}", daemon=True
        )

    def _run(self) -> None:
        while True:
            batch, stop = self._next_batch()
            if batch:
                self._execute(batch)
            if stop:
                return

    def _next_batch(self) -> tuple[list[_Job], bool]:
        """Block for one job, then take whatever else is already waiting, up to the cap."""
        first = self.jobs.get()
        if first is _STOP:
            return [], True
        batch: list[_Job] = [first]
        windows = first.size
        while windows < self.max_batch_windows:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is _STOP:
                return batch, True
            batch.append(job)
            windows += job.size
        return batch, False

    def _execute(self, batch: list[_Job]) -> None:
        generate = [job for job in batch if isinstance(job, _GenerateJob)]
        if generate:
            _resolve(
                generate,
                lambda: self.backend.generate([job.request for job in generate]),
            )
        logprob_groups: dict[tuple[tuple[int, ...], tuple[int, ...]], list[_LogprobJob]] = {}
        for job in batch:
            if isinstance(job, _LogprobJob):
                logprob_groups.setdefault((job.prompt_ids, job.candidates), []).append(job)
        for (prompt_ids, candidates), jobs in logprob_groups.items():
            _resolve(jobs, partial(self._logprob_rows, jobs, prompt_ids, candidates))
        alignment = [job for job in batch if isinstance(job, _AlignmentJob)]
        if alignment:
            _resolve(alignment, lambda: self._alignment_weights(alignment))

    def _logprob_rows(
        self, jobs: list[_LogprobJob], prompt_ids: tuple[int, ...], candidates: tuple[int, ...]
    ) -> list[np.ndarray]:
        return list(
            self.backend.next_token_logprobs([j.audio for j in jobs], prompt_ids, candidates)
        )

    def _alignment_weights(self, jobs: list[_AlignmentJob]) -> list[np.ndarray | None]:
        weights = self.backend.alignment_weights([job.request for job in jobs])
        if weights is None:
            return [None] * len(jobs)
        return list(weights)


def _resolve(jobs: Sequence[_Job], call: Callable[[], Sequence[Any]]) -> None:
    """Run one backend call for ``jobs`` and hand each job its result, or the failure."""
    try:
        results = call()
        if len(results) != len(jobs):
            raise EngineFailure(f"The backend returned {len(results)} results for {len(jobs)}")
    except Exception as exc:
        logger.exception("Backend call for %d jobs failed", len(jobs))
        failure = exc if isinstance(exc, EngineFailure) else EngineFailure(f"Engine failed: {exc}")
        if failure is not exc:
            failure.__cause__ = exc
        for job in jobs:
            job.future.set_exception(failure)
        return
    for job, result in zip(jobs, results, strict=True):
        job.future.set_result(result)


class EnginePool:
    """Several backends behind the ``Backend`` protocol, batching across concurrent callers."""

    def __init__(
        self,
        backends: Sequence[Backend],
        max_batch_windows: int = 16,
        *,
        close_backends: bool = False,
    ) -> None:
        """``close_backends``: whether ``close()`` also closes the backends (False when the
        caller keeps owning them, for instance a loaded model shared by several pools)."""
        if not backends:
            raise ValueError("EnginePool needs at least one backend")
        if max_batch_windows < 1:
            raise ValueError("max_batch_windows must be at least 1")
        self._backends = tuple(backends)
        self._close_backends = close_backends
        self._lock = threading.Lock()
        self._closed = False
        self._workers = [_Worker(b, max_batch_windows, i) for i, b in enumerate(self._backends)]
        self.name = "pool(" + ",".join(b.name for b in self._backends) + ")"
        self.device = ",".join(b.device for b in self._backends)
        self.max_target_positions = min(b.max_target_positions for b in self._backends)
        self.max_batch_windows = max_batch_windows
        for worker in self._workers:
            worker.thread.start()

    @property
    def pending_windows(self) -> int:
        """Windows submitted and not yet answered, over every backend."""
        with self._lock:
            return sum(worker.load for worker in self._workers)

    @property
    def closed(self) -> bool:
        return self._closed

    def _submit(self, job: _Job) -> None:
        with self._lock:
            if self._closed:
                raise EngineUnavailable("The engine is shutting down")
            worker = min(self._workers, key=lambda w: w.load)
            worker.load += job.size
            job.future.add_done_callback(lambda _future: self._finished(worker, job.size))
            worker.jobs.put(job)

    def _finished(self, worker: _Worker, size: int) -> None:
        with self._lock:
            worker.load -= size

    def _gather(self, jobs: Sequence[_Job]) -> list[Any]:
        for job in jobs:
            self._submit(job)
        results = []
        for job in jobs:
            try:
                results.append(job.future.result())
            except WhisperEngineError:
                raise
            except Exception as exc:  # a future can only hold what _resolve put there
                raise EngineFailure(f"Engine failed: {exc}") from exc
        return results

    def generate(self, requests: Sequence[WindowRequest]) -> list[WindowOutput]:
        return self._gather([_GenerateJob(request) for request in requests])

    def next_token_logprobs(
        self, audios: Sequence[np.ndarray], prompt_ids: tuple[int, ...], candidates: Sequence[int]
    ) -> np.ndarray:
        jobs = [_LogprobJob(audio, tuple(prompt_ids), tuple(candidates)) for audio in audios]
        rows = self._gather(jobs)
        if not rows:
            return np.zeros((0, len(candidates)), dtype=np.float32)
        return np.stack(rows)

    def alignment_weights(self, requests: Sequence[AlignmentRequest]) -> list[np.ndarray] | None:
        weights = self._gather([_AlignmentJob(request) for request in requests])
        if any(w is None for w in weights):
            return None
        return weights

    def close(self) -> None:
        """Refuse new work, let the workers finish what is queued, stop them."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for worker in self._workers:
                worker.jobs.put(_STOP)
        for worker in self._workers:
            worker.thread.join()
        if self._close_backends:
            for backend in self._backends:
                backend.close()

    @property
    def threads_alive(self) -> int:
        """Worker threads still running (0 once ``close()`` has returned)."""
        return sum(worker.thread.is_alive() for worker in self._workers)
