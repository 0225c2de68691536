"""The prompt cache on disk through the server: a conversation's next turn restores its
prefix from ``--cache-dir`` after its model on demand unloaded (``keep_alive: 0``) and after
``llmtrio serve`` restarted (drained by SIGTERM, a real process), counted in
``usage.prompt_tokens_details.cached_tokens``, Anthropic's ``cache_read_input_tokens`` and
``/metrics``' disk series (a model loaded at start's: as its other engine figures, a model on
demand's are not exported)."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from llmtrio.api import CHAT_PATH, MESSAGES_PATH
from llmtrio.cli import serve
from llmtrio.cli._catalog import CatalogModel
from llmtrio.web import ServeConfig
from llmtrio.worker import HostConfig

from .._helpers import engine_config, eventually
from .._procs import Ring
from ..worker.test_models_on_demand import Loads

pytestmark = pytest.mark.slow

SYSTEM = " ".join(
    f"Rule {i}: answer in one short sentence, politely, about topic number {i}." for i in range(14)
)


def anthropic(messages: list[dict[str, str]], **fields: object) -> dict[str, object]:
    return {
        "model": "gemma",
        "system": SYSTEM,
        "messages": messages,
        "max_tokens": 4,
        "temperature": 0,
        **fields,
    }


def next_turn(messages: list[dict[str, str]], answer: str) -> list[dict[str, str]]:
    return [
        *messages,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And another one?"},
    ]


def disk_samples(text: str) -> dict[str, float]:
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("llmtrio_prompt_cache_disk")
    }


@pytest.fixture
async def on_demand(gemma_path: Path, tmp_path: Path) -> AsyncIterator[tuple[str, Loads]]:
    """``llmtrio serve`` (in process) with gemma on demand, its snapshots in a folder."""
    config = engine_config(
        gemma_path,
        model_name="gemma",
        threads=1,
        max_inflight=2,
        ctx_size=1024,
        cache_dir=tmp_path / "cache",
    )
    loads = Loads()
    logger = __import__("logging").getLogger("llmtrio.worker")
    logger.addHandler(loads)
    logger.setLevel("INFO")
    shutdown = trio.Event()
    try:
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(
                partial(
                    serve,
                    [],
                    ServeConfig(port=0),
                    shutdown=shutdown,
                    on_demand=[CatalogModel("gemma", config, "models-file")],
                    host=HostConfig(max_loaded_models=1),
                )
            )
            yield binds[0], loads
            shutdown.set()
    finally:
        logger.removeHandler(loads)


async def test_the_next_turn_restores_its_prefix_after_an_unload(
    on_demand: tuple[str, Loads], tmp_path: Path
) -> None:
    url, loads = on_demand
    first = [{"role": "user", "content": "Name a colour."}]
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        one = await client.post(MESSAGES_PATH, json=anthropic(first, keep_alive=0))
        assert one.status_code == 200, one.text
        assert one.json()["usage"]["cache_read_input_tokens"] == 0
        await eventually(lambda: loads.count("unloaded", "gemma") == 1, within=60)
        assert list((tmp_path / "cache").rglob("*.snap"))  # written as the model unloaded
        answer = one.json()["content"][0]["text"]
        two = await client.post(MESSAGES_PATH, json=anthropic(next_turn(first, answer)))
        assert two.status_code == 200, two.text
        usage = two.json()["usage"]
        assert loads.count("loaded", "gemma") == 2
        # the whole first turn's prompt (system prompt included) came from the file
        assert usage["cache_read_input_tokens"] >= one.json()["usage"]["input_tokens"] - 2


def test_the_next_turn_restores_its_prefix_after_a_restart(
    tmp_path: Path, gemma_path: Path
) -> None:
    """A real ``llmtrio serve``: drained by SIGTERM (its slots' memory written as its engine
    closes), started again on the same ``--cache-dir``: turn 2 reads turn 1 from the file."""
    cache = tmp_path / "cache"
    first = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Name a colour."},
    ]
    body = {"messages": first, "max_tokens": 4, "temperature": 0}
    with Ring.opened(tmp_path, gemma_path) as ring:
        server = ring.serve("serve-1", f"--cache-dir={cache}")
        one = httpx.post(server.url + CHAT_PATH, json=body, timeout=120)
        assert one.status_code == 200, one.text
        server.proc.popen.send_signal(signal.SIGTERM)
        assert server.proc.popen.wait(timeout=60) == 0
        assert list(cache.rglob("*.snap"))
        again = ring.serve("serve-2", f"--cache-dir={cache}")
        answer = one.json()["choices"][0]["message"]["content"]
        turn2 = {**body, "messages": next_turn(first, answer)}
        two = httpx.post(again.url + CHAT_PATH, json=turn2, timeout=120)
        assert two.status_code == 200, two.text
        cached = two.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= one.json()["usage"]["prompt_tokens"] - 2
        metrics = disk_samples(httpx.get(again.url + "/metrics", timeout=10).text)
        assert metrics["llmtrio_prompt_cache_disk_hits_total"] == 1
        assert metrics["llmtrio_prompt_cache_disk_restored_tokens_total"] == cached
        assert metrics["llmtrio_prompt_cache_disk_restore_seconds_total"] > 0
        assert metrics["llmtrio_prompt_cache_disk_files"] >= 1
        assert metrics["llmtrio_prompt_cache_disk_bytes"] > 0
