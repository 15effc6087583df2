"""decode_audio on real speech transcoded, in the test, into every supported container."""

from __future__ import annotations

import io
import wave
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np
import pytest

from whisper_engine import audio
from whisper_engine.audio import SAMPLE_RATE, SUPPORTED_FORMATS, audio_duration, decode_audio
from whisper_engine.errors import AudioDecodeError, AudioTooLong

SPEECH = Path(__file__).parent / "data" / "speech"
JFK = SPEECH / "jfk.wav"  # 11.0 s, 16 kHz mono
INVALID_FORMAT = f"Invalid file format. Supported formats: {list(SUPPORTED_FORMATS)}"

# The worst measured match is 0.96 (mp3 at 8 kHz mono: everything above 4 kHz is gone and
# LAME's psychoacoustic model drops more). The same clip played 1 % fast scores 0.12 against
# itself, so any resampling error, or a channel read as garbage, falls far below 0.9.
MIN_CORRELATION = 0.9
# Containers with exact sample counts (wav, flac), gapless info (LAME header, mp4 edit lists,
# ogg granules and opus pre-skip) give the length back to well under one codec frame (an aac
# frame is 64 ms at 16 kHz; measured: at most 8 ms). Raw layer II and MPEG-PS cannot say where
# the encoder's priming starts: allow LAME's 1105-sample delay plus one 1152-sample frame of
# padding, at the lowest rate (8 kHz: 0.28 s).
GAPLESS_TOLERANCE_S = 0.02
MAX_CODEC_LAG_S = 0.3


@dataclass(frozen=True)
class Encoding:
    name: str  # the extension a user would give the file
    muxer: str
    codec: str
    rates: tuple[int, ...] = (16_000, 8_000, 44_100, 48_000)
    stereo_only: bool = False  # FFmpeg's own vorbis encoder writes two channels only
    gapless: bool = True


ENCODINGS = (
    Encoding("wav", "wav", "pcm_s16le"),
    # The other sample formats a decoder can hand back: u8, s32, double.
    Encoding("wav-u8", "wav", "pcm_u8", rates=(44_100,)),
    Encoding("wav-s24", "wav", "pcm_s24le", rates=(44_100,)),
    Encoding("wav-f64", "wav", "pcm_f64le", rates=(44_100,)),
    Encoding("flac", "flac", "flac"),
    Encoding("mp3", "mp3", "libmp3lame"),
    Encoding("mp4", "mp4", "aac"),
    Encoding("m4a", "ipod", "aac"),
    Encoding("ogg", "ogg", "vorbis", stereo_only=True),
    Encoding("oga", "oga", "libopus", rates=(16_000, 8_000, 48_000)),  # Opus has no 44.1 kHz
    Encoding("opus", "opus", "libopus", rates=(16_000, 8_000, 48_000)),
    Encoding("webm", "webm", "libopus", rates=(16_000, 8_000, 48_000)),
    # Raw MPEG audio and MPEG-PS carry no gapless info. Layer II has no 8 kHz.
    Encoding("mpga", "mp2", "mp2", rates=(16_000, 44_100, 48_000), gapless=False),
    Encoding("mpeg", "mpeg", "mp2", rates=(16_000, 44_100, 48_000), gapless=False),
    Encoding("mpeg-mp3", "mpeg", "libmp3lame", gapless=False),
)


def _read_jfk() -> np.ndarray:
    with wave.open(str(JFK)) as reader:
        assert (reader.getframerate(), reader.getnchannels()) == (SAMPLE_RATE, 1)
        pcm = np.frombuffer(reader.readframes(reader.getnframes()), dtype="<i2")
    return pcm.astype(np.float32) / 32768


JFK_SAMPLES = _read_jfk()


def resample_with_swresample(samples: np.ndarray, rate: int) -> np.ndarray:
    """Make the test input at another rate with FFmpeg's resampler, not the one under test."""
    if rate == SAMPLE_RATE:
        return samples
    resampler = av.AudioResampler(format="fltp", layout="mono", rate=rate)
    frame = av.AudioFrame.from_ndarray(samples[None], format="fltp", layout="mono")
    frame.sample_rate = SAMPLE_RATE
    frames = resampler.resample(frame) + resampler.resample(None)
    return np.concatenate([f.to_ndarray()[0] for f in frames])


