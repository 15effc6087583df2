"""``python -m whisper_engine``: see ``whisper_engine.cli``."""

from whisper_engine.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
