"""Models on demand: cold start (the load plus the first token) and warm time to first token
of each test model, and the resident memory of the process before, with a model loaded, and
after its unload; then the KV cache's cost per slot and decode speed at f16 and q8_0.

    PYTHONPATH=. .venv/bin/python benchmarks/on_demand.py [--threads 1] [--repeat 3]

One ``llmtrio serve`` in this process (catalog of gemma-3-270m, the qwen35 tiny model and
MiniLM, nothing loaded at start), over HTTP on loopback.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from functools import partial
from pathlib import Path

import attrs
import httpx
import trio

from llmtrio.cli import serve
from llmtrio.cli._catalog import CatalogModel
from llmtrio.engine import Engine, EngineConfig, GenerateRequest, Token, demo_model_path
from llmtrio.web import ServeConfig
from llmtrio.worker import HostConfig

DATA = Path(__file__).parent.parent / "tests" / "data"


def rss_mib() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


async def first_byte(client: httpx.AsyncClient, path: str, body: dict[str, object]) -> float:
    started = time.perf_counter()
    async with client.stream("POST", path, json=body) as response:
        async for _ in response.aiter_bytes():
            return time.perf_counter() - started
    raise AssertionError("no body")


async def state(client: httpx.AsyncClient, name: str) -> str:
    listed = (await client.get("/v1/models")).json()["data"]
    return str(next(m["state"] for m in listed if m["id"] == name))


async def cold_and_warm(threads: int, repeat: int) -> None:
    base = EngineConfig(threads=threads, max_inflight=2, ctx_size=512, spec=None, cache_ram_mib=0)
    models = {
        "gemma": demo_model_path(),
        "qwen35-tiny": DATA / "qwen35-tiny-random.gguf",
        "minilm": DATA / "all-MiniLM-L6-v2-Q8_0.gguf",
    }
    catalog = [
        CatalogModel(name, attrs.evolve(base, model=path, model_name=name), "models-file")
        for name, path in models.items()
    ]
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        (url,) = await nursery.start(
            partial(
                serve,
                [],
                ServeConfig(port=0),
                shutdown=shutdown,
                on_demand=catalog,
                host=HostConfig(keep_alive=0),
            )
        )
        async with httpx.AsyncClient(base_url=url, timeout=300) as client:
            print("model        cold (load + first byte)  warm first byte  RSS before/loaded/after")
            for name in models:
                if name == "minilm":
                    path, body = "/v1/embeddings", {"model": name, "input": "hello"}
                else:
                    path = "/v1/chat/completions"
                    body = {
                        "model": name,
                        "messages": [{"role": "user", "content": "Hello"}],
                        "max_tokens": 4,
                        "stream": True,
                    }
                colds, warms, memory = [], [], []
                for _ in range(repeat):
                    before = rss_mib()
                    colds.append(await first_byte(client, path, {**body, "keep_alive": 60}))
                    warms.append(await first_byte(client, path, {**body, "keep_alive": 60}))
                    loaded = rss_mib()
                    await client.post("/models/unload", json={"model": name})
                    while await state(client, name) != "unloaded":  # noqa: ASYNC110
                        await trio.sleep(0.1)  # a benchmark polls the listing a client sees
                    memory.append((before, loaded, rss_mib()))
                before, loaded, after = memory[-1]
                print(
                    f"{name:12} {statistics.median(colds) * 1000:10.0f} ms"
                    f"{statistics.median(warms) * 1000:22.0f} ms"
                    f"      {before:.0f}/{loaded:.0f}/{after:.0f} MiB"
                )
        shutdown.set()


async def kv_types(threads: int) -> None:
    print("\ngemma, 1 slot of 4096 tokens, 128 tokens decoded")
    for kind in ("f16", "q8_0"):
        config = EngineConfig(
            model=demo_model_path(),
            threads=threads,
            max_inflight=1,
            ctx_size=4096,
            spec=None,
            cache_ram_mib=0,
            cache_type_k=kind,
            cache_type_v=kind,
            flash_attn="on",
        )
        before = rss_mib()
        async with Engine.open(config) as engine:
            loaded = rss_mib()
            request = GenerateRequest.user("Write a story about a cat.", max_tokens=128)
            started, tokens = 0.0, 0
            async with engine.submit(request) as generation:
                async for event in generation:
                    if isinstance(event, Token):
                        tokens += 1
                        if tokens == 1:
                            started = time.perf_counter()
            rate = (tokens - 1) / (time.perf_counter() - started)
        print(f"  KV {kind:5}: RSS +{loaded - before:.0f} MiB loaded, {rate:.1f} tokens/s decode")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    trio.run(cold_and_warm, args.threads, args.repeat)
    trio.run(kv_types, args.threads)


if __name__ == "__main__":
    main()
