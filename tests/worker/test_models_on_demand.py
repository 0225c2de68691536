"""Models on demand in one ``llmtrio serve`` (in process): a catalog of the three test models
and a corrupt GGUF, a budget for two; loading on first use (32 concurrent first requests: one
load), LRU eviction over a rotation, a failed load answered in OpenAI's shape with the others
untouched, ``keep_alive: 0`` unloading (and the process's RSS coming back)."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from llmtrio.api import (
    ANTHROPIC_TYPES,
    CHAT_PATH,
    COMPLETIONS_PATH,
    EMBEDDINGS_PATH,
    MESSAGES_PATH,
    MODELS_LOAD_PATH,
    MODELS_UNLOAD_PATH,
    RESPONSES_PATH,
)
from llmtrio.cli import main, serve
from llmtrio.cli._catalog import CatalogModel
from llmtrio.web import ServeConfig
from llmtrio.worker import HostConfig

from .._helpers import engine_config, eventually
from .._procs import Ring
from .test_multi_model import wait_models

pytestmark = pytest.mark.slow

QWEN35 = Path(__file__).parents[1] / "data" / "qwen35-tiny-random.gguf"
MINILM = Path(__file__).parents[1] / "data" / "all-MiniLM-L6-v2-Q8_0.gguf"


def rss_mib() -> float:
    """This process's resident memory (Linux)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


