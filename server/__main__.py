"""``python -m server``: the same as the ``whisper-server`` command."""

from server.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