def encode(channels: np.ndarray, rate: int, muxer: str, codec: str) -> bytes:
    """channels: (1 or 2, n) float32 at ``rate``; the encoder converts to its sample format."""
    layout = "mono" if len(channels) == 1 else "stereo"
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=muxer) as output:
        stream = output.add_stream(codec, rate=rate, layout=layout)
        if codec == "vorbis":
            stream.codec_context.options = {"strict": "experimental"}
        for start in range(0, channels.shape[1], 4096):
            chunk = np.ascontiguousarray(channels[:, start : start + 4096], dtype=np.float32)
            frame = av.AudioFrame.from_ndarray(chunk, format="fltp", layout=layout)
            frame.sample_rate, frame.pts = rate, start
            output.mux(stream.encode(frame))
        output.mux(stream.encode(None))
    return buffer.getvalue()


def best_lag_correlation(decoded: np.ndarray, reference: np.ndarray, max_lag: int) -> float:
    """Normalized cross-correlation at the best lag within +-max_lag samples."""
    n = min(len(decoded), len(reference))
    a, b = decoded[:n].astype(np.float64), reference[:n].astype(np.float64)
    spectrum = np.fft.rfft(a, 2 * n) * np.conj(np.fft.rfft(b, 2 * n))
    correlation = np.fft.irfft(spectrum, 2 * n)
    lags = np.concatenate([correlation[: max_lag + 1], correlation[-max_lag:]])
    return float(lags.max() / np.sqrt((a**2).sum() * (b**2).sum()))


def rms(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(samples.astype(np.float64) ** 2)))


def assert_valid_output(samples: np.ndarray) -> None:
    assert samples.dtype == np.float32 and samples.ndim == 1
    assert samples.flags.c_contiguous
    assert np.abs(samples).max() <= 1.0


def round_trip_cases():
    for encoding in ENCODINGS:
        for rate in encoding.rates:
            stereo = encoding.stereo_only or rate in (44_100, 48_000)
            yield pytest.param(encoding, rate, stereo, id=f"{encoding.name}-{rate}-{stereo + 1}ch")


@pytest.mark.parametrize(("encoding", "rate", "stereo"), round_trip_cases())
def test_speech_round_trips_through_every_container(encoding, rate, stereo):
    mono = resample_with_swresample(JFK_SAMPLES, rate)
    # Stereo: speech left, silence right. A mean downmix halves the level; taking one
    # channel, or summing, would not.
    channels = np.stack([mono, np.zeros_like(mono)]) if stereo else mono[None]
    data = encode(channels, rate, encoding.muxer, encoding.codec)

    decoded = decode_audio(data)

    assert_valid_output(decoded)
    length_error = audio_duration(decoded) - audio_duration(JFK_SAMPLES)
    assert abs(length_error) <= (GAPLESS_TOLERANCE_S if encoding.gapless else MAX_CODEC_LAG_S)
    level = 2.0 if stereo else 1.0
    max_lag = int(MAX_CODEC_LAG_S * SAMPLE_RATE)
    assert best_lag_correlation(decoded * level, JFK_SAMPLES, max_lag) > MIN_CORRELATION
    # Lossy codecs shave a few percent off the level (LAME's low-pass: 5 %).
    assert rms(decoded) * level == pytest.approx(rms(JFK_SAMPLES), rel=0.1)


class NonSeekableReader(io.RawIOBase):
    """A pipe-like upload: read() only, with a name that lies about the format."""

    name = "upload.wav"

    def __init__(self, data: bytes) -> None:
        self._stream = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readinto(self, buffer) -> int:
        return self._stream.readinto(buffer)


