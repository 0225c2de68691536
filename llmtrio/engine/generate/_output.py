"""Per-generation output processing, on the Trio side: token ids in, events out.

Turning ids into text (UTF-8 assembly), stop strings, think blocks and log-probabilities
happen here, one :class:`OutputProcessor` per generation, off the decode thread's critical
path (vLLM v1's ``output_processor.py`` and ``detokenizer.py``). Pure: the pieces and the
log-probability entries come from callables the engine passes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .._types import StopReason, Token, TokenLogprob
from ..llama import RawLogprob
from ._text import StopMatcher, ThinkSplitter, Utf8Assembler

__all__ = ["OutputProcessor"]


class OutputProcessor:
    """One generation's text: :meth:`feed` its tokens as they come, :meth:`finish` at its
    end; both return the :class:`Token` events to emit.

    ``piece(token)`` gives a token's bytes; ``token_logprob(raw)`` a log-probability entry.
    """

    def __init__(
        self,
        *,
        stops: tuple[str, ...],
        opens_think: bool,
        piece: Callable[[int], bytes],
        token_logprob: Callable[[RawLogprob], TokenLogprob],
    ) -> None:
        self._piece = piece
        self._token_logprob = token_logprob
        self._utf8 = Utf8Assembler()
        self._stop = StopMatcher(stops)
        self._think = ThinkSplitter(reasoning=opens_think)
        self._logprobs: list[TokenLogprob] = []
        #: Tokens fed so far, and those of them inside a think block (its tags included).
        self.tokens = 0
        self.reasoning_tokens = 0

    def feed(
        self, tokens: Sequence[int], logprobs: Sequence[RawLogprob] | None = None
    ) -> tuple[list[Token], bool]:
        """The events for ``tokens``, and whether a stop string matched (then the tokens
        after the match were not counted and the generation is over)."""
        events: list[Token] = []
        for i, token in enumerate(tokens):
            # Each token's log-probability goes with the text it releases (several tokens
            # come at once when drafts were accepted: each its own event).
            if logprobs and i < len(logprobs):
                self._logprobs.append(self._token_logprob(logprobs[i]))
            self.tokens += 1
            reasoning = self._think.reasoning
            stopped = self._emit(self._utf8.feed(self._piece(token)), events)
            if reasoning or self._think.reasoning:
                self.reasoning_tokens += 1
            if stopped:
                return events, True
        return events, False

    @property
    def stop_string(self) -> str | None:
        """The stop string that ended the generation, if one did."""
        return self._stop.matched

    def finish(self, stop: StopReason) -> tuple[list[Token], StopReason]:
        """The events still held back, and the stop reason: a stop string, when the last
        (flushed) character completed one."""
        events: list[Token] = []
        if self._emit(self._utf8.flush(), events):
            return events, StopReason.STOP_STRING
        self._segments(self._think.feed(self._stop.flush()), events)
        self._segments(self._think.flush(), events)
        return events, stop

    def _emit(self, text: str, events: list[Token]) -> bool:
        """Pass text through the stop matcher and think splitter; true when a stop matched."""
        if not text:
            return False
        safe, stopped = self._stop.feed(text)
        self._segments(self._think.feed(safe), events)
        if stopped:
            self._segments(self._think.flush(), events)
        return stopped

    def _segments(self, segments: list[tuple[str, bool]], events: list[Token]) -> None:
        for text, reasoning in segments:
            if self._logprobs:
                logprobs, self._logprobs = tuple(self._logprobs), []
                events.append(Token(text, reasoning, logprobs))
            else:
                events.append(Token(text, reasoning))
