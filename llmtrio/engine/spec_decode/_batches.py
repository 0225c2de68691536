"""How llama.cpp splits one batch into micro-batches (:func:`micro_batch_sizes`), and which
models run on repacked weights (:func:`repacked`): what a step's shape is, before
:class:`~.StepCosts` prices it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

__all__ = ["BLOCK", "micro_batch_sizes", "micro_batches", "repacked"]


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

    The draft budget asks this for every plan it prices (a hundred and more a step at eight
    sequences), mostly of layouts it asked before: the answers are remembered.
    """
    return list(_sizes(tuple(tokens), split, n_ubatch))


@functools.lru_cache(maxsize=4096)
def _sizes(tokens: tuple[tuple[int, int], ...], split: bool, n_ubatch: int) -> tuple[int, ...]:
    total = sum(n for _, n in tokens)
    if not split:
        return tuple(min(n_ubatch, total - at) for at in range(0, total, max(1, n_ubatch)))
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
    return tuple(sizes)


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
