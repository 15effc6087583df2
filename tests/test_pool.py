"""EnginePool over the real torch backend: windows of concurrent callers share one backend
call, every caller gets its own answer, a failing call fails only its batch, a failed engine is
restarted by the factory while the others serve, close() drains; several engines on the CPU."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import anyio
import httpx
import numpy as np
import pytest
from server_support import reference_text
from speech import SPEECH_DIR
from speech import wer as word_error_rate

from server import app as server_app
from server.app import create_app, start_engines
from server.settings import EngineSettings, Settings
from whisper_engine.audio import decode_audio
from whisper_engine.backends import devices
from whisper_engine.backends.base import Backend, WindowOutput, WindowRequest
from whisper_engine.decoding import token_rules
from whisper_engine.errors import EngineFailure, EngineUnavailable
from whisper_engine.model import WhisperModel, load_model
from whisper_engine.pool import EnginePool

JFK = SPEECH_DIR / "jfk.wav"
MAX_NEW_TOKENS = 40
WAIT = 120.0  # seconds a test waits for any one answer before calling it a hang
CLIPS = {  # file -> what the speaker says (no timestamps asked: text tokens only)
    "librivox-0930.wav": "he might even have been made amiable himself",
    "librivox-0880.wav": "he was not an ill disposed young man",
    "jfk.wav": "and so my fellow americans ask not what your country can do for you",
}


@pytest.fixture(scope="module")
def model() -> WhisperModel:
    loaded = load_model()
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def requests(model) -> dict[str, WindowRequest]:
    prompt = model.tokenizer.decoder_prompt("en", "transcribe", timestamps=False)
    rules = token_rules(model.tokenizer, model.suppress_ids)
    out = {}
    for name in CLIPS:
        audio = decode_audio(SPEECH_DIR / name)[: 8 * 16_000]  # 8 s keeps the decode short
        out[name] = WindowRequest(audio, prompt, 0.0, MAX_NEW_TOKENS, False, rules)
    return out


class RecordingBackend:
    """A real backend behind a gate that records the size of every call it receives."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.name = f"recording-{inner.name}"
        self.device = inner.device
        self.max_target_positions = inner.max_target_positions
        self.calls: list[int] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Semaphore(0)  # released once per call reaching the gate
        self.fail_next = False

    def generate(self, requests: Sequence[WindowRequest]) -> list[WindowOutput]:
        self.calls.append(len(requests))
        self.entered.release()
        self.gate.wait()
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("device lost")
        return self.inner.generate(requests)

    def next_token_logprobs(self, audios, prompt_ids, candidates) -> np.ndarray:
        self.calls.append(len(audios))
        return self.inner.next_token_logprobs(audios, prompt_ids, candidates)

    def alignment_weights(self, requests):
        self.calls.append(len(requests))
        return self.inner.alignment_weights(requests)

    def close(self) -> None:
        self.closed = True


class GatedFactory:
    """Starts replacement backends with ``start``, once ``release`` is set; records the slots."""

    def __init__(self, start) -> None:
        self.start = start
        self.slots: list[int] = []
        self.called = threading.Event()
        self.release = threading.Event()
        self.started: list[Backend] = []

    def __call__(self, slot: int) -> Backend:
        self.slots.append(slot)
        self.called.set()
        assert self.release.wait(WAIT)
        backend = self.start()
        self.started.append(backend)
        return backend


def _text(model: WhisperModel, output: WindowOutput) -> str:
    return model.tokenizer.decode(list(output.token_ids))


def _wait_until(condition, timeout: float = 60.0) -> None:
    finished = threading.Event()
    while not condition():
        if finished.wait(0.01) or timeout <= 0:
            raise AssertionError("condition not reached")
        timeout -= 0.01


def test_concurrent_callers_share_one_backend_call(model, requests):
    backend = RecordingBackend(model.backend)
    pool = EnginePool([backend], max_batch_windows=8)
    names = list(CLIPS)
    try:
        backend.gate.clear()
        with ThreadPoolExecutor(len(names)) as callers:
            first = callers.submit(pool.generate, [requests[names[0]]])
            backend.entered.acquire()  # the worker is inside the first call, at the gate
            rest = [callers.submit(pool.generate, [requests[n]]) for n in names[1:]]
            _wait_until(lambda: pool.pending_windows == len(names))
            backend.gate.set()
            outputs = [first.result()[0]] + [f.result()[0] for f in rest]
    finally:
        pool.close()
    assert backend.calls == [1, len(names) - 1]  # the two waiting callers: one forward pass
    for name, output in zip(names, outputs, strict=True):
        assert word_error_rate(CLIPS[name], _text(model, output)) <= 0.15, name
    assert pool.pending_windows == 0


