"""A live ``llmtrio serve`` in a thread of its own, for tests that talk HTTP to it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence

import attrs
import httpx
import trio

from llmtrio.cli import serve
from llmtrio.engine import EngineConfig
from llmtrio.web import ServeConfig
from llmtrio.worker import RequestLimits

from ._helpers import wait_until

__all__ = ["LiveServer", "start_server"]


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

    def wait_idle(self, within: float = 15) -> None:
        """Wait until no request is in flight (a slot freed is freed within seconds)."""
        wait_until(lambda: self.inflight() == 0, lambda: f"idle: {self.health()}", within=within)

    def stop(self) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            trio.from_thread.run_sync(self._shutdown.set, trio_token=self._token)
        self._thread.join(timeout=60)
        if self.errors:
            raise self.errors[0]


def start_server(
    engine_config: EngineConfig | Sequence[EngineConfig],
    config: ServeConfig,
    limits: RequestLimits | None = None,
) -> LiveServer:
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
                    engine_config, config, shutdown=shutdown, limits=limits, task_status=task_status
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
