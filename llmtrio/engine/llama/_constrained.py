"""Picking tokens under a grammar without passing the whole vocabulary through it.

llama.cpp's common sampler samples first, checks the one token against the grammar, and on
a refusal applies the grammar to the whole vocabulary (262k tokens on gemma: tens of ms)
before sampling again. What the second pick needs is smaller: greedy needs the best token the
grammar allows; a chain that starts with top-k needs the k best it allows, since top-k keeps
exactly those and every later sampler (top-p, min-p, temperature, the draw) sees only them.
:meth:`GrammarSearch.best_allowed` finds them by checking candidates in descending logit order
(ties by token id), in growing blocks, and stops at the block that holds them: the same
tokens as the whole-vocabulary pass, at the cost of the blocks checked. Past the first block
it skips the tokens whose first byte the grammar refuses (and, for a byte that starts many
tokens, whose second byte it refuses after that one), asked of the grammar with the tokens
that spell one byte (:meth:`GrammarSearch.possible`): a token the grammar allows has every
prefix allowed, so none it allows is skipped.

Everything here runs on the decode thread; nothing here knows of Trio.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Container, Sequence
from typing import Any, cast

import llama_cpp
import numpy as np
import numpy.typing as npt

__all__ = ["EOG", "NEVER", "Candidates", "GrammarSearch", "OneToken", "VocabIndex", "ranked"]

_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
# How many of the most likely tokens each block reaches (the last block: all of them). The
# first holds the best allowed token most of the time; each further one costs ~16x the last.
BLOCKS = (64, 1024, 16384)


class Candidates:
    """A ``llama_token_data_array`` over a numpy structured array, refilled in place; its
    ``size`` is set by each fill (at most the capacity it was made with)."""

    def __init__(self, capacity: int) -> None:
        self.data = np.zeros(capacity, dtype=_TOKEN_DATA)
        self._ids = np.arange(capacity, dtype=np.int32)
        self.array: Any = llama_cpp.llama_token_data_array()
        self.array.data = cast(Any, self.data.ctypes.data_as(llama_cpp.llama_token_data_p))
        self.ref = ctypes.byref(self.array)
        self.reset(capacity)

    def reset(self, size: int) -> None:
        self.array.size = size
        self.array.selected = -1
        self.array.sorted = False

    def fill(self, logits: npt.NDArray[np.float32]) -> None:
        """Every token, in id order, with its logit."""
        self.data["id"] = self._ids
        self.data["logit"] = logits
        self.data["p"] = 0.0
        self.reset(len(self.data))

    def fill_ids(self, ids: npt.NDArray[np.int64], logits: npt.NDArray[np.float32]) -> None:
        """The tokens ``ids``, in that order, with their logits."""
        n = len(ids)
        self.data["id"][:n] = ids
        self.data["logit"][:n] = logits[ids]
        self.data["p"][:n] = 0.0
        self.reset(n)

    @property
    def size(self) -> int:
        return int(self.array.size)

    @property
    def selected(self) -> int:
        """The token a sampler chain picked."""
        return int(self.data["id"][self.array.selected])


class OneToken:
    """A ``llama_token_data_array`` of one token, for asking a grammar whether it takes
    that token: drafts are walked through the grammar a token at a time. Its fields are set
    through ctypes, not a numpy structured array's (2.4-2.7 against 5.4 us an ask here)."""

    def __init__(self) -> None:
        self._data: Any = (llama_cpp.llama_token_data * 1)()
        self._item: Any = self._data[0]  # shares the array's memory
        self._array: Any = llama_cpp.llama_token_data_array()
        self._array.data = cast(Any, ctypes.cast(self._data, llama_cpp.llama_token_data_p))
        self._ref = ctypes.byref(self._array)

    def allowed(self, grammar: Any, token: int) -> bool:
        """Whether ``grammar`` (a grammar sampler) takes ``token`` now."""
        item, array = self._item, self._array
        item.id, item.logit, item.p = token, 0.0, 0.0
        array.size, array.selected, array.sorted = 1, -1, False
        llama_cpp.llama_sampler_apply(grammar, self._ref)
        return math.isfinite(item.logit)

    def taken(self, grammar: Any, tokens: Sequence[int], eog: Container[int]) -> int:
        """How many of ``tokens``, one after another from ``grammar``'s state now, it takes
        (walked on a copy: ``grammar`` is left as it is); an end-of-generation token
        (``eog``) it takes is the last."""
        walk = llama_cpp.llama_sampler_clone(grammar)
        try:
            for i, token in enumerate(tokens):
                if not self.allowed(walk, token):
                    return i
                if token in eog:
                    return i + 1
                llama_cpp.llama_sampler_accept(walk, token)
            return len(tokens)
        finally:
            llama_cpp.llama_sampler_free(walk)


def ranked(logits: npt.NDArray[np.float32], k: int) -> npt.NDArray[np.int64]:
    """The tokens whose logit is at least the ``k``-th largest (all tied ones included),
    most likely first, ties by token id: for a larger ``k``, this list starts with the
    smaller one's."""
    if k >= len(logits):
        ids = np.arange(len(logits), dtype=np.int64)
    else:
        cut = logits[np.argpartition(-logits, k - 1)[k - 1]]
        ids = np.flatnonzero(logits >= cut)
    return ids[np.argsort(-logits[ids], kind="stable")]


