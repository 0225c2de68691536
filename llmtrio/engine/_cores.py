"""The cores this process may use: its CPU affinity and its cgroup's CPU quota (a container
given 2 CPUs on a 64-core host sees 64 in ``os.cpu_count()``, and gets 2), whether the
threads it is about to run fit in them, and on how many threads each decode runs when they
do not (:class:`ThreadChooser`, a pure policy both engines' decode threads feed).

Besides llama.cpp's ``threads`` (the decode thread calling ``llama_decode`` is the first of
them), an engine's process runs one busy thread of its own: Trio's, which turns tokens into
text and streams them out at every step. When the compute threads and that one are more
than the cores, they take turns, and llama.cpp's threads wait for one another at every
operation of a step (issue 48).
"""

from __future__ import annotations

import math
import os
import statistics
from collections import deque
from collections.abc import Callable
from pathlib import Path

import attrs

__all__ = [
    "Cores",
    "ThreadChooser",
    "cgroup_cpu_quota",
    "oversubscription",
    "read_cores",
    "usable_cores",
]

#: llmtrio's own busy threads beside llama.cpp's: the Trio thread.
OWN_THREADS = 1


@attrs.frozen
class Cores:
    """What this process may run on: ``affinity`` CPUs in its affinity mask, ``quota`` CPUs
    of time a period from its cgroup (``None``: no quota)."""

    affinity: int
    quota: float | None = None

    @property
    def usable(self) -> int:
        """Whole cores: the affinity, or fewer under a quota (rounded down, at least 1)."""
        limit = self.affinity if self.quota is None else min(self.affinity, self.quota)
        return max(1, math.floor(limit))

    def describe(self) -> str:
        quota = "no CPU quota" if self.quota is None else f"a cgroup quota of {self.quota:g} CPUs"
        return f"{self.usable} usable ({self.affinity} in its affinity, {quota})"


def cgroup_cpu_quota(cgroup: str, read: Callable[[str], str | None]) -> float | None:
    """The CPU quota, in CPUs, of the cgroup described by ``cgroup`` (the text of
    ``/proc/self/cgroup``) and of each cgroup above it (the smallest wins), read with
    ``read(path)`` (a file's text, ``None`` when it cannot be read). cgroup v2
    (``cpu.max``: ``"max 100000"`` or ``"200000 100000"``) and v1 (``cpu.cfs_quota_us`` over
    ``cpu.cfs_period_us``; ``-1`` is none). ``None`` when no quota applies."""
    quotas: list[float] = []
    for line in cgroup.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        files: tuple[str, ...]
        if controllers == "":
            roots = ["/sys/fs/cgroup"]
            files = ("cpu.max",)
        elif "cpu" in controllers.split(","):
            roots = [f"/sys/fs/cgroup/{controllers}", "/sys/fs/cgroup/cpu"]
            files = ("cpu.cfs_quota_us", "cpu.cfs_period_us")
        else:
            continue
        for folder in _ancestors(path):
            for root in roots:
                quota = _quota(root + folder, files, read)
                if quota is not None:
                    quotas.append(quota)
                    break
    return min(quotas) if quotas else None


def _ancestors(path: str) -> list[str]:
    """``/a/b`` -> ``["/a/b", "/a", ""]``: the cgroup's folder and each above it."""
    parts = [p for p in path.split("/") if p]
    return ["/" + "/".join(parts[:n]) if n else "" for n in range(len(parts), -1, -1)]


def _quota(folder: str, files: tuple[str, ...], read: Callable[[str], str | None]) -> float | None:
    texts = [read(f"{folder}/{name}") for name in files]
    if any(text is None for text in texts):
        return None
    try:
        if len(files) == 1:  # v2: "LIMIT PERIOD", LIMIT "max" for none
            limit, _, every = (texts[0] or "").strip().partition(" ")
            if limit == "max":
                return None
            quota, period = int(limit), int(every or "100000")
        else:  # v1: the quota (-1 for none), the period
            quota, period = (int((text or "").strip()) for text in texts)
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def read_cores() -> Cores:
    """This process's :class:`Cores`, read now (Linux: the affinity mask and the cgroup
    files; elsewhere ``os.cpu_count()`` and no quota)."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = os.cpu_count() or 1
    cgroup = _read("/proc/self/cgroup")
    return Cores(affinity, cgroup_cpu_quota(cgroup, _read) if cgroup else None)


def usable_cores() -> int:
    """The whole cores this process may use (its affinity and cgroup quota)."""
    return read_cores().usable


def oversubscription(threads: int, cores: Cores, *, own: int = OWN_THREADS) -> str | None:
    """Why ``threads`` llama.cpp threads (all engines' together) and llmtrio's ``own``
    busy threads do not fit in ``cores``, in a line for the log; ``None`` when they fit."""
    if threads + own <= cores.usable:
        return None
    fit = max(1, cores.usable - own)
    return (
        f"{threads} llama.cpp thread(s) and llmtrio's own {own} exceed the cores this process "
        f"may use: {cores.describe()}. They take turns, and streams slow down more when "
        f"another process is busy too; {fit} thread(s) would leave a core to the event loop"
    )


@attrs.define
class ThreadChooser:
    """Picks each decode's compute threads: ``most`` (the configured threads) or 1,
    whichever measured fewer seconds per token on decodes of about the same size. Both
    engines' decode threads use it: the embedding engine's decodes, the chat engine's steps.

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
