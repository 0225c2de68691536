"""Speculative decoding's policy: n-gram drafts (prompt lookup) and how many to verify.

Pure: token ids and measured step times in, draft tokens and draft lengths out; no llama.cpp.
The decode-step core (``_core.py``) carries it out: each decoding sequence's drafts go into
the one batched ``llama_decode`` of the step with logits on every position, and each
position's logits are sampled in turn, as they would be without speculation, until a sample
differs from the draft (vLLM's "prompt lookup", llama.cpp's ``ngram-simple``).

Three parts:

- :class:`NgramDrafter` (one per sequence): the tokens that followed the latest earlier
  occurrence of the sequence's last ``n`` tokens in its own prompt and output, for the longest
  ``n`` (up to ``max_n``) that occurred before (under a grammar, the occurrences whose
  continuations the grammar takes). :class:`NgramPool` (one per core) and
  :class:`PooledDrafter`: a bounded table of what followed each ``n``-gram in every
  sequence's prompt and output, whose draft a sequence takes where it is worth more tokens
  than its own lookup's at their acceptance rates (llama.cpp's ``ngram-mod``, vLLM's suffix
  decoding; off by default, ``EngineConfig.spec_pool``).
- :class:`Acceptance` (one per sequence, and one per core that they all count into): how
  often its drafts were right, by the length of the n-gram they were found with and apart
  while it is on a run; it forgets with every verified token, and drifts back to its prior
  (the core's rates) while the sequence does not draft, so a sequence whose drafts kept
  failing stops drafting for a while and then tries again.
- :class:`StepCosts`, :func:`micro_batch_sizes` and :func:`plan_drafts`: a step's cost,
  fitted to measured steps as a fixed cost per micro-batch llama.cpp splits the batch into
  plus a cost per position with logits (a micro-batch of one token priced apart: llama.cpp
  runs it with other kernels), and the draft lengths that maximize the expected tokens per
  second of the whole step (none when the step is compute-bound; never over
  ``target_step_ms`` when it is set).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import Protocol

import attrs

__all__ = [
    "AGREED_MATCH",
    "BLOCK",
    "CONTESTED_MATCH",
    "POOL_MATCH",
    "Acceptance",
    "Candidate",
    "NgramDrafter",
    "NgramPool",
    "PooledDrafter",
    "Shape",
    "StepCosts",
    "micro_batch_sizes",
    "micro_batches",
    "plan_drafts",
    "repacked",
    "verify",
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


#: Prior per-token acceptance by n-gram length (1, 2, 3, 4+), then where two continuations
#: a grammar takes agree (an :data:`AGREED_MATCH`: as a 4-gram's; most are a JSON key the
#: worked examples all write, whatever n-gram found them), then where the n-gram's last
#: two occurrences part at once (a :data:`CONTESTED_MATCH`: as a 3-gram's, low enough that
#: one stream does not draft on it before it has earned it: free chat's right ones put a
#: sequence on a run through its shadow drafts), then from the pool (a
#: :data:`POOL_MATCH`), then on a run (the last
#: draft was right to its end): the chance a draft token is right given that the ones before
#: it were, before anything was measured. Drafting is what measures them, so they sit at the
#: low end of what was measured on the benchmarks' workloads (per token: free chat 0.95,
#: rewrite 0.85-0.99, json_schema extraction 0.66-0.86): with gemma's costs on two cores
#: (:class:`StepCosts`) one stream's drafts pay from about 0.8, and a prior below that
#: would never draft, so never learn. A run's is the highest: on a run the drafts priced by
#: it are long (where a run's drafts are no likelier right, its bucket learns that within a
#: draft or two).
_PRIOR = (0.3, 0.5, 0.7, 0.85, 0.85, 0.7, 0.85, 0.9)
_NGRAM = 4  # buckets by n-gram length
_RUN = len(_PRIOR) - 1
_POOL = _RUN - 1
_CONTESTED = _POOL - 1
_AGREED = _CONTESTED - 1


@attrs.define
class Acceptance:
    """One sequence's per-token acceptance rate of drafts, by n-gram length, and apart from
    those while it is on a run.

    Each bucket is a success/trial count that decays by ``memory`` per verified token, so the
    rate follows the last few dozen tokens; a step without drafting moves every bucket
    ``relax`` of the way back to its prior (a sequence whose drafts failed stops drafting, and
    tries again some steps later).

    A run: the sequence's last draft was right to its end. Acceptance is not geometric on
    text the output copies (a rewrite, an edit, a quoted field): once a copy is on track the
    next token is far likelier right than a first draft token is, so drafts made on a run are
    counted in their own bucket, which on such text learns rates near 1 and lets the budget
    draft long (llama.cpp's n-gram modes draft 40-60 tokens there); the first wrong token or
    a step without drafts ends the run. A contested draft (:data:`CONTESTED_MATCH`) starts
    where the copied text forks, so it keeps its own bucket on a run too.

    ``shared``: the core's own :class:`Acceptance`, which every sequence's verifications
    also count into (bucket by bucket) and which stands in for the prior: a sequence starts
    from, and drifts back to, the rates the core's earlier sequences earned, so a fresh
    request on copy-like text drafts long from its first run instead of relearning it
    within a reply that may end first. The shared one drifts back to the fixed prior, once
    a step in which a sequence drafted nothing.
    """

    memory: float = 0.9
    relax: float = 0.05
    prior_weight: float = 2.0
    shared: Acceptance | None = None
    _hits: list[float] = attrs.field(init=False)
    _trials: list[float] = attrs.field(init=False)
    _run: bool = attrs.field(init=False, default=False)  # see :attr:`on_run`

    def __attrs_post_init__(self) -> None:
        self._hits = [p * self.prior_weight for p in self._priors()]
        self._trials = [self.prior_weight] * len(_PRIOR)

    def _priors(self) -> list[float]:
        if self.shared is None:
            return list(_PRIOR)
        return [self.shared._rate(b) for b in range(len(_PRIOR))]

    def _rate(self, b: int) -> float:
        return self._hits[b] / self._trials[b]

    def _count(self, b: int, drafted: int, accepted: int) -> None:
        for i in range(min(drafted, accepted + 1)):
            self._hits[b] = self._hits[b] * self.memory + (1.0 if i < accepted else 0.0)
            self._trials[b] = self._trials[b] * self.memory + 1.0

    def _relax(self, priors: Sequence[float]) -> None:
        for b, prior in enumerate(priors):
            rate = self._rate(b)
            rate += (prior - rate) * self.relax
            self._hits[b] = rate * self._trials[b]

    def _bucket(self, n: int) -> int:
        # A contested draft starts where the text it copies forks: a run does not carry
        # over it (on a run it was priced as a copy on track, and a record's value after
        # the key the examples also have was drafted 15 tokens long, and wrong).
        if n == CONTESTED_MATCH:
            return _CONTESTED
        if self._run:
            return _RUN
        if n == POOL_MATCH:
            return _POOL
        if n == AGREED_MATCH:
            return _AGREED
        return min(max(n, 1), _NGRAM) - 1

    @property
    def on_run(self) -> bool:
        """Whether the last draft was right to its end (and no step without drafts since)."""
        return self._run

    def rate(self, n: int) -> float:
        return self._rate(self._bucket(n))

    def verified(self, n: int, drafted: int, accepted: int) -> None:
        """``accepted`` of ``drafted`` tokens found with an ``n``-gram were right (the first
        wrong one ends the count: those after it say nothing)."""
        b = self._bucket(n)
        self._count(b, drafted, accepted)
        if self.shared is not None:
            self.shared._count(b, drafted, accepted)
        self._run = drafted > 0 and accepted >= drafted

    def back_on_track(self) -> None:
        """A draft the budget did not verify was right to its end, judged against what the
        sequence emitted (``DraftBudget``'s shadow drafts): a copy is on track again, the
        sequence is on a run. Its rates do not count it: tokens a draft's first few get
        right say little of the ones after them (a JSON key's quote and newline are right
        where the key after them is not), and rates raised by them drafted where drafts
        failed (extraction, measured: 0.95x against 1.2x the step without drafts)."""
        self._run = True

    def idle(self) -> None:
        """A step in which the sequence drafted nothing (the shared one drifts back once a
        step: its owner, :class:`~llmtrio.engine._drafting.DraftBudget`, calls this on it)."""
        self._run = False
        self._relax(self._priors())


def _median(times: Sequence[float]) -> float:
    """The middle of ``times`` (the upper one of an even count)."""
    ordered = sorted(times)
    return ordered[len(ordered) // 2]


def micro_batch_sizes(
    tokens: Sequence[tuple[int, int]], *, split: bool, n_ubatch: int
) -> list[int]:
    """The tokens of each micro-batch llama.cpp runs a batch in: ``tokens`` is each
    sequence's ``(id, tokens)`` in the batch's (ascending id) order.

    One memory pool (``kv_unified``): the batch is cut into ``n_ubatch``-token pieces
    (``split_simple``). Per-slot memory (``split``): ``split_equal(sequential=True)``, as in
    llama.cpp's ``llama_batch_allocr``: each micro-batch takes the first sequence with tokens
    left and the ones with the next consecutive ids that have tokens left, the same number of
    tokens from each (the fewest any of them has left). Eight sequences with one token each
    are one micro-batch of 8; with drafts of 1 and 0 tokens alternating, five (8, then each
    drafting sequence's draft token alone, its ids no longer consecutive). Each micro-batch
    reads all the weights again, and one of a single token runs llama.cpp's matrix-vector
    kernels instead of its matrix products (:class:`StepCosts` prices it apart).
    """
    total = sum(n for _, n in tokens)
    if not split:
        return [min(n_ubatch, total - at) for at in range(0, total, max(1, n_ubatch))]
    left = [n for _, n in tokens]
    ids = [seq for seq, _ in tokens]
    sizes: list[int] = []
    first = 0
    while first < len(left):
        if left[first] == 0:
            first += 1
            continue
        run = [first]
        i = first + 1
        while i < len(left) and left[i] > 0 and ids[i] == ids[run[-1]] + 1:
            run.append(i)
            i += 1
        run = run[: max(1, n_ubatch)]
        take = max(1, min(min(left[j] for j in run), n_ubatch // len(run)))
        for j in run:
            left[j] -= take
        sizes.append(take * len(run))
    return sizes


def micro_batches(tokens: Sequence[tuple[int, int]], *, split: bool, n_ubatch: int) -> int:
    """How many micro-batches llama.cpp runs a batch in (:func:`micro_batch_sizes`; at
    least one)."""
    return max(1, len(micro_batch_sizes(tokens, split=split, n_ubatch=n_ubatch)))


#: llama.cpp's CPU kernels for repacked weights (Q4_0, Q4_K, IQ4_NL: most of a Q4 model)
#: multiply the activations four tokens at a time; a micro-batch's tokens past the last four
#: run as matrix-vector products, one more pass over those weights.
BLOCK = 4

#: GGUF ``general.file_type`` values (llama.cpp's ``llama_ftype``) whose weights are mostly
#: of a type the CPU kernels repack: Q4_0, Q4_K_S, Q4_K_M, IQ4_NL.
_REPACKED_FILE_TYPES = frozenset({"2", "14", "15", "25"})


def repacked(file_type: str | None) -> bool:
    """Whether a model of this GGUF ``general.file_type`` runs mostly on repacked weights,
    so a micro-batch's tokens past whole blocks (:data:`BLOCK`) cost a pass of their own."""
    return file_type in _REPACKED_FILE_TYPES


@attrs.frozen
class Shape:
    """A step's micro-batches as :class:`StepCosts` prices them: how many, how many of one
    token (``singles``), of two or three (``short``, holding ``short_tokens``: too few for a
    matrix-product pass, each token a matrix-vector pass of its own), and of :data:`BLOCK`
    tokens or more whose tokens are not a whole number of blocks (``partial``: a
    matrix-vector pass over the remainder)."""

    batches: int = 1
    singles: int = 0
    short: int = 0
    short_tokens: int = 0
    partial: int = 0

    @classmethod
    def of(cls, sizes: Sequence[int]) -> Shape:
        """The shape of micro-batches of ``sizes`` tokens (at least one micro-batch)."""
        sizes = [size for size in sizes if size > 0] or [1]
        short = [size for size in sizes if 1 < size < BLOCK]
        return cls(
            len(sizes),
            sum(1 for size in sizes if size == 1),
            len(short),
            sum(short),
            sum(1 for size in sizes if size >= BLOCK and size % BLOCK),
        )

    @property
    def long(self) -> int:
        """Micro-batches of :data:`BLOCK` tokens or more."""
        return self.batches - self.singles - self.short


@attrs.frozen
class _Fit:
    base: float  # each micro-batch of BLOCK tokens or more
    gemv: float  # each of those with a remainder (``Shape.partial``)
    position: float  # each position with logits in them
    single: float | None  # a micro-batch of one token (None: no step of those only yet)


def _solve(rows: list[tuple[list[float], float, float]]) -> list[float] | None:
    """The weighted least-squares coefficients of ``(features, value, weight)`` rows, or
    None where the rows cannot tell every feature apart."""
    n = len(rows[0][0])
    a = [[sum(w * x[i] * x[j] for x, _, w in rows) for j in range(n)] for i in range(n)]
    b = [sum(w * x[i] * y for x, y, w in rows) for i in range(n)]
    scale = [math.sqrt(a[i][i]) or 1.0 for i in range(n)]
    m = [[a[i][j] / (scale[i] * scale[j]) for j in range(n)] + [b[i] / scale[i]] for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-6:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [v - f * p for v, p in zip(m[r], m[col], strict=True)]
    return [m[i][n] / m[i][i] / scale[i] for i in range(n)]


@attrs.define
class StepCosts:
    """A decode step's cost in ms, fitted to measured steps: ``single`` per micro-batch of
    one token, and per token of a micro-batch of two or three; per micro-batch of
    :data:`BLOCK` tokens or more ``base``, plus ``gemv`` where its tokens are not a whole
    number of blocks, plus ``position`` per position with logits in it; ``prefill_ms`` per
    prompt token ingested with them.

    On a CPU every micro-batch reads all the weights (what makes one sequence memory-bound)
    and every position multiplies them (gemma-3's 262k-token output layer makes it dear, and
    the samplers' time per position is in it too). How a micro-batch reads them depends on
    its size: llama.cpp multiplies its repacked weights (most of a Q4 model) four tokens at a
    time with matrix products, and runs the tokens past the last four, or all of them in a
    micro-batch of fewer than four, as matrix-vector products, a pass each. Measured here
    (gemma-3-270m, 2 threads, per slot, ``benchmarks/step_shapes.py --scan 24``): one token
    17 ms; 2, 3, 4 tokens 34, 40, 45; 7, 8, 9 78, 59, 82; 15, 16, 17 107, 86, 113; from 4
    tokens on, 29 ms + 22 with a remainder + 3.6 a position (3.6 ms rms), so one stream's
    draft of 15 tokens costs 5x its plain step and one of 16 costs 6.8x: the plans take
    lengths that fill the blocks. A step of eight sequences' equal drafts holds 8 x (1 +
    draft) tokens, whole blocks. When ``position * outputs`` dwarfs the rest the step is
    compute-bound, a draft position costs about what a token is worth, and the budget
    drafts nothing; one sequence, or a machine with bandwidth to spare, drafts.

    Measured per shape (:class:`Shape` and ``outputs``): each shape keeps the median of its
    last ``samples`` steps, so a step stalled by another process (seconds, on a shared
    machine) moves nothing, and a shape not seen in ``horizon`` steps is forgotten (the load
    changes). ``single`` is the mean over the shapes made of single-token micro-batches
    only; the rest is the least-squares fit over the other shapes (what their single-token
    and short micro-batches cost taken off), over the medians of the shapes seen ``settled``
    times or more, weighted by their samples. Where the shapes seen cannot tell ``gemv``
    apart (none with a remainder, or none without), the fit leaves it out, over the shapes
    without a remainder where there are some (a remainder never seen is not priced: such a
    plan is tried, and measured); where they cannot tell ``base`` from ``position`` either
    (one shape, or shapes all with the same positions per micro-batch), or tell them apart
    as something no machine does (a negative cost: noise), it assumes a micro-batch's fixed
    cost is ``prior_ratio`` positions' (measured here: about 9; on a step of one token only,
    that splits ``single`` alike, which prices a first draft cheap: it is tried, and
    measured).

    ``remainder_prior``: where the shapes cannot tell ``gemv`` apart, it is taken to be
    that many one-token steps (``single``) instead of nothing, and the rest fitted over
    every shape with it taken off. The core sets it to 1 for weights llama.cpp's CPU
    kernels repack (:func:`repacked`; measured here 22 ms against a one-token step's 17):
    one stream's plans otherwise keep to the one long shape they first settled on, the
    dearest of its neighbours (17 positions for a draft of 16: 113 ms, against 86 for 16),
    and never measure a whole-block one beside it often enough to learn what it saves.
    """

    horizon: int = 200
    samples: int = 9
    settled: int = 3
    prior_ratio: float = 9.0
    remainder_prior: float = 0.0
    weight: float = 0.25
    gap_s: float = 5.0
    _shapes: dict[tuple[Shape, int], tuple[list[float], int]] = attrs.field(factory=dict)
    _prefill_ms: float | None = None
    _clock: int = 0
    _fit: _Fit | None = None
    _last_at: float | None = None
    #: After a gap: each shape's median before it, and a shape's times since (see measured).
    _before_gap: dict[tuple[Shape, int], float] = attrs.field(factory=dict)
    _since_gap: dict[tuple[Shape, int], list[float]] = attrs.field(factory=dict)

    def measured(
        self,
        ms: float,
        *,
        outputs: int,
        prefill: int = 0,
        batches: int = 1,
        singles: int = 0,
        shape: Shape | None = None,
        at: float | None = None,
    ) -> None:
        """A step of ``ms`` with ``outputs`` positions with logits and ``prefill`` prompt
        tokens, in micro-batches of ``shape`` (or ``batches``, ``singles`` of one token),
        begun at ``at`` (seconds, a monotonic clock; see :meth:`_after_gap`)."""
        if outputs <= 0 and prefill <= 0:
            return
        shape = self._shape(outputs, batches, singles, shape)
        self._clock += 1
        if at is not None:
            if self._last_at is not None and at - self._last_at > self.gap_s:
                self._before_gap = {
                    key: _median(recent) for key, (recent, _) in self._shapes.items()
                }
                self._since_gap = {}
            self._last_at = at
        if prefill:
            fit = self._coefficients()
            if outputs and fit is not None:
                per = max(0.0, ms - self.predict(outputs, shape=shape)) / prefill
            elif not outputs:
                per = ms / prefill
            else:
                return
            old = self._prefill_ms
            self._prefill_ms = per if old is None else old + (per - old) * self.weight
            return
        key = (shape, outputs)
        entry = self._shapes.get(key)
        recent = entry[0] if entry is not None else []
        recent.append(ms)
        del recent[: -self.samples]
        self._shapes[key] = (recent, self._clock)
        self._fit = None
        if key in self._before_gap:
            self._after_gap(key, ms)

    def _after_gap(self, key: tuple[Shape, int], ms: float) -> None:
        """After ``gap_s`` without steps (an idle engine) the machine's speed may have moved
        (other processes came or went), and the shapes measured before the gap would be
        fitted against shapes measured after it: a budget that stopped drafting while its
        plain steps got faster found drafts dearer than they were, and drafted less for a
        whole batch. So the first shape from before the gap measured ``settled`` times
        after it sets the speed: every other shape from before the gap is scaled by how
        much its median moved, and it keeps only its times since."""
        since = self._since_gap.setdefault(key, [])
        since.append(ms)
        if len(since) < self.settled:
            return
        ratio = _median(since) / self._before_gap[key] if self._before_gap[key] > 0 else 1.0
        for other in self._before_gap:
            entry = self._shapes.get(other)
            if entry is None:
                continue
            recent, at = entry
            if other == key:
                self._shapes[other] = (list(since), at)
            else:
                self._shapes[other] = ([t * ratio for t in recent], at)
        if self._prefill_ms is not None:
            self._prefill_ms *= ratio
        self._before_gap, self._since_gap = {}, {}

    @staticmethod
    def _shape(outputs: int, batches: int, singles: int, shape: Shape | None) -> Shape:
        if shape is None:
            batches = max(1, batches)
            shape = Shape(batches, min(max(0, singles), batches, outputs))
        return shape

    def _coefficients(self) -> _Fit | None:
        """The fit to the shapes measured within the horizon (None while there are none)."""
        oldest = self._clock - self.horizon
        stale = [key for key, (_, at) in self._shapes.items() if at < oldest]
        for key in stale:
            del self._shapes[key]
            self._fit = None
        if self._fit is not None or not self._shapes:
            return self._fit
        rows = []
        for (shape, outputs), (recent, _) in self._shapes.items():
            rows.append((shape, float(outputs), _median(recent), float(len(recent))))
        # A shape seen once or twice may be a stalled step: it takes part once it has a
        # median of three (unless nothing has yet).
        settled = [row for row in rows if row[3] >= self.settled]
        rows = settled or rows
        only = [(s, m, w) for s, _, m, w in rows if s.singles == s.batches]
        single = (
            sum(w * m for _, m, w in only) / sum(w * s.singles for s, _, w in only)
            if only
            else None
        )
        # The other shapes' micro-batches of BLOCK tokens or more, what the others cost
        # taken off (every micro-batch, while ``single`` is not known).
        lines: list[tuple[list[float], float, float]] = []
        for s, p, m, w in rows:
            if single is None:
                lines.append(([float(s.batches), float(s.partial), p], m, w))
            elif s.long:
                ones = s.singles + s.short_tokens
                lines.append(
                    ([float(s.long), float(s.partial), max(0.0, p - ones)], m - single * ones, w)
                )
        gemv = self.remainder_prior * single if single is not None else 0.0
        fit = self._terms(lines, single, gemv) if lines else None
        if fit is None:
            # One line through them, split by the prior (with only steps of one token
            # measured, through those), the prior remainder taken off.
            split = [(x[0], x[2], y - gemv * x[1], w) for x, y, w in lines] or [
                (float(s.batches), p, m, w) for s, p, m, w in rows
            ]
            base, position = self._split(split)
            fit = _Fit(base, gemv, position, single)
        self._fit = fit
        return fit

    @staticmethod
    def _terms(
        lines: list[tuple[list[float], float, float]], single: float | None, gemv: float = 0.0
    ) -> _Fit | None:
        """``base``, ``gemv`` and ``position`` where the rows tell them apart with no
        negative term and a positive cost a position; else, with a prior ``gemv``, ``base``
        and ``position`` over all the rows with it taken off; without one, over the rows
        without a remainder (all of them where none is without)."""
        solved = _solve(lines)
        if solved is not None and min(solved) >= 0 and solved[2] > 0:
            return _Fit(solved[0], solved[1], solved[2], single)
        if gemv > 0:
            rows = [([x[0], x[2]], y - gemv * x[1], w) for x, y, w in lines]
        else:
            whole = [row for row in lines if row[0][1] == 0] or lines
            rows = [([x[0], x[2]], y, w) for x, y, w in whole]
        solved = _solve(rows)
        if solved is not None and min(solved) >= 0 and solved[1] > 0:
            return _Fit(solved[0], gemv, solved[1], single)
        return None

    def _split(self, rows: list[tuple[float, float, float, float]]) -> tuple[float, float]:
        """One line through ``(micro-batches, positions, ms, weight)`` rows, its cost split
        by the prior."""
        r = self.prior_ratio
        num = sum(w * (r * u + p) * m for u, p, m, w in rows)
        den = sum(w * (r * u + p) ** 2 for u, p, _, w in rows)
        position = max(0.0, num / den) if den > 0 else 0.0
        return r * position, position

    @property
    def known(self) -> bool:
        return self._coefficients() is not None

    @property
    def coefficients(self) -> tuple[float, float]:
        """The fitted ``(fixed, position)`` ms, ``fixed`` a micro-batch of whole blocks
        (zeros while nothing was measured)."""
        fit = self._coefficients()
        return (fit.base, fit.position) if fit is not None else (0.0, 0.0)

    @property
    def remainder(self) -> float:
        """The fitted ms a micro-batch's remainder past whole blocks adds (``gemv``)."""
        fit = self._coefficients()
        return fit.gemv if fit is not None else 0.0

    @property
    def single(self) -> float:
        """The fitted ms of a micro-batch of one token (``fixed + position`` while no step
        of those only was measured; zero while nothing was)."""
        fit = self._coefficients()
        if fit is None:
            return 0.0
        return fit.single if fit.single is not None else fit.base + fit.position

    def predict(
        self,
        outputs: int,
        prefill: int = 0,
        batches: int = 1,
        singles: int = 0,
        *,
        shape: Shape | None = None,
    ) -> float:
        """The expected ms of a step with ``outputs`` positions with logits in micro-batches
        of ``shape`` (or ``batches``, ``singles`` of them of one token), and ``prefill``
        prompt tokens (0 when nothing was measured)."""
        fit = self._coefficients()
        if fit is None:
            return 0.0
        decode = 0.0
        if outputs > 0:
            s = self._shape(outputs, batches, singles, shape)
            if fit.single is None:
                decode = fit.base * s.batches + fit.gemv * s.partial + fit.position * outputs
            else:
                ones = s.singles + s.short_tokens
                decode = fit.single * ones + fit.base * s.long + fit.gemv * s.partial
                decode += fit.position * max(0, outputs - ones)
        return decode + prefill * (self._prefill_ms or 0.0)


@attrs.frozen
class Candidate:
    """A decoding sequence's offer: ``tokens`` drafted, each right with ``rate`` given the
    ones before it were; its sampler takes ``sample_ms`` a position (a sampled request runs
    its whole chain at every position it verifies: 0.1 ms greedy on gemma's 262k
    vocabulary, 0.3 with top-k 40, 12 with top-p and no top-k, here)."""

    tokens: int
    rate: float
    sample_ms: float = 0.0


def plan_drafts(
    candidates: Sequence[Candidate],
    costs: StepCosts,
    *,
    outputs: int,
    prefill: int = 0,
    target_ms: float = 0.0,
    batches: Callable[[Sequence[int]], Sequence[int]] | None = None,
    sampling_ms: float = 0.0,
    margin: float = 0.2,
) -> list[int]:
    """How many of each candidate's draft tokens to verify in the next step.

    The step already has ``outputs`` positions with logits (one per decoding sequence) and
    ``prefill`` prompt tokens; ``batches(counts)`` is the tokens of each micro-batch the step
    runs in with ``counts`` draft tokens per candidate (:func:`micro_batch_sizes`; by default
    one micro-batch of them all), and ``sampling_ms``
    what sampling one position of every decoding sequence takes (a draft position adds its
    candidate's ``sample_ms``; ``costs`` are measured without sampling). A sequence's ``j``-th
    draft token adds an expected ``rate ** j`` tokens (it counts only if all before it are
    right), and one position to the step. Two families of plans are priced with the fitted
    costs: the ``m`` draft tokens of most expected gain per ms (for every ``m``), and every
    candidate's worthwhile tokens up to a common length ``k`` (equal lengths keep per-slot
    memory in one micro-batch); the plan with the most expected tokens per predicted ms of
    decoding (the prompt tokens' cost left out: they are ingested either way) wins, so a
    compute-bound step, where a position costs about what a token is worth, drafts nothing.
    With ``target_ms`` set, no plan whose predicted step (prompt tokens included) exceeds it.
    A plan never runs in more micro-batches than the step without drafts (``batches``), and
    with several sequences decoding it must beat that step's rate by ``margin``.
    """
    gains: list[tuple[float, int]] = []
    per: list[list[float]] = [[] for _ in candidates]
    for i, c in enumerate(candidates):
        g = 1.0
        for _ in range(c.tokens):
            g *= c.rate
            if g < 0.02:
                break
            gains.append((g, i))
            per[i].append(g)
    if not gains or not costs.known:
        return [0] * len(candidates)
    # Prompt tokens are ingested with or without drafts: the rate compared is decoding's
    # (a step mostly spent on a prompt chunk would make any draft look free beside it).
    extra = costs.predict(0, prefill)
    zero = [0] * len(candidates)

    def sizes_of(counts: Sequence[int]) -> Sequence[int]:
        if batches is None:
            return [outputs + sum(counts) + prefill]
        return batches(counts)

    def predict(counts: Sequence[int], sizes: Sequence[int]) -> float:
        return costs.predict(outputs + sum(counts), shape=Shape.of(sizes))

    zero_sizes = sizes_of(zero)
    base_ms = predict(zero, zero_sizes) + sampling_ms
    best, best_rate = zero, outputs / base_ms if base_ms > 0 else math.inf
    # With several sequences decoding, a plan with drafts must beat the step without by
    # ``margin``: what such a step costs beyond the fit (measured here: eight sequences with
    # drafts of one 85 ms in the core against 63 for the same ``llama_decode``; cutting
    # rejected drafts from memory, shapes the fit has not settled) is not in the
    # prediction. One stream's drafts of 4-5 tokens right 94% of the time gained the 1.15x
    # the fit predicts (free chat), so one stream has none.
    if outputs > 1:
        best_rate *= 1.0 + margin

    def consider(counts: list[int], tokens: float) -> None:
        nonlocal best, best_rate
        sizes = sizes_of(counts)
        if len(sizes) > len(zero_sizes):
            return
        ms = predict(counts, sizes) + sampling_ms
        ms += sum(c.sample_ms * n for c, n in zip(candidates, counts, strict=True))
        if target_ms > 0 and ms + extra > target_ms:
            return
        rate = tokens / ms if ms > 0 else math.inf
        if rate > best_rate:
            best, best_rate = counts, rate

    # Best first: expected tokens per ms the position adds (its sampler's time included).
    fixed, position = costs.coefficients

    def worth(item: tuple[float, int]) -> float:
        cost = position + candidates[item[1]].sample_ms
        return item[0] / cost if cost > 0 else math.inf

    gains.sort(key=worth, reverse=True)
    # No plan beats the step without drafts when even the best token adds fewer tokens per
    # ms than the step gives (a plan's added tokens over its added ms is at most its best
    # token's ratio while drafts add micro-batches, never remove them, and a micro-batch
    # costs at least a position whether it holds one token or more: true but where a
    # prompt chunk happens to match a drafting sequence's length; and while no micro-batch
    # of the step has a remainder that drafts could fill to a whole block, dropping a pass):
    # the compute-bound case, decided without pricing every plan (0.3 ms instead of 7 at
    # eight sequences).
    whole = Shape.of(zero_sizes).partial == 0 or costs.remainder == 0
    if whole and worth(gains[0]) <= best_rate and position <= costs.single <= fixed + position:
        return best
    counts = list(zero)
    tokens = float(outputs)
    for g, i in gains:
        counts[i] += 1
        tokens += g
        consider(list(counts), tokens)
    for k in range(1, max(len(p) for p in per) + 1):
        uniform = [min(k, len(p)) for p in per]
        consider(uniform, outputs + sum(sum(p[:n]) for p, n in zip(per, uniform, strict=True)))
    return best


def verify(
    sample: Callable[[int], int], first: int, draft: Sequence[int], ends: Callable[[int], bool]
) -> list[int]:
    """Sample the positions ``first, first + 1, ...`` in turn (the last token's, then each
    draft token's) and stop after the first sample that differs from the draft, or ends the
    generation: the tokens to emit. All but the last equal the draft."""
    out: list[int] = []
    for j in range(len(draft) + 1):
        token = sample(first + j)
        out.append(token)
        if j == len(draft) or token != draft[j] or ends(token):
            break
    return out