@pytest.mark.parametrize("encoding", ENCODINGS, ids=lambda e: e.name)
def test_every_source_kind_is_detected_from_the_bytes(encoding, tmp_path):
    channels = np.stack([JFK_SAMPLES] * 2) if encoding.stereo_only else JFK_SAMPLES[None]
    data = encode(channels, SAMPLE_RATE, encoding.muxer, encoding.codec)
    from_bytes = decode_audio(data)
    misleading = tmp_path / ("speech.mp3" if encoding.name == "wav" else "speech.wav")
    misleading.write_bytes(data)
    no_extension = tmp_path / "upload"
    no_extension.write_bytes(data)

    sources = [
        bytearray(data),
        memoryview(data),
        misleading,
        str(no_extension),
        NonSeekableReader(data),
        io.BufferedReader(NonSeekableReader(data)),
    ]
    for source in sources:
        np.testing.assert_array_equal(decode_audio(source), from_bytes)
    with misleading.open("rb") as file:
        np.testing.assert_array_equal(decode_audio(file), from_bytes)


@pytest.mark.parametrize(
    ("muxer", "codec", "rate"),
    [
        ("wav", "pcm_s16le", 44_100),
        ("flac", "flac", 44_100),
        ("mp3", "libmp3lame", 44_100),
        ("mp4", "aac", 44_100),
        ("mpeg", "mp2", 44_100),
        ("webm", "libopus", 48_000),
        # Not vorbis: FFmpeg's experimental vorbis encoder smears the quieter 1 kHz tone
        # (its peak lands at 991 Hz at a third of the level); speech through it is tested above.
    ],
)
def test_stereo_tones_keep_their_pitch_and_are_averaged(muxer, codec, rate):
    t = np.arange(2 * rate) / rate
    left, right = 0.5 * np.sin(2 * np.pi * 440 * t), 0.25 * np.sin(2 * np.pi * 1000 * t)

    decoded = decode_audio(encode(np.stack([left, right]), rate, muxer, codec))

    assert_valid_output(decoded)
    steady = decoded[SAMPLE_RATE // 4 : SAMPLE_RATE // 4 + SAMPLE_RATE]  # 1 s: 1 Hz bins
    amplitude = np.abs(np.fft.rfft(steady * np.hanning(len(steady)))) * 4 / len(steady)
    assert np.argmax(amplitude) == 440
    assert np.argmax(amplitude[600:]) + 600 == 1000
    # The mean of the channels: 0.25 at 440 Hz and 0.125 at 1 kHz.
    assert amplitude[440] == pytest.approx(0.25, rel=0.1)
    assert amplitude[1000] == pytest.approx(0.125, rel=0.1)


def encode_video(muxer: str, video_codec: str, audio_codec: str | None) -> bytes:
    """A tiny synthetic clip: 1 s of 64x64 frames, plus 1 s of jfk's speech when asked."""
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=muxer) as output:
        video = output.add_stream(video_codec, rate=10)
        video.width, video.height, video.pix_fmt = 64, 64, "yuv420p"
        sound = output.add_stream(audio_codec, rate=48_000, layout="mono") if audio_codec else None
        for index in range(10):
            image = np.full((64, 64, 3), index * 20, dtype=np.uint8)
            output.mux(video.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        output.mux(video.encode(None))
        if sound is not None:
            speech = resample_with_swresample(JFK_SAMPLES[SAMPLE_RATE : 2 * SAMPLE_RATE], 48_000)
            frame = av.AudioFrame.from_ndarray(speech[None], format="fltp", layout="mono")
            frame.sample_rate, frame.pts = 48_000, 0
            output.mux(sound.encode(frame))
            output.mux(sound.encode(None))
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("muxer", "video_codec", "audio_codec"),
    [("mp4", "mpeg4", "aac"), ("webm", "libvpx", "libopus")],
)
def test_video_files_give_their_audio_track(muxer, video_codec, audio_codec):
    decoded = decode_audio(encode_video(muxer, video_codec, audio_codec))

    assert_valid_output(decoded)
    assert audio_duration(decoded) == pytest.approx(1.0, abs=GAPLESS_TOLERANCE_S)
    reference = JFK_SAMPLES[SAMPLE_RATE : 2 * SAMPLE_RATE]
    assert best_lag_correlation(decoded, reference, 1000) > MIN_CORRELATION