class Loads(logging.Handler):
    """The host's log of loads and unloads, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        verb = str(record.msg).split(" ", 1)[0]
        if verb in ("loading", "loaded", "unloaded") and record.args:
            self.events.append((verb, str(record.args[0])))

    def count(self, verb: str, name: str) -> int:
        return self.events.count((verb, name))

    def most_held(self) -> int:
        """The most models held at once (from a load's start to its unload's end)."""
        held: set[str] = set()
        most = 0
        for verb, name in self.events:
            if verb == "loading":
                held.add(name)
            elif verb == "unloaded":
                held.discard(name)
            most = max(most, len(held))
        return most


@pytest.fixture
async def on_demand(gemma_path: Path, tmp_path: Path) -> AsyncIterator[tuple[str, Loads]]:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(QWEN35.read_bytes()[:4096])

    def model(name: str, path: Path, aliases: tuple[str, ...] = ()) -> CatalogModel:
        config = engine_config(path, model_name=name, threads=1, max_inflight=2, ctx_size=256)
        return CatalogModel(name, config, "models-file", aliases=aliases)

    catalog = [
        model("gemma", gemma_path),
        model("qwen", QWEN35, aliases=("tiny",)),
        model("minilm", MINILM),
        model("broken", broken),
    ]
    loads = Loads()
    logger = logging.getLogger("llmtrio.worker")
    logger.addHandler(loads)
    logger.setLevel(logging.INFO)
    shutdown = trio.Event()
    try:
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(
                partial(
                    serve,
                    [],
                    ServeConfig(port=0),
                    shutdown=shutdown,
                    on_demand=catalog,
                    host=HostConfig(max_loaded_models=2),
                )
            )
            yield binds[0], loads
            shutdown.set()
    finally:
        logger.removeHandler(loads)


async def _equal(value: Awaitable[object], expected: object) -> bool:
    return await value == expected


async def _state_of(value: Awaitable[dict[str, str]], model: str, state: str) -> bool:
    return (await value)[model] == state


def chat(model: str, **fields: object) -> dict[str, object]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        **fields,
    }


async def test_models_load_on_first_use_within_the_budget(
    on_demand: tuple[str, Loads], capsys: pytest.CaptureFixture[str]
) -> None:
    url, loads = on_demand
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        listed = (await client.get("/v1/models")).json()["data"]
        assert {m["id"]: m["kind"] for m in listed} == {
            "gemma": "chat",
            "qwen": "chat",
            "tiny": "chat",  # qwen's alias
            "minilm": "embedding",
            "broken": "chat",
        }
        assert loads.events == []  # nothing is loaded before it is asked for

        async def states() -> dict[str, str]:
            listed = (await client.get("/v1/models")).json()["data"]
            return {str(m["id"]): str(m["state"]) for m in listed}

        unloaded = dict.fromkeys(("gemma", "qwen", "tiny", "minilm", "broken"), "unloaded")
        await eventually(lambda: _equal(states(), unloaded))

        # 32 concurrent first requests: one load, every request answered
        statuses: list[int] = []

        async def one() -> None:
            statuses.append((await client.post(CHAT_PATH, json=chat("qwen"))).status_code)

        async with trio.open_nursery() as nursery:
            for _ in range(32):
                nursery.start_soon(one)
        assert statuses == [200] * 32
        assert loads.count("loading", "qwen") == 1 and loads.count("loaded", "qwen") == 1
        await eventually(lambda: _equal(states(), {**unloaded, "qwen": "loaded", "tiny": "loaded"}))
        by_alias = await client.post(CHAT_PATH, json=chat("tiny"))  # the same model, loaded
        assert by_alias.status_code == 200 and loads.count("loading", "qwen") == 1

        # llmtrio ps: the loaded one, its estimated memory and when it unloads (5 minutes)
        def ps() -> int:
            return main(["ps", f"--url={url}"])

        assert await trio.to_thread.run_sync(ps) == 0
        header, row, alias = capsys.readouterr().out.splitlines()
        assert header.split() == ["NAME", "KIND", "WORKERS", "SIZE", "UNTIL"]
        assert alias.split()[0] == "tiny"
        name, kind, workers, size, unit, *until = row.split()
        assert (name, kind, workers) == ("qwen", "chat", "1")
        assert float(size) > 0 and unit in ("MiB", "GiB")  # with its 1024 MiB prompt cache
        assert until[0] == "in" and until[2] == "min"

        # a rotation over all three with room for two: the least recently used makes room
        for _ in range(2):
            assert (
                await client.post(
                    COMPLETIONS_PATH, json={"model": "gemma", "prompt": "a", "max_tokens": 2}
                )
            ).status_code == 200
            assert (
                await client.post(EMBEDDINGS_PATH, json={"model": "minilm", "input": "a"})
            ).status_code == 200
            assert (await client.post(CHAT_PATH, json=chat("qwen"))).status_code == 200
        assert loads.most_held() <= 2
        assert loads.count("unloaded", "qwen") >= 1 and loads.count("loading", "qwen") >= 2

        # a corrupt file: a clear 503 in OpenAI's shape; the others are untouched
        failed = await client.post(CHAT_PATH, json=chat("broken"))
        assert failed.status_code == 503
        error = failed.json()["error"]
        assert error["code"] == "model_load_failed" and error["type"] == "server_error"
        assert "'broken'" in error["message"] and "truncated or corrupt" in error["message"]
        again = await client.post(CHAT_PATH, json=chat("broken"))  # within the back-off
        assert again.status_code == 503 and int(again.headers["retry-after"]) >= 1
        assert loads.count("loading", "broken") == 1  # not reloaded in a loop
        assert (await client.post(CHAT_PATH, json=chat("qwen"))).status_code == 200

        # the host's figures on /metrics
        samples = {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families((await client.get("/metrics")).text)
            for sample in family.samples
        }
        ok = (("model_name", "qwen"), ("outcome", "ok"))
        assert samples[("llmtrio_model_loads_total", ok)] == loads.count("loaded", "qwen")
        failed = (("model_name", "broken"), ("outcome", "failed"))
        assert samples[("llmtrio_model_loads_total", failed)] == 1
        assert samples[("llmtrio_model_unloads_total", (("model_name", "qwen"),))] >= 1
        count = ("llmtrio_model_load_seconds_count", (("model_name", "qwen"),))
        assert samples[count] == loads.count("loaded", "qwen")
        assert 1 <= samples[("llmtrio_models_loaded", ())] <= 2
        assert samples[("llmtrio_models_loaded_bytes", ())] > 0

        # the operator's load and unload, by name only
        assert (await client.post(MODELS_LOAD_PATH, json={"model": "minilm"})).json() == {
            "success": True,
            "model": "minilm",
            "state": "loaded",
        }
        await eventually(lambda: _state_of(states(), "minilm", "loaded"))
        unloaded_now = await client.post(MODELS_UNLOAD_PATH, json={"model": "minilm"})
        assert unloaded_now.status_code == 200
        assert unloaded_now.json()["state"] in ("unloading", "unloaded")
        await eventually(lambda: _state_of(states(), "minilm", "unloaded"))
        again = await client.post(MODELS_UNLOAD_PATH, json={"model": "minilm"})
        assert again.json()["state"] == "unloaded"
        for name in (
            "../qwen",
            "../../tests/data/qwen35-tiny-random.gguf",
            str(QWEN35),
            "/etc/passwd",
            "unsloth/Qwen3.5-0.8B-GGUF:Q4_K_M",
            "google/gemma-3-270m",
            "%2e%2e%2fqwen",
            "qwen%00",
            "https://huggingface.co/unsloth/Qwen3.5-0.8B-GGUF",
        ):
            for path in (MODELS_LOAD_PATH, MODELS_UNLOAD_PATH):
                refused = await client.post(path, json={"model": name})
                assert refused.status_code == 404, (path, name, refused.text)
                assert refused.json()["error"]["code"] == "model_not_found"
        missing = await client.post(MODELS_LOAD_PATH, json={})
        assert missing.status_code == 400 and missing.json()["error"]["param"] == "model"
        assert not any(
            name.startswith(("/", ".", "%", "unsloth", "google")) for _, name in loads.events
        )

        # a keep_alive that is not a duration is the client's error, naming the field
        wrong = await client.post(CHAT_PATH, json=chat("qwen", keep_alive="soon"))
        assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "keep_alive"


async def test_keep_alive_0_unloads_and_gives_the_memory_back(
    on_demand: tuple[str, Loads],
) -> None:
    """Loaded once and unloaded first, so that what the first load of any model leaves for
    good (llama.cpp's backends, Python's caches) is in the figure before."""
    url, loads = on_demand
    completion = {"model": "gemma", "prompt": "a", "max_tokens": 2}
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        figures = []
        for cycle in (1, 2):
            figures.append(rss_mib())
            first = await client.post(COMPLETIONS_PATH, json=completion)
            assert first.status_code == 200
            figures.append(rss_mib())
            last = await client.post(COMPLETIONS_PATH, json={**completion, "keep_alive": 0})
            assert last.status_code == 200
            await eventually(lambda cycle=cycle: loads.count("unloaded", "gemma") == cycle)
        figures.append(rss_mib())
    _, _, before, loaded, after = figures
    print("RSS MiB (first load, loaded, unloaded, second load, unloaded):", figures)
    # gemma's 253 MB file and its context: well over 100 MiB while loaded; unloaded, the
    # process is back within 32 MiB of where it was (Python's allocator keeps some).
    assert loaded - before > 100, figures
    assert after - before < 32, figures


def test_two_workers_with_different_catalogs_behind_one_ingress(
    tmp_path: Path, gemma_path: Path
) -> None:
    """Real processes: an ingress and two ``llmtrio worker``s, each with its own models file
    (the qwen35 model on one, MiniLM on the other), nothing loaded at start: the ingress lists
    both models at once, and each request loads its model on the worker that lists it."""
    files = {}
    for worker, (name, path) in {
        "w-qwen": ("qwen", QWEN35),
        "w-minilm": ("minilm", MINILM),
    }.items():
        files[worker] = tmp_path / f"{worker}.toml"
        files[worker].write_text(
            f'[models.{name}]\nsource = "{path}"\nthreads = 1\nmax_inflight = 2\nctx_size = 256\n'
        )
    with Ring.opened(tmp_path, gemma_path) as ring:
        ingress = ring.ingress("ingress")
        workers = {
            worker: ring.spawn(
                worker,
                "worker",
                f"--ingress-url={ingress.control}",
                f"--tls-cert={ring.certificate(worker)}",
                f"--ca={tmp_path / 'ingress-ca.pem'}",
                f"--models-file={file}",
                "--threads=1",
            )
            for worker, file in files.items()
        }
        with httpx.Client(base_url=ingress.url, timeout=120) as client:
            listed = wait_models(client, {"qwen": 1, "minilm": 1})
            assert {m["id"]: m["kind"] for m in listed} == {"qwen": "chat", "minilm": "embedding"}
            assert not any("loading" in proc.text() for proc in workers.values())
            answer = client.post(CHAT_PATH, json=chat("qwen"))
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-llmtrio-worker"].split("#")[0] == "w-qwen"
            answer = client.post(EMBEDDINGS_PATH, json={"model": "minilm", "input": "a"})
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-llmtrio-worker"].split("#")[0] == "w-minilm"
        workers["w-qwen"].wait_for(r"loaded qwen in")
        workers["w-minilm"].wait_for(r"loaded minilm in")
        assert "minilm" not in workers["w-qwen"].text()


async def test_health_shows_prompt_reuse_for_a_model_on_demand(
    on_demand: tuple[str, Loads],
) -> None:
    """A model loaded on demand beats the same capacity figures as one loaded at start: its
    prompt reuse reaches ``/health`` (a second turn reads the first from memory)."""
    url, _ = on_demand
    first_turn = [{"role": "user", "content": "Name a colour."}]
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        first = await client.post(CHAT_PATH, json=chat("gemma", messages=first_turn))
        assert first.status_code == 200, first.text
        answer = first.json()["choices"][0]["message"]["content"]
        second_turn = [
            *first_turn,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "Another one."},
        ]
        second = await client.post(CHAT_PATH, json=chat("gemma", messages=second_turn))
        assert second.status_code == 200, second.text
        cached = second.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached > 0  # the engine reused the first turn

        async def reuse() -> dict[str, int] | None:
            health = (await client.get("/health")).json()
            mine = [w for w in health["workers"] if w["models"] == ["gemma"]]
            beat = mine[0]["capacity"] if mine else None
            reused = beat["prompt_cache"] if beat else None
            return reused if reused and reused["cached_tokens"] >= cached else None

        reused = await eventually(reuse, "gemma's heartbeat stating its prompt reuse")
        assert reused["hits"] >= 1
        assert (await client.get("/health")).json()["prompt_cache"]["cached_tokens"] >= cached


async def test_a_model_on_demand_has_its_latency_series(on_demand: tuple[str, Loads]) -> None:
    """The per-request histograms (TTFT, time per output token, end to end) of a model loaded
    on demand, on the server's ``/metrics``, as a model loaded at start has them."""
    url, _ = on_demand
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        answer = await client.post(CHAT_PATH, json=chat("qwen", max_tokens=3, ignore_eos=True))
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 3

        async def counts() -> dict[str, float] | None:
            text = (await client.get("/metrics")).text
            found = {
                sample.name: sample.value
                for family in text_string_to_metric_families(text)
                for sample in family.samples
                if sample.labels == {"model_name": "qwen"}
            }
            return found if found.get("vllm:e2e_request_latency_seconds_count") else None

        found = await eventually(counts, "qwen's end-to-end series on /metrics")
    for name in (
        "vllm:time_to_first_token_seconds_count",
        "vllm:request_time_per_output_token_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_generation_tokens_count",
    ):
        assert found[name] == 1, name
    assert found["vllm:request_generation_tokens_sum"] == 3


