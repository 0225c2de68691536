"""The command's flags as one table: for each command its sections of rows, each row a flag,
the setting it gives (``Class.field``: a config field, its default read from the class; or a
bare ``name``) and its help (see ``llmtrio.cli._parser``, which builds the parser from it)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ._flag_sections import CATALOG, ENGINE, LIMITS
from ._parser import Command, flag, section
from ._values import seconds_or_none

__all__ = ["COMMANDS", "OPTIONS"]

_SAMPLING = "sampling (default %(default)s)"

GENERATE = Command(
    "generate",
    "generate one completion, streamed to stdout",
    (
        section(
            None,
            flag("--prompt", "prompt", required=True),
            flag("--system", "system"),
            flag(
                "--think",
                "think",
                "let the model reason first (reasoning goes to stderr)",
                action=argparse.BooleanOptionalAction,
            ),
            flag(
                "--max-tokens",
                "max_tokens",
                "tokens to generate at most (default 256)",
                type=int,
                default=256,
            ),
            flag("--temperature", "Sampling.temperature", _SAMPLING, type=float),
            flag("--top-p", "Sampling.top_p", _SAMPLING, type=float),
            flag("--top-k", "Sampling.top_k", _SAMPLING, type=int),
            flag("--min-p", "Sampling.min_p", _SAMPLING, type=float),
            flag("--seed", "Sampling.seed", _SAMPLING, type=int),
            flag("--stop", "stop", "a stop string (repeatable)", action="append", default=[]),
        ),
        ENGINE,
    ),
)

EMBED = Command(
    "embed",
    "embed texts with an embedding model: one JSON array per line, in order",
    (section(None, flag("texts", "texts", "a text to embed", nargs="+", metavar="TEXT")), ENGINE),
)

SERVE = Command(
    "serve",
    "serve the OpenAI-compatible API and the chat page",
    (
        section(
            None,
            flag("--host", "ServeConfig.host", "address to listen on (default %(default)s)"),
            flag(
                "--port",
                "port",
                "port (default 8443 with TLS, 8080 without; 0: any free)",
                type=int,
            ),
            flag("--tls-cert", "tls_cert", "certificate (PEM) for HTTPS", type=Path),
            flag("--tls-key", "tls_key", "private key (PEM) for HTTPS", type=Path),
            flag(
                "--ring-streams",
                "RingConfig.max_streams",
                "requests parked at once before 503 (default %(default)s)",
                type=int,
            ),
            flag(
                "--park-timeout",
                "RingConfig.park_timeout",
                "seconds a request may wait for a worker before 503 (default %(default)s)",
                type=float,
            ),
            flag(
                "--graceful-timeout",
                "ServeConfig.graceful_timeout",
                "seconds in-flight streams get on shutdown (default %(default)s)",
                type=float,
            ),
            flag(
                "--max-body-bytes",
                "ServeConfig.max_body_bytes",
                "largest request body before 413 (default %(default)s)",
                type=int,
            ),
            flag(
                "--max-image-body-bytes",
                "ServeConfig.max_image_body_bytes",
                "largest body of a request holding an image part, before 413 (default "
                "%(default)s; at most 15 MiB: the ring's frame limit)",
                type=int,
            ),
            flag(
                "--max-audio-body-bytes",
                "ServeConfig.max_audio_body_bytes",
                "largest body of a request holding an audio part, or of a transcription's "
                "form, before 413 (default %(default)s; at most 15 MiB: the ring's frame limit)",
                type=int,
            ),
            flag(
                "--send-timeout",
                "ServeConfig.send_timeout",
                "seconds a client may take nothing before it is disconnected (default %(default)s)",
                type=float,
            ),
            flag(
                "--allowed-origins",
                "allowed_origins",
                "web origins whose pages may call the API, comma-separated or repeated "
                "(besides this server's own and loopback ones; '*' allows all)",
                action="append",
                default=[],
                metavar="ORIGINS",
            ),
        ),
        section(
            "access and limits on the public listener",
            flag(
                "--api-key",
                "api_key",
                "an API key clients must send (Authorization: Bearer, or X-Api-Key); repeatable",
                action="append",
                default=[],
            ),
            flag(
                "--api-key-file",
                "api_key_file",
                "a file of API keys, one per line ('#' comments and blank lines skipped)",
                action="append",
                type=Path,
                default=[],
            ),
            flag(
                "--rate-limit",
                "rate_limit",
                "completion requests per API key (or client address) per minute, then 429",
                type=int,
            ),
            flag(
                "--request-timeout",
                "ServeConfig.request_timeout",
                "seconds a completion request may run, arrival to last byte "
                "(default %(default)s; 0: none)",
                type=seconds_or_none,
            ),
            flag(
                "--body-timeout",
                "ServeConfig.body_timeout",
                "seconds for a request body to arrive, then 408 (default %(default)s)",
                type=float,
            ),
            flag(
                "--idle-timeout",
                "ServeConfig.idle_timeout",
                "seconds a connection may sit idle, waiting for request headers included "
                "(default %(default)s)",
                type=float,
            ),
        ),
        LIMITS,
        CATALOG,
        section(
            "remote workers (the ring's control listener)",
            flag(
                "--control-port",
                "control_port",
                "listen for workers on this port (WebSocket over mutual TLS; 0: any free)",
                type=int,
            ),
            flag(
                "--control-host",
                "control_host",
                "address for the control listener (default: --host)",
            ),
            flag("--control-cert", "control_cert", "this ingress's certificate (PEM)", type=Path),
            flag("--control-key", "control_key", "its private key (PEM)", type=Path),
            flag(
                "--control-ca",
                "control_ca",
                "the CA that signs worker certificates (PEM)",
                type=Path,
            ),
            flag(
                "--worker-timeout",
                "ControlConfig.worker_timeout",
                "seconds without a heartbeat before a worker is declared dead "
                "(default %(default)s)",
                type=float,
            ),
            flag(
                "--cancel-ack-timeout",
                "ControlConfig.cancel_ack_timeout",
                "seconds a worker has to acknowledge a cancel (default %(default)s)",
                type=float,
            ),
            flag(
                "--no-local-worker",
                "no_local_worker",
                "run no engine here (llama.cpp is not loaded): only remote workers serve",
                action="store_true",
            ),
            flag(
                "--default-model",
                "ServeConfig.default_model",
                "the model a request naming an unknown model, or none, goes to (default: the "
                "model, when one --model is served here; else none: an unknown model is a 404)",
                metavar="NAME",
            ),
        ),
        ENGINE,
    ),
)

WORKER = Command(
    "worker",
    "run an engine that pulls requests from one or more ingresses",
    (
        section(
            None,
            flag(
                "--ingress-url",
                "ingress_url",
                "an ingress's control listener, wss://HOST:PORT (repeatable)",
                action="append",
                required=True,
            ),
            flag("--tls-cert", "tls_cert", "this worker's certificate", type=Path, required=True),
            flag("--tls-key", "tls_key", "its private key (default: in --tls-cert)", type=Path),
            flag(
                "--ca",
                "ca",
                "the CA that signs ingress certificates (PEM)",
                type=Path,
                required=True,
            ),
            flag("--name", "name", "a name for logs (the ingress uses the certificate's)"),
            flag(
                "--graceful-timeout",
                "run_worker.graceful_timeout",
                "seconds held streams get to finish on SIGTERM (default %(default)s)",
                type=float,
            ),
            flag(
                "--metrics-port",
                "metrics_port",
                "serve Prometheus metrics on this port (0: any free)",
                type=int,
            ),
            flag(
                "--metrics-host",
                "metrics_host",
                "address for --metrics-port (default %(default)s)",
                default="127.0.0.1",
            ),
            flag(
                "--resolve-interval",
                "DialConfig.resolve_interval",
                "seconds between lookups of an --ingress-url name: every address it resolves "
                "to is an ingress (default %(default)s)",
                type=float,
            ),
            flag(
                "--ingress-timeout",
                "DialConfig.ingress_timeout",
                "seconds an ingress may answer no ping before it is given up and redialed "
                "(default %(default)s)",
                type=float,
            ),
        ),
        LIMITS,
        CATALOG,
        ENGINE,
    ),
)

PULL = Command(
    "pull",
    "fetch a model into the Hugging Face cache (what llmtrio serve and worker read)",
    (
        section(
            None,
            flag(
                "model",
                "model",
                "a Hugging Face repo of GGUF files (default: the default model's)",
                nargs="?",
                metavar="REPO[:QUANT]",
            ),
            flag("--hf-file", "hf_file", "the GGUF file in the repo (default: chosen by quant)"),
            flag("--quant", "quant", "quantization to pick (default: the engine's, Q4_K_M)"),
        ),
    ),
)

PS = Command(
    "ps",
    "list the models a server has loaded, with their memory and when each unloads",
    (
        section(
            None,
            flag(
                "--url",
                "url",
                "the server (default %(default)s)",
                default="http://127.0.0.1:8080",
            ),
            flag("--api-key", "api_key", "an API key, if the server asks for one"),
        ),
    ),
)

COMMANDS = (GENERATE, EMBED, SERVE, WORKER, PULL, PS)

#: The options before the command.
OPTIONS = (
    flag("-v --verbose", "verbose", "log llama.cpp and engine details", action="store_true"),
)
