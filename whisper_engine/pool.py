"""A pool of backends that batches the windows of concurrent callers into shared forward passes.

``EnginePool`` is itself a ``Backend``: a ``Transcriber`` built on it does not know it is
talking to several engines. Callers on many threads submit work; one worker thread per backend
takes whatever is pending (up to ``max_batch_windows`` windows), runs ONE backend call for all
of it, and resolves each caller's futures. A caller's windows go to the least-loaded backends.
A backend that raises fails only the batch it was running (its callers get ``EngineFailure``).
Given a ``factory``, the pool then treats that engine as broken: it takes no more work, its
queued work moves to the healthy engines, it is closed and a new one is started for its slot
in the background while the others keep serving. While no engine is healthy, submissions fail
at once with ``EngineUnavailable``.
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
RESTART_BACKOFF_SECONDS = (1.0, 2.0, 5.0, 10.0, 30.0)  # between failed restarts of one slot

BackendFactory = Callable[[int], Backend]
"""Starts a new backend for the pool slot it is given (0-based), e.g. on that slot's device."""


@dataclass
class _GenerateJob:
    request: WindowRequest
    future: Future[WindowOutput] = field(default_factory=Future)
    size: int = 1
    worker: _Worker | None = None  # where it is queued; its load counts this job


@dataclass
class _LogprobJob:
    audio: np.ndarray
    prompt_ids: tuple[int, ...]
    candidates: tuple[int, ...]
    future: Future[np.ndarray] = field(default_factory=Future)
    size: int = 1
    worker: _Worker | None = None  # where it is queued; its load counts this job


@dataclass
class _AlignmentJob:
    request: AlignmentRequest
    future: Future[np.ndarray | None] = field(default_factory=Future)
    size: int = 1
    worker: _Worker | None = None  # where it is queued; its load counts this job


_Job = _GenerateJob | _LogprobJob | _AlignmentJob


class _Worker:
    """One backend slot, the queue in front of it and the thread that drains it in batches."""

    def __init__(
        self, pool: EnginePool, backend: Backend, max_batch_windows: int, index: int, owned: bool
    ) -> None:
        self.pool = pool
        self.backend = backend
        self.index = index
        self.owned = owned  # whether the pool closes this backend when it is done with it
        self.backend_open = True
        self.healthy = True  # takes new work (guarded by the pool's lock)
        self.max_batch_windows = max_batch_windows
        self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.load = 0  # windows queued here and not yet resolved (guarded by the pool's lock)
        self.thread = threading.Thread(
            target=self._run, name=f"engine-pool-{index}-{backend.name}", daemon=True
        )

    def _run(self) -> None:
        while True:
            batch, stop = self._next_batch()
            if batch:
                fault = self._execute(batch)
                if fault is not None and self.pool.restarts_engines:
                    stop = self.pool._recover(self) or stop
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

    def _execute(self, batch: list[_Job]) -> EngineFailure | None:
        """Run the batch as one backend call per kind of work. Returns the failure when the
        backend broke; the rest of the batch then fails with it, unrun."""
        backend = self.backend
        calls: list[tuple[list[Any], Callable[[], Sequence[Any]]]] = []
        generate = [job for job in batch if isinstance(job, _GenerateJob)]
        if generate:
            calls.append((generate, partial(backend.generate, [j.request for j in generate])))
        logprob_groups: dict[tuple[tuple[int, ...], tuple[int, ...]], list[_LogprobJob]] = {}
        for job in batch:
            if isinstance(job, _LogprobJob):
                logprob_groups.setdefault((job.prompt_ids, job.candidates), []).append(job)
        for (prompt_ids, candidates), jobs in logprob_groups.items():
            calls.append((jobs, partial(_logprob_rows, backend, jobs, prompt_ids, candidates)))
        alignment = [job for job in batch if isinstance(job, _AlignmentJob)]
        if alignment:
            calls.append((alignment, partial(_alignment_weights, backend, alignment)))
        for position, (jobs, call) in enumerate(calls):
            fault = _resolve(jobs, call)
            if fault is not None:
                for rest, _call in calls[position + 1 :]:
                    _fail(rest, fault)
                return fault
        return None

    def drain(self) -> tuple[list[_Job], bool]:
        """Everything still queued here, and whether the stop sentinel was among it."""
        jobs: list[_Job] = []
        stop = False
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                return jobs, stop
            if job is _STOP:
                stop = True
            else:
                jobs.append(job)

    def close_backend(self) -> None:
        if not self.backend_open:
            return
        self.backend_open = False
        try:
            self.backend.close()
        except Exception:  # a broken engine may fail to close too; it is being replaced
            logger.exception("Closing engine %d (%s) failed", self.index, self.backend.name)


def _logprob_rows(
    backend: Backend,
    jobs: list[_LogprobJob],
    prompt_ids: tuple[int, ...],
    candidates: tuple[int, ...],
) -> list[np.ndarray]:
    return list(backend.next_token_logprobs([j.audio for j in jobs], prompt_ids, candidates))


def _alignment_weights(backend: Backend, jobs: list[_AlignmentJob]) -> list[np.ndarray | None]:
    weights = backend.alignment_weights([job.request for job in jobs])
    if weights is None:
        return [None] * len(jobs)
    return list(weights)


