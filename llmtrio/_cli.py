"""The ``llmtrio`` command: ``generate``, ``serve`` and ``worker``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ._openai_errors import DEFAULT_MAX_BODY_BYTES

if TYPE_CHECKING:
    from .engine import EngineConfig
    from .ring import ControlConfig
    from .worker import RequestLimits

# The engine (and llama.cpp with it) is imported only by the commands that run one, so that
# ``llmtrio serve --no-local-worker`` is an ingress without llama.cpp loaded.

__all__ = ["main"]


def _mib(text: str) -> int:
    """A size in MiB: a whole number, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of MiB: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def _engine_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model and engine")
    group.add_argument("--model", type=Path, help="a local GGUF file (never falls back)")
    group.add_argument("--hf-repo", help="Hugging Face repo (default: unsloth/Qwen3.5-0.8B-GGUF)")
    group.add_argument("--hf-file", help="the GGUF file in the repo (default: chosen by --quant)")
    group.add_argument("--quant", help="quantization to pick (default: the engine's, Q4_K_M)")
    group.add_argument(
        "--max-inflight", type=int, default=8, help="slots decoded in one batch (default 8)"
    )
    group.add_argument(
        "--ctx-size", type=int, default=4096, help="context tokens per slot (default 4096)"
    )
    group.add_argument(
        "--target-step-ms",
        type=float,
        default=0.0,
        help="pause admission while a decode step is slower than this (0: off)",
    )
    group.add_argument(
        "--prefill-chunk", type=int, default=256, help="prompt tokens per step (default 256)"
    )
    group.add_argument(
        "--no-prompt-cache",
        action="store_true",
        help="ingest every prompt whole: reuse nothing a slot already holds",
    )
    group.add_argument(
        "--cache-ram",
        type=_mib,
        default=1024,
        metavar="MiB",
        help="host memory for prompt snapshots other slots can restore "
        "(default 1024; 0: none, a slot still reuses its own memory)",
    )
    spec = group.add_mutually_exclusive_group()
    spec.add_argument(
        "--spec",
        choices=["ngram"],
        help="speculative decoding: 'ngram' drafts tokens by looking the last ones up in the "
        "prompt and output, verified in the same batch (default: the engine's, ngram)",
    )
    spec.add_argument(
        "--no-spec", action="store_true", help="no speculative decoding: one token per step"
    )
    group.add_argument(
        "--spec-draft-max",
        type=int,
        metavar="N",
        help="the most draft tokens one sequence verifies in a step (1-16; default: the "
        "engine's); fewer are drafted when the measured step costs say so",
    )
    group.add_argument(
        "--kv-unified",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="one context pool of --max-inflight x --ctx-size cells shared by all slots: one "
        "request may use all of it (default: the engine's, off)",
    )
    group.add_argument(
        "--max-request-ctx",
        type=int,
        metavar="N",
        help="the most context one request may use (default: --ctx-size, or with "
        "--kv-unified the whole pool)",
    )
    group.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="llama.cpp threads (default: all cores)",
    )
    group.add_argument("--model-name", help="the name /v1/models shows")
    group.add_argument(
        "--no-fallback",
        action="store_true",
        help="fail when the default model cannot be had, instead of using the demo model",
    )


def engine_config(args: argparse.Namespace) -> EngineConfig:
    from .engine import DEFAULT_QUANT, DEFAULT_REPO, EngineConfig

    return EngineConfig(
        model=args.model,
        hf_repo=args.hf_repo or DEFAULT_REPO,
        hf_file=args.hf_file,
        quant=args.quant or DEFAULT_QUANT,
        max_inflight=args.max_inflight,
        ctx_size=args.ctx_size,
        target_step_ms=args.target_step_ms,
        prefill_chunk=args.prefill_chunk,
        threads=args.threads,
        model_name=args.model_name,
        allow_fallback=not args.no_fallback,
        prompt_cache=not args.no_prompt_cache,
        cache_ram_mib=args.cache_ram,
        **_given(args),
    )


def _given(args: argparse.Namespace) -> dict[str, Any]:
    """The speculation and pool flags that were given; the others keep the engine's
    defaults."""
    given: dict[str, Any] = {
        name: value
        for name in ("spec", "spec_draft_max", "kv_unified", "max_request_ctx")
        if (value := getattr(args, name)) is not None
    }
    if args.no_spec:
        given["spec"] = None
    return given


def _limit_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("request limits (a request over one gets a 400 naming it)")
    group.add_argument(
        "--max-messages", type=int, default=2048, help="messages per chat request (default 2048)"
    )
    group.add_argument(
        "--max-tokens-limit",
        type=int,
        help="the most tokens a request may ask to generate (default: the slot's context)",
    )
    group.add_argument(
        "--max-stop", type=int, default=4, help="stop sequences per request (default 4)"
    )
    group.add_argument(
        "--max-stop-chars",
        type=int,
        default=256,
        help="characters per stop sequence (default 256)",
    )


