"""The embedding engine's policies: which queued inputs go into the next ``llama_decode``
(:class:`EmbedPacker`), and on how many threads it runs (:class:`ThreadChooser`).

Pure (no llama.cpp, no Trio, no threads): the decode thread feeds them callers' inputs,
cancellations and measured decode times and asks for one batch at a time, so their policies
are tested on their own.

Policy: first come, first packed, one input per sequence, whole inputs only (an embedding
model attends over a whole sequence at once, so an input is never split across decodes).
A batch takes inputs in arrival order while they fit ``budget`` tokens and ``max_seqs``
sequences; the first input that does not fit ends the batch (no overtaking, so a long input
is never starved by short ones behind it). An input longer than the budget (up to
``max_tokens``, what one decode can take) goes alone. Many callers' inputs share one batch:
64 concurrent single-input requests are a few decodes, not 64.

Why a budget below what a decode can take: llama.cpp runs a BERT's attention over every token
of the batch, each sequence masked off from the others, so a decode's cost per token grows
with the batch's tokens (the mask and the attention scores are tokens x tokens a head and a
layer); past a few hundred tokens that outweighs what a bigger batch saves in per-decode
overhead (PERFORMANCE.md, "Embeddings").
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence

import attrs
import numpy as np
import numpy.typing as npt

__all__ = ["EmbedPacker", "Packed", "ThreadChooser"]


@attrs.frozen
class Packed:
    """One input in a batch: the caller's ``key``, its ``index`` among the caller's inputs,
    and its tokens."""

    key: int
    index: int
    tokens: npt.NDArray[np.int32] = attrs.field(eq=False)


@attrs.define
class EmbedPacker:
    """Queues callers' inputs and packs them into batches of at most ``max_seqs`` sequences
    and ``budget`` tokens (``max_tokens``, the most one decode takes, for a batch of one
    input longer than the budget; ``budget`` unset is ``max_tokens``).

    Error handling: ``ValueError`` from :meth:`add` for an input that could never be packed
    (empty, or longer than ``max_tokens``): the caller checks its inputs before queuing them,
    so this is a fault, and nothing of that caller is queued.
    """

    max_tokens: int
    max_seqs: int
    budget: int | None = None
    _queue: deque[Packed] = attrs.field(factory=deque, init=False)
    _cancelled: set[int] = attrs.field(factory=set, init=False)

    def add(self, key: int, inputs: Sequence[npt.NDArray[np.int32]]) -> None:
        """Queue ``inputs`` of caller ``key``, behind everything queued before."""
        for index, tokens in enumerate(inputs):
            if not 0 < len(tokens) <= self.max_tokens:
                raise ValueError(
                    f"input {index} of caller {key} has {len(tokens)} tokens; a batch takes "
                    f"1 to {self.max_tokens}"
                )
        self._queue.extend(Packed(key, index, tokens) for index, tokens in enumerate(inputs))

    def cancel(self, key: int) -> None:
        """Drop caller ``key``'s queued inputs (those in a batch already handed out are
        decoded; their results are the caller's to discard)."""
        if any(item.key == key for item in self._queue):
            self._cancelled.add(key)

    @property
    def pending(self) -> int:
        """Inputs queued and not cancelled."""
        self._drop_cancelled()
        return len(self._queue)

    def next_batch(self) -> list[Packed]:
        """The next batch, taken off the queue (empty when nothing is queued)."""
        self._drop_cancelled()
        budget = min(self.budget or self.max_tokens, self.max_tokens)
        batch: list[Packed] = []
        tokens = 0
        while self._queue and len(batch) < self.max_seqs:
            item = self._queue[0]
            if batch and tokens + len(item.tokens) > budget:
                break
            batch.append(self._queue.popleft())
            tokens += len(item.tokens)
        return batch

    def _drop_cancelled(self) -> None:
        if self._cancelled:
            self._queue = deque(item for item in self._queue if item.key not in self._cancelled)
            self._cancelled.clear()


