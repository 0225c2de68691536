"""A running generation as its caller sees it (:class:`Generation`): the events the decode
steps produce for it, in order, ending with one ``Done`` or ``Failed``; filled on the Trio
side by :class:`~llmtrio.engine.Engine` from each step's :class:`StepOutput`, through the
generation's :class:`OutputProcessor` (pieces, stop strings, log-probabilities)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import trio

from .._types import Done, Event, Failed, StopReason, Timings, Token
from ._output import OutputProcessor
from ._step import StepOutput

__all__ = ["Generation"]

logger = logging.getLogger("llmtrio.engine")


class Generation:
    """A running generation: iterate it for :class:`Token` events, ending with one
    :class:`Done` or :class:`Failed`.

    Resource handling: the generation runs inside its own cancel scope, opened by
    :meth:`Engine.submit`. :meth:`cancel`, leaving the ``async with``, or cancelling the task
    that iterates all end it the same way: the scope is cancelled, and the decode thread frees
    the slot at the next token boundary (or the next prefill chunk).
    """

    def __init__(
        self,
        *,
        prompt_tokens: int,
        audio_tokens: int = 0,
        output: OutputProcessor,
        scope: trio.CancelScope,
        end: Callable[[], None],
    ) -> None:
        self._output = output
        self._scope = scope
        self._end = end  # asks the decode thread to end this generation (idempotent)
        self._send, self._receive = trio.open_memory_channel[Event](float("inf"))
        self.prompt_tokens = prompt_tokens
        self.audio_tokens = audio_tokens
        self._submitted_at = time.perf_counter()
        #: Set once a Done or Failed event was produced; no event follows it.
        self.finished = False
        self.result: Done | Failed | None = None
        #: Set with ``finished``: the slot is free or being freed; what is left is buffered.
        self.ended = trio.Event()

    def __aiter__(self) -> Generation:
        return self

    async def __anext__(self) -> Event:
        if self.finished and self._receive.statistics().current_buffer_used == 0:
            raise StopAsyncIteration
        return await self._receive.receive()

    def cancel(self) -> None:
        """End the generation; safe to call from any Trio task, any number of times."""
        self._scope.cancel()
        self._end()

    def drain(self) -> list[Event]:
        """The events produced and not read yet, without waiting."""
        events: list[Event] = []
        while True:
            try:
                events.append(self._receive.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                return events

    def apply(self, output: StepOutput) -> None:
        """The engine's hand-off (Trio side): what a decode step did to this generation.
        A fault here ends this generation only, with ``Failed``."""
        try:
            self._apply(output)
        except Exception as exc:
            logger.exception("delivering to a generation failed")
            self.fail(exc)

    def fail(self, error: Exception) -> None:
        """End with ``Failed(error)`` (unless already ended) and free the slot."""
        if not self.finished:
            self.finished = True
            self.result = Failed(error)
            self._send.send_nowait(self.result)
            self.ended.set()
        self._end()

    def _apply(self, output: StepOutput) -> None:
        if self.finished:
            return
        events, stopped = self._output.feed(output.tokens, output.logprobs)
        self._send_all(events)
        if stopped:
            self._finish(StopReason.STOP_STRING, output)
            self._end()
        elif output.error is not None:
            self.fail(output.error)
        elif output.stop is not None:
            events, stop = self._output.finish(output.stop)
            self._send_all(events)
            self._finish(stop, output)

    def _send_all(self, events: list[Token]) -> None:
        for event in events:
            self._send.send_nowait(event)

    def _finish(self, stop: StopReason, output: StepOutput) -> None:
        now = time.perf_counter()
        admitted = output.admitted_at or now
        first = output.first_token_at or now
        self.finished = True
        self.result = Done(
            stop=stop,
            prompt_tokens=self.prompt_tokens,
            audio_tokens=self.audio_tokens,
            completion_tokens=self._output.tokens,
            reasoning_tokens=self._output.reasoning_tokens,
            cached_tokens=output.cached,
            draft_tokens=output.drafted,
            accepted_tokens=output.accepted,
            stop_string=self._output.stop_string if stop is StopReason.STOP_STRING else None,
            timings=Timings(
                queue_s=max(0.0, admitted - self._submitted_at),
                prefill_s=max(0.0, first - admitted),
                decode_s=max(0.0, now - first),
            ),
        )
        self._send.send_nowait(self.result)
        self.ended.set()