def test_one_caller_gets_its_windows_back_in_order(model, requests):
    backend = RecordingBackend(model.backend)
    pool = EnginePool([backend], max_batch_windows=2)
    order = ["jfk.wav", "librivox-0880.wav", "librivox-0930.wav"]
    try:
        outputs = pool.generate([requests[name] for name in order])
    finally:
        pool.close()
    assert sum(backend.calls) == 3 and max(backend.calls) <= 2  # the cap splits the work
    for name, output in zip(order, outputs, strict=True):
        assert word_error_rate(CLIPS[name], _text(model, output)) <= 0.15, name


def test_a_failing_call_fails_its_batch_and_the_pool_keeps_serving(model, requests):
    backend = RecordingBackend(model.backend)
    pool = EnginePool([backend])
    try:
        backend.fail_next = True
        with pytest.raises(EngineFailure, match="device lost"):
            pool.generate([requests["librivox-0880.wav"]])
        (output,) = pool.generate([requests["librivox-0880.wav"]])
        assert word_error_rate(CLIPS["librivox-0880.wav"], _text(model, output)) <= 0.15
        assert pool.threads_alive == 1
    finally:
        pool.close()


def test_least_loaded_dispatch_spreads_windows_over_backends(model, requests):
    first, second = RecordingBackend(model.backend), RecordingBackend(model.backend)
    pool = EnginePool([first, second])
    names = ["librivox-0880.wav", "librivox-0930.wav"]
    try:
        first.gate.clear()
        second.gate.clear()
        with ThreadPoolExecutor(1) as caller:
            result = caller.submit(pool.generate, [requests[n] for n in names])
            first.entered.acquire()
            second.entered.acquire()
            first.gate.set()  # one at a time: the two wrappers share one torch model
            _wait_until(lambda: pool.pending_windows == 1)
            second.gate.set()
            outputs = result.result()
    finally:
        pool.close()
    assert (first.calls, second.calls) == ([1], [1])
    for name, output in zip(names, outputs, strict=True):
        assert word_error_rate(CLIPS[name], _text(model, output)) <= 0.15, name


def test_language_detection_goes_through_the_pool(model):
    backend = RecordingBackend(model.backend)
    pool = EnginePool([backend])
    special = model.tokenizer.special
    codes = list(special.languages)
    jfk = decode_audio(JFK)
    try:
        rows = pool.next_token_logprobs(
            [jfk, jfk[: 5 * 16_000]], (special.sot,), [special.languages[c] for c in codes]
        )
    finally:
        pool.close()
    assert rows.shape == (2, len(codes))
    assert [codes[int(np.argmax(row))] for row in rows] == ["en", "en"]
    assert backend.calls == [2]  # both audios in one call: same prompt and candidates


def test_close_drains_queued_work_then_stops_threads(model, requests):
    backend = RecordingBackend(model.backend)
    pool = EnginePool([backend], close_backends=True)
    backend.gate.clear()
    with ThreadPoolExecutor(2) as callers:
        running = callers.submit(pool.generate, [requests["librivox-0880.wav"]])
        backend.entered.acquire()
        queued = callers.submit(pool.generate, [requests["librivox-0930.wav"]])
        _wait_until(lambda: pool.pending_windows == 2)
        closing = threading.Thread(target=pool.close)
        closing.start()
        _wait_until(lambda: pool.closed)
        with pytest.raises(EngineUnavailable):
            pool.generate([requests["jfk.wav"]])
        backend.gate.set()
        closing.join()
        assert running.result() and queued.result()  # both answered before the stop
    assert pool.threads_alive == 0
    assert backend.closed


def test_a_failed_engine_is_restarted_while_the_other_keeps_serving(model, requests):
    failing, other = RecordingBackend(model.backend), RecordingBackend(model.backend)
    factory = GatedFactory(lambda: model.start_backend("cpu"))  # a second real torch model
    pool = EnginePool([failing, other], factory=factory)
    names = ["librivox-0880.wav", "librivox-0930.wav"]
    try:
        with ThreadPoolExecutor(2) as callers:
            failing.fail_next = True
            broken = callers.submit(pool.generate, [requests["jfk.wav"]])  # slot 0: idle, first
            with pytest.raises(EngineFailure, match="device lost"):
                broken.result(WAIT)
            assert factory.called.wait(WAIT)
            assert factory.slots == [0] and failing.closed
            assert pool.healthy_engines == 1  # slot 0 is restarting; slot 1 serves meanwhile
            calls_before = len(failing.calls)
            (meanwhile,) = callers.submit(pool.generate, [requests[names[0]]]).result(WAIT)
            assert len(failing.calls) == calls_before and other.calls[-1] == 1
            factory.release.set()
            _wait_until(lambda: pool.restarts == 1)
            assert pool.healthy_engines == 2 and pool.backends[0] is factory.started[0]
            outputs = callers.submit(pool.generate, [requests[n] for n in names]).result(WAIT)
    finally:
        factory.release.set()
        pool.close()
    assert word_error_rate(CLIPS[names[0]], _text(model, meanwhile)) <= 0.15
    for name, output in zip(names, outputs, strict=True):
        assert word_error_rate(CLIPS[name], _text(model, output)) <= 0.15, name
    assert pool.pending_windows == 0 and pool.threads_alive == 0
    assert factory.started[0].model is None  # the pool closed the engine it started