def _resolve(jobs: Sequence[_Job], call: Callable[[], Sequence[Any]]) -> EngineFailure | None:
    """Run one backend call for ``jobs`` and hand each job its result, or the failure.
    Returns the failure when it says the backend is broken (not a caller's bad option)."""
    try:
        results = call()
        if len(results) != len(jobs):
            raise EngineFailure(f"The backend returned {len(results)} results for {len(jobs)}")
    except Exception as exc:
        caller_error = isinstance(exc, WhisperEngineError) and not isinstance(exc, EngineFailure)
        if caller_error:  # a bad option, not a broken engine: the caller gets it as it is
            _fail(jobs, exc)
            return None
        logger.exception("Backend call for %d jobs failed", len(jobs))
        failure = exc if isinstance(exc, EngineFailure) else EngineFailure(f"Engine failed: {exc}")
        if failure is not exc:
            failure.__cause__ = exc
        _fail(jobs, failure)
        return failure
    for job, result in zip(jobs, results, strict=True):
        job.future.set_result(result)
    return None


def _fail(jobs: Sequence[_Job], failure: Exception) -> None:
    for job in jobs:
        if not job.future.done():
            job.future.set_exception(failure)


class EnginePool:
    """Several backends behind the ``Backend`` protocol, batching across concurrent callers."""

    def __init__(
        self,
        backends: Sequence[Backend],
        max_batch_windows: int = 16,
        *,
        close_backends: bool = False,
        factory: BackendFactory | None = None,
    ) -> None:
        """``close_backends``: whether ``close()`` also closes the backends given here (False
        when the caller keeps owning them, for instance a loaded model shared by several pools).
        ``factory``: starts a replacement for a slot whose backend raised; without one, a
        backend that raised keeps serving. Backends the factory starts belong to the pool."""
        if not backends:
            raise ValueError("EnginePool needs at least one backend")
        if max_batch_windows < 1:
            raise ValueError("max_batch_windows must be at least 1")
        self._factory = factory
        self._lock = threading.Lock()
        self._closed = False
        self._stopping = threading.Event()  # interrupts restart back-offs at close()
        self._restarts = 0
        self._workers = [
            _Worker(self, b, max_batch_windows, i, close_backends) for i, b in enumerate(backends)
        ]
        self.name = "pool(" + ",".join(b.name for b in backends) + ")"
        self.device = ",".join(b.device for b in backends)
        self.max_target_positions = min(b.max_target_positions for b in backends)
        self.max_batch_windows = max_batch_windows
        for worker in self._workers:
            worker.thread.start()

    @property
    def restarts_engines(self) -> bool:
        return self._factory is not None

    @property
    def size(self) -> int:
        """Backend slots, healthy or not."""
        return len(self._workers)

    @property
    def backends(self) -> tuple[Backend, ...]:
        """The backend of each slot now (a restarted slot holds its replacement)."""
        with self._lock:
            return tuple(worker.backend for worker in self._workers)

    @property
    def healthy_engines(self) -> int:
        """Backends taking work now (the others are being restarted)."""
        with self._lock:
            return sum(worker.healthy for worker in self._workers)

    @property
    def restarts(self) -> int:
        """Backends started by the factory to replace one that failed."""
        with self._lock:
            return self._restarts

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
            if not self._enqueue(job):
                raise EngineUnavailable("No engine is available; it is restarting after a failure")
        job.future.add_done_callback(lambda _future: self._finished(job))

    def _enqueue(self, job: _Job) -> bool:
        """Queue ``job`` on the least-loaded healthy backend (caller holds the lock)."""
        healthy = [worker for worker in self._workers if worker.healthy]
        if not healthy:
            return False
        worker = min(healthy, key=lambda w: w.load)
        if job.worker is not None:
            job.worker.load -= job.size
        worker.load += job.size
        job.worker = worker
        worker.jobs.put(job)
        return True

    def _finished(self, job: _Job) -> None:
        with self._lock:
            if job.worker is not None:
                job.worker.load -= job.size

    def _recover(self, worker: _Worker) -> bool:
        """Take ``worker``'s broken backend out of service, hand its queued work to the healthy
        ones, close it and start a replacement. Runs on the worker's own thread, so the other
        backends keep serving. Returns whether the thread should stop (the pool is closing)."""
        orphans: list[_Job] = []
        with self._lock:
            worker.healthy = False
            queued, stop = worker.drain()
            for job in queued:
                if self._closed or not self._enqueue(job):
                    orphans.append(job)
        _fail(
            orphans, EngineUnavailable("No engine is available; it is restarting after a failure")
        )
        logger.warning("Engine %d (%s) failed; restarting it", worker.index, worker.backend.name)
        worker.close_backend()
        if stop or self._closed:
            return True
        replacement = self._start_replacement(worker.index)
        with self._lock:
            if replacement is None:
                return True
            worker.backend, worker.owned, worker.backend_open = replacement, True, True
            worker.healthy = not self._closed
            self._restarts += 1
        logger.info("Engine %d restarted as %s", worker.index, replacement.name)
        return False

    def _start_replacement(self, index: int) -> Backend | None:
        """A new backend for slot ``index``, retrying with back-off; None once closing."""
        assert self._factory is not None
        attempt = 0
        while not self._stopping.is_set():
            try:
                return self._factory(index)
            except Exception:
                delay = RESTART_BACKOFF_SECONDS[min(attempt, len(RESTART_BACKOFF_SECONDS) - 1)]
                logger.exception("Restarting engine %d failed; next try in %.0f s", index, delay)
                attempt += 1
                self._stopping.wait(delay)
        return None

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
            self._stopping.set()
            for worker in self._workers:
                worker.jobs.put(_STOP)
        for worker in self._workers:
            worker.thread.join()
        for worker in self._workers:
            if worker.owned:
                worker.close_backend()

    @property
    def threads_alive(self) -> int:
        """Worker threads still running (0 once ``close()`` has returned)."""
        return sum(worker.thread.is_alive() for worker in self._workers)
