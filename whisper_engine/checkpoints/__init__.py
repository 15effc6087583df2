"""Model checkpoints: find, verify and convert Whisper weights into the Hugging Face layout.

No model library is imported here: weights are read with numpy and written with safetensors.
"""

from whisper_engine.checkpoints.embedded import EMBEDDED_MODEL_ID, EMBEDDED_MODEL_SHA256
from whisper_engine.checkpoints.resolve import resolve_checkpoint

__all__ = ["EMBEDDED_MODEL_ID", "EMBEDDED_MODEL_SHA256", "resolve_checkpoint"]