def test_without_a_healthy_engine_calls_fail_fast_and_none_hangs(model, requests):
    failing = RecordingBackend(model.backend)
    factory = GatedFactory(lambda: RecordingBackend(model.backend))
    pool = EnginePool([failing], factory=factory)
    try:
        with ThreadPoolExecutor(2) as callers:
            failing.gate.clear()
            running = callers.submit(pool.generate, [requests["jfk.wav"]])
            failing.entered.acquire()  # the worker is inside the call, at the gate
            queued = callers.submit(pool.generate, [requests["librivox-0880.wav"]])
            _wait_until(lambda: pool.pending_windows == 2)
            failing.fail_next = True
            failing.gate.set()
            with pytest.raises(EngineFailure, match="device lost"):
                running.result(WAIT)
            with pytest.raises(EngineUnavailable):  # it was queued behind the broken engine
                queued.result(WAIT)
            assert factory.called.wait(WAIT)
            assert pool.healthy_engines == 0
            with pytest.raises(EngineUnavailable):  # refused at once, not queued
                pool.generate([requests["jfk.wav"]])
            factory.release.set()
            _wait_until(lambda: pool.healthy_engines == 1)
            (output,) = callers.submit(pool.generate, [requests["jfk.wav"]]).result(WAIT)
    finally:
        factory.release.set()
        pool.close()
    assert word_error_rate(CLIPS["jfk.wav"], _text(model, output)) <= 0.15
    assert factory.started[0].calls == [1]
    assert pool.pending_windows == 0


def test_two_engines_on_the_cpu(model, requests):
    settings = Settings(device="cpu", engine=EngineSettings(engines=2, warmup=False))
    cpu_devices = devices.engine_devices(settings.device, settings.engine.engines)
    assert cpu_devices == ["cpu", "cpu"]
    pool, extra = start_engines(settings, model, cpu_devices, restart=False)
    names = ["librivox-0880.wav", "librivox-0930.wav"]
    try:
        assert pool.size == 2 and len(extra) == 1
        assert pool.backends[0] is model.backend
        assert pool.backends[1] is extra[0] and extra[0] is not model.backend
        assert extra[0].device == "cpu"
        outputs = pool.generate([requests[n] for n in names])
    finally:
        pool.close()
        for engine in extra:
            engine.close()
    for name, output in zip(names, outputs, strict=True):
        assert word_error_rate(CLIPS[name], _text(model, output)) <= 0.15, name


def test_engine_devices_one_per_gpu_by_default(monkeypatch):
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 2)
    assert devices.engine_devices(None) == ["cuda:0", "cuda:1"]
    assert devices.engine_devices("cuda", 3) == ["cuda:0", "cuda:1", "cuda:0"]
    assert devices.engine_devices("cuda:1") == ["cuda:1"]
    assert devices.engine_devices("cpu") == ["cpu"]
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 0)
    assert devices.engine_devices(None, 2) == [None, None]
    with pytest.raises(ValueError):
        devices.engine_devices(None, 0)


@pytest.mark.anyio
async def test_server_is_not_ready_while_its_only_engine_restarts(model, monkeypatch):
    failing = RecordingBackend(model.backend)
    factory = GatedFactory(lambda: RecordingBackend(model.backend))
    served = dataclasses.replace(model, backend=failing)
    served.start_backend = lambda device=None: factory(0)  # type: ignore[method-assign]
    monkeypatch.setattr(server_app, "load_model", lambda *args, **kwargs: served)
    app = create_app(Settings(device="cpu", engine=EngineSettings(warmup=False)))
    jfk = {"files": {"file": ("jfk.wav", JFK.read_bytes(), "audio/wav")}}
    form = {"model": "whisper-1", "language": "en", "response_format": "text"}
    post = {**jfk, "data": form}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            assert (await http.get("/ready")).status_code == 200
            failing.fail_next = True
            assert (await http.post("/v1/audio/transcriptions", **post)).status_code == 500
            assert await anyio.to_thread.run_sync(factory.called.wait, WAIT)
            assert (await http.get("/ready")).status_code == 503
            refused = await http.post("/v1/audio/transcriptions", **post)
            assert refused.status_code == 503
            factory.release.set()
            await anyio.to_thread.run_sync(_wait_until, lambda: app.state.pool.restarts == 1)
            assert (await http.get("/ready")).status_code == 200
            recovered = await http.post("/v1/audio/transcriptions", **post)
    assert failing.closed
    assert recovered.status_code == 200
    assert word_error_rate(reference_text(JFK), recovered.text) <= 0.15
