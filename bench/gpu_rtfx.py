"""GPU throughput of the torch backend against Hugging Face transformers' ``generate``.

Two commands, run on a GPU machine from the repository root:

``rtfx``: for each model shape (large-v3, large-v3-turbo), builds a checkpoint of that shape
with random weights in a temporary directory (safetensors, feature extractor and generation
config, so that ``TorchBackend`` loads it as it would a real one), then for each number of
30 s windows in flight times, in the same process and on the same audio:

- ours: ``TorchBackend.generate`` with every window in one call (``max_batch_size`` = windows);
- the peer: transformers ``generate``, batched, fp16, SDPA, ``min/max_new_tokens`` fixed;

with a fixed number of generated tokens per window (end of text suppressed), one warm-up and
the best of N timed runs. Throughput does not depend on the weights' values, so random weights
measure the real cost of the shape. Writes ``gpu_rtfx.json`` (and ``gpu_rtfx.png`` where
matplotlib is installed) into ``--out``.

``check``: transcribes a WAV file with real weights (a local Hugging Face Whisper directory)
through ``load_model(..., backend="torch")`` and prints the text, to compare the GPU fp16
output with the CPU one.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import wave
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from transformers import (
    WhisperConfig,
    WhisperFeatureExtractor,
    WhisperForConditionalGeneration,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from whisper_engine.backends.base import (
    SAMPLE_RATE,
    WINDOW_SAMPLES,
    WINDOW_SECONDS,
    TokenRules,
    WindowRequest,
)
from whisper_engine.backends.torch_backend import TorchBackend

# large-v3's special tokens (vocabulary of 51866)
EOT, SOT, LANG_EN, TRANSCRIBE, NO_SPEECH, NO_TIMESTAMPS, TIMESTAMP_BEGIN = (
    50257,
    50258,
    50259,
    50360,
    50363,
    50364,
    50365,
)
PROMPT = (SOT, LANG_EN, TRANSCRIBE, NO_TIMESTAMPS)

# The roofline of performance.md: encoder FLOPs at the measured bf16 matrix rate, plus the
# cross-attention K/V re-read at every decoding step at the HBM bandwidth (not overlapped).
ENCODER_FLOP_PER_WINDOW = 2.27e12
MATRIX_FLOPS = 790e12
HBM_BYTES_PER_S = 4.8e12
ENCODER_FRAMES = 1500

DEFAULT_AUDIO = Path(__file__).resolve().parents[1] / "tests/data/speech/jfk.wav"


def shape_config(name: str) -> WhisperConfig:
    if name == "smoke":  # tiny, for checking this script on a CPU
        sizes = dict(d_model=64, encoder_layers=2, decoder_layers=2, ffn=128, heads=4)
    else:
        decoder_layers = {"large-v3": 32, "large-v3-turbo": 4}[name]
        sizes = dict(
            d_model=1280, encoder_layers=32, decoder_layers=decoder_layers, ffn=5120, heads=20
        )
    return WhisperConfig(
        vocab_size=51866,
        num_mel_bins=128,
        d_model=sizes["d_model"],
        encoder_layers=sizes["encoder_layers"],
        decoder_layers=sizes["decoder_layers"],
        encoder_attention_heads=sizes["heads"],
        decoder_attention_heads=sizes["heads"],
        encoder_ffn_dim=sizes["ffn"],
        decoder_ffn_dim=sizes["ffn"],
        max_source_positions=1500,
        max_target_positions=448,
        decoder_start_token_id=SOT,
        eos_token_id=EOT,
        pad_token_id=EOT,
        bos_token_id=EOT,
    )


def write_random_checkpoint(name: str, directory: Path, device: str) -> None:
    """A checkpoint of the shape, random weights, loadable with ``from_pretrained``."""
    torch.manual_seed(0)
    with torch.device(device):
        model = WhisperForConditionalGeneration(shape_config(name))
    model = model.half()
    _plain_generation_config(model)
    model.save_pretrained(str(directory), safe_serialization=True)
    WhisperFeatureExtractor(feature_size=128).save_pretrained(str(directory))
    del model
    _free(device)


def _plain_generation_config(model: WhisperForConditionalGeneration) -> None:
    # as gpu_hf_baseline.py: the prompt is passed explicitly, nothing forced or suppressed
    model.generation_config.forced_decoder_ids = None
    model.generation_config.suppress_tokens = None
    model.generation_config.begin_suppress_tokens = None


def speech_windows(path: Path, count: int) -> list[np.ndarray]:
    """``count`` full 30 s windows of real speech: the file tiled, each window shifted."""
    with wave.open(str(path), "rb") as wav:
        if wav.getframerate() != SAMPLE_RATE or wav.getnchannels() != 1:
            raise ValueError(f"{path}: expected 16 kHz mono PCM16")
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), dtype=np.int16)
    audio = pcm.astype(np.float32) / 32768.0
    tiled = np.tile(audio, WINDOW_SAMPLES // len(audio) + 2)
    step = SAMPLE_RATE // 10
    return [tiled[i * step : i * step + WINDOW_SAMPLES].copy() for i in range(count)]


def best_of(fn: Callable[[], object], reps: int, device: str) -> float:
    """Seconds of the fastest of ``reps`` runs, after one warm-up run."""
    fn()
    _sync(device)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return min(times)


def roofline_rtfx(decoder_layers: int, d_model: int, tokens: int) -> float:
    cross_kv_bytes = decoder_layers * 2 * ENCODER_FRAMES * d_model * 2  # fp16 K and V
    seconds = ENCODER_FLOP_PER_WINDOW / MATRIX_FLOPS + cross_kv_bytes * tokens / HBM_BYTES_PER_S
    return WINDOW_SECONDS / seconds


def window_requests(audios: list[np.ndarray], tokens: int) -> list[WindowRequest]:
    rules = TokenRules(
        eot=EOT,
        sot=SOT,
        no_speech=NO_SPEECH,
        no_timestamps=NO_TIMESTAMPS,
        timestamp_begin=TIMESTAMP_BEGIN,
        suppress_ids=(EOT,),  # exactly ``tokens`` generated tokens per window
        begin_suppress_ids=(),
    )
    return [
        WindowRequest(
            audio=audio,
            prompt_ids=PROMPT,
            temperature=0.0,
            max_new_tokens=tokens,
            timestamps=False,
            rules=rules,
        )
        for audio in audios
    ]


def measure_ours(
    checkpoint: Path, audios: list[np.ndarray], windows: list[int], args
) -> dict[int, dict]:
    backend = TorchBackend(checkpoint, device=args.device, dtype=args.dtype)
    results = {}
    for count in windows:
        backend.max_batch_size = count
        requests = window_requests(audios[:count], args.tokens)
        outputs: list = []

        def run(requests=requests, outputs=outputs, backend=backend):
            outputs[:] = backend.generate(requests)

        results[count] = _timed_with_memory(run, count, args)
        lengths = {len(o.token_ids) for o in outputs}
        if lengths != {args.tokens}:
            raise RuntimeError(f"ours generated {lengths} tokens per window, not {args.tokens}")
        _report("ours", count, results[count])
    backend.close()
    del backend
    _free(args.device)
    return results


def measure_peer(
    checkpoint: Path, audios: list[np.ndarray], windows: list[int], args
) -> dict[int, dict]:
    dtype = {"float16": torch.float16, "float32": torch.float32}[args.dtype]
    model = WhisperForConditionalGeneration.from_pretrained(
        str(checkpoint), dtype=dtype, attn_implementation="sdpa"
    )
    model = model.to(args.device).eval()
    _plain_generation_config(model)
    extractor = WhisperFeatureExtractor.from_pretrained(str(checkpoint))
    # features are computed before timing, as gpu_hf_baseline.py feeds ready features
    features = extractor(audios, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
    features = features.to(args.device, dtype)
    results = {}
    for count in windows:
        batch = features[:count]
        prompt = torch.tensor([PROMPT] * count, device=args.device)
        with torch.inference_mode():
            encoder_s = best_of(
                lambda batch=batch, model=model: model.model.encoder(batch), args.reps, args.device
            )

            def run(batch=batch, prompt=prompt, model=model):
                return model.generate(
                    input_features=batch,
                    decoder_input_ids=prompt,
                    min_new_tokens=args.tokens,
                    max_new_tokens=args.tokens,
                    do_sample=False,
                    num_beams=1,
                )

            results[count] = _timed_with_memory(run, count, args)
            sequences = run()
        # the returned length shows that every window got the fixed number of tokens
        results[count]["sequence_length"] = int(sequences.shape[1])
        results[count]["encoder_rtfx"] = round(count * WINDOW_SECONDS / encoder_s, 1)
        _report("peer", count, results[count])
    del model, features
    _free(args.device)
    return results


def _timed_with_memory(run: Callable[[], object], count: int, args) -> dict:
    _free(args.device)
    weights = _allocated(args.device)
    _reset_peak(args.device)
    seconds = best_of(run, args.reps, args.device)
    return {
        "seconds": round(seconds, 4),
        "rtfx": round(count * WINDOW_SECONDS / seconds, 1),
        "tokens_per_s": round(count * args.tokens / seconds, 1),
        "peak_gb": round(_peak(args.device) / 2**30, 2),
        "resident_before_gb": round(weights / 2**30, 2),
    }


def _report(who: str, count: int, result: dict) -> None:
    extra = f"  encoder alone {result['encoder_rtfx']}" if "encoder_rtfx" in result else ""
    print(
        f"  {who:4s} windows {count:4d}: RTFx {result['rtfx']:8.1f}  "
        f"tok/s {result['tokens_per_s']:9.1f}  peak {result['peak_gb']:6.2f} GB{extra}",
        flush=True,
    )


def run_rtfx(args) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    windows = sorted(args.windows)
    audios = speech_windows(args.audio, max(windows))
    report = {
        "command": " ".join(sys.argv),
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "dtype": args.dtype,
        "tokens_per_window": args.tokens,
        "timed_runs": f"1 warm-up, best of {args.reps}",
        "audio": f"{args.audio.name} tiled to 30 s windows",
        "shapes": {},
    }
    started = time.perf_counter()
    for name in args.shapes:
        if time.perf_counter() - started > args.budget_s:
            print(f"skipping {name}: past the {args.budget_s} s budget", flush=True)
            report["shapes"][name] = {"skipped": "time budget"}
            continue
        report["shapes"][name] = measure_shape(name, audios, windows, args)
        _write(report, args.out)
    _write(report, args.out)
    print_table(report)
    plot(report, args.out / "gpu_rtfx.png")


def measure_shape(name: str, audios: list[np.ndarray], windows: list[int], args) -> dict:
    config = shape_config(name)
    print(f"{name}: building a random-weight checkpoint", flush=True)
    with tempfile.TemporaryDirectory(prefix=f"whisper-{name}-") as tmp:
        checkpoint = Path(tmp)
        write_random_checkpoint(name, checkpoint, args.device)
        ours = measure_ours(checkpoint, audios, windows, args)
        peer = measure_peer(checkpoint, audios, windows, args)
    roofline = roofline_rtfx(config.decoder_layers, config.d_model, args.tokens)
    rows = {}
    for count in windows:
        rows[str(count)] = {
            "ours": ours[count],
            "peer": peer[count],
            "ours_over_peer": round(ours[count]["rtfx"] / peer[count]["rtfx"], 2),
            "ours_roofline_fraction": round(ours[count]["rtfx"] / roofline, 3),
            "peer_roofline_fraction": round(peer[count]["rtfx"] / roofline, 3),
        }
    return {"roofline_rtfx": round(roofline), "windows": rows}


def print_table(report: dict) -> None:
    print("\nshape            windows  ours RTFx  peer RTFx  ours/peer  ours %roof  peak GB o/p")
    for name, shape in report["shapes"].items():
        for count, row in shape.get("windows", {}).items():
            print(
                f"{name:16s} {count:>7s} {row['ours']['rtfx']:10.1f} {row['peer']['rtfx']:10.1f} "
                f"{row['ours_over_peer']:10.2f} {100 * row['ours_roofline_fraction']:10.1f} "
                f"  {row['ours']['peak_gb']:.1f}/{row['peer']['peak_gb']:.1f}"
            )


def plot(report: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", flush=True)
        return
    shapes = {n: s for n, s in report["shapes"].items() if "windows" in s}
    figure, axes = plt.subplots(1, len(shapes), figsize=(6 * len(shapes), 4.5), squeeze=False)
    for axis, (name, shape) in zip(axes[0], shapes.items(), strict=True):
        counts = [int(c) for c in shape["windows"]]
        for who, marker in (("ours", "o"), ("peer", "s")):
            values = [shape["windows"][str(c)][who]["rtfx"] for c in counts]
            label = "torch backend" if who == "ours" else "transformers generate"
            axis.plot(counts, values, marker=marker, label=label)
        axis.axhline(shape["roofline_rtfx"], linestyle="--", color="gray", label="roofline")
        axis.set(title=f"{name}, fp16, {report['tokens_per_window']} tokens/window")
        axis.set(xlabel="30 s windows in flight", ylabel="RTFx", xscale="log", xticks=counts)
        axis.set_xticklabels([str(c) for c in counts])
        axis.minorticks_off()
        axis.legend()
    figure.suptitle(report["device"])
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    print(f"plot: {path}", flush=True)


def run_check(args) -> None:
    """Real weights: transcribe a file through the engine and print the text."""
    from whisper_engine.model import load_model
    from whisper_engine.options import TranscribeOptions

    audio = speech_windows_raw(args.audio)
    model = load_model(str(args.checkpoint), backend="torch", device=args.device, dtype=args.dtype)
    transcriber = model.transcriber()
    start = time.perf_counter()
    result = transcriber.transcribe(audio, TranscribeOptions(language="en"))
    _sync(args.device)
    seconds = time.perf_counter() - start
    print(json.dumps({"device": args.device, "dtype": args.dtype, "seconds": round(seconds, 3)}))
    print(f"TEXT: {result.text.strip()}", flush=True)
    model.close()


def speech_windows_raw(path: Path) -> np.ndarray:
    with wave.open(str(path), "rb") as wav:
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), dtype=np.int16)
    return pcm.astype(np.float32) / 32768.0


def _write(report: dict, out: Path) -> None:
    (out / "gpu_rtfx.json").write_text(json.dumps(report, indent=1) + "\n")


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _free(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def _allocated(device: str) -> int:
    return torch.cuda.memory_allocated() if device.startswith("cuda") else 0


def _reset_peak(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()


def _peak(device: str) -> int:
    return torch.cuda.max_memory_allocated() if device.startswith("cuda") else 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rtfx = commands.add_parser("rtfx", help="throughput, ours against transformers generate")
    rtfx.add_argument("--shapes", nargs="+", default=["large-v3", "large-v3-turbo"])
    rtfx.add_argument("--windows", nargs="+", type=int, default=[16, 64, 128])
    rtfx.add_argument("--tokens", type=int, default=100)
    rtfx.add_argument("--reps", type=int, default=2)
    rtfx.add_argument("--budget-s", type=float, default=420, help="start no shape after this")
    rtfx.add_argument("--out", type=Path, default=Path("bench/results"))
    check = commands.add_parser("check", help="transcribe a WAV file with real weights")
    check.add_argument("--checkpoint", type=Path, required=True)
    for sub in (rtfx, check):
        sub.add_argument("--audio", type=Path, default=DEFAULT_AUDIO)
        sub.add_argument("--device", default="cuda")
        sub.add_argument("--dtype", default="float16")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.command == "rtfx":
        run_rtfx(args)
    else:
        run_check(args)


if __name__ == "__main__":
    main()
