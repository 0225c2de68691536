"""The ``llmtrio`` command: ``generate``, ``embed``, ``serve``, ``worker`` and ``pull``."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import attrs
import trio

from ._settings import (
    Default,
    control_config,
    dial_config,
    engine_config,
    engine_configs,
    flags_of,
    given,
    mib,
    request_limits,
    sampling,
    seconds_or_none,
    serve_config,
    threads_value,
)

# The engine (and llama.cpp with it) is imported only by the commands that run one, so that
# ``llmtrio serve --no-local-worker`` is an ingress without llama.cpp loaded.

__all__ = ["main"]


def _engine(name: str) -> Default:
    return Default("llmtrio.engine:EngineConfig", name)


def _template_file(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {exc}") from None


def _engine_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model and engine")
    group.add_argument(
        "--model",
        action="append",
        metavar="[NAME=]PATH|OWNER/REPO[:QUANT]",
        help="a model to serve: a local GGUF file (served under its stem; never falls back), "
        "NAME=PATH (under NAME), or a Hugging Face repo (under owner/repo:QUANT); give it "
        "again to serve several models, one engine each",
    )
    group.add_argument(
        "--hf-repo", default=_engine("hf_repo"), help="Hugging Face repo (default %(default)s)"
    )
    group.add_argument("--hf-file", help="the GGUF file in the repo (default: chosen by --quant)")
    group.add_argument(
        "--quant", default=_engine("quant"), help="quantization to pick (default %(default)s)"
    )
    group.add_argument(
        "--max-inflight",
        type=int,
        default=_engine("max_inflight"),
        help="slots decoded in one batch (default %(default)s)",
    )
    group.add_argument(
        "--ctx-size",
        type=int,
        default=_engine("ctx_size"),
        help="context tokens per slot (default %(default)s)",
    )
    group.add_argument(
        "--target-step-ms",
        type=float,
        default=_engine("target_step_ms"),
        help="pause admission while a decode step is slower than this (0: off; "
        "default %(default)s)",
    )
    group.add_argument(
        "--prefill-chunk",
        type=int,
        default=_engine("prefill_chunk"),
        help="prompt tokens per step (default %(default)s)",
    )
    group.add_argument(
        "--no-prompt-cache",
        action="store_false",
        dest="prompt_cache",
        default=_engine("prompt_cache"),
        help="ingest every prompt whole: reuse nothing a slot already holds",
    )
    group.add_argument(
        "--cache-ram",
        type=mib,
        dest="cache_ram_mib",
        default=_engine("cache_ram_mib"),
        metavar="MiB",
        help="host memory for prompt snapshots other slots can restore "
        "(default %(default)s; 0: none, a slot still reuses its own memory)",
    )
    spec = group.add_mutually_exclusive_group()
    spec.add_argument(
        "--spec",
        choices=["ngram"],
        default=_engine("spec"),
        help="speculative decoding: 'ngram' drafts tokens by looking the last ones up in the "
        "prompt and output, verified in the same batch (default %(default)s: None is off)",
    )
    spec.add_argument(
        "--no-spec",
        action="store_const",
        const=None,
        dest="spec",
        default=_engine("spec"),
        help="no speculative decoding: one token per step",
    )
    group.add_argument(
        "--spec-draft-max",
        type=int,
        default=_engine("spec_draft_max"),
        metavar="N",
        help="the most draft tokens one sequence verifies in a step (1-64; default "
        "%(default)s; at most 8 on a model with recurrent state); fewer are drafted when "
        "the measured step costs say so",
    )
    group.add_argument(
        "--spec-pool",
        type=int,
        default=_engine("spec_pool"),
        metavar="ENTRIES",
        help="entries of the pool of n-grams shared by a worker's requests, which a request "
        "also drafts from (what other requests wrote; about 100 bytes an entry; default "
        "%(default)s; 0 is off: a shared pool lets one request's speed depend on what "
        "others wrote)",
    )
    group.add_argument(
        "--kv-unified",
        action=argparse.BooleanOptionalAction,
        default=_engine("kv_unified"),
        help="one context pool of --max-inflight x --ctx-size cells shared by all slots: one "
        "request may use all of it (default %(default)s)",
    )
    group.add_argument(
        "--max-request-ctx",
        type=int,
        default=_engine("max_request_ctx"),
        metavar="N",
        help="the most context one request may use (default %(default)s: --ctx-size, or with "
        "--kv-unified the whole pool)",
    )
    group.add_argument(
        "--threads",
        type=threads_value,
        action="append",
        metavar="[NAME=]N",
        help="llama.cpp threads of each model's engine: N for every model, NAME=N for the "
        "model served as NAME (again for others); default: the cores that NAME=N leaves, "
        "split evenly between the other models, at least 1 each",
    )
    group.add_argument(
        "--model-name", help="the name /v1/models shows and requests route by (one model)"
    )
    group.add_argument(
        "--chat-template-file",
        type=_template_file,
        dest="chat_template",
        metavar="PATH",
        help="a Jinja chat template to use instead of the model's own (its tool-call form, "
        "XML or JSON, is the one forced calls take)",
    )
    group.add_argument(
        "--no-fallback",
        action="store_false",
        dest="allow_fallback",
        default=_engine("allow_fallback"),
        help="fail when the default model cannot be had, instead of using the demo model",
    )


_LIMITS = "llmtrio._fields:RequestLimits"


def _limit_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("request limits (a request over one gets a 400 naming it)")
    group.add_argument(
        "--max-messages",
        type=int,
        default=Default(_LIMITS, "max_messages"),
        help="messages per chat request (default %(default)s)",
    )
    group.add_argument(
        "--max-tokens-limit",
        type=int,
        dest="max_tokens",  # RequestLimits.max_tokens; only ``generate`` has --max-tokens
        default=Default(_LIMITS, "max_tokens"),
        help="the most tokens a request may ask to generate (default: the slot's context)",
    )
    group.add_argument(
        "--max-stop",
        type=int,
        default=Default(_LIMITS, "max_stop"),
        help="stop sequences per request (default %(default)s)",
    )
    group.add_argument(
        "--max-stop-chars",
        type=int,
        default=Default(_LIMITS, "max_stop_chars"),
        help="characters per stop sequence (default %(default)s)",
    )
    group.add_argument(
        "--max-embedding-inputs",
        type=int,
        default=Default(_LIMITS, "max_embedding_inputs"),
        help="inputs per embeddings request (default %(default)s)",
    )


_RING = "llmtrio.ring:RingConfig"
_CONTROL = "llmtrio.ring:ControlConfig"
_DIAL = "llmtrio.ring:DialConfig"


def _serving(name: str) -> Default:
    return Default("llmtrio.web:ServeConfig", name)


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
    gen.add_argument(
        "--max-tokens", type=int, default=256, help="tokens to generate at most (default 256)"
    )
    for flag, kind in (("--temperature", float), ("--top-p", float), ("--top-k", int),
                       ("--min-p", float), ("--seed", int)):  # fmt: skip
        name = flag[2:].replace("-", "_")
        gen.add_argument(
            flag,
            type=kind,
            default=Default("llmtrio.engine:Sampling", name),
            help="sampling (default %(default)s)",
        )
    gen.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    _engine_flags(gen)

    embed = sub.add_parser(
        "embed", help="embed texts with an embedding model: one JSON array per line, in order"
    )
    embed.add_argument("texts", nargs="+", metavar="TEXT", help="a text to embed")
    _engine_flags(embed)

    serve = sub.add_parser("serve", help="serve the OpenAI-compatible API and the chat page")
    serve.add_argument(
        "--host", default=_serving("host"), help="address to listen on (default %(default)s)"
    )
    serve.add_argument(
        "--port", type=int, help="port (default 8443 with TLS, 8080 without; 0: any free)"
    )
    serve.add_argument("--tls-cert", type=Path, help="certificate (PEM) for HTTPS")
    serve.add_argument("--tls-key", type=Path, help="private key (PEM) for HTTPS")
    serve.add_argument(
        "--ring-streams",
        type=int,
        dest="max_streams",  # RingConfig's
        default=Default(_RING, "max_streams"),
        help="requests parked at once before 503 (default %(default)s)",
    )
    serve.add_argument(
        "--park-timeout",
        type=float,
        default=Default(_RING, "park_timeout"),
        help="seconds a request may wait for a worker before 503 (default %(default)s)",
    )
    serve.add_argument(
        "--graceful-timeout",
        type=float,
        default=_serving("graceful_timeout"),
        help="seconds in-flight streams get on shutdown (default %(default)s)",
    )
    serve.add_argument(
        "--max-body-bytes",
        type=int,
        default=_serving("max_body_bytes"),
        help="largest request body before 413 (default %(default)s)",
    )
    serve.add_argument(
        "--send-timeout",
        type=float,
        default=_serving("send_timeout"),
        help="seconds a client may take nothing before it is disconnected (default %(default)s)",
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
        type=seconds_or_none,
        default=_serving("request_timeout"),
        help="seconds a completion request may run, arrival to last byte "
        "(default %(default)s; 0: none)",
    )
    guard.add_argument(
        "--body-timeout",
        type=float,
        default=_serving("body_timeout"),
        help="seconds for a request body to arrive, then 408 (default %(default)s)",
    )
    guard.add_argument(
        "--idle-timeout",
        type=float,
        default=_serving("idle_timeout"),
        help="seconds a connection may sit idle, waiting for request headers included "
        "(default %(default)s)",
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
        default=Default(_CONTROL, "worker_timeout"),
        help="seconds without a heartbeat before a worker is declared dead (default %(default)s)",
    )
    ring.add_argument(
        "--cancel-ack-timeout",
        type=float,
        default=Default(_CONTROL, "cancel_ack_timeout"),
        help="seconds a worker has to acknowledge a cancel (default %(default)s)",
    )
    ring.add_argument(
        "--no-local-worker",
        action="store_true",
        help="run no engine here (llama.cpp is not loaded): only remote workers serve",
    )
    ring.add_argument(
        "--default-model",
        default=Default("llmtrio.web:ServeConfig", "default_model"),
        metavar="NAME",
        help="the model a request naming an unknown model, or none, goes to (default: the "
        "model, when one --model is served here; else none: an unknown model is a 404)",
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
        default=Default("llmtrio._remote_worker:run_worker", "graceful_timeout"),
        help="seconds held streams get to finish on SIGTERM (default %(default)s)",
    )
    worker.add_argument(
        "--metrics-port", type=int, help="serve Prometheus metrics on this port (0: any free)"
    )
    worker.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address for --metrics-port (default %(default)s)",
    )
    worker.add_argument(
        "--resolve-interval",
        type=float,
        default=Default(_DIAL, "resolve_interval"),
        help="seconds between lookups of an --ingress-url name: every address it resolves to "
        "is an ingress (default %(default)s)",
    )
    worker.add_argument(
        "--ingress-timeout",
        type=float,
        default=Default(_DIAL, "ingress_timeout"),
        help="seconds an ingress may answer no ping before it is given up and redialed "
        "(default %(default)s)",
    )
    _limit_flags(worker)
    _engine_flags(worker)

    pull = sub.add_parser(
        "pull",
        help="fetch a model into the Hugging Face cache (what llmtrio serve and worker read)",
    )
    pull.add_argument(
        "model",
        nargs="?",
        metavar="REPO[:QUANT]",
        help="a Hugging Face repo of GGUF files (default: the default model's)",
    )
    pull.add_argument("--hf-file", help="the GGUF file in the repo (default: chosen by quant)")
    pull.add_argument("--quant", help="quantization to pick (default: the engine's, Q4_K_M)")
    for command in (gen, embed, serve, worker, pull):
        command.set_defaults(flags=flags_of(command))
    return parser


def _worker(args: argparse.Namespace) -> int:
    from ._ingress import until_signalled
    from ._remote_worker import run_worker
    from .ring import client_ssl_context

    try:
        context = client_ssl_context(args.tls_cert, args.tls_key, args.ca)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"llmtrio worker: cannot load the certificates: {exc}") from None
    config = engine_configs(args)
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
        )

    trio.run(partial(until_signalled, run, graceful_timeout=graceful_timeout))
    return 0


def _serve(args: argparse.Namespace) -> int:
    try:
        config = serve_config(args)
        control = control_config(args, config.host)
        if args.no_local_worker and control is None:
            raise ValueError("--no-local-worker needs --control-port (or nothing serves)")
    except ValueError as exc:
        raise SystemExit(f"llmtrio serve: {exc}") from None
    limits = request_limits(args)
    if args.no_local_worker:
        from ._ingress import serve_ring_ingress, until_signalled

        assert control is not None

        async def ingress(shutdown: trio.Event) -> None:
            name = args.model_name or ""
            await serve_ring_ingress(
                config, control, model_name=name, shutdown=shutdown, limits=limits
            )

        trio.run(partial(until_signalled, ingress, graceful_timeout=config.graceful_timeout))
        return 0
    from .server import serve_until_signalled

    trio.run(serve_until_signalled, engine_configs(args), config, control, limits)
    return 0


async def _generate(args: argparse.Namespace) -> int:
    from .engine import Done, Engine, Failed, GenerateRequest, Token

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
    from .engine import EmbeddingEngine

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
