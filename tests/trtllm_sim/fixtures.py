"""Puts the tensorrt_llm stand-in on sys.path for the duration of a fixture, then removes it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import pytest

SIM_DIR = Path(__file__).resolve().parent


@contextmanager
def stand_in_library() -> Iterator[ModuleType]:
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(SIM_DIR))
        import tensorrt_llm

        assert tensorrt_llm.IS_TEST_STAND_IN
        try:
            yield tensorrt_llm
        finally:
            for name in [n for n in sys.modules if n.split(".")[0] == "tensorrt_llm"]:
                del sys.modules[name]
