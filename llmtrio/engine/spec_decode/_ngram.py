"""Draft proposers: n-gram lookup in a sequence's own tokens (:class:`NgramDrafter`, vLLM's
"prompt lookup", llama.cpp's ``ngram-simple``) and a core-wide table of what followed each
n-gram in every sequence (:class:`NgramPool`, :class:`PooledDrafter`: llama.cpp's
``ngram-mod``, vLLM's suffix decoding; off by default, ``EngineConfig.spec_pool``).

A drafter reports with each draft the ``match`` it was found with (an n-gram length, or one of
the ``*_MATCH`` values below), so :class:`~.Acceptance` learns each kind's rate apart.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import Protocol

__all__ = [
    "AGREED_MATCH",
    "CONTESTED_MATCH",
    "POOL_MATCH",
    "NgramDrafter",
    "NgramPool",
    "PooledDrafter",
]


class NgramDrafter:
    """Prompt lookup over one sequence's tokens (its prompt, then every token it emits).

    For each ``n`` in ``min_n..max_n`` a table maps each n-gram to where the tokens that
    followed its latest occurrence start, and a second one to where they started at the
    occurrence before; :meth:`propose` looks the sequence's last ``n`` tokens up, longest
    first, and drafts what followed the latest occurrence only as far as the occurrence
    before agrees with it. An n-gram that occurred once drafts in full. One that recurs
    with other text after it each time (a key in a list of records, the ``": "`` after it)
    drafts nothing past the point where its occurrences part: what comes next is not in the
    text, and a draft of it would be a step of positions verified for nothing. Where they
    part at once, the latest continuation is offered as :data:`CONTESTED_MATCH`, whose
    acceptance is learned apart (:class:`Acceptance`): in a reply that repeats itself the
    latest is mostly right, after a record's key it is mostly wrong. Building the latest
    table is one pass in C (``dict(zip(...))``), the one before it a pass in Python (about
    1 ms for a 1000-token prompt); each token emitted later adds ``max_n - min_n + 1``
    entries to each.

    ``fits`` (a sequence held to a grammar: how many tokens of a draft its grammar takes
    from where the sequence is) chooses among the occurrences instead: each n-gram keeps
    every occurrence, each continuation is cut where the grammar refuses a token, and the
    first two of those it takes whole (latest first), then of the rest by how far it takes
    them, are compared as above (reported as :data:`AGREED_MATCH` where they agree and the
    grammar chose: they are not the latest two, or one is cut); an n-gram none of whose
    continuations the grammar takes a token of gives way to a shorter one.
    After a value in a JSON object, the continuations of ``",`` in the worked examples a
    prompt quotes that lead into the key the schema wants next (not the latest, which
    leads into another) are drafted as far as they agree: the key, and ``": "`` after it.
    At most ``choices`` occurrences are looked at, latest first.
    """

    def __init__(
        self,
        tokens: Sequence[int],
        *,
        max_n: int = 4,
        min_n: int = 1,
        fits: Callable[[Sequence[int]], int] | None = None,
        choices: int = 16,
    ) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError("need 1 <= min_n <= max_n")
        if choices < 1:
            raise ValueError("need choices >= 1")
        self._tokens = list(tokens)
        self._sizes = range(max_n, min_n - 1, -1)
        self._fits = fits
        self._choices = choices
        # Without ``fits``: n -> {n-gram: the index where what followed its latest
        # occurrence starts}; the n-gram that ends the sequence has no continuation yet, so
        # it is not in the table.
        self._tables: dict[int, dict[tuple[int, ...], int]] = {}
        # n -> {n-gram: the same for its occurrence before the latest}, for those that recur.
        self._before: dict[int, dict[tuple[int, ...], int]] = {}
        # With ``fits`` instead: n -> {n-gram: where what followed each occurrence starts}.
        self._every: dict[int, dict[tuple[int, ...], list[int]]] = {}
        t = self._tokens
        end = len(t) - 1  # the last token: what follows it is not known yet
        for n in self._sizes:
            count = max(0, end - n + 1)  # n-grams starting at 0 .. end - n
            grams = list(zip(*(t[j : j + count] for j in range(n)), strict=True))
            starts = range(n, end + 1)
            if fits is not None:
                every: dict[tuple[int, ...], list[int]] = {}
                for gram, start in zip(grams, starts, strict=True):
                    every.setdefault(gram, []).append(start)
                self._every[n] = every
                continue
            latest = dict(zip(grams, starts, strict=True))
            self._tables[n] = latest
            # Each n-gram's occurrences in order; keeping the last one that is not the
            # latest gives the occurrence before it.
            self._before[n] = {
                gram: start
                for gram, start in zip(grams, starts, strict=True)
                if latest[gram] != start
            }

    def __len__(self) -> int:
        return len(self._tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens the sequence emitted."""
        t = self._tokens
        for token in tokens:
            end = len(t)  # the n-grams ending here now get a continuation: ``token``
            t.append(token)
            for n in self._sizes:
                if end < n:
                    continue
                gram = tuple(t[end - n : end])
                if self._fits is not None:
                    self._every[n].setdefault(gram, []).append(end)
                    continue
                table = self._tables[n]
                latest = table.get(gram)
                if latest is not None:
                    self._before[n][gram] = latest
                table[gram] = end

    def propose(self, limit: int) -> tuple[list[int], int]:
        """Up to ``limit`` tokens that may come next, and the length of the n-gram they
        were found with (0 and no tokens when the last tokens never occurred before)."""
        t = self._tokens
        if limit <= 0:
            return [], 0
        for n in self._sizes:
            if len(t) <= n:
                continue
            gram = tuple(t[-n:])
            if self._fits is not None:
                found, chose = self._fitting(self._every[n].get(gram, ()), limit)
                if not found:
                    continue
                draft, match = _agreed(found[0], found[1] if len(found) > 1 else None, n)
                if chose and len(found) > 1 and match != CONTESTED_MATCH:
                    match = AGREED_MATCH
                return draft, match
            start = self._tables[n].get(gram)
            if start is None:
                continue
            draft = t[start : start + limit]
            before = self._before[n].get(gram)
            other = None if before is None else t[before : before + len(draft)]
            return _agreed(draft, other, n)
        return [], 0

    def _fitting(self, starts: Sequence[int], limit: int) -> tuple[list[list[int]], bool]:
        """Two continuations at ``starts``: those the grammar takes whole first, then those
        it takes furthest, latest first among equals; each cut where the grammar refuses a
        token, none it refuses at once. And whether the grammar chose them: whether they
        are other than the latest two, or cut."""
        assert self._fits is not None
        t = self._tokens
        found: list[tuple[bool, int, list[int]]] = []
        for i, start in enumerate(reversed(starts[-self._choices :])):
            draft = t[start : start + limit]
            taken = self._fits(draft)
            if taken:
                found.append((taken < len(draft), i, draft[:taken]))
                if sum(not cut for cut, _, _ in found) == 2:
                    break  # the latest two taken whole: nothing ranks above them
        # Stable: latest first among those taken whole, and among equals.
        found.sort(key=lambda f: (f[0], -len(f[2]) if f[0] else 0))
        chosen = found[:2]
        plain = [(False, i, d) for i, (_, _, d) in enumerate(chosen)]
        return [draft for _, _, draft in chosen], chosen != plain


