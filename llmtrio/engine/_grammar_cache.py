"""llama.cpp's parsed grammars, cached: a grammar many generations share is parsed once and
each gets a copy."""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import llama_cpp

from ._errors import GrammarError
from ._grammar import Grammar
from ._llama_log import recent_log

__all__ = ["GrammarCache"]


def _regex_literal(text: str) -> str:
    """``text`` as an ECMAScript regular expression matching it literally."""
    return "".join("\\" + c if c in "\\^$.|?*+()[]{}/" else c for c in text)


class GrammarCache:
    """llama.cpp's parsed grammars, the most recently used ``size`` kept: a generation gets
    a copy (``llama_sampler_clone``), so a grammar many requests share is parsed once.

    A lazy :class:`Grammar`'s trigger becomes a trigger token when the vocabulary has it as
    one special token (free per token), else a literal pattern (llama.cpp then searches the
    output so far at each token until the trigger appears).

    Thread-safe: the engine parses on a Trio worker thread, slots copy on the decode thread.
    Resource handling: a copy is the caller's to free; :meth:`clear` frees the parsed ones.
    """

    def __init__(
        self,
        vocab: Any,
        tokenize: Callable[..., list[int]],
        special_piece: Callable[[int], bytes],
        piece: Callable[[int], bytes],
        size: int = 32,
    ) -> None:
        self._vocab = vocab
        self._tokenize = tokenize
        self._special_piece = special_piece
        self._piece = piece
        self._size = size
        self._parsed: OrderedDict[Grammar, Any] = OrderedDict()
        self._lock = threading.Lock()

    def check(self, grammar: Grammar) -> None:
        """Parse ``grammar`` now, unless it is parsed already.

        Error handling: :class:`GrammarError` when llama.cpp cannot parse it.
        """
        with self._lock:
            self._get(grammar)

    def new(self, grammar: Grammar) -> Any:
        """A fresh copy of ``grammar``'s sampler (the caller frees it)."""
        with self._lock:
            return llama_cpp.llama_sampler_clone(self._get(grammar))

    def _get(self, grammar: Grammar) -> Any:
        parsed = self._parsed.get(grammar)
        if parsed is None:
            parsed = self._parse(grammar)
            self._parsed[grammar] = parsed
            while len(self._parsed) > self._size:
                llama_cpp.llama_sampler_free(self._parsed.popitem(last=False)[1])
        self._parsed.move_to_end(grammar)
        return parsed

    def _parse(self, grammar: Grammar) -> Any:
        text = grammar.text.encode("utf-8")
        recent_log()
        if grammar.trigger is None:
            parsed = llama_cpp.llama_sampler_init_grammar(self._vocab, text, b"root")
        else:
            tokens: Any = None
            patterns: Any = None
            found = self._tokenize(grammar.trigger, add_special=False, parse_special=True)
            if len(found) == 1 and self._special_piece(found[0]) != self._piece(found[0]):
                tokens = (llama_cpp.llama_token * 1)(found[0])
            else:
                patterns = (ctypes.c_char_p * 1)(_regex_literal(grammar.trigger).encode())
            parsed = llama_cpp.llama_sampler_init_grammar_lazy_patterns(
                self._vocab,
                text,
                b"root",
                patterns,
                0 if patterns is None else 1,
                tokens,
                0 if tokens is None else 1,
            )
        if not parsed:
            why = recent_log() or "llama.cpp could not parse it"
            raise GrammarError(f"invalid grammar: {why}")
        return parsed

    def clear(self) -> None:
        with self._lock:
            for parsed in self._parsed.values():
                llama_cpp.llama_sampler_free(parsed)
            self._parsed.clear()
