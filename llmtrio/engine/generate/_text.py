"""Turning generated token pieces into text events: pure, no llama.cpp, no Trio.

Three stages, fed in order for each generation:

- :class:`Utf8Assembler` joins piece bytes into text, holding back a multi-byte character
  split across tokens until it is whole;
- :class:`StopMatcher` holds back text that might be the start of a stop string and cuts the
  output at the first full match (the stop string itself is never emitted);
- :class:`ThinkSplitter` marks the text between ``<think>`` and ``</think>`` as reasoning and
  drops the tags.
"""

from __future__ import annotations

import codecs

import attrs

__all__ = ["StopMatcher", "ThinkSplitter", "Utf8Assembler"]

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


class Utf8Assembler:
    """Bytes in, whole characters out; an invalid sequence becomes U+FFFD."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, data: bytes) -> str:
        return self._decoder.decode(data)

    def flush(self) -> str:
        """The rest at the end of generation: an unfinished character becomes U+FFFD."""
        return self._decoder.decode(b"", final=True)


def _held_suffix(text: str, needles: tuple[str, ...]) -> int:
    """Length of the longest end of ``text`` that is a proper prefix of one of ``needles``."""
    best = 0
    for needle in needles:
        for length in range(min(len(needle) - 1, len(text)), best, -1):
            if text.endswith(needle[:length]):
                best = length
                break
    return best


@attrs.define
class StopMatcher:
    """Finds stop strings across piece boundaries.

    ``feed`` returns the text that is safe to emit and whether a stop string matched; after a
    match the matcher is done and the rest of the text is dropped.
    """

    _stops: tuple[str, ...]
    _pending: str = ""
    stopped: bool = False
    #: The stop string that matched (the first in the text), once one has.
    matched: str | None = None

    def feed(self, text: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        if not self._stops:
            return text, False
        buffer = self._pending + text
        found = [(at, stop) for stop in self._stops if (at := buffer.find(stop)) >= 0]
        if found:
            at, self.matched = min(found, key=lambda item: item[0])
            self.stopped = True
            self._pending = ""
            return buffer[:at], True
        held = _held_suffix(buffer, self._stops)
        self._pending = buffer[len(buffer) - held :]
        return buffer[: len(buffer) - held], False

    def flush(self) -> str:
        """Text held back as a possible stop-string start, released at the end."""
        pending, self._pending = self._pending, ""
        return pending


@attrs.define
class ThinkSplitter:
    """Splits text into (text, reasoning) segments at think tags, dropping the tags.

    ``reasoning`` starts true when the prompt left a think block open. Whitespace right after
    a tag is dropped, as the models put a newline or two there.
    """

    reasoning: bool = False
    _pending: str = ""
    _strip: bool = False

    def __attrs_post_init__(self) -> None:
        self._strip = self.reasoning

    def feed(self, text: str) -> list[tuple[str, bool]]:
        out: list[tuple[str, bool]] = []
        buffer = self._pending + text
        self._pending = ""
        while buffer:
            tag = THINK_CLOSE if self.reasoning else THINK_OPEN
            if self._strip:
                buffer = buffer.lstrip()
                if not buffer:
                    break
                self._strip = False
            at = buffer.find(tag)
            if at >= 0:
                self._emit(out, buffer[:at])
                buffer = buffer[at + len(tag) :]
                self.reasoning = not self.reasoning
                self._strip = True
                continue
            held = _held_suffix(buffer, (tag,))
            self._emit(out, buffer[: len(buffer) - held])
            self._pending = buffer[len(buffer) - held :]
            break
        return out

    def flush(self) -> list[tuple[str, bool]]:
        out: list[tuple[str, bool]] = []
        self._emit(out, self._pending)
        self._pending = ""
        return out

    def _emit(self, out: list[tuple[str, bool]], text: str) -> None:
        if text:
            out.append((text, self.reasoning))
