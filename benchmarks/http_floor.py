"""What one request costs the server's main thread (the Trio thread), ``llmtrio serve`` against
the floor: a trivial ASGI app on plain hypercorn that answers every request with the same
384-float JSON body (no ring, no engine, no checks, no log).

    .venv/bin/python benchmarks/http_floor.py --requests 400 --rounds 3

Both servers are up at once and measured in turns; each turn sends ``--requests`` sequential
single-input embedding requests over one kept-alive connection
(``embed_compare.closed_loop``) and reads the main thread's CPU time from
``/proc/PID/task/PID/schedstat`` before and after. Linux only.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from contextlib import AsyncExitStack
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _servers import HOST, free_port
from embed_compare import MINILM, closed_loop, llmtrio_argv, running

_BODY = json.dumps({"object": "list", "data": [{"embedding": [0.1] * 384}]}).encode()


async def _trivial_app(scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def]
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return
    while (await receive()).get("more_body"):
        pass
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(_BODY))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": _BODY})


def _serve_trivial(port: int) -> None:
    from hypercorn.config import Config
    from hypercorn.trio import serve

    config = Config()
    config.bind = [f"{HOST}:{port}"]
    config.accesslog = None
    trio.run(serve, _trivial_app, config)


def _main_thread_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0])


async def _turn(base: str, pid: int, requests: int) -> float:
    body = json.dumps({"input": "The quick brown fox jumps over the lazy dog."}).encode()
    before = _main_thread_ns(pid)
    await closed_loop(base, 1, requests, "/v1/embeddings", body, lambda i: body, lambda b: None)
    return (_main_thread_ns(pid) - before) / 1e6 / requests


async def _pid_of(port: int) -> int:
    """The server process listening on ``port`` (its command line names the port)."""
    found = await trio.run_process(["pgrep", "-f", "--", f"[ =]{port}( |$)"], capture_stdout=True)
    return int(found.stdout.split()[0])


async def main(args: argparse.Namespace) -> int:
    floor = "trivial ASGI app on hypercorn"
    ports = {floor: free_port(), "llmtrio serve": free_port()}
    argvs = {
        floor: [sys.executable, __file__, "--serve-trivial", str(ports[floor])],
        "llmtrio serve": llmtrio_argv(args.model, ports["llmtrio serve"], args.threads),
    }
    results: dict[str, list[float]] = {name: [] for name in ports}
    with tempfile.TemporaryDirectory() as tmp:
        async with AsyncExitStack() as stack:
            pids = {}
            for index, (name, port) in enumerate(ports.items()):
                base = f"http://{HOST}:{port}"
                log = Path(tmp) / f"server-{index}.log"
                await stack.enter_async_context(running(argvs[name], base, log))
                pids[name] = await _pid_of(port)
            for _ in range(args.rounds):
                for name, port in ports.items():
                    base = f"http://{HOST}:{port}"
                    results[name].append(await _turn(base, pids[name], args.requests))
    print("| server | main thread's CPU a request, each turn (ms) |")
    print("|---|---|")
    for name, values in results.items():
        print(f"| {name} | {', '.join(f'{v:.2f}' for v in values)} |")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", type=Path, default=MINILM)
    parser.add_argument("--serve-trivial", type=int, metavar="PORT", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.serve_trivial:
        _serve_trivial(arguments.serve_trivial)
    else:
        sys.exit(trio.run(main, arguments))
