"""Which devices the engines of a pool run on: one engine per visible CUDA GPU by default."""

from __future__ import annotations

import re

_ONE_GPU = re.compile(r"^cuda:\d+$")


def cuda_device_count() -> int:
    """CUDA GPUs this process can see (``CUDA_VISIBLE_DEVICES`` applies); 0 without torch."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def engine_devices(device: str | None, engines: int | None = None) -> list[str | None]:
    """The device of each engine to start, in slot order.

    ``device`` is what was asked for (cpu, cuda, cuda:N or None for "a GPU when present");
    ``engines`` how many engines (None: one per visible GPU, or one on the CPU or on a
    device pinned with cuda:N). Engines beyond the GPU count go round-robin over the GPUs.
    None in the result leaves the choice to the backend, as for a single engine.
    """
    if engines is not None and engines < 1:
        raise ValueError(f"engines must be at least 1, got {engines}")
    if device == "cpu" or (device is not None and _ONE_GPU.match(device)):
        return [device] * (engines or 1)
    gpus = cuda_device_count()
    if gpus == 0:
        return [device] * (engines or 1)
    return [f"cuda:{slot % gpus}" for slot in range(engines or gpus)]
