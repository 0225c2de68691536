"""The embedding engine's packing policy: which queued inputs go into the next
``llama_decode`` (:class:`EmbedPacker`; on how many threads it runs is the engine's
``ThreadChooser``, shared with the chat engine).

Pure (no llama.cpp, no Trio, no threads): the decode thread feeds it callers' inputs and
cancellations and asks for one batch at a time, so its policy is tested on its own.

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

from collections import deque
from collections.abc import Sequence

import attrs
import numpy as np
import numpy.typing as npt

__all__ = ["EmbedPacker", "Packed"]


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