def request_limits(args: argparse.Namespace) -> RequestLimits:
    from .worker import RequestLimits

    return RequestLimits(
        max_messages=args.max_messages,
        max_tokens=args.max_tokens_limit,
        max_stop=args.max_stop,
        max_stop_chars=args.max_stop_chars,
    )


def _api_keys(args: argparse.Namespace) -> list[str]:
    from .web import read_key_file

    keys = list(args.api_key)
    for path in args.api_key_file:
        try:
            keys += read_key_file(path)
        except OSError as exc:
            raise ValueError(f"cannot read --api-key-file {path}: {exc}") from None
    if args.api_key_file and not keys:
        raise ValueError("--api-key-file holds no key")
    return keys


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llmtrio", description=__doc__)
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log llama.cpp and engine details"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate one completion, streamed to stdout")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--system")
    gen.add_argument(
        "--think",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="let the model reason first (reasoning goes to stderr)",
    )
    gen.add_argument("--max-tokens", type=int, default=256)
    gen.add_argument("--temperature", type=float, default=0.8)
    gen.add_argument("--top-p", type=float, default=0.95)
    gen.add_argument("--top-k", type=int, default=40)
    gen.add_argument("--min-p", type=float, default=0.05)
    gen.add_argument("--seed", type=int)
    gen.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    _engine_flags(gen)

    serve = sub.add_parser("serve", help="serve the OpenAI-compatible API and the chat page")
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default %(default)s)"
    )
    serve.add_argument(
        "--port", type=int, help="port (default 8443 with TLS, 8080 without; 0: any free)"
    )
    serve.add_argument("--tls-cert", type=Path, help="certificate (PEM) for HTTPS")
    serve.add_argument("--tls-key", type=Path, help="private key (PEM) for HTTPS")
    serve.add_argument(
        "--ring-streams",
        type=int,
        default=64,
        help="requests parked at once before 503 (default 64)",
    )
    serve.add_argument(
        "--park-timeout",
        type=float,
        default=30.0,
        help="seconds a request may wait for a worker before 503 (default 30)",
    )
    serve.add_argument(
        "--graceful-timeout",
        type=float,
        default=10.0,
        help="seconds in-flight streams get on shutdown (default 10)",
    )
    serve.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="largest request body before 413 (default %(default)s)",
    )
    serve.add_argument(
        "--send-timeout",
        type=float,
        default=60.0,
        help="seconds a client may take nothing before it is disconnected (default 60)",
    )
    serve.add_argument(
        "--allowed-origins",
        action="append",
        default=[],
        metavar="ORIGINS",
        help="web origins whose pages may call the API, comma-separated or repeated "
        "(besides this server's own and loopback ones; '*' allows all)",
    )
    guard = serve.add_argument_group("access and limits on the public listener")
    guard.add_argument(
        "--api-key",
        action="append",
        default=[],
        help="an API key clients must send (Authorization: Bearer, or X-Api-Key); repeatable",
    )
    guard.add_argument(
        "--api-key-file",
        action="append",
        type=Path,
        default=[],
        help="a file of API keys, one per line ('#' comments and blank lines skipped)",
    )
    guard.add_argument(
        "--rate-limit",
        type=int,
        help="completion requests per API key (or client address) per minute, then 429",
    )
    guard.add_argument(
        "--request-timeout",
        type=float,
        default=600.0,
        help="seconds a completion request may run, arrival to last byte (default 600; 0: none)",
    )
    guard.add_argument(
        "--body-timeout",
        type=float,
        default=60.0,
        help="seconds for a request body to arrive, then 408 (default 60)",
    )
    guard.add_argument(
        "--idle-timeout",
        type=float,
        default=5.0,
        help="seconds a connection may sit idle, waiting for request headers included (default 5)",
    )
    _limit_flags(serve)
    ring = serve.add_argument_group("remote workers (the ring's control listener)")
    ring.add_argument(
        "--control-port",
        type=int,
        help="listen for workers on this port (WebSocket over mutual TLS; 0: any free)",
    )
    ring.add_argument("--control-host", help="address for the control listener (default: --host)")
    ring.add_argument("--control-cert", type=Path, help="this ingress's certificate (PEM)")
    ring.add_argument("--control-key", type=Path, help="its private key (PEM)")
    ring.add_argument("--control-ca", type=Path, help="the CA that signs worker certificates (PEM)")
    ring.add_argument(
        "--worker-timeout",
        type=float,
        default=10.0,
        help="seconds without a heartbeat before a worker is declared dead (default 10)",
    )
    ring.add_argument(
        "--cancel-ack-timeout",
        type=float,
        default=5.0,
        help="seconds a worker has to acknowledge a cancel (default 5)",
    )
    ring.add_argument(
        "--no-local-worker",
        action="store_true",
        help="run no engine here (llama.cpp is not loaded): only remote workers serve",
    )
    _engine_flags(serve)

    worker = sub.add_parser(
        "worker", help="run an engine that pulls requests from one or more ingresses"
    )
    worker.add_argument(
        "--ingress-url",
        action="append",
        required=True,
        help="an ingress's control listener, wss://HOST:PORT (repeatable)",
    )
    worker.add_argument("--tls-cert", type=Path, required=True, help="this worker's certificate")
    worker.add_argument("--tls-key", type=Path, help="its private key (default: in --tls-cert)")
    worker.add_argument(
        "--ca", type=Path, required=True, help="the CA that signs ingress certificates (PEM)"
    )
    worker.add_argument("--name", help="a name for logs (the ingress uses the certificate's)")
    worker.add_argument(
        "--graceful-timeout",
        type=float,
        default=30.0,
        help="seconds held streams get to finish on SIGTERM (default 30)",
    )
    worker.add_argument(
        "--metrics-port", type=int, help="serve Prometheus metrics on this port (0: any free)"
    )
    worker.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address for --metrics-port (default %(default)s)",
    )
    _limit_flags(worker)
    _engine_flags(worker)
    return parser


