"""Audio input: any supported container's bytes -> mono float32 samples at 16 kHz.

The format is detected from the bytes, never from a file name: input is always decoded from
memory, so FFmpeg sees no name to guess from. PyAV bundles FFmpeg's demuxers and decoders, so
no ffmpeg binary is needed.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from typing import BinaryIO

import av
import av.error
import numpy as np
import soxr

from whisper_engine.backends.base import SAMPLE_RATE
from whisper_engine.errors import AudioDecodeError, AudioTooLong

SUPPORTED_FORMATS = (
    "flac", "mp3", "mp4", "mpeg", "mpga", "m4a", "ogg", "oga", "opus", "wav", "webm",
)  # fmt: skip

AudioSource = bytes | bytearray | memoryview | str | os.PathLike | BinaryIO

# FFmpeg demuxers behind SUPPORTED_FORMATS (mp3 also reads mp2/mpga; ogg reads oga/opus;
# matroska reads webm; mov reads mp4/m4a; aac is the raw ADTS stream often found in .m4a
# uploads). Anything else FFmpeg recognises (images, playlists, exotic formats) is refused.
_ACCEPTED_DEMUXERS = frozenset({"aac", "flac", "matroska", "mov", "mp3", "mpeg", "ogg", "wav"})

# Refuse every nested open: a "concat" list could otherwise make FFmpeg read local files.
_OPEN_OPTIONS = {"protocol_whitelist": "none"}

# Failures of FFmpeg or of the bytes it was given, as PyAV and soxr report them.
_DECODER_FAILURES = (av.error.FFmpegError, OSError, EOFError, ValueError, RuntimeError)

_NO_SAMPLES = np.zeros(0, np.float32)
# Integer sample formats: the value that maps to full scale (u8 is offset by 128).
_FULL_SCALE = {np.dtype(np.uint8): 128.0, np.dtype(np.int16): 2.0**15, np.dtype(np.int32): 2.0**31}


def _invalid_format(reason: str | None = None) -> AudioDecodeError:
    message = f"Invalid file format. Supported formats: {list(SUPPORTED_FORMATS)}"
    return AudioDecodeError(f"{message} ({reason})" if reason else message)


def _read_bytes(source: AudioSource) -> bytes:
    """All of the source in memory; a file object is read from where it stands (seekable or not)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    if isinstance(source, (str, os.PathLike)):
        try:
            with open(source, "rb") as file:
                return file.read()
        except OSError as exc:
            raise AudioDecodeError(f"The audio file cannot be read: {exc.strerror}.") from exc
    if hasattr(source, "read"):
        data = source.read()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError("the audio file object must be opened in binary mode")
        return bytes(data)
    raise TypeError(f"unsupported audio source: {type(source).__name__}")


def _mono(frame: av.AudioFrame) -> np.ndarray:
    """The frame's samples as float32 in [-1, 1], channels averaged."""
    samples = frame.to_ndarray()
    if not frame.format.is_planar:  # interleaved: one row of samples * channels
        samples = samples.reshape(-1, len(frame.layout.channels)).T
    full_scale = _FULL_SCALE.get(samples.dtype)
    if full_scale is not None:
        offset = 128.0 if samples.dtype == np.uint8 else 0.0
        samples = (samples.astype(np.float32) - offset) / full_scale
    return samples.mean(axis=0, dtype=np.float32)


def _resampler_from(rate: int) -> soxr.ResampleStream:
    return soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float32", quality="HQ")


def _decode_16k(frames: Iterator[av.AudioFrame], max_seconds: float | None) -> list[np.ndarray]:
    """Resample frame by frame so memory stays at the 16 kHz size and a limit stops early.

    soxr at "HQ" (the quality of soxr.resample) rather than PyAV's swresample: with its
    default filter, a 8.3 kHz tone at 44.1 kHz aliases back at -19 dB (soxr: below -130 dB).
    soxr's streaming output equals its one-shot output, so chunking changes nothing.
    """
    pieces: list[np.ndarray] = []
    rate, seconds = SAMPLE_RATE, 0.0
    resampler = _resampler_from(rate)
    for frame in frames:
        if frame.sample_rate != rate:  # a chained stream may change rate: flush, start anew
            pieces.append(resampler.resample_chunk(_NO_SAMPLES, last=True))
            rate = frame.sample_rate
            resampler = _resampler_from(rate)
        mono = _mono(frame)
        seconds += mono.size / rate
        if max_seconds is not None and seconds > max_seconds:
            raise AudioTooLong(f"The audio is longer than the maximum of {max_seconds:g} seconds.")
        pieces.append(resampler.resample_chunk(mono))
    pieces.append(resampler.resample_chunk(_NO_SAMPLES, last=True))
    return pieces


def decode_audio(source: AudioSource, *, max_seconds: float | None = None) -> np.ndarray:
    """Decode the first audio stream of ``source`` to mono float32 samples at 16 kHz.

    Raises AudioDecodeError for anything that is not decodable audio in a supported format,
    and AudioTooLong as soon as the decoded audio passes ``max_seconds``.
    """
    data = _read_bytes(source)
    if not data:
        raise AudioDecodeError("The audio file is empty.")
    try:
        with av.open(io.BytesIO(data), mode="r", options=_OPEN_OPTIONS) as container:
            if not _ACCEPTED_DEMUXERS.intersection(container.format.name.split(",")):
                raise _invalid_format(f"detected {container.format.long_name}")
            if not container.streams.audio:
                raise _invalid_format("the file has no audio stream")
            pieces = _decode_16k(container.decode(container.streams.audio[0]), max_seconds)
    except (AudioDecodeError, AudioTooLong):
        raise
    except _DECODER_FAILURES as exc:
        raise _invalid_format("the audio could not be decoded") from exc
    samples = np.concatenate(pieces)
    if samples.size == 0:
        raise AudioDecodeError("The audio file contains no audio samples.")
    return np.ascontiguousarray(np.clip(samples, -1.0, 1.0), dtype=np.float32)


def audio_duration(samples: np.ndarray) -> float:
    """Length in seconds of mono samples at SAMPLE_RATE."""
    return samples.shape[-1] / SAMPLE_RATE
