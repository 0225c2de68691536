"""What preparing a short chat request costs on the event loop against a worker thread: the
engine's input processor (template, tokens, checks) run inline, and the same call handed to
``trio.to_thread.run_sync`` and back, per request, on the gemma test model.

    .venv/bin/python benchmarks/prepare_inline.py --requests 400

The engine prepares a request whose messages hold at most ``INLINE_PREPARE_CHARS``
characters (with no grammar, schema or tools) inline; this prints the microseconds per
request of both ways for messages of several lengths (the median of ``--rounds`` rounds), so
the threshold can be checked on a machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

import trio

from llmtrio.engine import Engine, EngineConfig, GenerateRequest, demo_model_path
from llmtrio.engine.generate._engine import INLINE_PREPARE_CHARS


async def _main(args: argparse.Namespace) -> None:
    config = EngineConfig(model=str(demo_model_path()), max_inflight=1, threads=1)
    async with Engine.open(config) as engine:
        prepare = engine._inputs.prepare
        print(f"INLINE_PREPARE_CHARS = {INLINE_PREPARE_CHARS}")
        print(f"{'characters':>10} {'inline us':>10} {'thread us':>10}")
        for chars in args.chars:
            text = ("The quick brown fox jumps over the lazy dog. " * (chars // 45 + 1))[:chars]
            request = GenerateRequest.user(text, max_tokens=1)
            inline, hop = [], []
            for _ in range(args.rounds):
                started = time.perf_counter()
                for _ in range(args.requests):
                    prepare(request)
                inline.append((time.perf_counter() - started) / args.requests * 1e6)
                started = time.perf_counter()
                for _ in range(args.requests):
                    await trio.to_thread.run_sync(prepare, request)
                hop.append((time.perf_counter() - started) / args.requests * 1e6)
            print(f"{chars:>10} {statistics.median(inline):>10.0f} {statistics.median(hop):>10.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="requests a round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--chars", type=int, nargs="+", default=[16, 256, 1024, 4096], help="message lengths"
    )
    trio.run(_main, parser.parse_args())


if __name__ == "__main__":
    main()
