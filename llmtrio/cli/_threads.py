"""How the models of one process share the machine's cores: each engine's llama.cpp
threads, so that by default the engines together never run more compute threads than the
machine has cores."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["split_threads", "thread_counts"]


def split_threads(cores: int, engines: int) -> int:
    """The default llama.cpp threads of each of ``engines`` engines in one process: the cores
    shared evenly (rounded down, at least 1), so that together they never run more compute
    threads than the machine has cores."""
    return max(1, cores // max(1, engines))


def thread_counts(
    names: Sequence[str], given: Sequence[tuple[str | None, int]], cores: int
) -> list[int]:
    """Each model's llama.cpp threads, in ``names``' order: its own ``NAME=N``; else a plain
    ``N`` (the last one given); else an even share of the cores that the named counts leave
    (rounded down, at least 1), so that by default the engines together never run more
    compute threads than the machine has cores.

    Error handling: ``ValueError`` naming a ``NAME=N`` whose NAME is not served."""
    named = {name: threads for name, threads in given if name is not None}
    unknown = sorted(set(named) - set(names))
    if unknown:
        raise ValueError(
            f"--threads names {', '.join(map(repr, unknown))}, which is not served "
            f"(served: {', '.join(map(repr, names))})"
        )
    plain = [threads for name, threads in given if name is None]
    if plain:
        share = plain[-1]
    else:
        rest = sum(1 for name in names if name not in named)
        share = split_threads(cores - sum(named.get(name, 0) for name in names), rest)
    return [named.get(name, share) for name in names]