def _agreed(draft: list[int], other: Sequence[int] | None, n: int) -> tuple[list[int], int]:
    """``draft`` as far as ``other`` (the continuation of the occurrence before) agrees with
    it, found with an ``n``-gram; all of it without another; where they part at once, all of
    it as :data:`CONTESTED_MATCH`."""
    if other is None:
        return draft, n
    agreed = 0
    for token, theirs in zip(draft, other, strict=False):
        if token != theirs:
            break
        agreed += 1
    if not agreed:
        return draft, CONTESTED_MATCH
    return draft[:agreed], n


#: The match a :class:`PooledDrafter` reports for a draft from the pool: its acceptance is
#: counted apart from prompt lookup's (:class:`Acceptance`).
POOL_MATCH = -1

#: The match :class:`NgramDrafter` reports for what followed an n-gram's latest occurrence
#: where the occurrence before it went on otherwise from the first token: counted apart.
CONTESTED_MATCH = -2

#: The match :class:`NgramDrafter` reports, for a sequence held to a grammar, where the
#: grammar chose the continuations (not the latest two, or one cut) and two agree: counted
#: apart.
AGREED_MATCH = -3


class NgramPool:
    """What followed each ``n``-gram in the sequences of one core: a table of at most
    ``size`` entries, from the hash of ``n`` tokens to the token that followed them last.

    Bounded as llama.cpp's ``common_ngram_mod`` is (a table of n-gram hash -> next token),
    but keyed by Python's hash of the tuple (a collision drafts a wrong token, which
    verification rejects: drafts never change what is emitted) and evicting the entry
    written least recently when full, instead of overwriting a slot of a fixed array. Each
    entry is about 100 bytes (two ints and an ordered dict's node).
    """

    def __init__(self, size: int, *, n: int = 8) -> None:
        if size < 1 or n < 1:
            raise ValueError("need size >= 1 and n >= 1")
        self.size = size
        self.n = n
        self._table: OrderedDict[int, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._table)

    def add(self, context: Sequence[int], tokens: Sequence[int]) -> None:
        """Record ``tokens``, which followed ``context`` (only its last ``n`` count)."""
        n, table = self.n, self._table
        seq = [*deque(context, maxlen=n), *tokens]
        for i in range(n, len(seq)):
            key = hash(tuple(seq[i - n : i]))
            table[key] = seq[i]
            table.move_to_end(key)
        while len(table) > self.size:
            table.popitem(last=False)

    def propose(self, context: Sequence[int], limit: int) -> list[int]:
        """Up to ``limit`` tokens that followed ``context``'s last ``n`` tokens, chained: each
        token found is looked up with the ``n - 1`` before it."""
        n = self.n
        if limit <= 0 or len(context) < n:
            return []
        gram = deque(context, maxlen=n)
        out: list[int] = []
        get = self._table.get
        while len(out) < limit:
            token = get(hash(tuple(gram)))
            if token is None:
                break
            out.append(token)
            gram.append(token)
        return out


