"""The converted-model cache: where it lives, content hashes, atomic publication."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import platformdirs

from whisper_engine.checkpoints.hf_layout import CT2Files, write_hf_checkpoint
from whisper_engine.errors import ModelLoadError

CACHE_ENV = "WHISPER_SERVE_CACHE"
# Bump when the converter's output changes, so older conversions are not reused.
CONVERTER_VERSION = 1
_CHUNK = 1 << 22
_HASH_MEMO = ".sha256"


def cache_root(cache_dir: Path | None = None) -> Path:
    """``cache_dir``, else ``$WHISPER_SERVE_CACHE``, else the user cache's ``models/``."""
    if cache_dir is not None:
        return Path(cache_dir)
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    return Path(platformdirs.user_cache_dir("whisper-serve")) / "models"


def sha256_of(paths: Iterable[Path], copy_to: Path | None = None) -> str:
    """SHA-256 of the files' concatenation, streamed; optionally writing that concatenation."""
    digest = hashlib.sha256()
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(open(copy_to, "wb")) if copy_to else None
        for path in paths:
            with open(path, "rb") as src:
                while chunk := src.read(_CHUNK):
                    digest.update(chunk)
                    if out is not None:
                        out.write(chunk)
    return digest.hexdigest()


def memoized_sha256(paths: list[Path], root: Path) -> str:
    """sha256_of(paths), remembered per (path, size, mtime, inode) so a reuse costs a stat."""
    stamps = []
    for path in paths:
        info = path.stat()
        stamps.append(f"{path.resolve()}:{info.st_size}:{info.st_mtime_ns}:{info.st_ino}")
    stamp = "|".join(stamps)
    memo = root / _HASH_MEMO / hashlib.sha256(stamp.encode()).hexdigest()
    with contextlib.suppress(OSError):
        known = memo.read_text().strip()
        if len(known) == 64:
            return known
    digest = sha256_of(paths)
    with contextlib.suppress(OSError):
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(f"{memo.name}.{os.getpid()}.tmp")
        tmp.write_text(digest)
        os.replace(tmp, memo)
    return digest


def sidecar_digest(files: CT2Files) -> str:
    """Short hash of the small files that shape the output besides the weights."""
    sidecars = [files.config, files.tokenizer, *([files.vocabulary] if files.vocabulary else [])]
    return sha256_of(sidecars)[:12]


def converted_dir_name(label: str, model_sha256: str, sidecars: str) -> str:
    return f"{label}-{model_sha256}-{sidecars}-hf{CONVERTER_VERSION}"


def publish_directory(final: Path, build: Callable[[Path], None]) -> Path:
    """Return ``final``, building it first (in a sibling temp dir, then renamed) if absent.

    A concurrent process may publish the same directory first: its result is kept.
    """
    if final.is_dir():
        return final
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    except OSError as exc:
        raise ModelLoadError(f"Cannot write to the model cache {final.parent}: {exc}") from exc
    try:
        build(tmp)
        _make_readable(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
    except OSError as exc:
        raise ModelLoadError(f"Cannot write the converted model to {final}: {exc}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _make_readable(directory: Path) -> None:
    # mkdtemp creates 0700: a cache filled at image build time must be readable by the
    # (often different) user that serves.
    directory.chmod(0o755)
    for path in directory.iterdir():
        path.chmod(0o644)


def convert_ct2_directory(files: CT2Files, root: Path, label: str, source: str) -> Path:
    """Convert a CTranslate2 Whisper model into the cache, keyed by its content."""
    for path in (files.model_bin, files.config, files.tokenizer):
        if not path.is_file():
            raise ModelLoadError(f"The CTranslate2 model is incomplete: {path} is missing")
    digest = memoized_sha256([files.model_bin], root)
    final = root / converted_dir_name(label, digest, sidecar_digest(files))

    def build(tmp: Path) -> None:
        provenance = {"source": source, "format": "ctranslate2", "sha256": digest}
        write_hf_checkpoint(files, tmp, provenance | {"converter_version": CONVERTER_VERSION})

    return publish_directory(final, build)