def _anthropic(model: str, **fields: object) -> dict[str, object]:
    return {
        "model": model,
        "max_tokens": 2,
        "messages": [{"role": "user", "content": "hi"}],
        **fields,
    }


#: A refusal of the model host's, asked for on a route of each error family.
FAMILIES = [
    pytest.param(CHAT_PATH, chat, id="openai-chat"),
    pytest.param(
        RESPONSES_PATH,
        lambda model, **f: {"model": model, "input": "hi", **f},
        id="openai-responses",
    ),
    pytest.param(MESSAGES_PATH, _anthropic, id="anthropic-messages"),
]


def _assert_family(path: str, response: httpx.Response, status: int, kind: str) -> str:
    """``response`` is ``status`` in the shape of ``path``'s family: Anthropic's
    ``{"type": "error", "error": {"type", "message"}}`` with its error type for the status, or
    OpenAI's ``{"error": {"message", "type", "param", "code"}}``; gives the message. A 503 is
    Anthropic's 529 (``overloaded_error``: it has no 503)."""
    if path == MESSAGES_PATH and status == 503:
        status = 529
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    if path == MESSAGES_PATH:
        assert body["type"] == "error" and set(body) == {"type", "error"}, body
        assert body["error"]["type"] == ANTHROPIC_TYPES[status], body
        return str(body["error"]["message"])
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["code"] == kind or body["error"]["param"] == kind, body
    return str(body["error"]["message"])


