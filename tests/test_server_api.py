"""The HTTP API in-process (httpx over ASGI) with the real embedded model: every response
format on real speech, streaming, and every bad input of the contract in OpenAI's error shape."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpx
import pytest
import srt
import webvtt
from server_support import (
    JFK,
    SPEECH_DIR,
    GatedModel,
    audio_upload,
    reference_text,
    running_app,
    word_error_rate,
)

from server.app import create_app
from server.settings import EngineSettings, LimitSettings, Settings
from whisper_engine.model import WhisperModel, load_model

TRANSCRIPTIONS = "/v1/audio/transcriptions"
TRANSLATIONS = "/v1/audio/translations"
LIBRIVOX = SPEECH_DIR / "librivox-0930.wav"
NO_WARMUP = EngineSettings(warmup=False)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module", params=["torch", "trtllm"])
def model(request) -> WhisperModel:
    """Every API test runs on both backends: TensorRT-LLM through the test stand-in of
    ``tensorrt_llm`` (tests/trtllm_sim), which decodes with the same weights on the CPU."""
    with pytest.MonkeyPatch.context() as patch:
        if request.param == "trtllm":
            patch.syspath_prepend(str(Path(__file__).parent / "trtllm_sim"))
        loaded = load_model(backend=request.param)
        yield loaded
        loaded.close()


@pytest.fixture(scope="module")
async def client(model):
    async with running_app(Settings(), model) as http:
        yield http


@pytest.fixture(scope="module")
async def jfk_json(client) -> dict:
    response = await client.post(TRANSCRIPTIONS, **audio_upload(JFK, model="whisper-1"))
    assert response.status_code == 200, response.text
    return response.json()


def assert_openai_error(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert "Traceback" not in error["message"]
    assert error["param"] == param
    return error


# -- response formats on real speech ---------------------------------------------------------


@pytest.mark.anyio
async def test_json(jfk_json):
    assert word_error_rate(reference_text(JFK), jfk_json["text"]) <= 0.05
    assert jfk_json["usage"] == {"type": "duration", "seconds": 11}
    assert set(jfk_json) == {"text", "usage"}


@pytest.mark.anyio
async def test_text(client, jfk_json):
    response = await client.post(
        TRANSCRIPTIONS, **audio_upload(JFK, model="whisper-1", response_format="text")
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert response.text == jfk_json["text"]


@pytest.mark.anyio
@pytest.mark.parametrize("response_format", ["srt", "vtt"])
async def test_subtitles(client, response_format):
    response = await client.post(
        TRANSCRIPTIONS, **audio_upload(JFK, model="whisper-1", response_format=response_format)
    )
    assert response.status_code == 200
    if response_format == "srt":
        cues = [
            (c.start.total_seconds(), c.end.total_seconds(), c.content)
            for c in srt.parse(response.text)
        ]
    else:
        assert response.text.startswith("WEBVTT\n")
        cues = [
            (c.start_in_seconds, c.end_in_seconds, c.text)
            for c in webvtt.from_string(response.text).captions
        ]
    assert cues
    assert all(0 <= start < end <= 11.01 for start, end, _ in cues)
    assert [start for start, _, _ in cues] == sorted(start for start, _, _ in cues)
    text = " ".join(content for _, _, content in cues)
    assert word_error_rate(reference_text(JFK), text) <= 0.05


@pytest.mark.anyio
async def test_verbose_json_with_words_on_librivox(client):
    form = {"response_format": "verbose_json", "timestamp_granularities[]": ["word", "segment"]}
    response = await client.post(
        TRANSCRIPTIONS, **audio_upload(LIBRIVOX, model="whisper-1", **form)
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["task"] == "transcribe"
    assert body["language"] == "english"
    assert type(body["duration"]) is float and body["duration"] == pytest.approx(3.3, abs=0.05)
    assert body["usage"] == {"type": "duration", "seconds": 4}
    assert word_error_rate(reference_text(LIBRIVOX), body["text"]) <= 0.15
    assert body["segments"]
    for index, segment in enumerate(body["segments"]):
        assert segment["id"] == index
        assert type(segment["seek"]) is int
        assert all(
            type(segment[key]) is float
            for key in (
                "start",
                "end",
                "temperature",
                "avg_logprob",
                "compression_ratio",
                "no_speech_prob",
            )
        )
        assert 0 <= segment["start"] < segment["end"] <= body["duration"] + 0.01
        assert segment["tokens"] and all(type(t) is int for t in segment["tokens"])
        assert 0.0 <= segment["no_speech_prob"] <= 1.0 and segment["avg_logprob"] <= 0.0
    words = body["words"]
    assert word_error_rate(reference_text(LIBRIVOX), "".join(w["word"] for w in words)) <= 0.15
    assert all(0 <= w["start"] <= w["end"] <= body["duration"] + 0.01 for w in words)
    assert [w["start"] for w in words] == sorted(w["start"] for w in words)


@pytest.mark.anyio
async def test_verbose_json_without_word_granularity_has_no_words(client):
    response = await client.post(
        TRANSCRIPTIONS,
        **audio_upload(LIBRIVOX, model="whisper-1", response_format="verbose_json", language="en"),
    )
    assert response.status_code == 200
    assert "words" not in response.json()
    assert response.json()["segments"]


@pytest.mark.anyio
async def test_json_with_logprobs(client):
    upload = audio_upload(LIBRIVOX, model="whisper-1", language="en", **{"include[]": "logprobs"})
    response = await client.post(TRANSCRIPTIONS, **upload)
    assert response.status_code == 200, response.text
    body = response.json()
    logprobs = body["logprobs"]
    assert logprobs and all(set(lp) == {"token", "logprob", "bytes"} for lp in logprobs)
    assert all(lp["logprob"] <= 0.0 for lp in logprobs)
    assert all(bytes(lp["bytes"]).decode("utf-8", "replace") == lp["token"] for lp in logprobs)
    assert "".join(lp["token"] for lp in logprobs).strip() == body["text"]


@pytest.mark.anyio
async def test_translation_is_english(client):
    response = await client.post(
        TRANSLATIONS,
        **audio_upload(JFK, model="whisper-1", response_format="verbose_json", stream="true"),
    )
    assert response.status_code == 200, response.text
    body = response.json()  # translations ignore stream (and any other extra field)
    assert body["task"] == "translate"
    assert word_error_rate(reference_text(JFK), body["text"]) <= 0.2


@pytest.mark.anyio
async def test_prompt_guides_the_text_or_is_refused_by_trtllm(client, model):
    clip = SPEECH_DIR / "librivox-0870.wav"  # "and mister john dashwood had then leisure ..."
    response = await client.post(
        TRANSCRIPTIONS,
        **audio_upload(clip, model="whisper-1", prompt="Mister John Dashwood and Mister Ferrars."),
    )
    if model.backend.name == "trtllm":
        # TensorRT-LLM requires the decoder prompt to start with <|startoftranscript|>, so
        # Whisper's previous-text prompt has no place there: refused, never moved elsewhere
        assert_openai_error(response, 400, param="prompt")
        return
    assert response.status_code == 200, response.text
    text = response.json()["text"]
    assert "Mister" in text  # without the prompt the model writes "Mr."
    assert word_error_rate(reference_text(clip), text) <= 0.1


@pytest.mark.anyio
async def test_streaming_deltas_join_to_the_non_streamed_text(client, jfk_json):
    response = await client.post(
        TRANSCRIPTIONS, **audio_upload(JFK, model="whisper-1", stream="true")
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [
        json.loads(line.removeprefix("data: "))
        for line in response.text.split("\n\n")
        if line.startswith("data: ")
    ]
    deltas = [e["delta"] for e in events if e["type"] == "transcript.text.delta"]
    assert deltas and [e["type"] for e in events][-1] == "transcript.text.done"
    done = events[-1]
    assert "".join(deltas) == done["text"] == jfk_json["text"]
    assert done["usage"] == {"type": "duration", "seconds": 11}


# -- models, probes, metrics -------------------------------------------------------------


@pytest.mark.anyio
async def test_models_list_and_retrieve(client, model):
    listed = (await client.get("/v1/models")).json()
    assert listed["object"] == "list"
    assert [m["id"] for m in listed["data"]] == [model.model_id, "whisper-1"]
    assert all(m["object"] == "model" and isinstance(m["created"], int) for m in listed["data"])
    one = await client.get("/v1/models/whisper-1")
    assert one.status_code == 200 and one.json()["id"] == "whisper-1"
    assert_openai_error(await client.get("/v1/models/gpt-4o"), 404, "model")


@pytest.mark.anyio
async def test_the_served_model_id_works_as_model(client, model):
    response = await client.post(
        TRANSCRIPTIONS, **audio_upload(LIBRIVOX, model=model.model_id, response_format="text")
    )
    assert response.status_code == 200
    assert word_error_rate(reference_text(LIBRIVOX), response.text) <= 0.15


@pytest.mark.anyio
async def test_probes_and_metrics(client, jfk_json):
    assert (await client.get("/health")).json() == {"status": "ok"}
    assert (await client.get("/ready")).status_code == 200
    metrics = (await client.get("/metrics")).text
    assert (
        'whisper_http_requests_total{method="POST",route="/v1/audio/transcriptions",status="200"}'
        in metrics
    )
    assert "whisper_http_request_duration_seconds_bucket" in metrics
    assert 'whisper_audio_seconds_processed_total{task="transcribe"}' in metrics
    assert "whisper_requests_waiting 0.0" in metrics


@pytest.mark.anyio
async def test_not_ready_before_startup(model):
    app = create_app(Settings(), model=model)  # lifespan not entered: nothing loaded yet
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        assert (await http.get("/health")).status_code == 200
        assert_openai_error(await http.get("/ready"), 503)
        upload = audio_upload(LIBRIVOX, model="whisper-1")
        assert_openai_error(await http.post(TRANSCRIPTIONS, **upload), 503)


# -- bad input ---------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": "xml"}, "response_format"),
        ({"language": "xx"}, "language"),
        ({"temperature": "1.5"}, "temperature"),
        ({"temperature": "-0.1"}, "temperature"),
        ({"temperature": "warm"}, "temperature"),
        ({"timestamp_granularities[]": "word"}, "timestamp_granularities"),
        (
            {"timestamp_granularities": "segment", "response_format": "srt"},
            "timestamp_granularities",
        ),
        (
            {"timestamp_granularities[]": "sentence", "response_format": "verbose_json"},
            "timestamp_granularities",
        ),
        ({"stream": "maybe"}, "stream"),
    ],
)
async def test_bad_field_is_400_naming_it(client, fields, param):
    response = await client.post(
        TRANSCRIPTIONS, **audio_upload(LIBRIVOX, model="whisper-1", **fields)
    )
    error = assert_openai_error(response, 400, param)
    assert error["type"] == "invalid_request_error"


@pytest.mark.anyio
async def test_missing_fields(client):
    no_file = await client.post(TRANSCRIPTIONS, data={"model": "whisper-1"})
    assert "file" in assert_openai_error(no_file, 400, "file")["message"]
    no_model = await client.post(TRANSCRIPTIONS, files={"file": ("a.wav", LIBRIVOX.read_bytes())})
    assert_openai_error(no_model, 400, "model")
    not_multipart = await client.post(TRANSCRIPTIONS, json={"model": "whisper-1"})
    assert_openai_error(not_multipart, 400, "file")


@pytest.mark.anyio
async def test_empty_and_garbage_files(client):
    empty = await client.post(
        TRANSCRIPTIONS, data={"model": "whisper-1"}, files={"file": ("a.wav", b"")}
    )
    assert "empty" in assert_openai_error(empty, 400, "file")["message"]
    garbage = await client.post(
        TRANSCRIPTIONS, data={"model": "whisper-1"}, files={"file": ("a.mp3", b"\x07" * 5000)}
    )
    message = assert_openai_error(garbage, 400, "file")["message"]
    assert message.startswith("Invalid file format. Supported formats: [")
    text_as_audio = await client.post(
        TRANSLATIONS, data={"model": "whisper-1"}, files={"file": ("a.wav", b"hello " * 100)}
    )
    assert_openai_error(text_as_audio, 400, "file")


@pytest.mark.anyio
async def test_unknown_model_is_404(client):
    response = await client.post(TRANSCRIPTIONS, **audio_upload(LIBRIVOX, model="whisper-9"))
    assert assert_openai_error(response, 404, "model")["code"] == "model_not_found"


@pytest.mark.anyio
async def test_unknown_route_and_wrong_method(client):
    assert_openai_error(await client.get("/v1/audio/speech"), 404)
    assert_openai_error(await client.get(TRANSCRIPTIONS), 405)
    assert_openai_error(await client.delete("/v1/models"), 405)


@pytest.mark.anyio
async def test_upload_over_the_limit_is_413(model):
    limits = LimitSettings(max_upload_bytes=50_000)
    async with running_app(Settings(limits=limits, engine=NO_WARMUP), model) as http:
        just_over = JFK.read_bytes()[:50_001]  # over the file limit, under the body slack
        response = await http.post(
            TRANSCRIPTIONS, data={"model": "whisper-1"}, files={"file": ("a.wav", just_over)}
        )
        assert assert_openai_error(response, 413, "file")["code"] == "file_too_large"
        response = await http.post(TRANSCRIPTIONS, **audio_upload(JFK, model="whisper-1"))
        assert_openai_error(response, 413, "file")  # refused from Content-Length

        async def chunks():  # no Content-Length: counted while it arrives
            yield (
                b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
                b"Content-Type: audio/wav\r\n\r\n"
            )
            for _ in range(100):
                sent_chunks.append(10_000)
                yield b"x" * 10_000

        sent_chunks: list[int] = []
        headers = {"content-type": "multipart/form-data; boundary=b"}
        response = await http.post(TRANSCRIPTIONS, content=chunks(), headers=headers)
        assert_openai_error(response, 413, "file")
        assert len(sent_chunks) < 20  # stopped reading soon after the limit, not at the end
        assert (await http.get("/ready")).status_code == 200


@pytest.mark.anyio
async def test_audio_over_the_duration_limit_is_400(model):
    limits = LimitSettings(max_audio_seconds=5)
    async with running_app(Settings(limits=limits, engine=NO_WARMUP), model) as http:
        response = await http.post(TRANSCRIPTIONS, **audio_upload(JFK, model="whisper-1"))
        assert_openai_error(response, 400, "file")


@pytest.mark.anyio
async def test_engine_failure_is_500_without_internals_then_recovers(model):
    gated = GatedModel.around(model)
    async with running_app(Settings(engine=NO_WARMUP), gated) as http:
        upload = audio_upload(LIBRIVOX, model="whisper-1", language="en", response_format="text")
        gated.backend.failure = RuntimeError("CUDA error: an illegal memory access at 0xdead")
        failed = await http.post(TRANSCRIPTIONS, **upload)
        error = assert_openai_error(failed, 500)
        assert error["type"] == "server_error" and "0xdead" not in error["message"]
        streamed = await http.post(
            TRANSCRIPTIONS, **{**upload, "data": {**upload["data"], "stream": "true"}}
        )
        assert streamed.status_code == 200  # the stream had started: the error is an event
        event = json.loads(streamed.text.strip().removeprefix("data: "))
        assert event["type"] == "error" and event["error"]["type"] == "server_error"
        gated.backend.failure = None
        recovered = await http.post(TRANSCRIPTIONS, **upload)
        assert recovered.status_code == 200
        assert word_error_rate(reference_text(LIBRIVOX), recovered.text) <= 0.15
        metrics = (await http.get("/metrics")).text
        assert 'whisper_engine_errors_total{kind="EngineFailure"} 2.0' in metrics


@pytest.mark.anyio
async def test_api_keys(model):
    settings = Settings(api_keys=["k1", "k2"], engine=NO_WARMUP)
    async with running_app(settings, model) as http:
        missing = await http.get("/v1/models")
        assert assert_openai_error(missing, 401)["code"] == "invalid_api_key"
        wrong = await http.post(
            TRANSCRIPTIONS,
            headers={"Authorization": "Bearer nope"},
            **audio_upload(LIBRIVOX, model="whisper-1"),
        )
        assert assert_openai_error(wrong, 401)["code"] == "invalid_api_key"
        good = await http.get("/v1/models", headers={"Authorization": "Bearer k2"})
        assert good.status_code == 200
        assert (await http.get("/health")).status_code == 200
        assert (await http.get("/ready")).status_code == 200


@pytest.mark.anyio
async def test_cors_headers_when_configured(model):
    settings = Settings(cors_origins=["https://app.example"], engine=NO_WARMUP)
    async with running_app(settings, model) as http:
        response = await http.get("/v1/models", headers={"Origin": "https://app.example"})
        assert response.headers["access-control-allow-origin"] == "https://app.example"
        other = await http.get("/v1/models", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers


async def _wait_for(event, seconds: float = 120.0) -> None:
    with anyio.fail_after(seconds):
        while not event.is_set():
            await anyio.sleep(0.01)


@pytest.mark.anyio
async def test_full_server_answers_429_then_keeps_serving(model):
    gated = GatedModel.around(model)
    limits = LimitSettings(max_concurrent_requests=1, max_queued_requests=0, retry_after_seconds=2)
    async with running_app(Settings(limits=limits, engine=NO_WARMUP), gated) as http:
        upload = audio_upload(LIBRIVOX, model="whisper-1", language="en", response_format="text")
        gated.backend.gate.clear()
        async with anyio.create_task_group() as group:
            held: list[httpx.Response] = []

            async def first() -> None:
                held.append(await http.post(TRANSCRIPTIONS, **upload))

            group.start_soon(first)
            await _wait_for(gated.backend.waiting)  # the first request is on the engine
            refused = await http.post(TRANSCRIPTIONS, **upload)
            error = assert_openai_error(refused, 429)
            assert error["type"] == "rate_limit_error"
            assert refused.headers["retry-after"] == "2"
            gated.backend.gate.set()
        assert held[0].status_code == 200
        again = await http.post(TRANSCRIPTIONS, **upload)
        assert again.status_code == 200 and again.text == held[0].text
        assert word_error_rate(reference_text(LIBRIVOX), again.text) <= 0.15
        assert "whisper_requests_rejected_total 1.0" in (await http.get("/metrics")).text


@pytest.mark.anyio
async def test_client_disconnect_cancels_remaining_work(model):
    """Raw ASGI: the body arrives, then the client goes away while the engine works."""
    gated = GatedModel.around(model)
    app = create_app(Settings(engine=NO_WARMUP), model=gated)
    request = httpx.Request(
        "POST", "http://t" + TRANSCRIPTIONS, **audio_upload(JFK, model="whisper-1")
    )
    body = request.read()
    disconnected = anyio.Event()
    sent: list[dict] = []

    async def receive() -> dict:
        if not sent:
            sent.append({"type": "http.request"})
            return {"type": "http.request", "body": body, "more_body": False}
        await disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": TRANSCRIPTIONS,
        "raw_path": TRANSCRIPTIONS.encode(),
        "query_string": b"",
        "root_path": "",
        "server": ("t", 80),
        "client": ("c", 1),
        "headers": [(k.lower().encode(), v.encode()) for k, v in request.headers.items()],
    }
    async with app.router.lifespan_context(app):
        backend = gated.backend
        calls_before: list[int] = []
        backend.gate.clear()
        async with anyio.create_task_group() as group:
            group.start_soon(app, scope, receive, send)
            await _wait_for(backend.waiting)  # language detection is at the gate
            calls_before.append(backend.calls)
            disconnected.set()
            await anyio.sleep(0.3)  # the watcher sees the disconnect and sets the cancel flag
            backend.gate.set()
        assert backend.calls == calls_before[0]  # detection finished; no window was decoded
        starts = [m for m in sent if m["type"] == "http.response.start"]
        assert [m["status"] for m in starts] == [499]
        metrics = app.state.metrics.exposition()[0].decode()
        assert "whisper_requests_cancelled_total 1.0" in metrics