def test_video_without_audio_is_refused():
    with pytest.raises(AudioDecodeError, match="no audio stream") as error:
        decode_audio(encode_video("mp4", "mpeg4", None))
    assert str(error.value).startswith(INVALID_FORMAT)


def silent_wav(frames: int) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(SAMPLE_RATE)
        writer.writeframes(b"\0\0" * frames)
    return buffer.getvalue()


def test_empty_input_says_so(tmp_path):
    empty_file = tmp_path / "empty.wav"
    empty_file.write_bytes(b"")
    for source in (b"", bytearray(), empty_file, io.BytesIO(b""), NonSeekableReader(b"")):
        with pytest.raises(AudioDecodeError, match=r"^The audio file is empty\.$"):
            decode_audio(source)


def test_audio_without_samples_says_so():
    with pytest.raises(AudioDecodeError, match="contains no audio samples"):
        decode_audio(silent_wav(0))
    assert len(decode_audio(silent_wav(1600))) == 1600  # the same file with 0.1 s decodes


def bad_inputs():
    jfk_mp3 = encode(JFK_SAMPLES[None], SAMPLE_RATE, "mp3", "libmp3lame")
    jfk_flac = encode(JFK_SAMPLES[None], SAMPLE_RATE, "flac", "flac")
    text = "And so my fellow Americans, ask not what your country can do for you.\n" * 20
    return [
        pytest.param(np.random.default_rng(0).bytes(20_000), id="random"),
        pytest.param(text.encode(), id="text"),
        pytest.param(b"\x89PNG\r\n\x1a\n" + bytes(200), id="png-header"),
        pytest.param(jfk_mp3[:300], id="truncated-mp3"),
        pytest.param(jfk_flac[:300], id="truncated-flac"),
        pytest.param(jfk_flac[:3000], id="truncated-flac-mid-frame"),
        pytest.param(silent_wav(16000)[:20], id="truncated-wav-header"),
    ]


@pytest.mark.parametrize("data", bad_inputs())
def test_bad_input_is_an_invalid_format(data, tmp_path):
    with pytest.raises(AudioDecodeError) as error:
        decode_audio(data)
    assert str(error.value).startswith(INVALID_FORMAT)
    # The same bytes behind a trustworthy-looking name are refused the same way.
    path = tmp_path / "speech.wav"
    path.write_bytes(data)
    with pytest.raises(AudioDecodeError, match=r"^Invalid file format\."):
        decode_audio(path)


def test_playlists_cannot_pull_in_local_files(tmp_path, monkeypatch):
    # FFmpeg's concat demuxer would read a file named in the upload, relative to the
    # working directory.
    (tmp_path / "secret.wav").write_bytes(JFK.read_bytes())
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AudioDecodeError, match=r"^Invalid file format\."):
        decode_audio(b"ffconcat version 1.0\nfile secret.wav\n")


def test_missing_path_is_a_decode_error(tmp_path):
    with pytest.raises(AudioDecodeError, match="cannot be read"):
        decode_audio(tmp_path / "missing.wav")


def test_max_seconds_refuses_long_audio():
    data = JFK.read_bytes()
    with pytest.raises(AudioTooLong, match="5 seconds"):
        decode_audio(data, max_seconds=5)
    assert audio_duration(decode_audio(data, max_seconds=20)) == pytest.approx(11.0)


def test_max_seconds_stops_decoding_early():
    with av.open(str(JFK)) as container:
        frames = list(container.decode(audio=0))
    consumed = []

    def counted():
        for frame in frames:
            consumed.append(frame)
            yield frame

    with pytest.raises(AudioTooLong):
        audio._decode_16k(counted(), max_seconds=2.0)
    seconds_read = sum(frame.samples for frame in consumed) / SAMPLE_RATE
    frame_seconds = frames[0].samples / SAMPLE_RATE
    assert 2.0 < seconds_read <= 2.0 + frame_seconds
    assert len(consumed) < len(frames)


def test_audio_duration_counts_samples_at_16k():
    assert audio_duration(np.zeros(24_000, np.float32)) == 1.5
    assert audio_duration(np.zeros(0, np.float32)) == 0.0
