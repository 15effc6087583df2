"""Whisper speech-to-text engine: audio in, typed transcriptions out, over pluggable backends."""