@attrs.define
class ThreadChooser:
    """Picks each decode's compute threads: ``most`` (the configured ``--threads``) or 1,
    whichever measured fewer seconds per token on decodes of about the same size.

    Why: llama.cpp's threads meet at a barrier after every operation of the graph (a small
    BERT has hundreds per decode), and a thread waiting there spins. When the machine has
    fewer free cores than threads (other processes, or this server's own HTTP thread, which
    is busy exactly when many requests arrive), a waiting thread spins while the one it waits
    for is descheduled: a 16-token decode of all-MiniLM-L6-v2 on 2 threads took 770 ms on a
    loaded 2-core machine and 12.5 ms on 1 thread (one trial of ``OMP_WAIT_POLICY=passive``:
    TODO.md). On a quiet machine, more threads are faster. So both are measured, and the
    faster one is used.

    Why by size: a decode's seconds per token depend on its size as much as on its threads
    (a fixed cost per decode, and attention over the whole batch): on MiniLM a one-sentence
    decode costs 1.9x an eight-sentence one a token on 2 threads, 1.3x on 1. Figures from
    decodes of different sizes would compare sizes, not thread counts, so decodes are
    classed by their tokens (powers of two: 1, 2-3, 4-7, ..., 128-255, ...) and each class
    keeps its own figures and its own probing.

    Policy, in each class: each count is tried once (``most`` first); then the one with the
    lower seconds per token runs (the median of its last ``window`` decodes of that class),
    and the other is probed once after ``first_probe`` decodes of that class. A probe's
    figure replaces that count's old ones (they are stale); a probe that wins makes its count
    the one used; one that loses doubles the gap to the next probe, up to ``longest_probe``
    decodes, so a slow count costs at most one decode in that many once the load is steady,
    and a change of load is found within that many.

    Why a median: on a machine with some other work, a multi-threaded decode now and then
    waits at a barrier for a thread another process holds (a one-sentence MiniLM decode on 2
    threads: 15-25 ms against 3), and an average moved by one such decode made the slower
    count the choice until its next probe (a single figure, which one more such decode made
    lose, doubling the gap): a lone server answering one request at a time ran half its
    decodes on 1 thread at 5.5 ms instead of 3 (PERFORMANCE.md, "Embeddings"). The median
    moves once most of the last decodes are slow: a load that stays.
    """

    most: int
    first_probe: int = 8
    longest_probe: int = 1024
    window: int = 5
    _cost: dict[tuple[int, int], deque[float]] = attrs.field(factory=dict, init=False)
    _since_probe: dict[int, int] = attrs.field(factory=dict, init=False)
    _gap: dict[int, int] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        if self.most < 1:
            raise ValueError("most must be at least 1")
        if self.window < 1:
            raise ValueError("window must be at least 1")

    @property
    def options(self) -> tuple[int, ...]:
        return (self.most, 1) if self.most > 1 else (1,)

    @staticmethod
    def size_class(tokens: int) -> int:
        """The class of a decode of ``tokens`` tokens (decodes within a power of two)."""
        return max(1, tokens).bit_length()

    def best(self, tokens: int) -> int:
        """The count that measured the fewest seconds per token so far on decodes the size of
        ``tokens`` (``most`` before any measurement)."""
        size = self.size_class(tokens)
        measured = [n for n in self.options if (size, n) in self._cost]
        if not measured:
            return self.most
        return min(measured, key=lambda n: statistics.median(self._cost[size, n]))

    def choose(self, tokens: int) -> int:
        """The thread count for the next decode, of ``tokens`` tokens."""
        size = self.size_class(tokens)
        for threads in self.options:
            if (size, threads) not in self._cost:
                return threads
        best = self.best(tokens)
        if len(self.options) > 1 and self._since_probe.get(size, 0) >= self._gap_of(size):
            return next(n for n in self.options if n != best)
        return best

    def observe(self, threads: int, tokens: int, seconds: float) -> None:
        """A decode of ``tokens`` tokens on ``threads`` threads took ``seconds``."""
        if tokens < 1 or threads not in self.options:
            return
        size = self.size_class(tokens)
        cost = seconds / tokens
        best = self.best(tokens)
        previous = self._cost.get((size, threads))
        if previous is None or threads != best:
            # a first figure, or a probe: the old ones are stale
            self._cost[size, threads] = deque([cost], maxlen=self.window)
        else:
            previous.append(cost)
        if previous is not None and threads != best:  # a probe
            self._since_probe[size] = 0
            won = self.best(tokens) == threads
            gap = self._gap_of(size)
            self._gap[size] = self.first_probe if won else min(self.longest_probe, 2 * gap)
        else:
            self._since_probe[size] = self._since_probe.get(size, 0) + 1

    def _gap_of(self, size: int) -> int:
        return self._gap.get(size, self.first_probe)
