"""Errors a caller can act on. Each says what was wrong in words a user understands."""

from __future__ import annotations


class WhisperEngineError(Exception):
    """Base of every error this package raises on purpose."""


class InvalidOption(WhisperEngineError, ValueError):
    """An option has a value the engine cannot use."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class AudioDecodeError(WhisperEngineError, ValueError):
    """The input is empty, truncated, or not audio in a supported format."""


class AudioTooLong(WhisperEngineError, ValueError):
    """The audio is longer than the configured limit."""


class ModelLoadError(WhisperEngineError, RuntimeError):
    """A model could not be found, verified, converted or loaded."""


class EngineOverloaded(WhisperEngineError, RuntimeError):
    """The engine's queue is full; try again later."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class EngineUnavailable(WhisperEngineError, RuntimeError):
    """The engine is not ready, or is shutting down."""


class EngineFailure(WhisperEngineError, RuntimeError):
    """The engine failed while decoding."""


class Cancelled(WhisperEngineError):
    """The caller cancelled the work (for instance, the client went away)."""
