"""``whisper-server``: serve the OpenAI-compatible API, or print TensorRT-LLM engine arguments.

    whisper-server [--host H] [--port P] [--model M] [--backend auto|torch|trtllm]
                   [--device D] [--config FILE] [--log-level L]
    whisper-server engine-config [--model M] [--format yaml|json]

With no arguments it serves the embedded whisper-base on 127.0.0.1:8000 (CPU unless a GPU is
present), fully offline.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from server.settings import Settings, load_settings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="whisper-server",
        description="OpenAI-compatible speech-to-text server (Whisper).",
        epilog="Every option can also be set as a WHISPER_* environment variable.",
    )
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="TCP port (default 8000)")
    parser.add_argument("--model", help="model id or checkpoint directory (default: embedded)")
    parser.add_argument("--backend", choices=["auto", "torch", "trtllm"])
    parser.add_argument("--device", help="cpu, cuda or cuda:N (default: a GPU if present)")
    parser.add_argument("--config", metavar="FILE", help="YAML settings file (WHISPER_CONFIG)")
    parser.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug"])
    commands = parser.add_subparsers(dest="command", metavar="{engine-config}")
    engine = commands.add_parser(
        "engine-config",
        help="print the TensorRT-LLM engine arguments for a checkpoint",
        description="Print the TensorRT-LLM engine arguments computed from a checkpoint's "
        "config.json, as the YAML that trtllm-serve --config takes (or JSON).",
    )
    engine.add_argument("--model", dest="engine_model", help="checkpoint (default: embedded)")
    engine.add_argument("--format", choices=["yaml", "json"], default="yaml")
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {
        name: getattr(args, name)
        for name in ("host", "port", "model", "backend", "device", "log_level")
        if getattr(args, name) is not None
    }
    return load_settings(args.config, **overrides)


def serve(settings: Settings) -> None:
    import uvicorn

    from server.app import create_app

    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=30,
    )


def print_engine_config(model: str | None, fmt: str) -> None:
    # Imported here: only this subcommand needs the TensorRT-LLM argument builder.
    from whisper_engine.backends.trtllm_args import engine_config_text
    from whisper_engine.checkpoints import resolve_checkpoint

    sys.stdout.write(engine_config_text(resolve_checkpoint(model), fmt))


def main(argv: Sequence[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "engine-config":
            print_engine_config(args.engine_model or args.model, args.format)
            return
        settings = _settings(args)
    except ValidationError as exc:
        parser.exit(2, f"whisper-server: invalid settings:\n{exc}\n")
    except (OSError, ValueError) as exc:
        parser.exit(2, f"whisper-server: {exc}\n")
    serve(settings)
