"""The contract test: a real ``whisper-server`` process on a local port, driven by the
official ``openai`` client and by curl, exactly as users call it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from server_support import JFK, SPEECH_DIR, reference_text, word_error_rate

ROOT = Path(__file__).resolve().parent.parent
CLIP = SPEECH_DIR / "librivox-0930.wav"
API_KEY = "sk-test-e2e"
STARTUP_SECONDS = 600


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_ready(base_url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the server exited with {process.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{base_url}/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    pytest.fail(f"the server was not ready after {STARTUP_SECONDS} s:\n{log.read_text()}")


@pytest.fixture(scope="module")
def base_url(tmp_path_factory) -> Iterator[str]:
    port = _free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "WHISPER_API_KEYS": API_KEY,
        "WHISPER_LIMITS__MAX_CONCURRENT_REQUESTS": "1",
        "WHISPER_LIMITS__MAX_QUEUED_REQUESTS": "0",
    }
    command = [
        sys.executable,
        "-m",
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    with open(log, "wb") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, process, log)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def client(base_url) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=API_KEY, max_retries=0, timeout=300)


def _transcribe(client: openai.OpenAI, path: Path, **options):
    with open(path, "rb") as audio:
        return client.audio.transcriptions.create(file=audio, model="whisper-1", **options)


def test_json(client):
    result = _transcribe(client, JFK)
    assert word_error_rate(reference_text(JFK), result.text) <= 0.05


@pytest.mark.parametrize("response_format", ["text", "srt", "vtt"])
def test_text_formats(client, response_format):
    result = _transcribe(client, CLIP, response_format=response_format, language="en")
    assert isinstance(result, str)
    if response_format == "srt":
        assert result.startswith("1\n00:00:0") and " --> " in result
    if response_format == "vtt":
        assert result.startswith("WEBVTT\n\n00:00:0")
    spoken = " ".join(
        line
        for line in result.splitlines()
        if line and "-->" not in line and not line.isdigit() and line != "WEBVTT"
    )
    assert word_error_rate(reference_text(CLIP), spoken) <= 0.15


def test_verbose_json_with_words_and_segments(client):
    result = _transcribe(
        client, CLIP, response_format="verbose_json", timestamp_granularities=["word", "segment"]
    )
    assert result.language == "english" and result.duration == pytest.approx(3.3, abs=0.05)
    assert word_error_rate(reference_text(CLIP), result.text) <= 0.15
    assert result.segments and all(s.end > s.start >= 0 for s in result.segments)
    assert all(isinstance(s.no_speech_prob, float) for s in result.segments)
    assert result.words
    assert word_error_rate(reference_text(CLIP), "".join(w.word for w in result.words)) <= 0.15


def test_translation(client):
    with open(CLIP, "rb") as audio:
        result = client.audio.translations.create(file=audio, model="whisper-1")
    assert word_error_rate(reference_text(CLIP), result.text) <= 0.2


def test_stream_matches_the_non_streamed_text(client):
    plain = _transcribe(client, CLIP, language="en").text
    events = list(_transcribe(client, CLIP, language="en", stream=True))
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    assert events[-1].type == "transcript.text.done"
    assert "".join(deltas) == events[-1].text == plain


def test_errors_surface_as_openai_exceptions(client, base_url):
    with pytest.raises(openai.BadRequestError) as bad_language:
        _transcribe(client, CLIP, language="xx")
    assert bad_language.value.body["param"] == "language"
    with pytest.raises(openai.BadRequestError):
        client.audio.transcriptions.create(file=("a.mp3", b"\x00" * 4096), model="whisper-1")
    with pytest.raises(openai.NotFoundError), open(CLIP, "rb") as audio:
        client.audio.transcriptions.create(file=audio, model="not-a-model")
    wrong_key = openai.OpenAI(base_url=f"{base_url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong_key.models.list()
    assert [m.id for m in client.models.list()][-1] == "whisper-1"


def test_rate_limited_when_the_only_slot_is_busy(client, base_url):
    held: list[object] = []
    busy = threading.Thread(
        target=lambda: held.append(
            client.audio.transcriptions.create(
                file=("jfk.wav", JFK.read_bytes()), model="whisper-1", language="en"
            )
        )
    )
    busy.start()
    try:
        deadline = time.monotonic() + 120
        while "whisper_requests_running 1.0" not in httpx.get(f"{base_url}/metrics").text:
            assert time.monotonic() < deadline and busy.is_alive()
            time.sleep(0.02)
        with pytest.raises(openai.RateLimitError) as refused:
            _transcribe(client, CLIP, language="en")
        assert refused.value.response.headers["retry-after"] == "1"
    finally:
        busy.join()
    assert held and word_error_rate(reference_text(JFK), held[0].text) <= 0.05


def test_curl(base_url):
    completed = subprocess.run(
        [
            "curl",
            "-sS",
            "--fail-with-body",
            f"{base_url}/v1/audio/transcriptions",
            "-H",
            f"Authorization: Bearer {API_KEY}",
            "-F",
            f"file=@{JFK}",
            "-F",
            "model=whisper-1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    body = json.loads(completed.stdout)
    assert word_error_rate(reference_text(JFK), body["text"]) <= 0.05
    assert body["usage"] == {"type": "duration", "seconds": 11}


def test_engine_config_command_prints_trtllm_arguments():
    completed = subprocess.run(
        [sys.executable, "-m", "server", "engine-config", "--format", "json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert completed.returncode == 0, completed.stderr
    args = json.loads(completed.stdout)
    assert args["max_input_len"] == 1500  # whisper-base's max_source_positions
    assert args["kv_cache_config"]["enable_block_reuse"] is False


def test_invalid_settings_exit_with_a_message():
    completed = subprocess.run(
        [sys.executable, "-m", "server", "--port", "70000"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert completed.returncode == 2
    assert "port" in completed.stderr and "Traceback" not in completed.stderr
