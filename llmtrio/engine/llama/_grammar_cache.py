"""llama.cpp's parsed grammars, cached: a grammar many generations share is parsed once and
each gets a copy."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import llama_cpp

from .._errors import GrammarError
from ._log import recent_log

__all__ = ["GrammarCache"]


class GrammarCache:
    """llama.cpp's parsed grammars (by their text), the most recently used ``size`` kept: a
    generation gets a copy (``llama_sampler_clone``), so a grammar many requests share is
    parsed once.

    Thread-safe: the engine parses on a Trio worker thread, slots copy on the decode thread.
    Resource handling: a copy is the caller's to free; :meth:`clear` frees the parsed ones.
    """

    def __init__(self, vocab: Any, size: int = 32) -> None:
        self._vocab = vocab
        self._size = size
        self._parsed: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()
        #: Grammars parsed so far (a grammar found in the cache is not parsed again).
        self.parses = 0

    def check(self, grammar: str) -> None:
        """Parse ``grammar`` now, unless it is parsed already.

        Error handling: :class:`GrammarError` when llama.cpp cannot parse it.
        """
        with self._lock:
            self._get(grammar)

    def new(self, grammar: str) -> Any:
        """A fresh copy of ``grammar``'s sampler (the caller frees it)."""
        with self._lock:
            return llama_cpp.llama_sampler_clone(self._get(grammar))

    def _get(self, grammar: str) -> Any:
        parsed = self._parsed.get(grammar)
        if parsed is None:
            parsed = self._parse(grammar)
            self._parsed[grammar] = parsed
            while len(self._parsed) > self._size:
                llama_cpp.llama_sampler_free(self._parsed.popitem(last=False)[1])
        self._parsed.move_to_end(grammar)
        return parsed

    def _parse(self, grammar: str) -> Any:
        recent_log()
        self.parses += 1
        parsed = llama_cpp.llama_sampler_init_grammar(self._vocab, grammar.encode(), b"root")
        if not parsed:
            why = recent_log() or "llama.cpp could not parse it"
            raise GrammarError(f"invalid grammar: {why}")
        return parsed

    def clear(self) -> None:
        with self._lock:
            for parsed in self._parsed.values():
                llama_cpp.llama_sampler_free(parsed)
            self._parsed.clear()
