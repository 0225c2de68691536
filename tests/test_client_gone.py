"""A client that goes away while its stream's work is in a nursery of its own: the worker ends
that stream quietly and serves on (the client leaving is not a fault)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.lowlevel

from llmtrio.ring import StreamCancelledError
from llmtrio.worker import _endpoint
from llmtrio.worker._endpoints import CHAT


class GoneClient:
    """The little of a claimed stream that ``serve_request`` touches before the client
    leaves: its cancellation (the event, and the scope it serves the stream in)."""

    def __init__(self) -> None:
        self.cancelled = trio.Event()
        self.cancel_scope = trio.CancelScope()
        self.body = b"{}"

    def cancel(self) -> None:  # as the ring's Claimed.cancel
        self.cancelled.set()
        self.cancel_scope.cancel()


async def test_a_client_leaving_mid_send_ends_its_stream_without_an_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Seen in the ring simulation: the client left while the response's nursery had other
    tasks; the send raised StreamCancelledError as the stream's scope cancelled the nursery, so
    the two came out as one group that no ``except StreamCancelledError`` matched, and it took the
    worker's whole ``serve_link`` (every stream it held) down."""
    claimed = GoneClient()

    async def respond(*args: Any) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)  # the engine's side, say
            claimed.cancel()  # the client goes away: the stream's scope is cancelled ...
            with trio.CancelScope(shield=True):
                await trio.lowlevel.checkpoint()
            raise StreamCancelledError("the client of stream 1 went away")  # as send() does

    monkeypatch.setattr(_endpoint, "_respond", respond)
    await _endpoint.serve_request(
        CHAT,
        None,  # type: ignore[arg-type]
        claimed,  # type: ignore[arg-type]
        limits=None,  # type: ignore[arg-type]
        metrics=None,
        request_id="stream-1",
    )
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
