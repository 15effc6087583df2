"""HTTP serving overhead and concurrent throughput of the server, against the bare engine.

One run, one machine, the same real clips (tests/data/speech: jfk.wav, 11 s, and the LibriVox
clips), the same embedded model in both paths:

1. Overhead. The engine called directly in this process (``decode_audio`` on the bytes of
   jfk.wav, then ``transcribe`` with default options) against the same upload sent to a real
   server (``python -m server`` in a subprocess on a free 127.0.0.1 port) as a multipart
   ``/v1/audio/transcriptions`` request (``response_format=json``). Both are warmed up, then
   timed ``--runs`` times, alternating direct and server so that drift on a shared machine
   falls on both alike. Overhead = (server median - direct median) / server median.
2. Throughput. 1, 8 and 32 concurrent clients (asyncio + httpx), ``--requests-per-client``
   requests each, every request a random clip of the set: requests/s, audio seconds per
   second (RTFx), p50/p95 latency and non-200 answers; ratios against one client.

    python bench/server_overhead.py          # writes bench/results/server_overhead.json

Absolute numbers from a loaded, shared machine are noisy; compare figures of one run only.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import random
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
SPEECH = REPO / "tests" / "data" / "speech"
CLIP_NAMES = (
    "jfk.wav",
    "librivox-0870.wav",
    "librivox-0880.wav",
    "librivox-0890.wav",
    "librivox-0920.wav",
    "librivox-0930.wav",
)
ROUTE = "/v1/audio/transcriptions"
READY_TIMEOUT_SECONDS = 300.0
REQUEST_TIMEOUT_SECONDS = 600.0
NOISE_NOTE = (
    "Measured on a shared, loaded machine: absolute numbers are noisy; "
    "only the ratios within this run count."
)

sys.path.insert(0, str(REPO))


@dataclass(frozen=True)
class Clip:
    name: str
    data: bytes
    seconds: float


@dataclass
class OverheadResult:
    clip: str
    clip_seconds: float
    runs: int
    direct_seconds: list[float]
    direct_pool_seconds: list[float]
    server_seconds: list[float]
    direct_median: float
    direct_pool_median: float
    server_median: float
    overhead_seconds: float
    overhead_percent: float
    overhead_vs_pool_seconds: float
    overhead_vs_pool_percent: float
    same_text: bool
    text: str


@dataclass
class LevelResult:
    clients: int
    requests: int
    ok: int
    non_200: int
    wall_seconds: float
    requests_per_second: float
    audio_seconds_per_second: float
    p50_seconds: float
    p95_seconds: float
    statuses: dict[str, int]


# ----- clips and the direct engine -----


def load_clips() -> list[Clip]:
    from whisper_engine.audio import audio_duration, decode_audio

    clips = []
    for name in CLIP_NAMES:
        data = (SPEECH / name).read_bytes()
        clips.append(Clip(name, data, audio_duration(decode_audio(data))))
    return clips


def direct_engines() -> tuple[Any, Any]:
    """Two functions wav bytes -> text (decode_audio, then the transcriber, no HTTP): over the
    bare backend, and over an EnginePool of it, as the server builds it."""
    from whisper_engine.audio import decode_audio
    from whisper_engine.model import load_model
    from whisper_engine.options import TranscribeOptions
    from whisper_engine.pool import EnginePool

    model = load_model()
    bare = model.transcriber()
    pooled = model.transcriber(EnginePool([model.backend], max_batch_windows=16))
    options = TranscribeOptions()
    return (
        lambda data: bare.transcribe(decode_audio(data), options).text,
        lambda data: pooled.transcribe(decode_audio(data), options).text,
    )


# ----- the server subprocess -----


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def server_environment(args: argparse.Namespace) -> dict[str, str]:
    top = max(args.levels)
    return {
        "WHISPER_LIMITS__MAX_CONCURRENT_REQUESTS": str(top),
        "WHISPER_LIMITS__MAX_QUEUED_REQUESTS": str(max(64, 2 * top)),
        "WHISPER_ENGINE__MAX_BATCH_WINDOWS": str(args.max_batch_windows),
    }


def start_server(port: int, settings_env: dict[str, str], log_file: Any) -> subprocess.Popen:
    command = [sys.executable, "-m", "server", "--port", str(port), "--log-level", "warning"]
    env = {**os.environ, **settings_env}
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=log_file, stderr=subprocess.STDOUT)


def wait_ready(server: subprocess.Popen, base_url: str) -> float:
    started = time.perf_counter()
    while time.perf_counter() - started < READY_TIMEOUT_SECONDS:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with status {server.returncode}")
        try:
            if httpx.get(f"{base_url}/ready", timeout=5).status_code == 200:
                return time.perf_counter() - started
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server was not ready after {READY_TIMEOUT_SECONDS:.0f} s")


def stop_server(server: subprocess.Popen) -> None:
    if server.poll() is None:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def upload(clip: Clip) -> dict[str, Any]:
    return {
        "files": {"file": (clip.name, clip.data, "audio/wav")},
        "data": {"model": "whisper-1", "response_format": "json"},
    }


# ----- 1. overhead -----


def measure_overhead(
    direct: Any, direct_pool: Any, client: httpx.Client, clip: Clip, runs: int
) -> OverheadResult:
    def via_server() -> str:
        response = client.post(ROUTE, **upload(clip))
        response.raise_for_status()
        return str(response.json()["text"])

    direct_text, server_text = direct(clip.data), via_server()  # warm-up, every path
    direct_pool(clip.data)
    direct_times: list[float] = []
    pool_times: list[float] = []
    server_times: list[float] = []
    paths = (
        (direct, direct_times),
        (direct_pool, pool_times),
        (lambda _: via_server(), server_times),
    )
    for _ in range(runs):
        for call, times in paths:
            started = time.perf_counter()
            call(clip.data)
            times.append(time.perf_counter() - started)
    direct_median = statistics.median(direct_times)
    server_median = statistics.median(server_times)
    pool_median = statistics.median(pool_times)
    return OverheadResult(
        clip=clip.name,
        clip_seconds=clip.seconds,
        runs=runs,
        direct_seconds=direct_times,
        direct_pool_seconds=pool_times,
        server_seconds=server_times,
        direct_median=direct_median,
        direct_pool_median=pool_median,
        server_median=server_median,
        overhead_seconds=server_median - direct_median,
        overhead_percent=100.0 * (server_median - direct_median) / server_median,
        overhead_vs_pool_seconds=server_median - pool_median,
        overhead_vs_pool_percent=100.0 * (server_median - pool_median) / server_median,
        same_text=direct_text.strip() == server_text.strip(),
        text=server_text.strip(),
    )


# ----- 2. throughput -----


async def run_level(
    base_url: str, clips: list[Clip], clients: int, total: int, rng: random.Random
) -> LevelResult:
    work = [rng.choice(clips) for _ in range(total)]
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    audio_done = 0.0

    async def client_loop(client: httpx.AsyncClient) -> None:
        nonlocal audio_done
        while work:
            clip = work.pop()
            started = time.perf_counter()
            try:
                response = await client.post(ROUTE, **upload(clip))
                status = str(response.status_code)
            except httpx.HTTPError as error:
                status = type(error).__name__
            latencies.append(time.perf_counter() - started)
            statuses[status] = statuses.get(status, 0) + 1
            if status == "200":
                audio_done += clip.seconds

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(
        base_url=base_url, timeout=REQUEST_TIMEOUT_SECONDS, limits=limits
    ) as client:
        started = time.perf_counter()
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
        wall = time.perf_counter() - started
    ok = statuses.get("200", 0)
    return LevelResult(
        clients=clients,
        requests=total,
        ok=ok,
        non_200=total - ok,
        wall_seconds=wall,
        requests_per_second=ok / wall,
        audio_seconds_per_second=audio_done / wall,
        p50_seconds=percentile(latencies, 50),
        p95_seconds=percentile(latencies, 95),
        statuses=statuses,
    )


def percentile(values: list[float], percent: float) -> float:
    ordered = sorted(values)
    rank = (len(ordered) - 1) * percent / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


# ----- report -----


def print_overhead(result: OverheadResult) -> None:
    print(f"\nOverhead: {result.clip} ({result.clip_seconds:.1f} s), median of {result.runs}")
    print(f"{'path':<28} {'median s':>9} {'runs s':>40}")
    for name, median, times in (
        ("direct, bare backend", result.direct_median, result.direct_seconds),
        ("direct, EnginePool", result.direct_pool_median, result.direct_pool_seconds),
        ("server (HTTP multipart)", result.server_median, result.server_seconds),
    ):
        runs = " ".join(f"{t:.3f}" for t in times)
        print(f"{name:<28} {median:9.3f} {runs:>40}")
    for name, seconds, percent in (
        ("bare backend", result.overhead_seconds, result.overhead_percent),
        ("EnginePool", result.overhead_vs_pool_seconds, result.overhead_vs_pool_percent),
    ):
        print(
            f"overhead vs direct {name}: {seconds * 1000:+.1f} ms = {percent:+.2f}% "
            "of the server request (goal < 2%)"
        )
    print(f"same text direct/server: {result.same_text}")


def print_levels(levels: list[LevelResult]) -> None:
    base = levels[0]
    print(
        f"\n{'clients':>7} {'reqs':>5} {'non200':>6} {'wall s':>7} {'req/s':>7} {'RTFx':>7} "
        f"{'p50 s':>7} {'p95 s':>7} {'req/s vs 1':>11} {'RTFx vs 1':>10}"
    )
    for level in levels:
        print(
            f"{level.clients:7d} {level.requests:5d} {level.non_200:6d} {level.wall_seconds:7.1f} "
            f"{level.requests_per_second:7.2f} {level.audio_seconds_per_second:7.1f} "
            f"{level.p50_seconds:7.2f} {level.p95_seconds:7.2f} "
            f"{level.requests_per_second / base.requests_per_second:11.2f} "
            f"{level.audio_seconds_per_second / base.audio_seconds_per_second:10.2f}"
        )


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in ("torch", "transformers", "fastapi", "uvicorn", "httpx", "av", "numpy"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "missing"
    return found


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs per path for overhead")
    parser.add_argument(
        "--levels",
        type=lambda text: [int(part) for part in text.split(",")],
        default=[1, 8, 32],
        help="concurrent clients per throughput level, comma separated (default 1,8,32)",
    )
    parser.add_argument("--requests-per-client", type=int, default=2, help="per level")
    parser.add_argument("--max-batch-windows", type=int, default=16, help="server engine batch")
    parser.add_argument("--seed", type=int, default=0, help="clip choice of the throughput runs")
    parser.add_argument("--note", default="", help="free text stored in the JSON (e.g. the tree)")
    parser.add_argument(
        "--output", type=Path, default=REPO / "bench" / "results" / "server_overhead.json"
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    print(NOISE_NOTE, flush=True)
    clips = load_clips()
    jfk = clips[0]
    print("loading the engine in this process ...", flush=True)
    direct, direct_pool = direct_engines()
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    settings_env = server_environment(args)
    rng = random.Random(args.seed)
    with tempfile.TemporaryFile() as server_log:
        server = start_server(port, settings_env, server_log)
        try:
            print(f"server on {base_url}: waiting for /ready ...", flush=True)
            ready_seconds = wait_ready(server, base_url)
            with httpx.Client(base_url=base_url, timeout=REQUEST_TIMEOUT_SECONDS) as client:
                overhead = measure_overhead(direct, direct_pool, client, jfk, args.runs)
            print_overhead(overhead)
            asyncio.run(run_level(base_url, clips, 2, 2, rng))  # warm the async path
            levels = []
            for clients in args.levels:
                total = clients * args.requests_per_client
                print(f"throughput: {clients} clients, {total} requests ...", flush=True)
                levels.append(asyncio.run(run_level(base_url, clips, clients, total, rng)))
        except BaseException:
            server_log.seek(0)
            sys.stderr.write(server_log.read().decode(errors="replace")[-4000:])
            raise
        finally:
            stop_server(server)
    print_levels(levels)
    print(f"\n{NOISE_NOTE}")
    report = {
        "command": shlex.join([sys.executable.rsplit("/", 1)[-1], *sys.argv]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "load_average_at_end": list(os.getloadavg()),
        "versions": versions(),
        "note": NOISE_NOTE,
        "run_note": args.note,
        "server_settings_env": settings_env,
        "server_ready_seconds": ready_seconds,
        "clips": {clip.name: clip.seconds for clip in clips},
        "overhead": asdict(overhead),
        "throughput": [asdict(level) for level in levels],
        "throughput_vs_1_client": {
            str(level.clients): {
                "requests_per_second": level.requests_per_second / levels[0].requests_per_second,
                "audio_seconds_per_second": level.audio_seconds_per_second
                / levels[0].audio_seconds_per_second,
            }
            for level in levels
        },
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
