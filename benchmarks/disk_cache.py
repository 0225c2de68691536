"""The prompt cache on disk: turn 2's time to first token after an 18k-token prefix (a body of
Claude Code's first request's shape: a billing block and a long system prompt, 24 tools, a
user turn; sized to the model's tokens), in four cases:

- warm: turn 1 and turn 2 on the loaded model (the prefix in a slot's memory);
- after an unload: turn 1, the model unloaded (its snapshots written to ``--cache-dir``),
  loaded again (the load timed apart), then turn 2 (restored from disk);
- after a restart: turn 1, the server shut down (drained: snapshots written), a new server on
  the same ``--cache-dir``, then turn 2 (restored from disk);
- cold: turn 2 on a fresh model with nothing cached (the whole prefix computed).

    PYTHONPATH=. .venv/bin/python benchmarks/disk_cache.py [--models gemma qwen35-tiny]
        [--tokens 18000 | --captured] [--threads 2] [--repeat 3]

``--captured`` takes Claude Code 2.1.197's own first request instead (its body as captured in
``tests/data/clients``, answered whole, not streamed) at whatever size it is on the model.

Turn 1 is computed once; each other case runs ``--repeat`` times (medians shown), each time
with a new question after turn 1's answer, so that it finds turn 1 cached and computes its own
question; cold runs once. Turn 2 is a non-streamed Anthropic ``/v1/messages`` request for one
token, timed from its send to its answer (HTTP, templating and tokenizing of the 18k-token
prompt included). One ``llmtrio serve`` in this process at a time, the model on demand.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio

from llmtrio.cli import serve
from llmtrio.cli._catalog import CatalogModel
from llmtrio.engine import EngineConfig, demo_model_path
from llmtrio.web import ServeConfig
from llmtrio.worker import HostConfig

DATA = Path(__file__).parent.parent / "tests" / "data"
CAPTURED = DATA / "clients" / "claude-code-2.1.197.messages.json"
MODELS = {"gemma": demo_model_path, "qwen35-tiny": lambda: DATA / "qwen35-tiny-random.gguf"}
#: Each model's slot: room for the prompt, and for the qwen35 tiny model's random tokenizer,
#: whose pieces are no measure of its text, room for the size check's bound too.
CTX = {"gemma": 20480, "qwen35-tiny": 40960}

_WORDS = (
    "read the file before you edit it and keep every change as small as the task allows; "
    "prefer the project's own helpers, run its tests, and say what you changed and why. "
    "When a command fails, read its output, fix the cause, and never hide an error. "
)


def claude_like(lines: int) -> dict[str, Any]:
    """An Anthropic body of Claude Code's first request's shape: ``lines`` lines of system
    prompt, and 24 tools with descriptions of ``lines`` words each."""
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197; cch=0a1b2;"},
        {
            "type": "text",
            "text": "You are a Claude agent, built on Anthropic's Claude Agent SDK.",
            "cache_control": {"type": "ephemeral"},
        },
        {"type": "text", "text": "\n".join(f"{i}. {_WORDS}" for i in range(lines))},
    ]
    words = _WORDS.split()
    tools = [
        {
            "name": f"Tool{i}",
            "description": " ".join(words[j % len(words)] for j in range(lines)),
            "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
        }
        for i in range(24)
    ]
    user = {
        "role": "user",
        "content": [
            {
                "type": "text",
                "text": "<system-reminder>Today's date is 2026-12-07.</system-reminder>",
            },
            {"type": "text", "text": "Say hi", "cache_control": {"type": "ephemeral"}},
        ],
    }
    return {
        "model": "m",
        "system": system,
        "tools": tools,
        "messages": [user],
        "max_tokens": 8,
        "temperature": 0,
    }


def captured() -> dict[str, Any]:
    """Claude Code's first ``/v1/messages`` body as captured, for model ``m``, answered whole
    (8 tokens at most, greedy). Its ``system``-role message (the agent types, after the user
    turn) becomes a text block at the end of the user turn before it: the same text in the
    same place of the prompt. (The Messages API refused such a message when PERFORMANCE.md's
    figures were taken; it takes them since issue 42, folded much the same way for the
    templates that need it.)"""
    (request,) = json.loads(CAPTURED.read_text())["requests"]
    body: dict[str, Any] = request["body"]
    messages: list[dict[str, Any]] = []
    for message in body["messages"]:
        if message["role"] == "system":
            text = message["content"]
            messages[-1]["content"] = [*messages[-1]["content"], {"type": "text", "text": text}]
        else:
            messages.append(dict(message))
    return {
        **body,
        "messages": messages,
        "model": "m",
        "stream": False,
        "max_tokens": 8,
        "temperature": 0,
    }


@asynccontextmanager
async def server(name: str, cache: Path | None, threads: int) -> AsyncIterator[httpx.AsyncClient]:
    """``llmtrio serve`` with model ``name`` on demand as ``m`` (one slot), loaded before the
    block; shut down (drained) after it."""
    config = EngineConfig(
        model=MODELS[name](),
        model_name="m",
        threads=threads,
        max_inflight=1,
        ctx_size=CTX[name],
        spec=None,
        cache_dir=cache,
    )
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        (url,) = await nursery.start(
            partial(
                serve,
                [],
                ServeConfig(port=0, request_timeout=None),  # a cold 18k prefill may take long
                shutdown=shutdown,
                on_demand=[CatalogModel("m", config, "models-file")],
                host=HostConfig(),  # keep_alive 5 min: a request's keep_alive 0 unloads
            )
        )
        async with httpx.AsyncClient(base_url=url, timeout=3600) as client:
            await load(client)
            yield client
        shutdown.set()


async def load(client: httpx.AsyncClient) -> float:
    started = time.perf_counter()
    answer = await client.post("/models/load", json={"model": "m"})
    assert answer.status_code == 200, answer.text
    return time.perf_counter() - started


async def unloaded(client: httpx.AsyncClient) -> None:
    while True:
        listed = (await client.get("/v1/models")).json()["data"]
        if next(m["state"] for m in listed if m["id"] == "m") == "unloaded":
            return
        await trio.sleep(0.05)  # a benchmark polls the listing a client sees


async def timed(client: httpx.AsyncClient, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    answer = await client.post("/v1/messages", json=body)
    assert answer.status_code == 200, answer.text
    return time.perf_counter() - started, answer.json()


def turn2(body: dict[str, Any], answer: str, question: str) -> dict[str, Any]:
    messages = [
        *body["messages"],
        {"role": "assistant", "content": answer},
        {"role": "user", "content": question},
    ]
    return {**body, "messages": messages, "max_tokens": 1}


async def sized(name: str, tokens: int, threads: int) -> dict[str, Any]:
    """A body of about ``tokens`` prompt tokens on model ``name``."""
    async with server(name, None, threads) as client:

        async def count(lines: int) -> int:
            body = claude_like(lines)
            answer = await client.post("/v1/messages/count_tokens", json=body)
            if answer.status_code != 200:  # longer than the context
                return 1 << 30
            return int(answer.json()["input_tokens"])

        low, high = 1, 2
        while await count(high) < tokens:
            low, high = high, high * 2
        while low < high:  # the fewest lines that reach ``tokens``
            middle = (low + high) // 2
            low, high = (middle + 1, high) if await count(middle) < tokens else (low, middle)
        return claude_like(low)


#: Turn 2's new user message: a different one each time a case repeats, so that each turn 2
#: finds turn 1 (and its answer) in the cache, and computes its own question.
QUESTIONS = [f"Now list the files of folder number {i}." for i in range(100)]


async def bench(name: str, tokens: int | None, threads: int, repeat: int) -> None:
    body = captured() if tokens is None else await sized(name, tokens, threads)
    questions = iter(QUESTIONS)
    figures: dict[str, list[float]] = {case: [] for case in ("warm", "unload", "load", "restart")}
    cached: dict[str, list[int]] = {case: [] for case in ("warm", "unload", "restart", "cold")}

    def second(answer: str) -> dict[str, Any]:
        return turn2(body, answer, next(questions))

    async def measure(client: httpx.AsyncClient, case: str, answer: str) -> None:
        seconds, two = await timed(client, second(answer))
        figures[case].append(seconds)
        cached[case].append(two["usage"]["cache_read_input_tokens"])

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "cache"
        async with server(name, folder, threads) as client:
            _, one = await timed(client, body)  # turn 1, computed (once)
            answer = next((b["text"] for b in one["content"] if b["type"] == "text"), "")
            for _ in range(repeat):
                await measure(client, "warm", answer)
            for _ in range(repeat):
                # the model unloads after a request (its slot's memory written), loads again
                await timed(client, {**second(answer), "keep_alive": 0})
                await unloaded(client)
                figures["load"].append(await load(client))
                await measure(client, "unload", answer)
        for _ in range(repeat):  # the server drained (its slot written), started again
            async with server(name, folder, threads) as client:
                await measure(client, "restart", answer)
        files = sum(path.stat().st_size for path in folder.rglob("*.snap"))
    async with server(name, None, threads) as client:  # nothing cached: computed
        cold, two = await timed(client, second(answer))
        cached["cold"].append(two["usage"]["cache_read_input_tokens"])
    prompt = two["usage"]["input_tokens"]
    median = {case: statistics.median(values) for case, values in figures.items()}
    median["cold"] = cold
    print(
        f"\n{name}: turn 2 of {prompt} prompt tokens, {threads} threads; medians of {repeat} "
        f"(cold: one); {files / 2**20:.0f} MiB of snapshot files at the end"
    )
    print("case                 turn 2 TTFT   cached tokens   vs warm   vs cold")
    for case, label in (
        ("warm", "warm in memory"),
        ("unload", "disk, after unload"),
        ("restart", "disk, after restart"),
        ("cold", "computed cold"),
    ):
        print(
            f"{label:20} {median[case] * 1000:9.0f} ms {min(cached[case]):13}"
            f" {median[case] / median['warm']:8.2f}x {median['cold'] / median[case]:8.1f}x faster"
        )
    print(f"(the load after the unload, apart: {median['load'] * 1000:.0f} ms)")
    print(
        "each run, ms:",
        {case: [round(v * 1000) for v in values] for case, values in figures.items()},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--tokens", type=int, default=18000)
    size.add_argument("--captured", action="store_true", help="Claude Code's own first body")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for name in args.models:
        tokens = None if args.captured else args.tokens
        trio.run(bench, name, tokens, args.threads, args.repeat)


if __name__ == "__main__":
    main()
