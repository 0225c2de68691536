"""The ``llmtrio serve`` subcommand."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from ..worker._openai import DEFAULT_MAX_BODY_BYTES
from ._serve import ServeConfig, serve_until_signalled

__all__ = ["add_serve_parser"]


def add_serve_parser(sub: Any, engine_flags: Callable[[argparse.ArgumentParser], None]) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "serve", help="serve the OpenAI-compatible API and the chat page"
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default %(default)s)"
    )
    parser.add_argument(
        "--port", type=int, help="port (default 8443 with TLS, 8080 without; 0: any free)"
    )
    parser.add_argument("--tls-cert", type=Path, help="certificate (PEM) for HTTPS")
    parser.add_argument("--tls-key", type=Path, help="private key (PEM) for HTTPS")
    parser.add_argument(
        "--ring-streams",
        type=int,
        default=64,
        help="requests parked at once before 503 (default 64)",
    )
    parser.add_argument(
        "--graceful-timeout",
        type=float,
        default=10.0,
        help="seconds in-flight streams get on shutdown (default 10)",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="largest request body before 413",
    )
    engine_flags(parser)
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from .._cli import engine_config

    try:
        config = ServeConfig(
            host=args.host,
            port=args.port,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            ring_streams=args.ring_streams,
            graceful_timeout=args.graceful_timeout,
            max_body_bytes=args.max_body_bytes,
        )
    except ValueError as exc:
        raise SystemExit(f"llmtrio serve: {exc}") from None
    trio.run(serve_until_signalled, engine_config(args), config)
    return 0
