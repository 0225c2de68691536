"""The ``llmtrio`` command: ``generate``, ``embed``, ``serve``, ``worker``, ``pull`` and
``ps``."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from functools import partial

import attrs
import trio

from ._configs import (
    control_config,
    dial_config,
    engine_config,
    given,
    host_config,
    on_demand,
    request_limits,
    sampling,
    serve_config,
    startup_configs,
)
from ._flags import COMMANDS, OPTIONS
from ._parser import parser

# The engine (and llama.cpp with it) is imported only by the commands that run one, so that
# ``llmtrio serve --no-local-worker`` is an ingress without llama.cpp loaded.

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    return parser(__doc__, OPTIONS, COMMANDS)


def _worker(args: argparse.Namespace) -> int:
    from ..ring import client_ssl_context
    from ._ingress import until_signalled
    from ._worker import run_worker

    try:
        context = client_ssl_context(args.tls_cert, args.tls_key, args.ca)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"llmtrio worker: cannot load the certificates: {exc}") from None
    config = startup_configs(args)
    hosted = on_demand(args)
    host = host_config(args)
    limits = request_limits(args)
    dial = dial_config(args)
    metrics = None if args.metrics_port is None else (args.metrics_host, args.metrics_port)
    graceful_timeout = given(args.graceful_timeout)

    async def run(shutdown: trio.Event) -> None:
        await run_worker(
            config,
            args.ingress_url,
            context,
            shutdown=shutdown,
            name=args.name,
            graceful_timeout=graceful_timeout,
            limits=limits,
            metrics_address=metrics,
            dial=dial,
            on_demand=hosted,
            host=host,
        )

    trio.run(partial(until_signalled, run, graceful_timeout=graceful_timeout))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from . import _serve as server

    try:
        config = serve_config(args)
        control = control_config(args, config.host)
        run = server.serving(
            config,
            control,
            request_limits(args),
            local_worker=not args.no_local_worker,
            engine_configs=partial(startup_configs, args),
            model_name=args.model_name or "",
            on_demand=partial(on_demand, args),
            host=partial(host_config, args),
        )
    except ValueError as exc:
        raise SystemExit(f"llmtrio serve: {exc}") from None
    trio.run(run)
    return 0


async def _generate(args: argparse.Namespace) -> int:
    from ..engine import Done, Engine, Failed, GenerateRequest, Token

    request = GenerateRequest.user(
        args.prompt,
        system=args.system,
        max_tokens=args.max_tokens,
        think=args.think,
        stop=tuple(args.stop),
        sampling=sampling(args),
    )
    dim = ("\x1b[2m", "\x1b[0m") if sys.stderr.isatty() else ("", "")
    async with Engine.open(attrs.evolve(engine_config(args), max_inflight=1)) as engine:
        started = time.perf_counter()
        async with engine.submit(request) as generation:
            async for event in generation:
                if isinstance(event, Token):
                    stream = sys.stderr if event.reasoning else sys.stdout
                    if event.reasoning:
                        stream.write(dim[0] + event.text + dim[1])
                    else:
                        stream.write(event.text)
                    stream.flush()
                elif isinstance(event, Done):
                    elapsed = time.perf_counter() - started
                    decode = event.timings.decode_s
                    rate = (event.completion_tokens - 1) / decode if decode > 0 else 0.0
                    print(file=sys.stdout)
                    print(
                        f"[{event.stop.value}] prompt {event.prompt_tokens} tokens, "
                        f"completion {event.completion_tokens} tokens, {rate:.1f} tok/s decode, "
                        f"prefill {event.timings.prefill_s:.2f}s, total {elapsed:.2f}s",
                        file=sys.stderr,
                    )
                elif isinstance(event, Failed):
                    print(f"\nerror: {event.error}", file=sys.stderr)
                    return 1
    return 0


async def _embed(args: argparse.Namespace) -> int:
    from ..engine import EmbeddingEngine

    async with EmbeddingEngine.open(engine_config(args)) as engine:
        result = await engine.embed(args.texts)
    for vector in result.vectors:
        print(json.dumps(vector.tolist()), flush=True)
    print(
        f"[{engine.model_name}] {len(args.texts)} inputs, {result.prompt_tokens} tokens, "
        f"{engine.dimensions} dimensions ({engine.pooling} pooling, L2-normalized)",
        file=sys.stderr,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        logging.getLogger("llmtrio.llama").setLevel(logging.ERROR)
    try:
        if args.command == "generate":
            return trio.run(_generate, args)
        if args.command == "embed":
            return trio.run(_embed, args)
        if args.command == "worker":
            return _worker(args)
        if args.command == "ps":
            from ._ps import ps

            return ps(args.url, args.api_key)
        if args.command == "pull":
            from ._pull import pull

            pull(args.model, hf_file=args.hf_file, quant=args.quant)
            return 0
        return _serve(args)
    except Exception as exc:
        engine = sys.modules.get("llmtrio.engine")  # loaded only by commands that use it
        if engine is not None and isinstance(exc, engine.EngineError):
            print(f"llmtrio: {exc}", file=sys.stderr)
            return 2
        raise
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
