"""The disk budget's policy: which snapshot files a folder keeps, which serves a prompt, and
which go when a new one needs room (least recently used first). Pure: names, tokens, byte
counts and use times in, decisions out; the store carries them out on files.
"""

from __future__ import annotations

import attrs

from ._prefix import Tokens, covers, reusable, worth

__all__ = ["DiskEntry", "DiskIndex", "Found"]


@attrs.define(eq=False)
class DiskEntry:
    """One file: its name, the tokens its state follows, its size and when it was last
    written or restored (a time; the files' own mtimes across restarts)."""

    name: str
    tokens: Tokens
    nbytes: int
    used: float


@attrs.frozen(eq=False)
class Found:
    """A file that serves a prompt: ``keep`` of its tokens."""

    entry: DiskEntry
    keep: int


@attrs.define
class DiskIndex:
    """The files of one folder under ``budget_bytes``; see the module.

    ``cut_anywhere`` is the model's memory (see ``_prefix``); ``min_restore`` the fewest
    tokens worth a restore (fewer with an image among them)."""

    budget_bytes: int
    cut_anywhere: bool
    min_restore: int = 32
    _entries: dict[str, DiskEntry] = attrs.field(init=False, factory=dict)

    @property
    def bytes_used(self) -> int:
        return sum(entry.nbytes for entry in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def names(self) -> list[str]:
        return list(self._entries)

    def sizes(self) -> dict[str, int]:
        return {name: entry.nbytes for name, entry in self._entries.items()}

    def fits(self, nbytes: int) -> bool:
        """Whether a file of ``nbytes`` may be kept at all."""
        return 0 < nbytes <= self.budget_bytes

    def add(self, name: str, tokens: Tokens, nbytes: int, used: float) -> list[str]:
        """Keep file ``name``; returns the names to remove now: on attention memory the
        files it serves every prefix of (no use any more), then the least recently used
        (never the new one) until the files fit the budget again. A file that cannot fit at
        all is not kept: its own name comes back."""
        if not self.fits(nbytes):
            self._entries.pop(name, None)
            return [name]
        gone = [
            old.name
            for old in self._entries.values()
            if self.cut_anywhere
            and old.name != name
            and covers(tokens, old.tokens, cut_anywhere=True)
        ]
        for old_name in gone:
            del self._entries[old_name]
        self._entries[name] = DiskEntry(name, tokens, nbytes, used)
        used_bytes = self.bytes_used
        for old in sorted(self._entries.values(), key=lambda entry: (entry.used, entry.name)):
            if used_bytes <= self.budget_bytes:
                break
            if old.name == name:
                continue
            del self._entries[old.name]
            used_bytes -= old.nbytes
            gone.append(old.name)
        return gone

    def remove(self, name: str) -> None:
        self._entries.pop(name, None)

    def touch(self, name: str, used: float) -> None:
        entry = self._entries.get(name)
        if entry is not None:
            entry.used = max(entry.used, used)

    def best(
        self, tokens: Tokens, limit: int, *, longer_than: int = 0, room: int | None = None
    ) -> Found | None:
        """The file serving the most of ``tokens`` (at most ``limit`` of them), if it serves
        more than ``longer_than`` and is worth a restore; the most recently used on a tie.
        A file of more than ``room`` tokens (a slot's context) is passed over: its state
        cannot be restored whole into the slot (it stays, for a process with room)."""
        found: Found | None = None
        for entry in self._entries.values():
            if room is not None and len(entry.tokens) > room:
                continue
            keep = reusable(entry.tokens, tokens, limit, cut_anywhere=self.cut_anywhere)
            if keep <= longer_than or not worth(tokens, keep, self.min_restore):
                continue
            if found is None or (keep, entry.used) > (found.keep, found.entry.used):
                found = Found(entry, keep)
        return found

    def covers(self, tokens: Tokens) -> bool:
        """Whether a file serves every prefix a file of ``tokens`` would."""
        return any(
            covers(entry.tokens, tokens, cut_anywhere=self.cut_anywhere)
            for entry in self._entries.values()
        )
