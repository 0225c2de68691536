"""Fixtures shared by the tests: the two real test models, and a live server."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import attrs
import httpx
import pytest
import trio

from llmtrio.engine import EngineConfig, demo_model_path
from llmtrio.web import ServeConfig, serve

# A copy of shared/test-models/qwen35-tiny-random.gguf (see data/README-qwen35.md).
QWEN35_TINY = Path(__file__).resolve().parent / "data" / "qwen35-tiny-random.gguf"
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """google/gemma-3-270m (base, Q4_K_M), assembled once from its PyPI package."""
    return demo_model_path()


@pytest.fixture(scope="session")
def qwen35_path() -> Path:
    """A 5 MB random-weight model of the qwen35 architecture (the default model's)."""
    return QWEN35_TINY


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@attrs.define
class LiveServer:
    """``llmtrio serve`` running in a thread of its own (its own Trio run), so tests of any
    kind (sync clients, async clients, a browser) can talk to it over real sockets."""

    url: str
    _token: trio.lowlevel.TrioToken
    _shutdown: trio.Event
    _thread: threading.Thread
    errors: list[BaseException]

    def health(self) -> dict[str, object]:
        response = httpx.get(self.url + "/health", timeout=10)
        response.raise_for_status()
        data: dict[str, object] = response.json()
        return data

    def inflight(self) -> int:
        capacity = self.health()["capacity"]
        assert isinstance(capacity, dict)
        return int(capacity["inflight"])

    def stop(self) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            trio.from_thread.run_sync(self._shutdown.set, trio_token=self._token)
        self._thread.join(timeout=60)
        if self.errors:
            raise self.errors[0]


def start_server(engine_config: EngineConfig, config: ServeConfig) -> LiveServer:
    ready = threading.Event()
    found: dict[str, object] = {}
    errors: list[BaseException] = []

    async def main() -> None:
        shutdown = trio.Event()
        found["token"] = trio.lowlevel.current_trio_token()
        found["shutdown"] = shutdown
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(
                lambda task_status: serve(
                    engine_config, config, shutdown=shutdown, task_status=task_status
                )
            )
            found["url"] = binds[0]
            ready.set()

    def run() -> None:
        try:
            trio.run(main)
        except BaseException as exc:
            errors.append(exc)
        finally:
            ready.set()

    thread = threading.Thread(target=run, name="llmtrio-serve", daemon=True)
    thread.start()
    ready.wait(timeout=120)
    if errors or "url" not in found:
        raise RuntimeError(f"the server did not start: {errors!r}")
    return LiveServer(
        str(found["url"]),
        found["token"],  # type: ignore[arg-type]
        found["shutdown"],  # type: ignore[arg-type]
        thread,
        errors,
    )


@pytest.fixture(scope="session")
def live_server(gemma_path: Path) -> Iterator[LiveServer]:
    """The gemma test model behind ``llmtrio serve`` on a free loopback port: 4 slots of
    512 tokens, up to 16 parked requests."""
    server = start_server(
        EngineConfig(model=gemma_path, max_inflight=4, ctx_size=512, threads=2),
        ServeConfig(host="127.0.0.1", port=0, ring_streams=16, graceful_timeout=2),
    )
    yield server
    server.stop()