def _control_config(args: argparse.Namespace) -> ControlConfig | None:
    from .ring import ControlConfig, server_ssl_context

    files = (args.control_cert, args.control_key, args.control_ca)
    if args.control_port is None:
        if any(files):
            raise ValueError("--control-cert/--control-key/--control-ca need --control-port")
        return None
    if not all(files):
        raise ValueError("--control-port needs --control-cert, --control-key and --control-ca")
    try:
        context = server_ssl_context(args.control_cert, args.control_key, args.control_ca)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot load the control certificates: {exc}") from None
    return ControlConfig(
        context,
        host=args.control_host or args.host,
        port=args.control_port,
        worker_timeout=args.worker_timeout,
        cancel_ack_timeout=args.cancel_ack_timeout,
    )


def _worker(args: argparse.Namespace) -> int:
    from ._ingress import until_signalled
    from ._remote_worker import run_worker
    from .ring import client_ssl_context

    try:
        context = client_ssl_context(args.tls_cert, args.tls_key, args.ca)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"llmtrio worker: cannot load the certificates: {exc}") from None
    config = engine_config(args)
    try:
        limits = request_limits(args)
    except ValueError as exc:
        raise SystemExit(f"llmtrio worker: {exc}") from None
    metrics = None if args.metrics_port is None else (args.metrics_host, args.metrics_port)

    async def run(shutdown: trio.Event) -> None:
        await run_worker(
            config,
            args.ingress_url,
            context,
            shutdown=shutdown,
            name=args.name,
            graceful_timeout=args.graceful_timeout,
            limits=limits,
            metrics_address=metrics,
        )

    trio.run(partial(until_signalled, run, graceful_timeout=args.graceful_timeout))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from .web import ServeConfig

    try:
        control = _control_config(args)
        if args.no_local_worker and control is None:
            raise ValueError("--no-local-worker needs --control-port (or nothing serves)")
        config = ServeConfig(
            host=args.host,
            port=args.port,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            ring_streams=args.ring_streams,
            park_timeout=args.park_timeout,
            graceful_timeout=args.graceful_timeout,
            max_body_bytes=args.max_body_bytes,
            send_timeout=args.send_timeout,
            allowed_origins=[
                origin.strip()
                for value in args.allowed_origins
                for origin in value.split(",")
                if origin.strip()
            ],
            api_keys=_api_keys(args),
            rate_limit=args.rate_limit,
            request_timeout=args.request_timeout or None,
            body_timeout=args.body_timeout,
            idle_timeout=args.idle_timeout,
        )
        limits = request_limits(args)
    except ValueError as exc:
        raise SystemExit(f"llmtrio serve: {exc}") from None
    if args.no_local_worker:
        from ._ingress import serve_ring_ingress, until_signalled

        assert control is not None

        async def ingress(shutdown: trio.Event) -> None:
            name = args.model_name or ""
            await serve_ring_ingress(config, control, model_name=name, shutdown=shutdown)

        trio.run(partial(until_signalled, ingress, graceful_timeout=config.graceful_timeout))
        return 0
    from .server import serve_until_signalled

    trio.run(serve_until_signalled, engine_config(args), config, control, limits)
    return 0


async def _generate(args: argparse.Namespace) -> int:
    from .engine import Done, Engine, Failed, GenerateRequest, Sampling, Token

    request = GenerateRequest.user(
        args.prompt,
        system=args.system,
        max_tokens=args.max_tokens,
        think=args.think,
        stop=tuple(args.stop),
        sampling=Sampling(
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            min_p=args.min_p,
            seed=args.seed,
        ),
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
        if args.command == "worker":
            return _worker(args)
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
