"""``python -m server``: the same as the ``whisper-server`` command."""

from server.cli import main

main()