class VocabIndex:
    """Each token's first two bytes (as llama.cpp's grammar reads its text: special tokens
    rendered), for ruling tokens out by their first bytes before the grammar is asked.

    ``first[t]``: the first byte; :data:`EOG` for an end-of-generation token (the grammar
    decides those apart); :data:`NEVER` for a token the grammar always refuses (empty text,
    or text starting with a NUL byte). ``second[t]``: the second byte, or -1.
    """

    def __init__(self, pieces: list[bytes], eog: frozenset[int]) -> None:
        n = len(pieces)
        self.first = np.full(n, NEVER, dtype=np.int16)
        self.second = np.full(n, -1, dtype=np.int16)
        for token, piece in enumerate(pieces):
            if token in eog:
                self.first[token] = EOG
            elif piece and piece[0]:
                self.first[token] = piece[0]
                if len(piece) > 1:
                    self.second[token] = piece[1]
        #: For each byte, a token whose text is that byte alone (-1: none).
        self.byte_token = np.full(256, -1, dtype=np.int64)
        for token in range(n - 1, -1, -1):  # the lowest id wins
            piece = pieces[token]
            if len(piece) == 1 and token not in eog:
                self.byte_token[piece[0]] = token
        #: The tokens of each first byte with more than one byte of text, for the bytes
        #: that start many (the second byte then rules more of them out).
        longer = np.flatnonzero(self.second >= 0)
        self.groups: dict[int, npt.NDArray[np.int64]] = {}
        for byte, count in enumerate(np.bincount(self.first[longer], minlength=258)[:256]):
            if count >= _GROUP:
                self.groups[byte] = longer[self.first[longer] == byte]

    def __len__(self) -> int:
        return len(self.first)


#: ``VocabIndex.first`` of an end-of-generation token, and of a token no grammar allows.
EOG = 256
NEVER = 257
# A first byte that starts this many tokens of 2+ bytes has them sorted by the second too.
_GROUP = 2048


class GrammarSearch:
    """Finds the best tokens a grammar allows next, checking candidates most likely first
    and skipping the tokens whose first two bytes it refuses."""

    def __init__(self, index: VocabIndex) -> None:
        self._index = index
        self._buf = Candidates(len(index))
        self._bytes = Candidates(256)
        #: Tokens the grammar was asked about in the last search (for benchmarks and tests).
        self.checked = 0

    def best_allowed(
        self, grammar: Any, logits: npt.NDArray[np.float32], want: int
    ) -> npt.NDArray[np.int64]:
        """The ``want`` most likely tokens that ``grammar`` allows next and whose logit is
        finite, most likely first (ties by id); fewer when the vocabulary has fewer. The
        same tokens as applying the grammar to the whole vocabulary and keeping the ``want``
        best (ties at the last place broken by id)."""
        self.checked = 0
        # The most likely tokens first, as they are: cheaper than ruling any out.
        first = ranked(logits, BLOCKS[0])
        found = [self._allowed(grammar, first, logits)[:want]]
        count = len(found[0])
        if count >= want or len(first) >= len(logits):
            return found[0]
        # The rest, less the tokens whose first bytes the grammar refuses: the next most
        # likely in growing blocks, then all that is left, sorted once checked.
        below = (logits < logits[first[-1]]) & (logits > -np.inf)
        rest = np.flatnonzero(self.possible(grammar) & below)
        for reach in BLOCKS[1:]:
            if reach >= len(rest):
                break
            block = rest[ranked(logits[rest], reach)]
            hits = self._allowed(grammar, block, logits)[: want - count]
            found.append(hits)
            count += len(hits)
            if count >= want:
                return np.concatenate(found)
            rest = rest[logits[rest] < logits[block[-1]]]
        hits = self._allowed(grammar, rest, logits)
        found.append(hits[np.argsort(-logits[hits], kind="stable")][: want - count])
        return np.concatenate(found)

    def _allowed(
        self, grammar: Any, ids: npt.NDArray[np.int64], logits: npt.NDArray[np.float32]
    ) -> npt.NDArray[np.int64]:
        """Those of ``ids`` that ``grammar`` allows next and whose logit is finite, in the
        order given (the grammar sets refused tokens' logits to -inf, in place)."""
        if not len(ids):
            return ids
        self._buf.fill_ids(ids, logits)
        llama_cpp.llama_sampler_apply(grammar, self._buf.ref)
        self.checked += len(ids)
        allowed: npt.NDArray[np.int64] = ids[np.isfinite(self._buf.data["logit"][: len(ids)])]
        return allowed

    def possible(self, grammar: Any) -> npt.NDArray[np.bool_]:
        """Tokens ``grammar`` may allow next: every token it allows is among them (a token
        is allowed only if its first byte, and after that byte its second, would be)."""
        index = self._index
        firsts = self._next_bytes(grammar)
        lookup = np.zeros(258, dtype=np.bool_)
        lookup[:256] = firsts
        lookup[EOG] = True
        mask = lookup[index.first]
        for byte, ids in index.groups.items():
            if not firsts[byte] or index.byte_token[byte] < 0:
                continue
            after = llama_cpp.llama_sampler_clone(grammar)
            try:
                llama_cpp.llama_sampler_accept(after, int(index.byte_token[byte]))
                seconds = self._next_bytes(after)
            finally:
                llama_cpp.llama_sampler_free(after)
            mask[ids] = seconds[index.second[ids]]
        return mask

    def _next_bytes(self, grammar: Any) -> npt.NDArray[np.bool_]:
        """For each byte, whether ``grammar`` may take it next (true for a byte no token
        spells alone: it cannot be asked)."""
        tokens = self._index.byte_token
        known = tokens >= 0
        ids = tokens[known]
        buf = self._bytes
        buf.data["id"][: len(ids)] = ids
        buf.data["logit"][: len(ids)] = 0.0
        buf.reset(len(ids))
        llama_cpp.llama_sampler_apply(grammar, buf.ref)
        self.checked += len(ids)
        result = np.ones(256, dtype=np.bool_)
        result[known] = np.isfinite(buf.data["logit"][: len(ids)])
        return result