@pytest.mark.parametrize(("path", "body"), FAMILIES)
async def test_a_failed_load_is_told_in_the_routes_family(
    on_demand: tuple[str, Loads], path: str, body: Callable[..., dict[str, object]]
) -> None:
    url, loads = on_demand
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        failed = await client.post(path, json=body("broken"))
    message = _assert_family(path, failed, 503, "model_load_failed")
    assert "'broken'" in message and "truncated or corrupt" in message
    assert loads.count("loading", "broken") == 1


@pytest.mark.parametrize(("path", "body"), FAMILIES)
async def test_the_load_back_off_is_told_in_the_routes_family(
    on_demand: tuple[str, Loads], path: str, body: Callable[..., dict[str, object]]
) -> None:
    url, loads = on_demand
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        await client.post(path, json=body("broken"))  # the failed load
        again = await client.post(path, json=body("broken"))  # within its back-off
    message = _assert_family(path, again, 503, "model_load_failed")
    assert "'broken'" in message
    assert int(again.headers["retry-after"]) >= 1
    assert loads.count("loading", "broken") == 1  # not loaded again


@pytest.mark.parametrize(("path", "body"), FAMILIES)
async def test_a_bad_keep_alive_is_told_in_the_routes_family(
    on_demand: tuple[str, Loads], path: str, body: Callable[..., dict[str, object]]
) -> None:
    url, loads = on_demand
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        wrong = await client.post(path, json=body("qwen", keep_alive="soon"))
    message = _assert_family(path, wrong, 400, "keep_alive")
    assert "keep_alive" in message
    assert loads.count("loading", "qwen") == 0  # refused before anything loads