class _Drafter(Protocol):
    def extend(self, tokens: Sequence[int]) -> None: ...

    def propose(self, limit: int) -> tuple[list[int], int]: ...


class PooledDrafter:
    """A sequence's own drafter, and its core's :class:`NgramPool`: it feeds the pool with
    the sequence's tokens (``tokens``, its prompt and first ones, then each it emits) and
    offers whichever of the two drafts is worth more tokens, each priced by ``rate(match)``
    (the sequence's acceptance of drafts found so: the pool's drafts are reported with
    :data:`POOL_MATCH` and learn their own rate); a tie goes to the pool, whose match is
    ``pool.n`` tokens long (prompt lookup's is at most 4). Without ``rate``, the longer
    draft, the pool's on a tie. ``fits`` (a sequence held to a grammar, as
    :class:`NgramDrafter`'s) cuts the pool's draft where the grammar refuses a token before
    the two are compared.
    """

    def __init__(
        self,
        own: _Drafter,
        pool: NgramPool,
        tokens: Sequence[int],
        rate: Callable[[int], float] | None = None,
        fits: Callable[[Sequence[int]], int] | None = None,
    ) -> None:
        self._own = own
        self._pool = pool
        self._rate = rate
        self._fits = fits
        self._tail: deque[int] = deque(tokens, maxlen=pool.n)
        pool.add((), tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        self._own.extend(tokens)
        self._pool.add(self._tail, tokens)
        self._tail.extend(tokens)

    def _worth(self, draft: Sequence[int], match: int) -> float:
        if self._rate is None:
            return float(len(draft))
        rate, g, total = self._rate(match), 1.0, 0.0
        for _ in draft:
            g *= rate
            total += g
        return total

    def propose(self, limit: int) -> tuple[list[int], int]:
        draft, match = self._own.propose(limit)
        pooled = self._pool.propose(self._tail, limit)
        if pooled and self._fits is not None:
            pooled = pooled[: self._fits(pooled)]
        if pooled and (not draft or self._worth(pooled, POOL_MATCH) >= self._worth(draft, match)):
            return pooled, POOL_MATCH
        return draft, match
