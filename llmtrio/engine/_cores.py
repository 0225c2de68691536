"""The cores this process may use: its CPU affinity and its cgroup's CPU quota (a container
given 2 CPUs on a 64-core host sees 64 in ``os.cpu_count()``, and gets 2), and whether the
threads it is about to run fit in them.

Besides llama.cpp's ``threads`` (the decode thread calling ``llama_decode`` is the first of
them), an engine's process runs one busy thread of its own: Trio's, which turns tokens into
text and streams them out at every step. When the compute threads and that one are more
than the cores, they take turns, and llama.cpp's threads wait for one another at every
operation of a step (issue 48).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

import attrs

__all__ = ["Cores", "cgroup_cpu_quota", "oversubscription", "read_cores", "usable_cores"]

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
