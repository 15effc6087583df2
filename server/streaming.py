"""Server-sent events of a transcription: one delta per decoded segment, then the whole text.

``Transcription.text`` is the authority. It is the segments' texts joined and stripped, so the
running text after each segment, stripped the same way, is always a prefix of the final text:
each delta is what that prefix adds, and the deltas concatenate to the final text exactly.
"""

from __future__ import annotations

import logging

from whisper_engine.results import Segment, Transcription

logger = logging.getLogger(__name__)


class TextDeltas:
    """Turns segments, in order, into text deltas whose concatenation is the final text."""

    def __init__(self) -> None:
        self._joined: list[str] = []
        self.emitted = ""

    def add(self, segment: Segment) -> str:
        self._joined.append(segment.text)
        running = "".join(self._joined).strip()
        if not running.startswith(self.emitted):
            return ""  # cannot happen with stripped joins; the remainder comes in finish()
        delta = running[len(self.emitted) :]
        self.emitted = running
        return delta

    def finish(self, transcription: Transcription) -> str:
        """The last delta: whatever of the final text has not been sent yet."""
        if not transcription.text.startswith(self.emitted):
            logger.error("Streamed text diverged from the final transcription text")
            return ""
        delta = transcription.text[len(self.emitted) :]
        self.emitted = transcription.text
        return delta
